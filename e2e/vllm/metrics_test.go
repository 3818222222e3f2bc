package vllm

import (
	"context"
	"encoding/json"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omnious/provider-node/capacity"
	"github.com/omnious/provider-node/engines/metrics"
)

func get(t *testing.T, url string) []byte {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, "GET %s: %s", url, b)
	return b
}

// TestMetricsRealVLLM: the scraper reads vLLM's real metric names, labels
// and histogram buckets, and the EPP's capacity curve learns from them:
// /v1/capacity shows a non-empty curve for each replica after load.
func TestMetricsRealVLLM(t *testing.T) {
	f := getFleet(t)
	// Load with generation, so that TTFT and ITL are observed at a few
	// batch sizes.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	for w := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(53, uint64(w)))
			for i := range 6 {
				c := chat{{"role": "user", "content": text(rng, 50+10*w+i)}}
				require.NoError(t, postJSON(ctx, f.gatewayURL()+"/v1/chat/completions",
					map[string]any{"model": model, "messages": c, "max_tokens": 24, "ignore_eos": true}, nil))
			}
		}()
	}
	wg.Wait()

	for _, r := range f.replicas {
		body := get(t, r.base()+"/metrics")
		if dir := os.Getenv("E2E_VLLM_SAVE"); dir != "" {
			require.NoError(t, os.WriteFile(filepath.Join(dir, "metrics-"+r.name+".txt"), body, 0o644))
		}
		var s metrics.Signals
		require.NoError(t, metrics.Parse(body, &s))
		require.Equal(t, metrics.EngineVLLM, s.Engine)
		for _, h := range []struct {
			bit  uint32
			name string
		}{
			{metrics.HasRunning, "running"}, {metrics.HasWaiting, "waiting"}, {metrics.HasKVUsage, "kv usage"},
			{metrics.HasPrefixQueries, "prefix queries"}, {metrics.HasPrefixHits, "prefix hits"},
			{metrics.HasPromptTokens, "prompt tokens"}, {metrics.HasGenerationTokens, "generation tokens"},
			{metrics.HasCacheConfig, "cache_config_info"}, {metrics.HasTTFT, "TTFT histogram"}, {metrics.HasITL, "ITL histogram"},
		} {
			require.NotZero(t, s.Has&h.bit, "%s: the scraper did not read vLLM's %s", r.name, h.name)
		}
		require.Equal(t, blockSize, s.BlockSize, "cache_config_info block_size")
		require.EqualValues(t, kvCacheBytes/512/blockSize, s.NumGPUBlocks, "cache_config_info num_gpu_blocks")
		require.Positive(t, s.GenerationTokens)
		require.Positive(t, s.PromptTokens)
		require.Positive(t, s.TTFT.Count, "TTFT observations")
		require.Positive(t, s.ITL.Count, "ITL observations")
	}

	require.Eventually(t, func() bool {
		var snap capacity.Snapshot
		if json.Unmarshal(get(t, "http://"+f.epp.AdminAddr()+capacity.Path), &snap) != nil || len(snap.Models) != 1 {
			return false
		}
		learnt := 0
		for _, rc := range snap.Models[0].ReplicaCapacity {
			if len(rc.Curve.Bins) > 0 && len(rc.Curve.TTFTBounds) > 0 && len(rc.Curve.ITLBounds) > 0 {
				learnt++
			}
		}
		return learnt == len(f.replicas) && snap.Models[0].TotalKVTokens == int64(len(f.replicas)*kvCacheBytes/512)
	}, 15*time.Second, 250*time.Millisecond, "/v1/capacity shows no learnt curve for every replica")
}

package metrics

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestParseRealVLLM032 parses the exposition of a running vLLM 0.32.0
// (CPU build; e2e/vllm, TestMetricsRealVLLM with E2E_VLLM_SAVE): its real
// names, labels (engine, model_name), cache_config_info labels and
// histogram buckets, and the newer vllm:num_requests_waiting_by_reason,
// which must not be read as the waiting queue.
func TestParseRealVLLM032(t *testing.T) {
	var s Signals
	require.NoError(t, Parse(readFixture(t, "vllm-0.32.0-cpu.txt"), &s))
	require.Equal(t, EngineVLLM, s.Engine)
	require.Zero(t, s.Running)
	require.Zero(t, s.Waiting)
	require.InDelta(t, 2568, s.PrefixQueries, 1e-9)
	require.InDelta(t, 640, s.PrefixHits, 1e-9)
	require.InDelta(t, 2568, s.PromptTokens, 1e-9)
	require.InDelta(t, 692, s.GenerationTokens, 1e-9)
	require.Equal(t, 32, s.BlockSize)
	require.EqualValues(t, 256, s.NumGPUBlocks)
	require.InDelta(t, 23, s.TTFT.Count, 1e-9)
	require.InDelta(t, 669, s.ITL.Count, 1e-9)
	require.NotEmpty(t, s.TTFT.Bounds)
	require.NotEmpty(t, s.ITL.Bounds)
	for _, bit := range []uint32{HasRunning, HasWaiting, HasKVUsage, HasPrefixQueries, HasPrefixHits,
		HasPromptTokens, HasGenerationTokens, HasCacheConfig, HasTTFT, HasITL} {
		require.NotZero(t, s.Has&bit)
	}

	// The by-reason split of the queue, made non-zero, leaves Waiting alone.
	body := readFixture(t, "vllm-0.32.0-cpu.txt")
	for _, reason := range []string{"capacity", "deferred"} {
		line := []byte(`vllm:num_requests_waiting_by_reason{engine="0",model_name="qwen3-test",reason="` + reason + `"} 0.0`)
		require.True(t, bytes.Contains(body, line))
		body = bytes.Replace(body, line, bytes.Replace(line, []byte("} 0.0"), []byte("} 7.0"), 1), 1)
	}
	var s2 Signals
	require.NoError(t, Parse(body, &s2))
	require.Zero(t, s2.Waiting)
}

package rig

import (
	"context"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/omnious/provider-node/bench/internal/leak"
	"github.com/omnious/provider-node/engines/sim/simtest"
)

// smallOptions is a fleet and traffic small enough for a test.
func smallOptions(t *testing.T) Options {
	return Options{Scenario: "e2e", Seed: 3, Log: zaptest.NewLogger(t),
		Fleet: FleetOptions{Replicas: 2, TimeScale: 4, NumGPUBlocks: 400},
		Workload: WorkloadOptions{Kind: WorkloadSharedPrefix, SharedPrefix: SharedPrefixOptions{
			NumGroups: 4, PromptsPerGroup: 2, SystemPromptLen: 300, QuestionLen: 40, OutputLen: 8,
			QPS: []float64{10, 20}, StageDuration: 2 * time.Second}}}
}

func TestParseCounters(t *testing.T) {
	vllm := `# HELP vllm:prefix_cache_queries_total x
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1000
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 250
vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"} 3
vllm:request_success_total{engine="0",finished_reason="length",model_name="m"} 4
vllm:prompt_tokens_total{engine="0",model_name="m"} 1.5e3
vllm:num_requests_running{engine="0",model_name="m"} 9
`
	require.Equal(t, Counters{OK: true, Queries: 1000, Hits: 250, Requests: 7, PromptTokens: 1500}, parseCounters([]byte(vllm)))
	sgl := `sglang:prompt_tokens_total{model_name="m"} 400
sglang:cached_tokens_total{model_name="m"} 100
sglang:num_requests_total{model_name="m"} 5
`
	require.Equal(t, Counters{OK: true, Queries: 400, Hits: 100, Requests: 5, PromptTokens: 400}, parseCounters([]byte(sgl)))
	require.Equal(t, Counters{}, parseCounters([]byte("garbage {\nfoo 1\n")))
}

func TestFleetStopsEverything(t *testing.T) {
	base, _ := leak.Goroutines()
	o := smallOptions(t).WithDefaults()
	f, err := StartFleet(context.Background(), o.Fleet, 1, 1000, o.Log)
	require.NoError(t, err)
	eps := f.Endpoints()
	require.Len(t, eps, 2)
	for _, ep := range eps {
		require.True(t, strings.HasPrefix(ep.KVEvents, "tcp://127.0.0.1:"), ep.KVEvents)
		require.True(t, strings.HasPrefix(ep.KVReplay, "tcp://127.0.0.1:"), ep.KVReplay)
		require.NotEqual(t, ep.KVEvents, ep.KVReplay)
		require.Equal(t, "vllm", ep.Engine)
		require.Equal(t, "http://"+ep.Addr+"/metrics", ep.MetricsURL)
	}
	c := f.Counters(context.Background())
	require.Len(t, c, 2)
	require.True(t, c[0].OK, "the simulator exposes prefix-cache counters")
	require.NoError(t, f.Stop())
	for _, ep := range eps {
		leak.RequireFree(t, ep.Addr)
		leak.RequireFree(t, strings.TrimPrefix(ep.KVEvents, "tcp://"))
		leak.RequireFree(t, strings.TrimPrefix(ep.KVReplay, "tcp://"))
	}
	leak.Settle(t, base)
}

// The capacity proof kills the last replica of a simulated fleet, in
// process or as a process; a fleet of real URLs has none to kill.
func TestFleetKills(t *testing.T) {
	bin := simtest.Binary(t)
	for _, mode := range []string{FleetInProcess, FleetProcess} {
		t.Run(mode, func(t *testing.T) {
			o := smallOptions(t).WithDefaults()
			o.Fleet.Mode, o.Fleet.EnginesimBin = mode, bin
			f, err := StartFleet(context.Background(), o.Fleet, 1, 1000, o.Log)
			require.NoError(t, err)
			defer func() { require.NoError(t, f.Stop()) }()
			require.Len(t, f.Kills(), len(f.Endpoints()))
			f.Kills()[len(f.Kills())-1]()
			last := f.Endpoints()[len(f.Endpoints())-1]
			require.Eventually(t, func() bool {
				l, err := net.Listen("tcp", last.Addr)
				if err == nil {
					_ = l.Close()
				}
				return err == nil
			}, 10*time.Second, 20*time.Millisecond, "the killed replica's port is still bound")
			resp, err := http.Get("http://" + f.Endpoints()[0].Addr + "/health")
			require.NoError(t, err, "the others still serve")
			require.NoError(t, resp.Body.Close())
		})
	}
	u := FleetOptions{Mode: FleetURLs, URLs: []string{"http://127.0.0.1:1"}, Model: "m"}
	f, err := StartFleet(context.Background(), u, 1, 1000, zaptest.NewLogger(t))
	require.NoError(t, err)
	require.Empty(t, f.Kills())
	require.NoError(t, f.Stop())
}

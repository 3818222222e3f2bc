package scheduler

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/omnious/provider-node/endpoint"
	"github.com/omnious/provider-node/engines/metrics"
	"github.com/omnious/provider-node/kvindex"
)

// TestRunScrapesAndTrips runs the real scrape loop against loopback
// engines: signals arrive, and an engine whose metrics fail opens its
// breaker and stops receiving requests.
func TestRunScrapesAndTrips(t *testing.T) {
	var failing atomic.Bool
	engine := func(waiting string, fail *atomic.Bool) *httptest.Server {
		return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if fail != nil && fail.Load() {
				http.Error(w, "down", http.StatusInternalServerError)
				return
			}
			_, _ = w.Write([]byte("vllm:num_requests_waiting{engine=\"0\"} " + waiting + "\nvllm:kv_cache_usage_perc 0.1\n" +
				"vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"100\"} 1\n"))
		}))
	}
	a, b := engine("1", &failing), engine("2", nil)
	defer a.Close()
	defer b.Close()

	cfg := DefaultConfig()
	cfg.Signals.ScrapeInterval = 20 * time.Millisecond
	cfg.Signals.ScrapeTimeout = 500 * time.Millisecond
	cfg.Signals.StaleAfter = time.Second
	s, err := New(cfg, kvindex.New(kvindex.Config{}), prometheus.NewRegistry(), zaptest.NewLogger(t))
	require.NoError(t, err)
	s.SetEndpoints(targets(
		endpoint.Endpoint{Addr: "127.0.0.1:1", Model: testModel, Engine: "vllm", MetricsURL: a.URL + "/metrics"},
		endpoint.Endpoint{Addr: "127.0.0.1:2", Model: testModel, Engine: "vllm", MetricsURL: b.URL + "/metrics"},
	))
	// The scraper runs beside the scheduler, as the EPP wires them.
	scraper := metrics.NewScraper(metrics.ScraperConfig{
		Interval: cfg.Signals.ScrapeInterval, Timeout: cfg.Signals.ScrapeTimeout, OnSample: s.Observe,
	}, zaptest.NewLogger(t))
	scraper.SetTargets([]string{a.URL + "/metrics", b.URL + "/metrics"})
	runCtx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(runCtx) }()
	scraped := make(chan struct{})
	go func() { scraper.Run(runCtx); close(scraped) }()
	defer func() {
		cancel()
		require.NoError(t, <-done)
		<-scraped
	}()

	require.Eventually(t, func() bool {
		c := s.Capacity()
		return len(c.Models) == 1 && c.Models[0].Healthy == 2 && c.Models[0].Waiting == 3
	}, 5*time.Second, 10*time.Millisecond)
	require.Equal(t, int64(2*1600*9/10), s.Capacity().Models[0].FreeKVTokens)

	failing.Store(true)
	require.Eventually(t, func() bool {
		return s.snap.Load().byAddr["127.0.0.1:1"].br.current(s.now(), cfg.Breaker.Cooldown) == BreakerOpen
	}, 5*time.Second, 10*time.Millisecond)
	for range 10 {
		d, err := s.admitPick(context.Background(), &Request{Model: testModel})
		require.NoError(t, err)
		require.Equal(t, "127.0.0.1:2", primary(d))
		d.Done(DoneInfo{Status: 200})
	}
}

func TestMetricsNames(t *testing.T) {
	e := newEnv(t, 2, nil)
	e.freshAll()
	d, err := e.s.admitPick(ctx, &Request{Model: testModel, Tokens: tokens(256, 1), Tenant: "acme"})
	require.NoError(t, err)
	d.Done(DoneInfo{Status: 200, PromptTokens: 10, CompletionTokens: 2})
	_, _ = e.s.admitPick(ctx, &Request{Model: "missing"})
	e.s.refreshGauges()

	mfs, err := e.reg.Gather()
	require.NoError(t, err)
	got := map[string]bool{}
	for _, mf := range mfs {
		got[mf.GetName()] = true
	}
	for _, name := range []string{
		"inference_extension_scheduler_e2e_duration_seconds",
		"inference_extension_prefix_indexer_hit_ratio",
		"inference_pool_per_pod_queue_size",
		"inference_pool_average_kv_cache_utilization",
		"inference_pool_average_queue_size",
		"inference_pool_ready_pods",
		"inference_extension_scheduler_attempts_total",
		"omnious_epp_decisions_total",
		"omnious_epp_breaker_state",
		"omnious_epp_flow_queue_depth",
		"omnious_epp_tenant_tokens_total",
		"omnious_epp_endpoint_score",
		"omnious_epp_replica_stale",
		"omnious_epp_kv_lookup_duration_seconds",
	} {
		require.True(t, got[name], name)
	}
	// A second scheduler on the same registry is refused with an error, not
	// a panic.
	_, err = New(DefaultConfig(), nil, e.reg, nil)
	require.ErrorContains(t, err, "cannot register scheduler metrics")
}

package scheduler

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/omnious/provider-node/endpoint"
	"github.com/omnious/provider-node/engines/metrics"
	"github.com/omnious/provider-node/kvindex"
)

// fakeClock is a settable clock.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{t: time.Unix(1_700_000_000, 0)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// set moves the clock forward to t (never back).
func (c *fakeClock) set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if t.After(c.t) {
		c.t = t
	}
}

// SleepUntil makes the clock an engine simulator's clock: sleeping jumps.
func (c *fakeClock) SleepUntil(_ context.Context, t time.Time) { c.set(t) }

type testEnv struct {
	s     *Scheduler
	ix    *kvindex.Index
	clock *fakeClock
	reg   *prometheus.Registry
}

const testModel = "llama"

// newEnv builds a scheduler over n endpoints 10.0.0.<i+1>:8000 serving
// testModel, with a fake clock and a deterministic random source.
func newEnv(t testing.TB, n int, mut func(*Config)) *testEnv {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Seed = 1
	// Flow-control tests turn admission back on; elsewhere picks without
	// Done must not end up queued.
	cfg.Admission.Enabled = ptr(false)
	// The routing tables were written against the llmgw guard (8 requests
	// and 1.5x); pinning it keeps them about the guard's logic, not about
	// whichever default the bench tuned.
	cfg.Prefix.BalanceAbs, cfg.Prefix.BalanceRel = new(8.0), 1.5
	if mut != nil {
		mut(&cfg)
	}
	ix := kvindex.New(kvindex.Config{})
	reg := prometheus.NewRegistry()
	s, err := New(cfg, ix, reg, nil)
	require.NoError(t, err)
	clock := newFakeClock()
	s.now = clock.Now
	s.SetEndpoints(endpoints(n, testModel))
	return &testEnv{s: s, ix: ix, clock: clock, reg: reg}
}

// endpoints returns n targets 10.0.0.<i+1>:8000 with replica id i.
func endpoints(n int, model string) []Target {
	eps := make([]Target, n)
	for i := range eps {
		eps[i] = Target{Replica: kvindex.Replica(i), Endpoint: endpoint.Endpoint{
			Addr: addr(i), Model: model, Engine: "vllm", MetricsURL: fmt.Sprintf("http://127.0.0.1:1/metrics?ep=%d", i)}}
	}
	return eps
}

// targets gives each endpoint its position as replica id.
func targets(eps ...endpoint.Endpoint) []Target {
	out := make([]Target, len(eps))
	for i, ep := range eps {
		out[i] = Target{Endpoint: ep, Replica: kvindex.Replica(i)}
	}
	return out
}

func addr(i int) string { return fmt.Sprintf("10.0.0.%d:8000", i+1) }

func (e *testEnv) rep(i int) *replica { return e.s.snap.Load().byAddr[addr(i)] }

// setSignals publishes fresh engine signals for endpoint i.
func (e *testEnv) setSignals(i int, sig metrics.Signals) {
	r := e.rep(i)
	r.sample.Store(e.s.sampled(&metrics.Sample{URL: r.ep.MetricsURL, Signals: sig, At: e.clock.Now()}))
}

// freshAll publishes idle signals for every endpoint.
func (e *testEnv) freshAll() {
	for i := range e.s.snap.Load().all.reps {
		e.setSignals(i, metrics.Signals{Engine: metrics.EngineVLLM})
	}
}

func tokens(n int, seed uint32) []uint32 {
	t := make([]uint32, n)
	for i := range t {
		t[i] = seed*1_000_003 + uint32(i)
	}
	return t
}

// store puts the first blocks of toks on endpoint i in the index.
func (e *testEnv) store(i int, toks []uint32) {
	keys := kvindex.AppendBlockKeys(nil, kvindex.RootKey(testModel, "", ""), toks, e.s.cfg.BlockSize)
	e.ix.Store(e.rep(i).id, kvindex.TierGPU, keys)
}

// remove takes the first blocks of toks off endpoint i in the index.
func (e *testEnv) remove(i int, toks []uint32) {
	keys := kvindex.AppendBlockKeys(nil, kvindex.RootKey(testModel, "", ""), toks, e.s.cfg.BlockSize)
	e.ix.Remove(e.rep(i).id, kvindex.TierGPU, keys)
}

func primary(d *Decision) string { return d.Endpoints[0].Addr }

// admitPick admits and picks as the ext_proc server does.
func (s *Scheduler) admitPick(ctx context.Context, req *Request) (*Decision, error) {
	t, err := s.Admit(ctx, req)
	if err != nil {
		return nil, err
	}
	return s.Pick(req, t)
}

// statusOf returns the HTTP status for err: the Error's status, or 500.
func statusOf(err error) int {
	var e *Error
	if errors.As(err, &e) {
		return e.Status
	}
	return http.StatusInternalServerError
}

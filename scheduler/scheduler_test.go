package scheduler

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/omnious/provider-node/capacity"
	"github.com/omnious/provider-node/endpoint"
	"github.com/omnious/provider-node/engines/metrics"
)

var ctx = context.Background()

func TestScorers(t *testing.T) {
	tests := []struct {
		name string
		got  float64
		want float64
	}{
		{"queue idle", queueScorer(0, 4), 1},
		{"queue at target", queueScorer(4, 4), 0.5},
		{"queue 3x target", queueScorer(12, 4), 0.25},
		{"queue negative clamps", queueScorer(-3, 4), 1},
		{"inflight idle", inflightScorer(0, 8), 1},
		{"inflight at target", inflightScorer(8, 8), 0.5},
		{"kv empty", kvScorer(0, 0.9), 1},
		{"kv half ceiling", kvScorer(0.45, 0.9), 0.5},
		{"kv at ceiling", kvScorer(0.9, 0.9), 0},
		{"kv above ceiling", kvScorer(1, 0.9), 0},
		{"session own replica at mean", sessionScorer(true, 4, 4, 1.25), 1},
		{"session own replica one over", sessionScorer(true, 6, 4, 1.25), 1},
		{"session own replica hot", sessionScorer(true, 10, 4, 1.25), 0},
		{"session other replica", sessionScorer(false, 0, 4, 1.25), 0},
		{"prefix ok", prefixScorer(&cand{prefixOK: true, prefixShare: 0.7}), 0.7},
		{"prefix not ok", prefixScorer(&cand{prefixOK: false, prefixShare: 0.7}), 0},
		{"prefix share clamped", prefixScorer(&cand{prefixOK: true, prefixShare: 1.5}), 1},
		{"lora loaded", loraScorer(&cand{sig: &sampled{sm: &metrics.Sample{Signals: metrics.Signals{RunningLoRA: "a,b"}}}}, "b"), 1},
		{"lora waiting", loraScorer(&cand{sig: &sampled{sm: &metrics.Sample{Signals: metrics.Signals{WaitingLoRA: "b"}}}}, "b"), 1},
		{"lora not loaded", loraScorer(&cand{sig: &sampled{sm: &metrics.Sample{Signals: metrics.Signals{RunningLoRA: "a"}}}}, "b"), 0},
		{"lora no signals", loraScorer(&cand{}, "b"), 0},
		{"lora base model", loraScorer(&cand{sig: &sampled{sm: &metrics.Sample{Signals: metrics.Signals{RunningLoRA: "a"}}}}, ""), 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.InDelta(t, tt.want, tt.got, 1e-12)
		})
	}
}

func TestGuardTrips(t *testing.T) {
	tests := []struct {
		name          string
		load, minLoad float64
		want          bool
	}{
		{"idle pool small gap", 2, 0, false},
		{"idle pool abs gap", 8, 0, true},
		{"busy pool rounding error", 200, 180, false},
		{"abs and rel", 30, 10, true},
		{"abs only", 30, 25, false},
		{"rel only", 6, 2, false},
		{"exactly both", 12, 4, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, guardTrips(tt.load, tt.minLoad, 8, 1.5))
		})
	}
}

func TestBreakerTransitions(t *testing.T) {
	const cooldown = 15 * time.Second
	t0 := time.Unix(1000, 0)
	type step struct {
		at     time.Duration
		op     string // req-ok, req-fail, scrape-ok, scrape-fail, probe, release
		want   int    // state after (current)
		admits bool   // admit after
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{"opens after threshold consecutive failures", []step{
			{0, "req-fail", BreakerClosed, true},
			{0, "req-fail", BreakerClosed, true},
			{0, "req-fail", BreakerOpen, false},
		}},
		{"success resets the count", []step{
			{0, "req-fail", BreakerClosed, true},
			{0, "req-fail", BreakerClosed, true},
			{0, "req-ok", BreakerClosed, true},
			{0, "req-fail", BreakerClosed, true},
			{0, "req-fail", BreakerClosed, true},
		}},
		{"scrape failures trip too", []step{
			{0, "scrape-fail", BreakerClosed, true},
			{0, "scrape-fail", BreakerClosed, true},
			{0, "scrape-fail", BreakerOpen, false},
		}},
		{"scrape success does not hide request failures", []step{
			{0, "req-fail", BreakerClosed, true},
			{0, "scrape-ok", BreakerClosed, true},
			{0, "req-fail", BreakerClosed, true},
			{0, "scrape-ok", BreakerClosed, true},
			{0, "req-fail", BreakerOpen, false},
		}},
		{"cooldown then half-open probe closes on success", []step{
			{0, "req-fail", BreakerClosed, true},
			{0, "req-fail", BreakerClosed, true},
			{0, "req-fail", BreakerOpen, false},
			{cooldown - time.Second, "none", BreakerOpen, false},
			{cooldown, "none", BreakerHalfOpen, true},
			{cooldown, "probe", BreakerHalfOpen, false}, // one probe at a time
			{cooldown, "req-ok", BreakerClosed, true},
		}},
		{"half-open probe failure reopens", []step{
			{0, "req-fail", BreakerClosed, true},
			{0, "req-fail", BreakerClosed, true},
			{0, "req-fail", BreakerOpen, false},
			{cooldown, "probe", BreakerHalfOpen, false},
			{cooldown, "req-fail", BreakerOpen, false},
			{2*cooldown - time.Second, "none", BreakerOpen, false},
			{2 * cooldown, "none", BreakerHalfOpen, true},
		}},
		{"released probe lets another through", []step{
			{0, "scrape-fail", BreakerClosed, true},
			{0, "scrape-fail", BreakerClosed, true},
			{0, "scrape-fail", BreakerOpen, false},
			{cooldown, "probe", BreakerHalfOpen, false},
			{cooldown, "release", BreakerHalfOpen, true},
		}},
		{"scrape success does not close half-open", []step{
			{0, "req-fail", BreakerClosed, true},
			{0, "req-fail", BreakerClosed, true},
			{0, "req-fail", BreakerOpen, false},
			{cooldown, "scrape-ok", BreakerHalfOpen, true},
			{cooldown, "scrape-fail", BreakerOpen, false},
		}},
		{"late outcomes while open are ignored", []step{
			{0, "req-fail", BreakerClosed, true},
			{0, "req-fail", BreakerClosed, true},
			{0, "req-fail", BreakerOpen, false},
			{time.Second, "req-ok", BreakerOpen, false},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b breaker
			for i, st := range tt.steps {
				now := t0.Add(st.at)
				switch st.op {
				case "req-ok":
					b.request(true, now, 3)
				case "req-fail":
					b.request(false, now, 3)
				case "scrape-ok":
					b.scrape(true, now, 3)
				case "scrape-fail":
					b.scrape(false, now, 3)
				case "probe":
					ok, probe := b.admit(now, cooldown)
					require.True(t, ok, "step %d", i)
					require.True(t, probe, "step %d", i)
					require.True(t, b.claimProbe(now), "step %d", i)
				case "release":
					b.releaseProbe()
				}
				require.Equal(t, st.want, b.current(now, cooldown), "step %d state", i)
				ok, _ := b.admit(now, cooldown)
				require.Equal(t, st.admits, ok, "step %d admit", i)
			}
		})
	}
}

func TestModelNotServed(t *testing.T) {
	e := newEnv(t, 2, func(c *Config) { c.Adapters = map[string]string{"sql-lora": testModel, "orphan": "other"} })
	_, err := e.s.admitPick(ctx, &Request{Model: "nope", Tokens: tokens(64, 1)})
	require.ErrorIs(t, err, ErrModelNotServed)
	require.Equal(t, 404, statusOf(err))
	_, err = e.s.admitPick(ctx, &Request{Model: "orphan"})
	require.ErrorIs(t, err, ErrModelNotServed)

	d, err := e.s.admitPick(ctx, &Request{})
	require.NoError(t, err, "a request naming no model (GET /v1/models) goes to any endpoint")
	d.Done(DoneInfo{Status: 200})

	d, err = e.s.admitPick(ctx, &Request{Model: "sql-lora", Tokens: tokens(64, 1)})
	require.NoError(t, err, "a configured adapter is served by its base model's replicas")
	d.Done(DoneInfo{Status: 200})

	// An adapter no config names is served where an engine reports it loaded.
	e.setSignals(1, metrics.Signals{RunningLoRA: "chat-lora"})
	for range 5 {
		d, err = e.s.admitPick(ctx, &Request{Model: "chat-lora", Tokens: tokens(64, 1)})
		require.NoError(t, err)
		require.Equal(t, addr(1), primary(d))
		d.Done(DoneInfo{Status: 200})
	}
}

func TestLoRAAffinity(t *testing.T) {
	e := newEnv(t, 3, func(c *Config) { c.Adapters = map[string]string{"sql-lora": testModel} })
	e.freshAll()
	e.setSignals(2, metrics.Signals{RunningLoRA: "x,sql-lora"})
	d, err := e.s.admitPick(ctx, &Request{Model: "sql-lora"})
	require.NoError(t, err)
	require.Equal(t, addr(2), primary(d))
	d.Done(DoneInfo{Status: 200})
}

func TestSubsetExactAddr(t *testing.T) {
	e := newEnv(t, 0, nil)
	e.s.SetEndpoints(targets(
		endpoint.Endpoint{Addr: "10.0.0.1:8000", Model: testModel},
		endpoint.Endpoint{Addr: "10.0.0.1:8001", Model: testModel},
		endpoint.Endpoint{Addr: "10.0.0.2:8000", Model: testModel},
	))
	for range 20 {
		d, err := e.s.admitPick(ctx, &Request{Model: testModel, Subset: []string{"10.0.0.1:8001"}})
		require.NoError(t, err)
		require.Len(t, d.Endpoints, 1, "the subset leaves one candidate, so no fallback")
		require.Equal(t, "10.0.0.1:8001", primary(d))
		d.Done(DoneInfo{Status: 200})
	}
	_, err := e.s.admitPick(ctx, &Request{Model: testModel, Subset: []string{"10.0.0.9:8000"}})
	require.ErrorIs(t, err, ErrNoEndpoint)
	_, err = e.s.admitPick(ctx, &Request{Model: testModel, Subset: []string{}})
	require.ErrorIs(t, err, ErrNoEndpoint, "an empty non-nil subset matches nothing")
}

func TestFilters(t *testing.T) {
	tests := []struct {
		name       string
		setup      func(e *testEnv)
		wantIn     []int
		wantReason string
	}{
		{"breaker open removes the replica", func(e *testEnv) {
			for range 3 {
				e.rep(0).br.request(false, e.clock.Now(), 3)
			}
		}, []int{1, 2}, ""},
		{"kv above ceiling removes the replica", func(e *testEnv) {
			e.setSignals(1, metrics.Signals{KVUsage: 0.95})
		}, []int{0, 2}, ""},
		{"kv above ceiling stays a candidate when the rest are queueing", func(e *testEnv) {
			// Only an unfiltered replica 0 wins: its empty queue outweighs
			// the others' KV headroom.
			e.setSignals(0, metrics.Signals{KVUsage: 0.95})
			e.setSignals(1, metrics.Signals{KVUsage: 0.3, Waiting: 20})
			e.setSignals(2, metrics.Signals{KVUsage: 0.3, Waiting: 20})
		}, []int{0}, ""},
		{"kv above ceiling is removed while others can start", func(e *testEnv) {
			e.setSignals(0, metrics.Signals{KVUsage: 0.95})
			e.setSignals(1, metrics.Signals{KVUsage: 0.3, Waiting: 3})
			e.setSignals(2, metrics.Signals{KVUsage: 0.3, Waiting: 3})
		}, []int{1, 2}, ""},
		{"kv above ceiling everywhere keeps all", func(e *testEnv) {
			for i := range 3 {
				e.setSignals(i, metrics.Signals{KVUsage: 0.95})
			}
		}, []int{0, 1, 2}, ""},
		{"every breaker open still routes", func(e *testEnv) {
			for i := range 3 {
				for range 3 {
					e.rep(i).br.request(false, e.clock.Now(), 3)
				}
			}
		}, []int{0, 1, 2}, ReasonFallback},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, 3, nil)
			e.freshAll()
			tt.setup(e)
			seen := map[string]bool{}
			for range 60 {
				d, err := e.s.admitPick(ctx, &Request{Model: testModel})
				require.NoError(t, err)
				seen[primary(d)] = true
				if tt.wantReason != "" {
					require.Equal(t, tt.wantReason, d.Reason)
				}
				d.Done(DoneInfo{})
			}
			want := map[string]bool{}
			for _, i := range tt.wantIn {
				want[addr(i)] = true
			}
			require.Equal(t, want, seen)
		})
	}
}

func TestBreakerFedByDone(t *testing.T) {
	e := newEnv(t, 2, nil)
	e.freshAll()
	// Requests served by endpoint 0 fail (the served endpoint is blamed,
	// even when the primary was another one).
	for range 3 {
		d, err := e.s.admitPick(ctx, &Request{Model: testModel})
		require.NoError(t, err)
		d.Done(DoneInfo{Served: addr(0), Status: 503})
	}
	require.Equal(t, BreakerOpen, e.rep(0).br.current(e.clock.Now(), e.s.cfg.Breaker.Cooldown))
	for range 10 {
		d, err := e.s.admitPick(ctx, &Request{Model: testModel})
		require.NoError(t, err)
		require.Equal(t, addr(1), primary(d))
		d.Done(DoneInfo{Status: 200})
	}
	// After the cooldown one probe goes to endpoint 0 when it scores best.
	e.clock.Add(e.s.cfg.Breaker.Cooldown)
	e.rep(1).inflight.Add(50)
	d, err := e.s.admitPick(ctx, &Request{Model: testModel})
	require.NoError(t, err)
	require.Equal(t, addr(0), primary(d))
	d2, err := e.s.admitPick(ctx, &Request{Model: testModel})
	require.NoError(t, err)
	require.Equal(t, addr(1), primary(d2), "only one probe while half-open")
	d.Done(DoneInfo{Status: 200, Err: nil})
	d2.Done(DoneInfo{Status: 200})
	require.Equal(t, BreakerClosed, e.rep(0).br.current(e.clock.Now(), e.s.cfg.Breaker.Cooldown))
	e.rep(1).inflight.Add(-50)

	// A stream that ends without a 5xx is no evidence against the replica
	// however often it happens: the client may have gone away.
	for range 10 {
		d, err := e.s.admitPick(ctx, &Request{Model: testModel, Subset: []string{addr(1)}})
		require.NoError(t, err)
		d.Done(DoneInfo{Err: errors.New("ext_proc stream cancelled")})
	}
	require.Equal(t, BreakerClosed, e.rep(1).br.current(e.clock.Now(), e.s.cfg.Breaker.Cooldown))
	// An upstream 5xx is, even when the stream then ends early.
	for range 3 {
		d, err := e.s.admitPick(ctx, &Request{Model: testModel, Subset: []string{addr(1)}})
		require.NoError(t, err)
		d.Done(DoneInfo{Status: 503, Err: errors.New("ext_proc stream cancelled")})
	}
	require.Equal(t, BreakerOpen, e.rep(1).br.current(e.clock.Now(), e.s.cfg.Breaker.Cooldown))
}

func TestOutcome(t *testing.T) {
	cut := errors.New("ext_proc stream cancelled")
	for _, tt := range []struct {
		name string
		info DoneInfo
		want Outcome
	}{
		{"no response phase, stream ended", DoneInfo{Err: cut}, OutcomeUnknown},
		{"nothing reported", DoneInfo{}, OutcomeUnknown},
		{"2xx complete", DoneInfo{Status: 200}, OutcomeSuccess},
		{"4xx complete", DoneInfo{Status: 404}, OutcomeSuccess},
		{"2xx cut mid-body", DoneInfo{Status: 200, Err: cut}, OutcomeUnknown},
		{"4xx cut", DoneInfo{Status: 429, Err: cut}, OutcomeUnknown},
		{"5xx complete", DoneInfo{Status: 500}, OutcomeFailure},
		{"Envoy's 503 for a connect failure", DoneInfo{Status: 503}, OutcomeFailure},
		{"5xx cut", DoneInfo{Status: 502, Err: cut}, OutcomeFailure},
	} {
		require.Equal(t, tt.want, tt.info.Outcome(), tt.name)
	}
}

// TestUnknownProbeReleased: a half-open probe whose stream ends with no
// status proves nothing, so the next request may probe again.
func TestUnknownProbeReleased(t *testing.T) {
	e := newEnv(t, 2, nil)
	e.freshAll()
	for range 3 {
		d, err := e.s.admitPick(ctx, &Request{Model: testModel, Subset: []string{addr(0)}})
		require.NoError(t, err)
		d.Done(DoneInfo{Status: 500})
	}
	e.clock.Add(e.s.cfg.Breaker.Cooldown)
	e.rep(1).inflight.Add(50)
	defer e.rep(1).inflight.Add(-50)
	d, err := e.s.admitPick(ctx, &Request{Model: testModel})
	require.NoError(t, err)
	require.Equal(t, addr(0), primary(d), "the probe")
	d.Done(DoneInfo{Err: errors.New("ext_proc stream cancelled")})
	require.Equal(t, BreakerHalfOpen, e.rep(0).br.current(e.clock.Now(), e.s.cfg.Breaker.Cooldown))
	d, err = e.s.admitPick(ctx, &Request{Model: testModel})
	require.NoError(t, err)
	require.Equal(t, addr(0), primary(d), "another probe may go")
	d.Done(DoneInfo{Status: 200})
	require.Equal(t, BreakerClosed, e.rep(0).br.current(e.clock.Now(), e.s.cfg.Breaker.Cooldown))
	require.Equal(t, 1.0, testutil.ToFloat64(e.s.m.outcomes[OutcomeUnknown]))
}

func TestInflightAccounting(t *testing.T) {
	e := newEnv(t, 1, nil)
	var ds []*Decision
	for i := range 5 {
		d, err := e.s.admitPick(ctx, &Request{Model: testModel})
		require.NoError(t, err)
		require.Equal(t, int64(i+1), e.rep(0).inflight.Load())
		ds = append(ds, d)
	}
	for i, d := range ds {
		d.Done(DoneInfo{Status: 200})
		d.Done(DoneInfo{Status: 200}) // a second Done is ignored
		require.Equal(t, int64(len(ds)-i-1), e.rep(0).inflight.Load())
	}
}

func TestFallbacks(t *testing.T) {
	tests := []struct {
		name      string
		n         int
		fb        *int // nil: the default
		wantCount int
	}{
		{"default two fallbacks", 5, nil, 3},
		{"zero fallbacks: the primary alone", 5, new(0), 1},
		{"fewer replicas than fallbacks", 2, new(4), 2},
		{"configured four", 8, new(4), 5},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, tt.n, func(c *Config) { c.Fallbacks = tt.fb })
			d, err := e.s.admitPick(ctx, &Request{Model: testModel})
			require.NoError(t, err)
			require.Len(t, d.Endpoints, tt.wantCount)
			seen := map[string]bool{}
			for _, ep := range d.Endpoints {
				require.False(t, seen[ep.Addr], "fallbacks are distinct")
				seen[ep.Addr] = true
			}
			d.Done(DoneInfo{})
		})
	}
}

// TestFallbackOrder checks the one-pass fallback selection against the
// definition: repeatedly the best-scored candidate not yet taken, the
// lowest index among equal scores, on random scores with many ties.
func TestFallbackOrder(t *testing.T) {
	rng := rand.New(rand.NewPCG(21, 22))
	s := &Scheduler{}
	var sc scratch
	for range 2000 {
		cands := make([]cand, 1+rng.IntN(20))
		for i := range cands {
			cands[i].score = float64(rng.IntN(6)) / 4
		}
		primary, fb := rng.IntN(len(cands)), rng.IntN(18)
		s.cfg.Fallbacks = &fb
		s.fallbacks(&sc, cands, primary)
		want := []int{primary}
		for len(want) <= fb && len(want) < len(cands) {
			best := -1
			for i := range cands {
				if !slices.Contains(want, i) && (best < 0 || cands[i].score > cands[best].score) {
					best = i
				}
			}
			want = append(want, best)
		}
		require.Equal(t, want, sc.order, "scores %v, primary %d, fallbacks %d", cands, primary, fb)
	}
}

func TestPreciseRouting(t *testing.T) {
	prompt := tokens(1024, 7)
	tests := []struct {
		name       string
		setup      func(e *testEnv)
		want       int // expected primary, -1 = any
		wantReason string
	}{
		{"prefix hit wins", func(e *testEnv) { e.store(2, prompt) }, 2, ReasonPrefix},
		{"short shared header is ignored (match_ratio)", func(e *testEnv) { e.store(2, prompt[:128]) }, -1, ReasonCold},
		{"cold pool", func(e *testEnv) {}, -1, ReasonCold},
		{"hot replica loses affinity to the guard", func(e *testEnv) {
			e.store(2, prompt)
			e.rep(2).inflight.Add(20)
		}, -1, ReasonOverride},
		{"engine queue loses affinity to the guard", func(e *testEnv) {
			e.store(2, prompt)
			e.setSignals(2, metrics.Signals{Engine: metrics.EngineVLLM, Running: 40, Waiting: 20})
		}, -1, ReasonOverride},
		{"a batch running without a queue keeps affinity", func(e *testEnv) {
			// A batching engine serves its running requests in one step:
			// 60 against 10 is no hot spot while nothing waits.
			e.store(2, prompt)
			for i := range 4 {
				e.setSignals(i, metrics.Signals{Engine: metrics.EngineVLLM, Running: 10})
			}
			e.setSignals(2, metrics.Signals{Engine: metrics.EngineVLLM, Running: 60})
		}, 2, ReasonPrefix},
		{"moderately busy replica keeps affinity", func(e *testEnv) {
			e.store(2, prompt)
			e.rep(2).inflight.Add(4)
		}, 2, ReasonPrefix},
		{"busier replica with a longer prefix still wins below the guard", func(e *testEnv) {
			e.store(1, prompt[:512])
			e.store(2, prompt)
			e.rep(2).inflight.Add(2)
		}, 2, ReasonPrefix},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, 4, func(c *Config) { c.Prefix.SpeculativeTTL = new(time.Nanosecond) })
			e.freshAll()
			tt.setup(e)
			d, err := e.s.admitPick(ctx, &Request{Model: testModel, Tokens: prompt})
			require.NoError(t, err)
			require.Equal(t, ModePrecise, d.Mode)
			require.Equal(t, tt.wantReason, d.Reason)
			require.Equal(t, len(prompt)/16, d.PromptBlocks)
			if tt.want >= 0 {
				require.Equal(t, addr(tt.want), primary(d))
				require.Equal(t, len(prompt)/16, d.PrefixBlocks)
			} else {
				require.NotEqual(t, addr(2), primary(d))
			}
			d.Done(DoneInfo{Status: 200})
		})
	}
}

func TestCacheSaltIsolates(t *testing.T) {
	e := newEnv(t, 4, func(c *Config) { c.Prefix.SpeculativeTTL = new(time.Nanosecond) })
	prompt := tokens(512, 3)
	e.store(1, prompt)
	d, err := e.s.admitPick(ctx, &Request{Model: testModel, Tokens: prompt, CacheSalt: "tenant-a"})
	require.NoError(t, err)
	require.Equal(t, ReasonCold, d.Reason)
	require.Zero(t, d.PrefixBlocks)
}

func TestSpeculativeCredit(t *testing.T) {
	e := newEnv(t, 8, nil)
	e.freshAll()
	prompt := tokens(2048, 11)
	first, err := e.s.admitPick(ctx, &Request{Model: testModel, Tokens: prompt})
	require.NoError(t, err)
	require.Equal(t, ReasonCold, first.Reason)
	// A burst of the same prefix follows the first request before any KV
	// event arrives, with a different suffix too.
	for i := range 5 {
		p := append(append([]uint32(nil), prompt...), tokens(100, uint32(100+i))...)
		d, err := e.s.admitPick(ctx, &Request{Model: testModel, Tokens: p})
		require.NoError(t, err)
		require.Equal(t, primary(first), primary(d))
		require.Equal(t, ReasonPrefix, d.Reason)
		require.GreaterOrEqual(t, d.PrefixBlocks, len(prompt)/16-specStride)
	}
	// After the TTL the credit is gone: the index shows the prefix nowhere,
	// so the routing memory recalls the replica it went to, and promises no
	// cached blocks there.
	e.clock.Add(3 * *e.s.cfg.Prefix.SpeculativeTTL)
	e.freshAll()
	d, err := e.s.admitPick(ctx, &Request{Model: testModel, Tokens: prompt})
	require.NoError(t, err)
	require.Equal(t, ReasonRecall, d.Reason)
	require.Equal(t, primary(first), primary(d))
	require.Zero(t, d.PrefixBlocks)
	// Past the routing memory's TTL too, the prefix is cold.
	e.clock.Add(e.s.cfg.Prefix.TTL + time.Second)
	e.freshAll()
	d, err = e.s.admitPick(ctx, &Request{Model: testModel, Tokens: prompt})
	require.NoError(t, err)
	require.Equal(t, ReasonCold, d.Reason)
}

// The routing memory extends only the longest match the index shows: a
// replica holding part of the prompt wins over the one the prompt went to
// and that the index shows without it; a longer match held elsewhere wins
// too; with the part gone again, the memory recalls its replica.
func TestRecallBesideIndex(t *testing.T) {
	e := newEnv(t, 4, nil)
	e.freshAll()
	prompt := tokens(640, 9)
	first, err := e.s.admitPick(ctx, &Request{Model: testModel, Tokens: prompt})
	require.NoError(t, err)
	e.clock.Add(3 * *e.s.cfg.Prefix.SpeculativeTTL)
	e.freshAll()
	others := []int{}
	for i := range 4 {
		if addr(i) != primary(first) {
			others = append(others, i)
		}
	}
	e.store(others[0], prompt[:320]) // half the prompt elsewhere
	d, err := e.s.admitPick(ctx, &Request{Model: testModel, Tokens: prompt})
	require.NoError(t, err)
	require.Equal(t, ReasonPrefix, d.Reason)
	require.Equal(t, addr(others[0]), primary(d))
	require.Equal(t, 320/16, d.PrefixBlocks)
	d.Done(DoneInfo{Status: 200})

	e.clock.Add(3 * *e.s.cfg.Prefix.SpeculativeTTL)
	e.remove(others[0], prompt[:320])
	e.freshAll()
	d, err = e.s.admitPick(ctx, &Request{Model: testModel, Tokens: prompt})
	require.NoError(t, err)
	require.Equal(t, ReasonRecall, d.Reason)
	require.Contains(t, []string{primary(first), addr(others[0])}, primary(d))
	require.Zero(t, d.PrefixBlocks)

	e.clock.Add(3 * *e.s.cfg.Prefix.SpeculativeTTL)
	e.freshAll()
	longer := append(append([]uint32(nil), prompt...), tokens(640, 10)...)
	e.store(others[1], longer) // more than was ever routed anywhere
	d, err = e.s.admitPick(ctx, &Request{Model: testModel, Tokens: longer})
	require.NoError(t, err)
	require.Equal(t, ReasonPrefix, d.Reason)
	require.Equal(t, addr(others[1]), primary(d))
}

func TestApproximateRouting(t *testing.T) {
	for _, policy := range []string{PolicyPrecise, PolicyApproximate} {
		t.Run(policy, func(t *testing.T) {
			e := newEnv(t, 8, func(c *Config) { c.Policy = policy })
			e.freshAll()
			text := make([]byte, 8000)
			for i := range text {
				text[i] = byte('a' + i%26)
			}
			req := &Request{Model: testModel, PromptText: text}
			if policy == PolicyApproximate {
				req.Tokens = tokens(2000, 1) // ignored by the approximate policy
			}
			first, err := e.s.admitPick(ctx, req)
			require.NoError(t, err)
			require.Equal(t, ModeApproximate, first.Mode)
			require.Equal(t, ReasonCold, first.Reason)
			for range 4 {
				longer := append(append([]byte(nil), text...), "and a new question"...)
				d, err := e.s.admitPick(ctx, &Request{Model: testModel, PromptText: longer})
				require.NoError(t, err)
				require.Equal(t, primary(first), primary(d))
				require.Equal(t, ReasonPrefix, d.Reason)
			}
			// Records expire after the TTL.
			e.clock.Add(e.s.cfg.Prefix.TTL + time.Second)
			e.freshAll()
			d, err := e.s.admitPick(ctx, &Request{Model: testModel, PromptText: text})
			require.NoError(t, err)
			require.Equal(t, ReasonCold, d.Reason)
		})
	}
}

func TestSessionAffinity(t *testing.T) {
	e := newEnv(t, 4, nil)
	e.freshAll()
	first, err := e.s.admitPick(ctx, &Request{Model: testModel, SessionKey: "u1"})
	require.NoError(t, err)
	first.Done(DoneInfo{Status: 200})
	for range 5 {
		d, err := e.s.admitPick(ctx, &Request{Model: testModel, SessionKey: "u1"})
		require.NoError(t, err)
		require.Equal(t, primary(first), primary(d))
		require.Equal(t, ReasonSession, d.Reason)
		d.Done(DoneInfo{Status: 200})
	}
	// The session's replica turned hot: the session moves.
	e.s.snap.Load().byAddr[primary(first)].inflight.Add(30)
	d, err := e.s.admitPick(ctx, &Request{Model: testModel, SessionKey: "u1"})
	require.NoError(t, err)
	require.NotEqual(t, primary(first), primary(d))
	require.Equal(t, ReasonCold, d.Reason)
}

// TestNewReplicaNotStaleBeforeStaleAfter: a replica not yet scraped is
// stale only once stale_after has passed since it joined the pool, as one
// whose scrapes stopped is stale_after after its last good one. Until then
// it is scored as an idle replica, so a prefix it holds keeps its requests
// against a fresh replica without it (an EPP that just started routes on
// its index before every first scrape has landed); it is neither healthy
// nor stale to the quoter.
func TestNewReplicaNotStaleBeforeStaleAfter(t *testing.T) {
	prompt := tokens(1024, 7)
	e := newEnv(t, 3, func(c *Config) { c.Prefix.SpeculativeTTL = new(time.Nanosecond) })
	e.setSignals(0, metrics.Signals{Engine: metrics.EngineVLLM})
	e.store(1, prompt)
	pick := func() *Decision {
		d, err := e.s.admitPick(ctx, &Request{Model: testModel, Tokens: prompt})
		require.NoError(t, err)
		d.Done(DoneInfo{Status: 200})
		return d
	}
	model := func() capacity.Model { return e.s.Capacity().Models[0] }

	e.clock.Add(e.s.cfg.Signals.StaleAfter - time.Second)
	d := pick()
	require.Equal(t, addr(1), primary(d), "the prefix holder, not yet scraped, is not scored down")
	require.Equal(t, ReasonPrefix, d.Reason)
	require.Equal(t, 1, model().Healthy, "only a scraped replica is healthy")
	require.Zero(t, model().Stale)

	e.clock.Add(2 * time.Second)
	e.setSignals(0, metrics.Signals{Engine: metrics.EngineVLLM})
	require.Equal(t, addr(0), primary(pick()), "never scraped for stale_after: scored down")
	require.Equal(t, 2, model().Stale)

	// A replica that leaves and returns under the same address keeps its
	// join time; one that joins later gets its own.
	e.s.SetEndpoints(append(endpoints(3, testModel), Target{Replica: 3, Endpoint: endpoint.Endpoint{Addr: addr(3), Model: testModel, MetricsURL: "http://127.0.0.1:1/metrics?ep=3"}}))
	e.store(3, prompt)
	require.Equal(t, addr(3), primary(pick()), "a replica that just joined is not stale")
}

func TestStaleScoredDownNotDropped(t *testing.T) {
	e := newEnv(t, 3, nil)
	e.freshAll()
	e.clock.Add(e.s.cfg.Signals.StaleAfter + time.Second)
	e.setSignals(1, metrics.Signals{}) // only endpoint 1 is fresh
	for range 10 {
		d, err := e.s.admitPick(ctx, &Request{Model: testModel})
		require.NoError(t, err)
		require.Equal(t, addr(1), primary(d), "stale replicas are scored down")
		require.Len(t, d.Endpoints, 3, "stale replicas remain fallbacks")
		d.Done(DoneInfo{Status: 200})
	}
	// Everything stale (and one never scraped since it joined a
	// stale_after ago): still routes.
	e.s.SetEndpoints(append(endpoints(3, testModel), Target{Replica: 3, Endpoint: endpoint.Endpoint{Addr: "10.0.0.9:8000", Model: testModel, MetricsURL: "http://127.0.0.1:1/metrics?ep=9"}}))
	e.clock.Add(e.s.cfg.Signals.StaleAfter + time.Second)
	seen := map[string]bool{}
	for range 40 {
		d, err := e.s.admitPick(ctx, &Request{Model: testModel})
		require.NoError(t, err)
		seen[primary(d)] = true
		d.Done(DoneInfo{Status: 200})
	}
	require.Len(t, seen, 4, "an all-stale pool is still load-balanced")
}

func TestBaselinePolicies(t *testing.T) {
	t.Run("round-robin", func(t *testing.T) {
		e := newEnv(t, 3, func(c *Config) { c.Policy = PolicyRoundRobin })
		var got []string
		for range 6 {
			d, err := e.s.admitPick(ctx, &Request{Model: testModel})
			require.NoError(t, err)
			require.Equal(t, ReasonRoundRobin, d.Reason)
			got = append(got, primary(d))
		}
		require.Equal(t, []string{addr(0), addr(1), addr(2), addr(0), addr(1), addr(2)}, got)
	})
	t.Run("least-queue", func(t *testing.T) {
		e := newEnv(t, 3, func(c *Config) { c.Policy = PolicyLeastQueue })
		e.setSignals(0, metrics.Signals{Waiting: 5})
		e.setSignals(1, metrics.Signals{Waiting: 1})
		e.setSignals(2, metrics.Signals{Waiting: 3})
		d, err := e.s.admitPick(ctx, &Request{Model: testModel})
		require.NoError(t, err)
		require.Equal(t, addr(1), primary(d))
		require.Equal(t, []string{addr(1), addr(2), addr(0)}, []string{d.Endpoints[0].Addr, d.Endpoints[1].Addr, d.Endpoints[2].Addr})
	})
	t.Run("random", func(t *testing.T) {
		e := newEnv(t, 4, func(c *Config) { c.Policy = PolicyRandom })
		seen := map[string]int{}
		for range 400 {
			d, err := e.s.admitPick(ctx, &Request{Model: testModel})
			require.NoError(t, err)
			require.Equal(t, ReasonRandom, d.Reason)
			seen[primary(d)]++
			d.Done(DoneInfo{})
		}
		require.Len(t, seen, 4)
		for a, n := range seen {
			require.Greater(t, n, 50, a)
		}
	})
}

func TestTieBreakAndSoftmax(t *testing.T) {
	e := newEnv(t, 4, nil)
	cands := []cand{{score: 1}, {score: 2}, {score: 2}, {score: 0.5}}
	seen := map[int]int{}
	for range 400 {
		seen[e.s.pickPrimary(cands)]++
	}
	require.Equal(t, 2, len(seen), "only the two best tie")
	require.Greater(t, seen[1], 120)
	require.Greater(t, seen[2], 120)

	// Injected random source: a fixed value selects deterministically.
	e.s.rnd = func() float64 { return 0 }
	e.s.cfg.Scoring.Temperature = 1
	require.Equal(t, 0, e.s.pickPrimary(cands))
	e.s.rnd = func() float64 { return 0.999999 }
	require.Equal(t, 3, e.s.pickPrimary(cands))
	e.s.cfg.Scoring.Temperature = 0.001
	seen = map[int]int{}
	e.s.rnd = func() float64 { return 0.3 }
	seen[e.s.pickPrimary(cands)]++
	e.s.rnd = func() float64 { return 0.7 }
	seen[e.s.pickPrimary(cands)]++
	require.Equal(t, map[int]int{1: 1, 2: 1}, seen, "a cold softmax only picks the best")
}

func TestTenantUsage(t *testing.T) {
	e := newEnv(t, 2, nil)
	for _, tenant := range []string{"acme", "acme", ""} {
		d, err := e.s.admitPick(ctx, &Request{Model: testModel, Tenant: tenant})
		require.NoError(t, err)
		d.Done(DoneInfo{Status: 200, PromptTokens: 100, CachedTokens: 40, CompletionTokens: 7})
	}
	for _, tt := range []struct {
		tenant, kind string
		want         float64
	}{
		{"acme", "prompt", 200}, {"acme", "cached", 80}, {"acme", "completion", 14},
		{"default-flow", "prompt", 100}, {"default-flow", "cached", 40}, {"default-flow", "completion", 7},
	} {
		require.Equal(t, tt.want, testutil.ToFloat64(e.s.m.tenantTokens.WithLabelValues(tt.tenant, tt.kind)), tt)
	}
	require.Equal(t, 6, testutil.CollectAndCount(e.s.m.tenantTokens), "no series for tenants without traffic")
}

func TestCapacity(t *testing.T) {
	e := newEnv(t, 0, nil)
	e.s.SetEndpoints(append(endpoints(3, testModel), Target{Replica: 3, Endpoint: endpoint.Endpoint{Addr: "10.0.1.1:30000", Model: "qwen", Engine: "sglang", MetricsURL: "http://127.0.0.1:1/metrics?ep=q"}}))
	e.setSignals(0, metrics.Signals{Running: 2, Waiting: 1, KVUsage: 0.5, BlockSize: 16, NumGPUBlocks: 1000})
	e.setSignals(1, metrics.Signals{Running: 4, Waiting: 3, KVUsage: 0.25, BlockSize: 16, NumGPUBlocks: 1000})
	// Endpoint 2 is not scraped yet: neither healthy nor, before stale_after
	// has passed since it joined, stale. The qwen endpoint has an open
	// breaker.
	q := e.s.snap.Load().byAddr["10.0.1.1:30000"]
	q.sample.Store(e.s.sampled(&metrics.Sample{URL: "http://127.0.0.1:1/metrics?ep=q", At: e.clock.Now(), Signals: metrics.Signals{MaxTotalTokens: 5000, KVUsage: 0.2}}))
	for range 3 {
		q.br.request(false, e.clock.Now(), 3)
	}
	d, err := e.s.admitPick(ctx, &Request{Model: testModel, Subset: []string{addr(0)}})
	require.NoError(t, err)
	defer d.Done(DoneInfo{})

	snap := e.s.Capacity()
	require.Len(t, snap.Models, 2)
	l := snap.Models[0]
	require.Equal(t, testModel, l.Model)
	require.Equal(t, 3, l.Replicas)
	require.Equal(t, 2, l.Healthy)
	require.Equal(t, 0, l.Stale)
	require.Equal(t, 6, l.Running)
	require.Equal(t, 4, l.Waiting)
	require.Equal(t, 1, l.InFlight)
	require.Equal(t, int64(500+750), l.FreeKVBlocks)
	require.Equal(t, int64(16*(500+750)), l.FreeKVTokens)
	require.Equal(t, int64(2*16000), l.TotalKVTokens)
	require.Equal(t, 2*256, l.MaxConcurrency, "admission.target_inflight per healthy replica")
	qw := snap.Models[1]
	require.Equal(t, "qwen", qw.Model)
	require.Equal(t, 0, qw.Healthy)
	require.Zero(t, qw.FreeKVTokens, "a replica with an open breaker offers no capacity")
	require.Nil(t, l.Admission, "flow control off")
}

// The snapshot carries flow control as the quote reads it: the scoring
// targets and the default band's ceiling.
func TestCapacityAdmission(t *testing.T) {
	e := newEnv(t, 1, func(c *Config) {
		c.Admission.Enabled = ptr(true)
		c.Admission.DefaultBand = "silver"
		c.Scoring.TargetWaiting, c.Scoring.KVCeiling = 6, 0.8
	})
	snap := e.s.Capacity()
	require.Len(t, snap.Models, 1)
	require.Equal(t, &capacity.Admission{TargetWaiting: 6, KVCeiling: 0.8, Ceiling: 0.60}, snap.Models[0].Admission)
}

// The load a quote subtracts is a replica's sustained output rate and
// requests, not its last scrape's: scrapes alternating 2,000 and 0 tok/s
// read 1,000, and windows alternating 1 and 5 requests read 3.
func TestCapacityReplicaRateIsSustained(t *testing.T) {
	e := newEnv(t, 0, nil)
	e.s.SetEndpoints(endpoints(1, testModel))
	url := e.rep(0).ep.MetricsURL
	for i := range 60 {
		e.s.Observe(&metrics.Sample{URL: url, At: e.clock.Now(), GenerationTokensPerSec: 2000 * float64(i%2),
			Signals: metrics.Signals{Running: float64(1 + 4*(i%2))}, Window: metrics.Window{Seconds: 1, Running: float64(1 + 4*(i%2))}})
	}
	snap := e.s.Capacity()
	require.Len(t, snap.Models, 1)
	require.Equal(t, 2000.0, snap.Models[0].OutputTokensPerSec, "the pool's figure is the last scrape's")
	require.InDelta(t, 1000, snap.Models[0].ReplicaCapacity[0].OutputTokensPerSec, 1e-9)
	require.Equal(t, 5, snap.Models[0].ReplicaCapacity[0].Running, "the last scrape's count")
	require.InDelta(t, 3, snap.Models[0].ReplicaCapacity[0].Load, 1e-9)
}

// The window observer sees each window a replica's curve learns from,
// under the replica's address, and nothing from a failed or empty scrape.
func TestWindowObserver(t *testing.T) {
	type seen struct {
		addr string
		w    capacity.Window
	}
	var got []seen
	s, err := New(DefaultConfig(), nil, nil, nil,
		WithWindowObserver(func(addr string, w capacity.Window) { got = append(got, seen{addr, w}) }))
	require.NoError(t, err)
	s.SetEndpoints(endpoints(2, testModel))
	url := s.snap.Load().byAddr[addr(1)].ep.MetricsURL
	s.Observe(&metrics.Sample{URL: url, GenerationTokensPerSec: 300, Window: metrics.Window{Seconds: 2, Running: 3, Waiting: 1}})
	s.Observe(&metrics.Sample{URL: url, Err: errors.New("refused"), Window: metrics.Window{Seconds: 2, Running: 3}})
	s.Observe(&metrics.Sample{URL: url, Window: metrics.Window{Seconds: 0}})
	require.Len(t, got, 1)
	require.Equal(t, addr(1), got[0].addr)
	require.Equal(t, 2.0, got[0].w.Seconds)
	require.Equal(t, 3.0, got[0].w.Running)
	require.Equal(t, 1.0, got[0].w.Waiting)
	require.Equal(t, 300.0, got[0].w.OutputTokensPerSec)
}

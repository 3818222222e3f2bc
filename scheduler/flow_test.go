package scheduler

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omnious/provider-node/engines/metrics"
)

type pickResult struct {
	band string
	d    *Decision
	err  error
}

// flowEnv is 2 replicas with target_inflight 10: saturation is the mean
// in-flight over 10, so each in-flight request adds 0.05.
func flowEnv(t *testing.T, mut func(*Config)) (*testEnv, context.CancelFunc) {
	e := newEnv(t, 2, func(c *Config) {
		c.Admission.Enabled = ptr(true)
		c.Admission.TargetInflight = 10
		c.Signals.StaleAfter = time.Hour
		if mut != nil {
			mut(c)
		}
	})
	// No metrics URLs: replicas are never stale, so the signals the tests
	// set decide alone.
	eps := endpoints(2, testModel)
	for i := range eps {
		eps[i].MetricsURL = ""
	}
	e.s.SetEndpoints(eps)
	e.freshAll()
	runCtx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = e.s.Run(runCtx); close(done) }()
	return e, func() { cancel(); <-done }
}

func TestSaturation(t *testing.T) {
	e := newEnv(t, 2, func(c *Config) { c.Admission.TargetInflight = 10 })
	tests := []struct {
		name string
		set  func()
		want float64
	}{
		{"idle", func() {}, 0},
		{"inflight", func() { e.rep(0).inflight.Store(5); e.rep(1).inflight.Store(3) }, (0.5 + 0.3) / 2},
		{"waiting dominates", func() { e.setSignals(0, metrics.Signals{Waiting: 8}) }, (2 + 0.3) / 2},
		{"kv dominates", func() { e.setSignals(1, metrics.Signals{KVUsage: 0.45}) }, (2 + 0.5) / 2},
		{"open breaker excluded", func() {
			for range 3 {
				e.rep(0).br.request(false, e.clock.Now(), 3)
			}
		}, 0.5},
	}
	for _, tt := range tests {
		tt.set()
		require.InDelta(t, tt.want, e.s.flow.saturation(), 1e-9, tt.name)
	}
}

func TestFlowBronzeQueuesFirstPlatinumNeverWaits(t *testing.T) {
	e, stop := flowEnv(t, nil)
	defer stop()
	var held []*Decision
	pick := func(band string) pickResult {
		d, err := e.s.admitPick(ctx, &Request{Model: testModel, Band: band})
		return pickResult{band, d, err}
	}
	// Saturation 0.35 (7 in flight over 2x10): above bronze's 0.30 only.
	for range 7 {
		r := pick("platinum")
		require.NoError(t, r.err)
		held = append(held, r.d)
	}
	require.InDelta(t, 0.35, e.s.flow.saturation(), 1e-9)

	bronze := make(chan pickResult, 1)
	go func() { bronze <- pick("bronze") }()
	require.Eventually(t, func() bool { return e.s.flow.depth("bronze") == 1 }, 2*time.Second, time.Millisecond)

	// Silver, gold and platinum all pass immediately below their ceilings.
	for _, band := range []string{"silver", "gold", "platinum"} {
		r := pick(band)
		require.NoError(t, r.err, band)
		require.Zero(t, r.d.Queued, band)
		held = append(held, r.d)
	}
	// Saturation is now 0.5: push it to 0.9, above gold's 0.85; platinum
	// (ceiling 1.0) still never waits.
	for range 8 {
		r := pick("platinum")
		require.NoError(t, r.err)
		require.Zero(t, r.d.Queued)
		held = append(held, r.d)
	}
	require.InDelta(t, 0.9, e.s.flow.saturation(), 1e-9)
	gold := make(chan pickResult, 1)
	go func() { gold <- pick("gold") }()
	require.Eventually(t, func() bool { return e.s.flow.depth("gold") == 1 }, 2*time.Second, time.Millisecond)
	require.Equal(t, 1, e.s.flow.depth("bronze"))

	// Finishing requests lowers saturation: gold (higher priority) is
	// released before bronze.
	release := func(n int) {
		for range n {
			held[0].Done(DoneInfo{Status: 200})
			held = held[1:]
		}
	}
	release(2) // 0.8 < 0.85
	g := <-gold
	require.NoError(t, g.err)
	require.Positive(t, g.d.Queued)
	held = append(held, g.d)
	require.Equal(t, 1, e.s.flow.depth("bronze"), "bronze still waits at saturation 0.85")
	select {
	case r := <-bronze:
		t.Fatalf("bronze released early: %+v", r)
	case <-time.After(50 * time.Millisecond):
	}
	release(len(held) - 5) // 5 in flight: 0.25 < 0.30
	b := <-bronze
	require.NoError(t, b.err)
	require.Positive(t, b.d.Queued)
	b.d.Done(DoneInfo{Status: 200})
	release(len(held))
}

func TestFlowQueueLimits(t *testing.T) {
	tests := []struct {
		name    string
		mut     func(*Config)
		ctx     func() (context.Context, context.CancelFunc)
		arrived time.Duration // before now
		want    error
	}{
		{"capacity", func(c *Config) { c.Admission.QueueCapacityPerBand = new(1) }, nil, 0, ErrQueueFull},
		{"ttl", func(c *Config) { c.Admission.QueueTTL = 30 * time.Millisecond }, nil, 0, ErrQueueExpired},
		{"ttl counted from arrival", func(c *Config) { c.Admission.QueueTTL = time.Second }, nil, 2 * time.Second, ErrQueueExpired},
		{"client gone", nil, func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), 30*time.Millisecond)
		}, 0, ErrClientGone},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e, stop := flowEnv(t, tt.mut)
			defer stop()
			// Saturate for bronze: 0.35.
			var held []*Decision
			for range 7 {
				d, err := e.s.admitPick(ctx, &Request{Model: testModel, Band: "platinum"})
				require.NoError(t, err)
				held = append(held, d)
			}
			defer func() {
				for _, d := range held {
					d.Done(DoneInfo{Status: 200})
				}
			}()
			if tt.want == ErrQueueFull {
				first := make(chan error, 1)
				qctx, cancel := context.WithCancel(context.Background())
				go func() {
					_, err := e.s.admitPick(qctx, &Request{Model: testModel, Band: "bronze"})
					first <- err
				}()
				require.Eventually(t, func() bool { return e.s.flow.depth("bronze") == 1 }, 2*time.Second, time.Millisecond)
				_, err := e.s.admitPick(ctx, &Request{Model: testModel, Band: "bronze"})
				require.ErrorIs(t, err, ErrQueueFull)
				require.Equal(t, 429, statusOf(err))
				cancel()
				require.ErrorIs(t, <-first, ErrClientGone)
				return
			}
			c := context.Background()
			if tt.ctx != nil {
				var cancel context.CancelFunc
				c, cancel = tt.ctx()
				defer cancel()
			}
			req := &Request{Model: testModel, Band: "bronze"}
			if tt.arrived > 0 {
				req.Arrived = time.Now().Add(-tt.arrived)
			}
			_, err := e.s.admitPick(c, req)
			require.ErrorIs(t, err, tt.want)
			require.Equal(t, 503, statusOf(err))
			require.Zero(t, e.s.flow.depth("bronze"), "an expired waiter leaves the queue")
		})
	}
}

func TestFlowUnknownBandUsesDefault(t *testing.T) {
	e := newEnv(t, 1, nil)
	require.Equal(t, "gold", e.s.flow.band("").Name)
	require.Equal(t, "gold", e.s.flow.band("diamond").Name)
	require.Equal(t, "bronze", e.s.flow.band("bronze").Name)
}

// TestPickNeverWaits: with every band's queue full, the pool past every
// ceiling and the caller's context already cancelled, Admit refuses and
// Pick still places the request. Nothing dispatches queues here (Run is
// not running), so a Pick that waited on flow control would stay blocked
// and synctest.Wait would return with it unfinished.
func TestPickNeverWaits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, 2, func(c *Config) {
			c.Admission.Enabled = ptr(true)
			c.Admission.QueueCapacityPerBand = new(1)
		})
		for i := range 2 {
			e.setSignals(i, metrics.Signals{Engine: metrics.EngineVLLM, Waiting: 100, KVUsage: 1})
		}
		require.Greater(t, e.s.flow.saturation(), 1.0)
		// One waiter fills the platinum band.
		waitCtx, stopWaiting := context.WithCancel(context.Background())
		waited := make(chan error, 1)
		go func() {
			_, err := e.s.Admit(waitCtx, &Request{Model: testModel, Band: "platinum"})
			waited <- err
		}()
		synctest.Wait()
		require.Equal(t, 1, e.s.flow.depth("platinum"))

		cancelled, cancel := context.WithCancel(context.Background())
		cancel()
		req := &Request{Model: testModel, Band: "platinum", Tokens: tokens(256, 1)}
		_, err := e.s.Admit(cancelled, req)
		require.ErrorIs(t, err, ErrQueueFull)

		var d *Decision
		picked := make(chan struct{})
		go func() {
			defer close(picked)
			d, err = e.s.Pick(req, nil)
		}()
		synctest.Wait()
		select {
		case <-picked:
		default:
			t.Fatal("Pick waited")
		}
		require.NoError(t, err)
		require.NotEmpty(t, d.Endpoints)
		d.Done(DoneInfo{Status: 200})
		stopWaiting()
		require.ErrorIs(t, <-waited, ErrClientGone)
	})
}

// TestSaturationCountsOtherEPPs: the engines' running and waiting counts
// are what every EPP replica shares, so requests another EPP routed count
// against the ceiling here too, and what this EPP routed since the last
// scrape is added on top.
func TestSaturationCountsOtherEPPs(t *testing.T) {
	e := newEnv(t, 2, func(c *Config) {
		c.Admission.Enabled = ptr(true)
		c.Admission.TargetInflight = 10
	})
	observe := func(running, waiting float64) {
		for i := range 2 {
			e.s.Observe(&metrics.Sample{URL: e.rep(i).ep.MetricsURL, At: e.clock.Now(),
				Signals: metrics.Signals{Engine: metrics.EngineVLLM, Running: running, Waiting: waiting}})
		}
	}
	// Another EPP keeps 7 requests running on each replica; this one has
	// none in flight.
	observe(7, 0)
	require.InDelta(t, 0.7, e.s.flow.saturation(), 1e-9)

	// This EPP routes two (one each) before the next scrape: they are not
	// in the engines' counts yet, so they are added.
	var held []*Decision
	for i := range 2 {
		d, err := e.s.admitPick(ctx, &Request{Model: testModel, Subset: []string{addr(i)}})
		require.NoError(t, err)
		held = append(held, d)
	}
	require.InDelta(t, 0.8, e.s.flow.saturation(), 1e-9)
	// The next scrape has them (8 running each): not counted twice.
	observe(8, 0)
	require.InDelta(t, 0.8, e.s.flow.saturation(), 1e-9)
	for _, d := range held {
		d.Done(DoneInfo{Status: 200})
	}
	// The engines lag behind a finish: this EPP's own count cannot go
	// below what the engines last said.
	require.InDelta(t, 0.8, e.s.flow.saturation(), 1e-9)

	// Bronze (ceiling 0.30) now waits here although this EPP itself has
	// nothing in flight.
	cctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	_, err := e.s.Admit(cctx, &Request{Model: testModel, Band: "bronze"})
	require.ErrorIs(t, err, ErrClientGone)
}

package scheduler

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omnious/provider-node/engines/metrics"
)

// TestLoadStaysBalanced drives a steady 64 requests in flight over 8
// replicas. For prompts with no shared prefix the load scorers keep max/mean
// in-flight within 1.15. When every request has the same prompt, no request
// is sent for its prefix to a replica the imbalance guard trips on, and the
// guard does override.
func TestLoadStaysBalanced(t *testing.T) {
	tests := []struct {
		name     string
		sameText bool
	}{
		{"distinct prompts", false},
		{"one hot prompt", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, 8, func(c *Config) { c.Prefix.SpeculativeTTL = new(time.Hour) })
			var held []*Decision
			var worstRatio float64
			reasons := map[string]int{}
			for i := range 2000 {
				seed := uint32(i)
				if tt.sameText {
					seed = 1
				}
				before := map[string]float64{}
				minLoad := 1e9
				for k := range 8 {
					n := float64(e.rep(k).inflight.Load())
					before[addr(k)] = n
					minLoad = min(minLoad, n)
				}
				d, err := e.s.admitPick(ctx, &Request{Model: testModel, Tokens: tokens(1024, seed)})
				require.NoError(t, err)
				reasons[d.Reason]++
				if d.Reason == ReasonPrefix {
					require.False(t, guardTrips(before[primary(d)], minLoad, 8, 1.5),
						"prefix decision to a replica at %v with min %v", before[primary(d)], minLoad)
				}
				held = append(held, d)
				if len(held) > 64 {
					// Finish a pseudo-random earlier request.
					j := (i * 7919) % len(held)
					held[j].Done(DoneInfo{Status: 200})
					held = append(held[:j], held[j+1:]...)
				}
				if len(held) < 64 || tt.sameText {
					continue
				}
				var sum, hi int64
				for k := range 8 {
					n := e.rep(k).inflight.Load()
					sum += n
					hi = max(hi, n)
				}
				worstRatio = max(worstRatio, float64(hi)/(float64(sum)/8))
			}
			if tt.sameText {
				require.Positive(t, reasons[ReasonOverride], "%v", reasons)
				require.Positive(t, reasons[ReasonPrefix], "%v", reasons)
			} else {
				require.LessOrEqual(t, worstRatio, 1.15)
				require.Equal(t, 2000, reasons[ReasonCold], "%v", reasons)
			}
			for _, d := range held {
				d.Done(DoneInfo{Status: 200})
			}
		})
	}
}

// TestSpreadBetweenScrapes: between two scrapes the samples say the same
// thing on every decision. Two replicas each hold 48 requests the last
// scrape saw running; it showed one with less KV in use. New requests with
// no cached prefix must not all go to that one until the next scrape: what
// was routed since counts as not yet started, so they spread.
func TestSpreadBetweenScrapes(t *testing.T) {
	e := newEnv(t, 2, nil)
	var held []*Decision
	for i := range 96 {
		d, err := e.s.admitPick(ctx, &Request{Model: testModel, Tokens: tokens(64, uint32(1000+i))})
		require.NoError(t, err)
		held = append(held, d)
	}
	require.Equal(t, int64(48), e.rep(0).inflight.Load())
	require.Equal(t, int64(48), e.rep(1).inflight.Load())
	for i, kv := range []float64{0.30, 0.50} {
		r := e.rep(i)
		e.s.Observe(&metrics.Sample{URL: r.ep.MetricsURL, At: e.clock.Now(),
			Signals: metrics.Signals{Engine: metrics.EngineVLLM, Running: 48, KVUsage: kv}})
	}
	got := map[string]int{}
	for i := range 10 {
		d, err := e.s.admitPick(ctx, &Request{Model: testModel, Tokens: tokens(64, uint32(2000+i))})
		require.NoError(t, err)
		got[primary(d)]++
		held = append(held, d)
	}
	require.GreaterOrEqual(t, got[addr(1)], 3, "%v", got)
	require.GreaterOrEqual(t, got[addr(0)], got[addr(1)], "%v", got)
	for _, d := range held {
		d.Done(DoneInfo{Status: 200})
	}
}

package scheduler

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
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

package compare

import (
	"bytes"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omnious/provider-node/capacity"
)

func TestCapacityEdge(t *testing.T) {
	r := &capacityRun{o: CapacityOptions{Objectives: capacity.Objectives{TTFT: 2 * time.Second, ITL: 50 * time.Millisecond, Quantile: 0.95}}}
	step := func(qps, itl float64) CapacityStep {
		return CapacityStep{QPS: qps, Requests: 100, TTFTP95ms: 100, ITLP95ms: itl, OutputTokPS: qps * 50, Concurrency: qps, Within: itl <= 50}
	}
	for _, tc := range []struct {
		name  string
		steps []CapacityStep
		qps   float64
	}{
		{"crossing between two steps", []CapacityStep{step(10, 30), step(20, 40), step(30, 60)}, 25},
		// 52.5 at 32 and 45 at 34 pool to 48.75; the crossing moves past 34.
		{"a noisy step is pooled with its neighbour", []CapacityStep{step(16, 30), step(32, 52.5), step(34, 45), step(36, 60)},
			34 + 2*(50-48.75)/(60-48.75)},
		{"never crosses: the highest step", []CapacityStep{step(10, 30), step(20, 40)}, 20},
		{"an errored step counts as past the edge", []CapacityStep{step(10, 30), {QPS: 20, Requests: 10, Errors: 1}}, 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r.rep = &CapacityReport{Ladder: tc.steps}
			lo := tc.steps[0]
			for _, s := range tc.steps {
				if s.Errors == 0 && s.ITLP95ms <= 50 && s.QPS > lo.QPS {
					lo = s
				}
			}
			got := r.edge(lo)
			require.InDelta(t, tc.qps, got.QPS, 1e-9)
			require.True(t, got.Within)
			// Rates follow the arrival rate from the step below the edge.
			require.InDelta(t, 50*tc.qps, got.OutputTokPS, 1e-6)
		})
	}
}

func TestCapacityVerdicts(t *testing.T) {
	r := &CapacityReport{Replicas: 4, Objectives: capacity.ObjectivesJSON{TTFTSeconds: 2, ITLSeconds: 0.05, Quantile: 0.95},
		True:     CapacityStep{QPS: 30, OutputTokPS: 1500, Concurrency: 40},
		HalfLoad: CapacityStep{OutputTokPS: 750, Within: true},
		Quotes: []CapacityQuote{{Label: "idle", TokensPerS: 1425, Concurrency: 38}, {Label: "half loaded", TokensPerS: 700},
			{Label: "idle, before the loss", TokensPerS: 1400}, {Label: "one replica lost", TokensPerS: 1050}},
		Checks: []CapacityStep{{Label: "0.50x idle quote", Within: true}, {Label: "1.00x idle quote", Within: true},
			{Label: "1.25x idle quote", Within: false}, {Label: "half load + 1.00x quote", Within: true}}}
	v := r.Verdicts()
	require.InDelta(t, 0.95, v.IdleTokens, 1e-9)
	require.InDelta(t, 0.95, v.IdleConcurrency, 1e-9)
	require.True(t, v.AtQuote)
	require.True(t, v.Over)
	require.InDelta(t, 700.0/750, v.HalfTokens, 1e-9)
	require.True(t, v.HalfAtQuote)
	require.InDelta(t, 1.0, v.LostTokens, 1e-9)
	require.True(t, math.IsNaN((&CapacityReport{}).Verdicts().IdleTokens))

	var b bytes.Buffer
	require.NoError(t, r.WriteHTML(&b))
	require.Contains(t, b.String(), "<svg")
	b.Reset()
	require.NoError(t, r.WriteTable(&b))
	require.Contains(t, b.String(), "idle quote / true capacity, tok/s")
}

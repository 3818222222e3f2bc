package capacity

import (
	"fmt"
	"math"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestAdmissionBound(t *testing.T) {
	adm := Admission{TargetWaiting: 4, KVCeiling: 0.9, Ceiling: 0.85}
	// bin is a readable bin at load c with the given mean queue and KV
	// usage, serving 100 output tokens per second per request.
	bin := func(c, waiting, kv float64) Bin {
		b := testBin(c, 1, 1, 100*c, 200)
		b.Waiting, b.KVUsage = waiting, kv
		return b
	}
	for _, tc := range []struct {
		name   string
		adm    Admission
		bins   []Bin
		conc   float64
		want   float64
		wantOK bool
	}{
		{name: "never saturates", adm: adm, bins: []Bin{bin(4, 0, 0.2), bin(8, 1, 0.4), bin(16, 2, 0.6)}},
		// Waiting 4*0.85 = 3.4 crosses between 8 (1) and 16 (5): at
		// 8 + 8*(0.85-0.25)/(1.25-0.25) = 12.8 requests.
		{name: "queue crosses", adm: adm, bins: []Bin{bin(4, 0, 0.1), bin(8, 1, 0.1), bin(16, 5, 0.1)}, conc: 12.8, want: 1280, wantOK: true},
		// KV 0.9*0.85 = 0.765 crosses between 8 (0.45/0.9 = 0.5) and 16
		// (0.9/0.9 = 1): at 8 + 8*0.35/0.5 = 13.6.
		{name: "KV crosses", adm: adm, bins: []Bin{bin(4, 0, 0.2), bin(8, 0, 0.45), bin(16, 0, 0.9)}, conc: 13.6, want: 1360, wantOK: true},
		// Saturated from the first bin: from an idle engine's 0, at 4*0.85.
		{name: "first bin", adm: adm, bins: []Bin{bin(4, 4, 0.2), bin(8, 8, 0.4)}, conc: 3.4, want: 340, wantOK: true},
		// A burst of waiting in one bin, then less: pooled with the next
		// (2.2 and 0.6 at equal weight are 1.4 > 0.85) rather than ending
		// the curve at the burst alone.
		{name: "burst pooled", adm: adm, bins: []Bin{bin(4, 0, 0), bin(8, 8.8, 0), bin(12, 2.4, 0), bin(16, 8, 0)},
			conc: 4 + 4*0.85/1.4, want: 400 + 400*0.85/1.4, wantOK: true},
		{name: "flow control has no ceiling", adm: Admission{TargetWaiting: 4, KVCeiling: 0.9}, bins: []Bin{bin(8, 8, 0.9)}},
		{name: "no target", adm: Admission{KVCeiling: 0.9, Ceiling: 0.85}, bins: []Bin{bin(8, 8, 0.9)}},
		{name: "no data", adm: adm},
	} {
		t.Run(tc.name, func(t *testing.T) {
			conc, got, ok := testCurve(tc.bins...).AdmissionBound(tc.adm)
			require.Equal(t, tc.wantOK, ok)
			require.InDelta(t, tc.conc, conc, 1e-9)
			require.InDelta(t, tc.want, got, 1e-6)
		})
	}
}

func TestAdmittedLoad(t *testing.T) {
	// tail is P(Poisson(lambda) >= t), interpolated between whole counts,
	// summed term by term.
	tail := func(lambda, t float64) float64 {
		k := math.Floor(t)
		pmf := func(j float64) float64 {
			lg, _ := math.Lgamma(j + 1)
			return math.Exp(j*math.Log(lambda) - lambda - lg)
		}
		below := 0.0
		for j := 0.0; j < k; j++ {
			below += pmf(j)
		}
		return 1 - below - (t-k)*pmf(k)
	}
	for _, tc := range []struct {
		name     string
		crossing float64
		pool     int
		q        float64
		lo, hi   float64
	}{
		// Poisson(4) reaches 8 with probability 0.051: just under 4.
		{name: "one replica", crossing: 8, pool: 1, q: 0.95, lo: 3.9, hi: 4},
		// The demo fleet: 4 replicas crossing at about 20 requests each.
		{name: "four replicas", crossing: 20.4, pool: 4, q: 0.95, lo: 16, hi: 17.5},
		// A large pool's load is nearly its mean: the normal
		// approximation, 400m + 1.645*sqrt(400m) = 8000, gives 19.63.
		{name: "large pool", crossing: 20, pool: 400, q: 0.95, lo: 19.6, hi: 19.67},
		{name: "median", crossing: 20.4, pool: 4, q: 0.5, lo: 20, hi: 20.4},
		// Poisson(0.0513) reaches 1 with probability 0.05.
		{name: "below one request", crossing: 1, pool: 1, q: 0.95, lo: 0.05, hi: 0.052},
		// Normal: 500 - 1.645*sqrt(500/1000) = 498.84.
		{name: "huge pool", crossing: 500, pool: 1000, q: 0.95, lo: 498.8, hi: 498.9},
		// Normal: 4m + 4.75*sqrt(4m) = 80 at m = 11.8; the Poisson's
		// right tail is heavier.
		{name: "strict", crossing: 20, pool: 4, q: 0.999999, lo: 10.5, hi: 11.8},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := AdmittedLoad(tc.crossing, tc.pool, tc.q)
			require.Greater(t, got, tc.lo)
			require.Less(t, got, tc.hi)
			n := float64(tc.pool)
			require.InDelta(t, 1-tc.q, tail(got*n, tc.crossing*n), 1e-4, "the pool reaches the crossing 1-q of the time")
		})
	}
	require.Less(t, AdmittedLoad(20, 2, 0.95), AdmittedLoad(20, 8, 0.95), "a larger pool strays less from its mean")
	require.Less(t, AdmittedLoad(20, 4, 0.99), AdmittedLoad(20, 4, 0.95), "a stricter quantile reads lower")
	require.InDelta(t, AdmittedLoad(8, 1, 0.95), AdmittedLoad(8+1e-9, 1, 0.95), 1e-6, "smooth in the crossing")
	for _, bad := range []struct {
		crossing float64
		pool     int
		q        float64
	}{{0, 4, 0.95}, {math.NaN(), 4, 0.95}, {math.Inf(1), 4, 0.95}, {20, 0, 0.95}, {20, 4, 0}, {20, 4, 1}, {20, 4, math.NaN()}} {
		require.Zero(t, AdmittedLoad(bad.crossing, bad.pool, bad.q), "%+v", bad)
	}
}

func TestAtAdmitted(t *testing.T) {
	// Every load measured holds the objectives; the queue reaches 3.4
	// (0.85 of a target of 4) at the given load.
	curve := func(crossing float64) Curve {
		var bins []Bin
		for _, c := range []float64{4, 8, 12, 16, 20, 24, 28, 32, 36, 40} {
			b := testBin(c, 1, 1, 100*c, 400)
			b.Waiting = 3.4 * c / crossing
			bins = append(bins, b)
		}
		return testCurve(bins...)
	}
	adm := &Admission{TargetWaiting: 4, KVCeiling: 0.9, Ceiling: 0.85}
	free, err := curve(1000).At(testObjectives)
	require.NoError(t, err)
	require.Equal(t, LimitMeasured, free.Limit)
	require.Greater(t, free.Concurrency, 12.0)

	got, err := curve(8).AtAdmitted(testObjectives, nil, 4)
	require.NoError(t, err)
	require.Equal(t, free, got, "flow control off: the curve alone")

	// The capacity stops where the pool reaches the crossing at most 5% of
	// the time, lower for a smaller pool; the crossing is reported.
	var prev float64
	for _, pool := range []int{1, 4, 16} {
		got, err = curve(8).AtAdmitted(testObjectives, adm, pool)
		require.NoError(t, err)
		mean := AdmittedLoad(8, pool, testObjectives.Quantile)
		require.Equal(t, LimitAdmission, got.Limit)
		require.InDelta(t, mean, got.Concurrency, 1e-9)
		require.InDelta(t, 100*mean, got.OutputTokensPerSec, 1e-6)
		require.InDelta(t, 8, got.AdmissionBoundConcurrency, 1e-9)
		require.InDelta(t, 800, got.AdmissionBoundTokensPerSec, 1e-6)
		require.Greater(t, got.Concurrency, prev)
		require.Less(t, got.Concurrency, 8.0)
		prev = got.Concurrency
	}

	const late = 39
	require.Greater(t, AdmittedLoad(late, 4, testObjectives.Quantile), free.Concurrency)
	got, err = curve(late).AtAdmitted(testObjectives, adm, 4)
	require.NoError(t, err)
	require.Equal(t, free.Limit, got.Limit, "queueing starts well past the objectives' load")
	require.Equal(t, free.Concurrency, got.Concurrency)
	require.InDelta(t, late, got.AdmissionBoundConcurrency, 1e-9)

	// Queueing starts past the objectives' load and a noisy bin between
	// reads low: the rates are read from their non-decreasing fit, so the
	// heavier load's is no lower, and nothing is bound.
	noisy := curve(late)
	noisy.Bins[len(noisy.Bins)-2].OutputTokensPerSec = 10
	got, err = noisy.AtAdmitted(testObjectives, adm, 4)
	require.NoError(t, err)
	require.Equal(t, free.Limit, got.Limit)
	require.GreaterOrEqual(t, got.AdmissionBoundTokensPerSec, got.OutputTokensPerSec)

	_, err = Curve{}.AtAdmitted(testObjectives, adm, 4)
	require.ErrorIs(t, err, ErrNoData)
}

// A client keeping streams open holds the load the objectives allow, up
// to where the EPP starts to queue.
func TestAtAdmittedStreams(t *testing.T) {
	// Every load measured holds the objectives; the queue reaches 3.4
	// (0.85 of a target of 4) at 8 requests.
	var bins []Bin
	for _, c := range []float64{4, 8, 12, 16, 20, 24} {
		b := testBin(c, 1, 1, 10*c, 400)
		b.Waiting = 3.4 * c / 8
		bins = append(bins, b)
	}
	c := testCurve(bins...)
	adm := &Admission{TargetWaiting: 4, KVCeiling: 0.9, Ceiling: 0.85}
	free, err := c.At(testObjectives)
	require.NoError(t, err)
	require.Greater(t, free.Concurrency, 8.0)
	require.Equal(t, 24.0, free.Streams, "nothing queues: every load measured is held")

	got, err := c.AtAdmitted(testObjectives, adm, 4)
	require.NoError(t, err)
	require.InDelta(t, 8, got.Streams, 1e-9, "the crossing itself")
	require.Less(t, got.Concurrency, 8.0, "arrivals from many clients reach it sooner")

	// The load arrivals hold at the rate (here half the engine's) bounds
	// Concurrency, not Streams: a closed loop does not bunch.
	c.Sustained = []SustainedBin{{Concurrency: 4, OutputTokensPerSec: 80, Seconds: 100, Spans: 1}}
	got, err = c.At(testObjectives)
	require.NoError(t, err)
	require.InDelta(t, free.Streams, got.Streams, 1e-9)
	require.InDelta(t, free.Concurrency/2, got.Concurrency, 1e-9)
}

// BenchmarkAdmittedLoad reads one replica's admitted load in pools of the
// demo's size and of 400 replicas; a quote reads it once per replica.
func BenchmarkAdmittedLoad(b *testing.B) {
	for _, pool := range []int{4, 400} {
		b.Run(fmt.Sprintf("pool=%d", pool), func(b *testing.B) {
			for b.Loop() {
				AdmittedLoad(20.4, pool, 0.95)
			}
		})
	}
}

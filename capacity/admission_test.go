package capacity

import (
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

func TestAtAdmitted(t *testing.T) {
	// Every load measured holds the objectives; the queue reaches 3.4
	// (0.85 of a target of 4) at the given load.
	curve := func(crossing float64) Curve {
		var bins []Bin
		for _, c := range []float64{4, 8, 12, 16, 20, 24} {
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

	got, err := curve(8).AtAdmitted(testObjectives, nil)
	require.NoError(t, err)
	require.Equal(t, free, got, "flow control off: the curve alone")

	got, err = curve(8).AtAdmitted(testObjectives, adm)
	require.NoError(t, err)
	require.Equal(t, LimitAdmission, got.Limit)
	require.InDelta(t, 8, got.Concurrency, 1e-9)
	require.InDelta(t, 800, got.OutputTokensPerSec, 1e-6)
	require.InDelta(t, 8, got.AdmissionBoundConcurrency, 1e-9)
	require.InDelta(t, 800, got.AdmissionBoundTokensPerSec, 1e-6)

	got, err = curve(22).AtAdmitted(testObjectives, adm)
	require.NoError(t, err)
	require.Equal(t, free.Limit, got.Limit, "queueing starts past the objectives' load")
	require.Equal(t, free.Concurrency, got.Concurrency)
	require.InDelta(t, 22, got.AdmissionBoundConcurrency, 1e-9)

	// Queueing starts past the objectives' load and a noisy bin between
	// reads low: the rates are read from their non-decreasing fit, so the
	// heavier load's is no lower, and nothing is bound.
	noisy := curve(22)
	noisy.Bins[len(noisy.Bins)-2].OutputTokensPerSec = 10
	got, err = noisy.AtAdmitted(testObjectives, adm)
	require.NoError(t, err)
	require.Equal(t, free.Limit, got.Limit)
	require.GreaterOrEqual(t, got.AdmissionBoundTokensPerSec, got.OutputTokensPerSec)

	_, err = Curve{}.AtAdmitted(testObjectives, adm)
	require.ErrorIs(t, err, ErrNoData)
}

package capacity

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// testStall is a stall bin at x new tokens/s whose share within 50 ms ITL
// is itl, over n observations and 5 windows.
func testStall(x, itl, n float64) StallBin {
	return StallBin{NewTokensPerSec: x, Seconds: 10, Windows: 5,
		ITL: Histogram{Counts: []float64{0, itl * n, n}, Count: n, Sum: n * 0.04}}
}

// testMix is 100 requests of 2,000 new prompt tokens and 150 output tokens.
var testMix = Prefill{Requests: 100, NewTokens: 100 * 2000, OutputTokens: 100 * 150}

func TestStallBound(t *testing.T) {
	for _, tc := range []struct {
		name  string
		stall []StallBin
		mix   Prefill
		o     Objectives
		bound float64 // want; -1: none
	}{
		// 0.97 at 2,000 and 0.93 at 4,000 cross 0.95 half way, at 3,000
		// new tokens/s: 1.5 requests/s of the mix, 225 output tokens/s.
		{"interpolated at the crossing", []StallBin{testStall(1000, 0.99, 500), testStall(2000, 0.97, 500),
			testStall(4000, 0.93, 500), testStall(8000, 0.5, 500)}, testMix, testObjectives, 225},
		// 0.93 then 0.95 is pooled to 0.94 at both: the crossing moves
		// to 2,000 + 2,000 * 0.02/0.03 new tokens/s.
		{"a rise past the crossing is pooled with it", []StallBin{testStall(1000, 0.99, 500), testStall(2000, 0.97, 500),
			testStall(4000, 0.93, 500), testStall(6000, 0.95, 500), testStall(8000, 0.5, 500)}, testMix, testObjectives, 0.075 * (2000 + 2000*0.02/0.03)},
		{"a thin bin joins its neighbour", []StallBin{testStall(1000, 0.99, 500), testStall(2000, 0.97, 50), testStall(2100, 0.97, 50),
			testStall(4000, 0.93, 500)}, testMix, testObjectives, 0.075 * (2050 + (4000-2050)*0.5)},
		{"nothing measured breaks: no bound", []StallBin{testStall(1000, 0.99, 500), testStall(8000, 0.96, 500)}, testMix, testObjectives, -1},
		{"the lightest load breaks: the concurrency bins' to read", []StallBin{testStall(1000, 0.9, 500), testStall(8000, 0.5, 500)}, testMix, testObjectives, -1},
		{"no mix: no bound", []StallBin{testStall(1000, 0.99, 500), testStall(8000, 0.5, 500)}, Prefill{}, testObjectives, -1},
		{"a cached mix: no bound", []StallBin{testStall(1000, 0.99, 500), testStall(8000, 0.5, 500)},
			Prefill{Requests: 100, OutputTokens: 100}, testObjectives, -1},
		{"no objective: no bound", []StallBin{testStall(1000, 0.99, 500), testStall(8000, 0.5, 500)}, testMix,
			Objectives{TTFT: time.Second, Quantile: 0.95}, -1},
		{"too thin to read", []StallBin{testStall(1000, 0.5, 50)}, testMix, testObjectives, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := testCurve(testBin(10, 0.99, 1, 1e6, 500))
			c.Stall, c.Prefill = tc.stall, tc.mix
			require.NoError(t, c.Validate())
			got, ok := c.StallBound(tc.o)
			if tc.bound < 0 {
				require.False(t, ok, "bound %v", got)
				return
			}
			require.True(t, ok)
			require.InDelta(t, tc.bound, got, 1e-6)
			at, err := c.At(tc.o)
			require.NoError(t, err)
			require.Equal(t, LimitStall, at.Limit)
			require.InDelta(t, tc.bound, at.OutputTokensPerSec, 1e-6)
			require.InDelta(t, tc.bound, at.StallBoundTokensPerSec, 1e-6)
		})
	}
}

// A queue draining has nothing new to prefill and runs the batch of the
// steady load before it: keyed by its requests it lands in that load's
// bin and sells it, keyed by its prefill load it does not.
func TestLearnerKeysStallsByPrefillLoad(t *testing.T) {
	window := func(x, itl float64) Window {
		return Window{Seconds: 1, Running: 8, OutputTokensPerSec: 300, NewPromptTokensPerSec: x, FirstTokens: 2,
			TTFTBounds: testTTFTBounds, ITLBounds: testITLBounds,
			ITL:  Histogram{Counts: []float64{0, itl * 300, 300}, Count: 300, Sum: 12},
			TTFT: Histogram{Counts: []float64{2, 2, 2}, Count: 2, Sum: 1}}
	}
	l := NewLearner(0)
	for range 120 {
		l.Add(window(1000, 0.99)) // light prefill, decoding keeps pace
	}
	for range 120 {
		l.Add(window(8000, 0.80)) // heavy prefill, decoding stalls
	}
	for range 90 {
		l.Add(window(0, 1)) // draining: nothing to prefill
	}
	c := l.Curve()
	require.NoError(t, c.Validate())
	require.Len(t, c.Bins, 1, "every window runs the batch of 8")

	last := c.Stall[len(c.Stall)-1]
	require.InDelta(t, 8000, last.NewTokensPerSec, 200, "the steady heavy load converges to its rate")
	require.Less(t, last.ITL.Within(c.ITLBounds, 0.05), 0.85, "the heavy load's bin holds its stalls")
	first := c.Stall[0]
	require.Less(t, first.NewTokensPerSec, 100.0, "the drain ends with nothing to prefill")
	require.Greater(t, first.ITL.Within(c.ITLBounds, 0.05), 0.99)

	bound, ok := c.StallBound(testObjectives)
	require.True(t, ok)
	lambda := bound / (c.Prefill.OutputTokens / c.Prefill.Requests)
	x := lambda * c.Prefill.NewTokens / c.Prefill.Requests
	require.Greater(t, x, 1000.0, "the light load holds")
	require.Less(t, x, 8000.0, "the heavy load does not")
}

func TestStallMergePoolValidate(t *testing.T) {
	live := testCurve(testBin(10, 0.99, 1, 100, 500))
	live.Stall = []StallBin{testStall(1000, 0.99, 500), testStall(4000, 0.9, 50)}
	cal := testCurve(testBin(10, 0.99, 1, 100, 500))
	cal.Stall = []StallBin{testStall(4000, 0.93, 500), testStall(8000, 0.5, 500)}
	m, err := live.Merge(cal)
	require.NoError(t, err)
	require.Equal(t, []StallBin{testStall(1000, 0.99, 500), testStall(4000, 0.93, 500), testStall(8000, 0.5, 500)}, m.Stall,
		"a stall bin live has too little of is the calibration's")
	require.Equal(t, 0.9*50, live.Stall[1].ITL.Counts[1], "merging leaves the live curve as it was")

	p, _ := Pool([]Curve{live, cal})
	require.Len(t, p.Stall, 3)
	require.Equal(t, 550.0, p.Stall[1].ITL.Count)
	require.NoError(t, p.Validate())

	// Observations of no time count, as in the concurrency bins, in a bin
	// of no time as well; the mean rate is the timed ones'.
	none := testStall(3000, 0.5, 100)
	none.Seconds = 0
	b := StallBin{NewTokensPerSec: 3000}
	addStall(&b, &none)
	require.Equal(t, 100.0, b.ITL.Count)
	require.Equal(t, 5.0, b.Windows)
	b = testStall(1000, 0.99, 500)
	addStall(&b, &none)
	require.Equal(t, 1000.0, b.NewTokensPerSec)
	require.Equal(t, 600.0, b.ITL.Count)
	require.Equal(t, 10.0, b.Seconds)

	cl := m.Clone()
	cl.Stall[0].ITL.Counts[0] = 7
	require.Zero(t, m.Stall[0].ITL.Counts[0], "a clone is deep")

	for name, s := range map[string][]StallBin{
		"negative":      {testStall(-1, 1, 10)},
		"not ascending": {testStall(2000, 1, 10), testStall(1000, 1, 10)},
		"bad histogram": {{NewTokensPerSec: 1, ITL: Histogram{Counts: []float64{5, 3}, Count: 5}}},
	} {
		c := testCurve()
		c.Stall = s
		require.Error(t, c.Validate(), name)
	}
}

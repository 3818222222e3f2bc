package capacity

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"
)

func testHeld(load, rate float64) SustainedBin {
	return SustainedBin{Concurrency: load, OutputTokensPerSec: rate, Seconds: 15, Spans: 1}
}

func TestHeldAt(t *testing.T) {
	// An engine that ran 300 tok/s at 6, 500 at 10 and, queued, 520 at 40.
	held := []SustainedBin{testHeld(6, 300), testHeld(10, 500), testHeld(40, 520)}
	inf := math.Inf(1)
	for _, tc := range []struct {
		name  string
		bins  []SustainedBin
		rate  float64
		upTo  float64
		want  float64
		found bool
	}{
		{"between two spans", held, 400, inf, 8, true},
		{"at a span", held, 500, inf, 10, true},
		{"below the lightest: in proportion from no load", held, 150, inf, 3, true},
		{"the queued load past the knee", held, 510, inf, 25, true},
		{"past the fastest: in proportion to the fastest", held, 1040, inf, 80, true},
		{"a slower span before the peak pools with the one before it",
			[]SustainedBin{testHeld(6, 300), testHeld(8, 280), testHeld(10, 500)}, 400, inf, 8 + 2*110/210.0, true},
		{"a slower overload past the peak does not pool with it",
			[]SustainedBin{testHeld(6, 300), testHeld(10, 500), testHeld(20, 520), testHeld(30, 400)}, 510, inf, 15, true},
		{"past the fastest, slower spans after it: in proportion to the fastest",
			[]SustainedBin{testHeld(10, 500), testHeld(40, 300)}, 1000, inf, 20, true},
		{"a forgotten span does not count",
			[]SustainedBin{testHeld(6, 300), {Concurrency: 7, OutputTokensPerSec: 600, Seconds: 0.7, Spans: 0.05}, testHeld(8, 600)}, 450, inf, 7, true},
		// Fitted through the overload at 40, the rate is reached at 30.5.
		{"spans past the load the capacity stops at are left out",
			[]SustainedBin{testHeld(6, 300), testHeld(10, 500), testHeld(20, 480), testHeld(40, 700)}, 600, 25, 12, true},
		{"nothing held within the load", held, 300, 5, 0, false},
		{"nothing held", nil, 300, inf, 0, false},
		{"no rate", held, 0, inf, 0, false},
		{"no rate held", []SustainedBin{testHeld(6, 0)}, 300, inf, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := testCurve()
			c.Sustained = tc.bins
			got, ok := c.heldAt(tc.rate, tc.upTo)
			require.Equal(t, tc.found, ok)
			require.InDelta(t, tc.want, got, 1e-9)
		})
	}
}

// A load the engine can hold within the objectives for a moment is not one
// an open stream of arrivals at its rate stays at: the quote's concurrency
// is what the engine held at the rate read, its rate unchanged.
func TestAtHoldsTheSustainedLoad(t *testing.T) {
	one := func(float64) float64 { return 1 }
	c := linearCurve(60, 25, one)
	free, err := c.At(testObjectives)
	require.NoError(t, err)
	require.Zero(t, free.HeldConcurrency, "nothing sustained: the objectives' load")

	// Held: an engine faster a request than its windows say, then a queue.
	held := []SustainedBin{testHeld(4, 40), testHeld(8, 120), testHeld(12, 250), testHeld(30, 260)}
	c.Sustained = held
	at, err := c.At(testObjectives)
	require.NoError(t, err)
	require.Equal(t, free.OutputTokensPerSec, at.OutputTokensPerSec, "the rate is the objectives'")
	require.Equal(t, free.Limit, at.Limit)
	want, ok := c.heldAt(free.OutputTokensPerSec, free.Concurrency)
	require.True(t, ok)
	require.Less(t, want, free.Concurrency)
	require.InDelta(t, want, at.Concurrency, 1e-9)
	require.InDelta(t, want, at.HeldConcurrency, 1e-9)

	adm, err := c.AtAdmitted(testObjectives, &Admission{TargetWaiting: 1, KVCeiling: 1, Ceiling: 1}, 1)
	require.NoError(t, err)
	require.Equal(t, at, adm, "no admission bound within the curve: as At")

	// Held only past the objectives' load: that is a queue, and the
	// objectives' load stands.
	c.Sustained = []SustainedBin{testHeld(2*free.Concurrency, 2*free.OutputTokensPerSec)}
	at, err = c.At(testObjectives)
	require.NoError(t, err)
	require.Equal(t, free, at)

	// A quarter of the rate held at half the load: in proportion, the
	// rate needs twice the load, and the objectives' load stands.
	c.Sustained = []SustainedBin{testHeld(free.Concurrency/2, free.OutputTokensPerSec/4)}
	at, err = c.At(testObjectives)
	require.NoError(t, err)
	require.Equal(t, free.Concurrency, at.Concurrency)
	require.Greater(t, at.HeldConcurrency, free.Concurrency)

	// Flow control lowers the rate; the load held at the lower rate bounds it.
	c = linearCurve(60, 25, one)
	for i := range c.Bins {
		c.Bins[i].Waiting = c.Bins[i].Concurrency / 10
	}
	c.Sustained = held
	adm, err = c.AtAdmitted(testObjectives, &Admission{TargetWaiting: 1, KVCeiling: 1, Ceiling: 1}, 1)
	require.NoError(t, err)
	require.Equal(t, LimitAdmission, adm.Limit)
	mean := AdmittedLoad(adm.AdmissionBoundConcurrency, 1, testObjectives.Quantile)
	h, _ := c.heldAt(adm.OutputTokensPerSec, mean)
	require.InDelta(t, min(mean, h), adm.Concurrency, 1e-9)
	require.InDelta(t, h, adm.HeldConcurrency, 1e-9)
}

func TestLearnerSustainsSpans(t *testing.T) {
	w := func(load, rate float64) Window {
		return Window{Seconds: 1, Running: load, OutputTokensPerSec: rate, TTFTBounds: testTTFTBounds, ITLBounds: testITLBounds,
			ITL: Histogram{Counts: []float64{0, 10, 10}, Count: 10, Sum: 0.4}}
	}
	l := NewLearner(0)
	// A queue forming and draining within each span: 5 s at 20.5, 10 at 5.5.
	for range 3 {
		for range 5 {
			l.Add(w(20.5, 600))
		}
		for range 10 {
			l.Add(w(5.5, 300))
		}
	}
	l.Add(Window{Seconds: 30, TTFTBounds: testTTFTBounds, ITLBounds: testITLBounds}) // idle: no span time
	c := l.Curve()
	require.NoError(t, c.Validate())
	require.Len(t, c.Sustained, 1, "three spans of the same load")
	s := c.Sustained[0]
	require.InDelta(t, 10.5, s.Concurrency, 1e-9, "the load held over a span, not its moments")
	require.InDelta(t, 400, s.OutputTokensPerSec, 1e-9)
	decay := math.Exp2(-1 / mixHalfLife.Seconds())
	require.InDelta(t, 15*(1+math.Pow(decay, 15)+math.Pow(decay, 30)), s.Seconds, 1e-9, "forgotten as the mix is")
	require.InDelta(t, 1+math.Pow(decay, 15)+math.Pow(decay, 30), s.Spans, 1e-9)

	for range 14 {
		l.Add(w(40, 900))
	}
	require.Len(t, l.Curve().Sustained, 1, "a span under way is not read")
	l.Add(w(40, 900))
	c = l.Curve()
	require.Len(t, c.Sustained, 2)
	require.InDelta(t, 40, c.Sustained[1].Concurrency, 1e-9)

	l.Add(Window{Seconds: 1, Running: 5, TTFTBounds: []float64{9}, ITLBounds: testITLBounds})
	require.Empty(t, l.Curve().Sustained, "another engine starts over")
}

func TestSustainedMergePoolValidate(t *testing.T) {
	live := testCurve(testBin(10, 0.99, 1, 100, 500))
	live.Sustained = []SustainedBin{testHeld(10, 100)}
	cal := testCurve(testBin(12, 0.99, 1, 100, 500))
	cal.Sustained = []SustainedBin{testHeld(4, 50), testHeld(12, 90)}

	m, err := live.Merge(cal)
	require.NoError(t, err)
	require.Equal(t, live.Sustained, m.Sustained, "live spans are not mixed with another run's")
	m, err = testCurve(testBin(10, 0.99, 1, 100, 500)).Merge(cal)
	require.NoError(t, err)
	require.Equal(t, cal.Sustained, m.Sustained, "none live: the calibration's")
	m, err = Curve{Sustained: live.Sustained}.Merge(cal)
	require.NoError(t, err)
	require.Equal(t, live.Sustained, m.Sustained, "no live bins yet, but spans")

	other := testCurve(testBin(10, 0.99, 1, 100, 500))
	other.Sustained = []SustainedBin{{Concurrency: 10.5, OutputTokensPerSec: 140, Seconds: 5, Spans: 1}}
	p, _ := Pool([]Curve{live, cal, other})
	require.NoError(t, p.Validate())
	require.Len(t, p.Sustained, 3)
	require.InDelta(t, (10*15+10.5*5)/20.0, p.Sustained[1].Concurrency, 1e-9)
	require.InDelta(t, (100*15+140*5)/20.0, p.Sustained[1].OutputTokensPerSec, 1e-9)
	require.InDelta(t, 2, p.Sustained[1].Spans, 1e-9)

	cl := p.Clone()
	cl.Sustained[0].Concurrency = 99
	require.InDelta(t, 4, p.Sustained[0].Concurrency, 1e-9, "a clone is deep")

	for name, s := range map[string][]SustainedBin{
		"negative":      {testHeld(-1, 10)},
		"not finite":    {testHeld(1, math.Inf(1))},
		"not ascending": {testHeld(8, 10), testHeld(4, 10)},
	} {
		c := testCurve()
		c.Sustained = s
		require.Error(t, c.Validate(), name)
	}
}

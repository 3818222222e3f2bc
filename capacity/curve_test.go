package capacity

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

var (
	testITLBounds  = []float64{0.025, 0.05, 0.1}
	testTTFTBounds = []float64{1, 2, 4}
)

// testBin is a bin at running whose shares within 50 ms ITL and 2 s TTFT
// are itl and ttft, over n observations.
func testBin(running, itl, ttft, tps, n float64) Bin {
	return Bin{Concurrency: running, Running: running, Seconds: 10, Windows: 5, OutputTokensPerSec: tps,
		ITL:  Histogram{Counts: []float64{0, itl * n, n}, Count: n, Sum: n * 0.04},
		TTFT: Histogram{Counts: []float64{0, ttft * n, n}, Count: n, Sum: n}}
}

func testCurve(bins ...Bin) Curve {
	return Curve{ITLBounds: testITLBounds, TTFTBounds: testTTFTBounds, Bins: bins}
}

var testObjectives = Objectives{TTFT: 2 * time.Second, ITL: 50 * time.Millisecond, Quantile: 0.95}

func TestHistogramWithin(t *testing.T) {
	h := Histogram{Counts: []float64{10, 60, 90}, Count: 100}
	for _, tc := range []struct {
		x, want float64
	}{
		{0.025, 0.10}, {0.05, 0.60}, {0.0375, 0.35}, {0.0125, 0.05}, {0.1, 0.90}, {5, 0.90}, {0, 0},
	} {
		require.InDelta(t, tc.want, h.Within(testITLBounds, tc.x), 1e-9, "x=%v", tc.x)
	}
	require.Equal(t, 1.0, (&Histogram{}).Within(testITLBounds, 0.01), "an empty histogram breaks nothing")
}

// linearCurve has one bin per batch size 1..n whose ITL share within the
// objective falls linearly from 1 to 0.95 at cross, and whose TTFT share
// is ttft(k).
func linearCurve(n int, cross float64, ttft func(k float64) float64) Curve {
	c := testCurve()
	for k := 1; k <= n; k++ {
		kf := float64(k)
		itl := 1 - 0.05*kf/cross
		c.Bins = append(c.Bins, testBin(kf, max(itl, 0), ttft(kf), 10*kf, 1000))
	}
	return c
}

// mixture is the definition At implements, written out directly: the
// Poisson(m) mixture of f, weighted by batch size when byBatch.
func mixture(m float64, f func(k float64) float64, byBatch bool) float64 {
	var num, den float64
	for k := 0; k < 400; k++ {
		lg, _ := math.Lgamma(float64(k) + 1)
		p := math.Exp(float64(k)*math.Log(m) - m - lg)
		w := p
		if byBatch {
			w *= float64(k)
		}
		num += w * f(float64(k))
		den += w
	}
	return num / den
}

func TestCurveAt(t *testing.T) {
	one := func(float64) float64 { return 1 }
	t.Run("itl: the Poisson mixture reaches the quantile", func(t *testing.T) {
		c := linearCurve(60, 25, one)
		at, err := c.At(testObjectives)
		require.NoError(t, err)
		require.Equal(t, LimitITL, at.Limit)
		f := func(k float64) float64 { return math.Max(1-0.05*max(k, 1)/25, 0) }
		require.InDelta(t, 0.95, mixture(at.Concurrency, f, true), 2e-3)
		require.Less(t, mixture(at.Concurrency+0.5, f, true), 0.95)
		// The spread of the batch costs capacity: the mean is below the
		// batch size whose own share is at the quantile.
		require.Less(t, at.Concurrency, 25.0)
		require.Greater(t, at.Concurrency, 15.0)
		require.InDelta(t, 10*at.Concurrency, at.OutputTokensPerSec, 1e-6)
		// A client's streams hold the load itself: no spread.
		require.InDelta(t, 25, at.Streams, 0.05)
	})
	t.Run("ttft breaks first", func(t *testing.T) {
		ttft := func(k float64) float64 { return math.Max(1-0.05*k/10, 0) }
		at, err := linearCurve(60, 25, ttft).At(testObjectives)
		require.NoError(t, err)
		require.Equal(t, LimitTTFT, at.Limit)
		require.InDelta(t, 0.95, mixture(at.Concurrency, ttft, false), 2e-3)
		require.InDelta(t, 10, at.Streams, 0.05)
	})
	t.Run("never breaks: stops where unmeasured sizes would matter", func(t *testing.T) {
		at, err := linearCurve(16, 1000, one).At(testObjectives)
		require.NoError(t, err)
		require.Equal(t, LimitMeasured, at.Limit)
		beyond := func(k float64) float64 { return b2f(k <= 16) }
		require.InDelta(t, 0.95, mixture(at.Concurrency, beyond, true), 2e-3)
		require.Less(t, at.Concurrency, 16.0)
		require.Equal(t, 16.0, at.Streams, "held up to the largest load measured, never past it")
	})
	t.Run("first bin breaks: nothing to sell", func(t *testing.T) {
		at, err := testCurve(testBin(4, 0.5, 1, 50, 500), testBin(8, 0.4, 1, 90, 500)).At(testObjectives)
		require.NoError(t, err)
		require.Zero(t, at.Concurrency)
		require.Zero(t, at.OutputTokensPerSec)
		require.Zero(t, at.Streams)
		require.Equal(t, LimitITL, at.Limit)
	})
	t.Run("a noisy good bin past bad ones does not raise capacity", func(t *testing.T) {
		c := linearCurve(20, 8, one)
		base, err := c.At(testObjectives)
		require.NoError(t, err)
		c.Bins = append(c.Bins, testBin(30, 1, 1, 300, 100))
		noisy, err := c.At(testObjectives)
		require.NoError(t, err)
		require.InDelta(t, base.Concurrency, noisy.Concurrency, 0.05*base.Concurrency)
	})
	t.Run("a measured dispersion below 1 reads the mixture of a narrower batch", func(t *testing.T) {
		c := linearCurve(60, 25, one)
		poisson, err := c.At(testObjectives)
		require.NoError(t, err)
		c.Dispersion = 0.5
		narrow, err := c.At(testObjectives)
		require.NoError(t, err)
		require.Greater(t, narrow.Concurrency, poisson.Concurrency)
		require.Less(t, narrow.Concurrency, 25.0)
		require.Equal(t, poisson.Streams, narrow.Streams, "streams are read without a spread")
		f := func(k float64) float64 { return math.Max(1-0.05*max(k, 1)/25, 0) }
		// The batch is 0.5 x Poisson(2m): the same mixture written out.
		var num, den float64
		for j := 0; j < 400; j++ {
			lg, _ := math.Lgamma(float64(j) + 1)
			lam := narrow.Concurrency / 0.5
			p := math.Exp(float64(j)*math.Log(lam) - lam - lg)
			k := 0.5 * float64(j)
			num += p * k * f(k)
			den += p * k
		}
		require.InDelta(t, 0.95, num/den, 2e-3)
		c.Dispersion = math.NaN()
		nan, err := c.At(testObjectives)
		require.NoError(t, err)
		require.InDelta(t, poisson.Concurrency, nan.Concurrency, 1e-9, "an unusable dispersion reads as Poisson")
	})
	t.Run("thin bins at the top are pooled, not dropped", func(t *testing.T) {
		// 1..10 measured well; 11..20 visited once each, every visit
		// within the objectives: pooled, they extend what was measured.
		c := linearCurve(10, 1000, one)
		for k := 11.0; k <= 20; k++ {
			b := testBin(k, 1, 1, 10*k, 50)
			b.Windows = 1
			c.Bins = append(c.Bins, b)
		}
		at, err := c.At(testObjectives)
		require.NoError(t, err)
		require.Greater(t, at.MaxMeasured, 11.0)
		alone, err := linearCurve(10, 1000, one).At(testObjectives)
		require.NoError(t, err)
		require.Greater(t, at.Concurrency, alone.Concurrency)
	})
	t.Run("bins with too few samples are not read", func(t *testing.T) {
		_, err := testCurve(testBin(10, 0.99, 1, 100, MinSamples-1)).At(testObjectives)
		require.ErrorIs(t, err, ErrNoData)
		_, err = testCurve().At(testObjectives)
		require.ErrorIs(t, err, ErrNoData)
	})
	t.Run("bad quantile", func(t *testing.T) {
		_, err := testCurve(testBin(1, 1, 1, 1, 500)).At(Objectives{TTFT: time.Second, ITL: time.Second})
		require.ErrorContains(t, err, "quantile")
	})
}

// An overloaded engine holds its batch and grows its queue: its windows
// are keyed by both, so their times to first token do not land on the
// batch size a light load also runs at.
func TestLearnerKeysOverloadByQueue(t *testing.T) {
	w := func(running, waiting, ttftWithin float64) Window {
		return Window{Seconds: 1, Running: running, Waiting: waiting, OutputTokensPerSec: running * 30,
			TTFTBounds: testTTFTBounds, ITLBounds: testITLBounds,
			ITL:  Histogram{Counts: []float64{0, 100, 100}, Count: 100},
			TTFT: Histogram{Counts: []float64{0, ttftWithin, 10}, Count: 10}}
	}
	l := NewLearner(0)
	for range MinWindows {
		l.Add(w(9, 0, 10))   // steady: every first token within 2 s
		l.Add(w(9, 18, 0))   // overloaded: none within
		l.Add(w(4.5, 0, 10)) // lighter
	}
	c := l.Curve()
	require.Len(t, c.Bins, 3)
	require.InDelta(t, 27, c.Bins[2].Concurrency, 1e-9)
	require.InDelta(t, 9, c.Bins[2].Running, 1e-9)
	at, err := c.At(testObjectives)
	require.NoError(t, err)
	require.Equal(t, LimitTTFT, at.Limit)
	require.Greater(t, at.Concurrency, 4.5, "the overload's first tokens are not charged to a batch of 9 with no queue")
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

func TestLearner(t *testing.T) {
	w := func(running float64, secs float64) Window {
		return Window{Seconds: secs, Running: running, OutputTokensPerSec: running * 30, TTFTBounds: testTTFTBounds, ITLBounds: testITLBounds,
			ITL: Histogram{Counts: []float64{0, 95, 100}, Count: 100}, TTFT: Histogram{Counts: []float64{10, 10, 10}, Count: 10}}
	}
	l := NewLearner(time.Minute)
	l.Add(w(0, 2))                                 // idle: nothing learnt
	l.Add(Window{Seconds: 2, Running: math.NaN()}) // garbage
	require.Empty(t, l.Curve().Bins)
	l.Add(w(3.2, 2))
	l.Add(w(3.9, 2)) // same bin
	l.Add(w(40, 2))
	c := l.Curve()
	require.Len(t, c.Bins, 2)
	// Means are weighted by window time, the older window's decayed.
	d := math.Exp2(-2.0 / 60)
	require.InDelta(t, (3.2*2*d+3.9*2)/(2*d+2), c.Bins[0].Running, 1e-9)
	// Two windows of 2s later the first bin has decayed twice by 2^(-2/60).
	require.InDelta(t, 100*math.Exp2(-4.0/60)+100*math.Exp2(-2.0/60), c.Bins[0].ITL.Count, 1e-6)
	require.InDelta(t, math.Exp2(-4.0/60)+math.Exp2(-2.0/60), c.Bins[0].Windows, 1e-9)
	require.NoError(t, c.Validate())
	// Two windows hold enough observations but are too few to be read
	// alone, whatever their length.
	_, err := c.At(testObjectives)
	require.ErrorIs(t, err, ErrNoData)
	for range MinWindows {
		l.Add(w(3.5, 0.1))
	}
	_, err = l.Curve().At(testObjectives)
	require.NoError(t, err)

	// Another engine's buckets start the curve over.
	other := w(5, 2)
	other.ITLBounds = []float64{0.01, 0.02, 0.04}
	l.Add(other)
	require.Len(t, l.Curve().Bins, 1)

	// Busy scrapes of a steady batch of 10 or so have little spread.
	steady := NewLearner(0)
	for i := range 40 {
		x := w(10, 2)
		x.ConcurrencyNow = float64(9 + i%3)
		steady.Add(x)
	}
	require.InDelta(t, (2.0/3)/10, steady.Curve().Dispersion, 0.02)

	// The copy is deep.
	c = l.Curve()
	c.Bins[0].ITL.Counts[0] = 42
	require.NotEqual(t, 42.0, l.Curve().Bins[0].ITL.Counts[0])
}

// The prefill bound: an engine that took 15,000 new tokens a second into
// prefill through a saturated run, for a mix of 6,000 new prompt tokens
// and 120 output tokens a request while it kept up, prefills 2.5
// requests a second; a p95 TTFT of 2 s keeps lambda <= 2.5 - ln(20)/2,
// about 1.0 request, 120 tokens a second.
func TestPrefillBound(t *testing.T) {
	window := func(waitingMin, kv float64) Window {
		return Window{Seconds: 1, Running: 4, Waiting: waitingMin, WaitingMin: waitingMin, KVUsage: kv, OutputTokensPerSec: 300,
			NewPromptTokensPerSec: 15000, FirstTokens: 2.5, TTFTBounds: testTTFTBounds, ITLBounds: testITLBounds,
			ITL:  Histogram{Counts: []float64{100, 100, 100}, Count: 100},
			TTFT: Histogram{Counts: []float64{3, 3, 3}, Count: 3}}
	}
	// kept is a window the engine kept up in; queued one of a saturated
	// run (a request waiting at both ends). Both carry the mix.
	kept, queued := window(0, 0.5), window(1, 0.5)
	feed := func(l *Learner, w Window, n int) {
		for range n {
			l.Add(w)
		}
	}
	lambda := 2.5 - math.Log(20)/2
	for _, tc := range []struct {
		name  string
		feed  func(*Learner)
		o     Objectives
		bound float64 // want; -1: not measured
	}{
		{"a saturated run measures the rate", func(l *Learner) { feed(l, kept, 10); feed(l, queued, 6); feed(l, kept, 1) }, testObjectives, lambda * 120},
		{"a run under way counts once long enough", func(l *Learner) { feed(l, kept, 10); feed(l, queued, 6) }, testObjectives, lambda * 120},
		{"a shorter run does not", func(l *Learner) { feed(l, kept, 10); feed(l, queued, 4); feed(l, kept, 1) }, testObjectives, -1},
		{"nor a queue for want of KV", func(l *Learner) {
			w := queued
			w.KVUsage = 0.95
			feed(l, kept, 10)
			feed(l, w, 6)
		}, testObjectives, -1},
		{"an idle window ends a run", func(l *Learner) {
			feed(l, kept, 10)
			feed(l, queued, 3)
			l.Add(Window{Seconds: 1, TTFTBounds: testTTFTBounds, ITLBounds: testITLBounds})
			feed(l, queued, 3)
		}, testObjectives, -1},
		{"a mix of too few requests says nothing", func(l *Learner) { feed(l, queued, 6); feed(l, kept, 1) }, testObjectives, -1},
		{"every prompt cached costs no prefill", func(l *Learner) {
			k, q := kept, queued
			k.NewPromptTokensPerSec, q.NewPromptTokensPerSec = 0, 0
			feed(l, k, 10)
			feed(l, q, 6)
		}, testObjectives, -1},
		{"an objective no request can meet sells nothing", func(l *Learner) { feed(l, kept, 10); feed(l, queued, 6) },
			Objectives{TTFT: time.Second, ITL: time.Second, Quantile: 0.95}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := NewLearner(0)
			tc.feed(l)
			c := l.Curve()
			require.NoError(t, c.Validate())
			b, ok := c.Prefill.Bound(tc.o)
			if tc.bound < 0 {
				require.False(t, ok)
				return
			}
			require.True(t, ok)
			require.InDelta(t, tc.bound, b, 1e-9)
			require.InDelta(t, 15000, l.Summary().PrefillTokensPerSec, 1e-9)

			// The bound scales down the tokens and concurrency the
			// curve alone sells.
			free := c.Clone()
			free.Prefill = Prefill{}
			alone, err := free.At(tc.o)
			require.NoError(t, err)
			require.Greater(t, alone.OutputTokensPerSec, tc.bound)
			at, err := c.At(tc.o)
			require.NoError(t, err)
			require.Equal(t, LimitPrefill, at.Limit)
			require.InDelta(t, tc.bound, at.OutputTokensPerSec, 1e-9)
			require.InDelta(t, alone.Concurrency*tc.bound/alone.OutputTokensPerSec, at.Concurrency, 1e-9)
			require.InDelta(t, tc.bound, at.PrefillBoundTokensPerSec, 1e-9)
		})
	}

	// The mix is every busy window's and forgets by mixHalfLife of their
	// time; the rate forgets by the curve's half-life only.
	l := NewLearner(0)
	feed(l, kept, 10)
	feed(l, queued, 6)
	w := kept
	w.FirstTokens = 1
	n := int(mixHalfLife.Seconds())
	feed(l, w, n)
	p := l.Curve().Prefill
	// After mixHalfLife of later windows, the first 16 weigh half.
	f := math.Exp2(-1 / mixHalfLife.Seconds())
	var first, later float64
	for i := range 16 {
		first += 2.5 * math.Pow(f, float64(i))
	}
	for i := range n {
		later += math.Pow(f, float64(i))
	}
	require.InDelta(t, first/2+later, p.Requests, 1e-9)
	require.InDelta(t, 6.0, p.QueuedSeconds, 1e-9)
	require.InDelta(t, 15000, p.QueuedTokens/p.QueuedSeconds, 1e-9)

	// Merged over a calibration, each half the live curve has not
	// measured is the calibration's; pooled, the sums add.
	l = NewLearner(0)
	feed(l, kept, 10)
	feed(l, queued, 6)
	cal := l.Curve()
	live := NewLearner(0)
	w = kept
	w.FirstTokens, w.NewPromptTokensPerSec = 100, 1000
	live.Add(w)
	m, err := live.Curve().Merge(cal)
	require.NoError(t, err)
	require.Equal(t, cal.Prefill.QueuedTokens, m.Prefill.QueuedTokens, "the calibration's rate")
	require.Equal(t, 100.0, m.Prefill.Requests, "the live mix is measured")
	pool, _ := Pool([]Curve{cal, cal})
	require.Equal(t, 2*cal.Prefill.QueuedSeconds, pool.Prefill.QueuedSeconds)
	b, ok := pool.Prefill.Bound(testObjectives)
	require.True(t, ok)
	require.InDelta(t, lambda*120, b, 1e-9, "a pooled curve is one replica's share")
}

func TestMergeAndPool(t *testing.T) {
	live := testCurve(testBin(10, 0.99, 1, 100, 500), testBin(20, 0.9, 1, 150, 10))
	cal := testCurve(testBin(20, 0.97, 1, 180, 500), testBin(30, 0.93, 1, 240, 500))
	m, err := live.Merge(cal)
	require.NoError(t, err)
	require.Len(t, m.Bins, 3)
	require.Equal(t, 0.97*500, m.Bins[1].ITL.Counts[1], "a bin live has too little of is the calibration's")

	_, err = live.Merge(Curve{ITLBounds: []float64{1, 2, 3}, TTFTBounds: testTTFTBounds, Bins: cal.Bins})
	require.Error(t, err)

	p, skipped := Pool([]Curve{live, cal, {}, {ITLBounds: []float64{9}, Bins: []Bin{testBin(1, 1, 1, 1, 1)}}})
	require.Equal(t, 1, skipped)
	require.Len(t, p.Bins, 3)
	require.Equal(t, 510.0, p.Bins[1].ITL.Count)
	require.NoError(t, p.Validate())
}

// TestPoolKeepsBinsApart: two saturated replicas whose running gauge,
// averaged over a window, reads a hair under 4 pool into a curve that is
// still ascending. The sum form of a weighted mean rounded such a bin up
// to 4.0, equal to the next bin, and a calibration failed to load.
func TestPoolKeepsBinsApart(t *testing.T) {
	under := math.Nextafter(4, 0)
	replica := func(seconds float64) Curve {
		b := testBin(under, 0.99, 1, 50, 10)
		b.Seconds = seconds
		return testCurve(b, testBin(4, 0.9, 1, 60, 10))
	}
	for _, tc := range [][2]float64{{0.5, 0.9}, {1, 0.9}, {2, 0.3}, {0.3, 2}} {
		p, _ := Pool([]Curve{replica(tc[0]), replica(tc[1])})
		require.NoError(t, p.Validate(), "seconds %v", tc)
		require.Len(t, p.Bins, 2)
		require.Equal(t, under, p.Bins[0].Concurrency)
	}
	for _, tc := range []struct{ x, y, w float64 }{
		{under, under, 0.9 / 1.4}, {1, 2, 0.5}, {2, 1, 0.25}, {0.001, 0.9, 1}, {3, 3.5, 0}, {1e300, 1.7e308, 0.5},
	} {
		m := between(tc.x, tc.y, tc.w)
		require.GreaterOrEqual(t, m, min(tc.x, tc.y), "%v", tc)
		require.LessOrEqual(t, m, max(tc.x, tc.y), "%v", tc)
		require.InDelta(t, tc.x*(1-tc.w)+tc.y*tc.w, m, 1e-12*max(1, math.Abs(tc.y)), "%v", tc)
	}
}

func TestCalibrationRoundTrip(t *testing.T) {
	c := &Calibration{Version: CalibrationVersion, Model: "m", URL: "http://127.0.0.1:1", Replicas: 2,
		Objectives: ObjectivesJSON{TTFTSeconds: 2, ITLSeconds: 0.05, Quantile: 0.95},
		Curve:      testCurve(testBin(10, 0.99, 1, 100, 500))}
	var buf bytes.Buffer
	require.NoError(t, c.Write(&buf))
	got, err := ReadCalibration(&buf)
	require.NoError(t, err)
	require.Equal(t, c.Curve, got.Curve)

	for _, tc := range []struct{ name, doc, want string }{
		{"not json", "{", "cannot decode"},
		{"unknown field", `{"version":1,"bogus":1}`, "unknown field"},
		{"older version", `{"version":1}`, "run quoter calibrate again"},
		{"no curve", `{"version":2,"model":"m","replicas":1,"objectives":{"ttft_seconds":2,"itl_seconds":0.05,"quantile":0.95}}`, "empty curve"},
		{"decreasing counts", `{"version":2,"model":"m","replicas":1,"objectives":{"ttft_seconds":2,"itl_seconds":0.05,"quantile":0.95},
			"curve":{"itl_bounds":[0.05,0.1],"ttft_bounds":[1],"bins":[{"running":1,"itl":{"counts":[5,3],"count":5}}]}}`, "decrease"},
		{"negative running", `{"version":2,"model":"m","replicas":1,"objectives":{"ttft_seconds":2,"itl_seconds":0.05,"quantile":0.95},
			"curve":{"itl_bounds":[0.05],"ttft_bounds":[1],"bins":[{"running":-1}]}}`, "negative"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ReadCalibration(strings.NewReader(tc.doc))
			require.ErrorContains(t, err, tc.want)
		})
	}
}

// FuzzReadCalibration: a calibration file is outside input; whatever it
// holds, reading it either fails or yields a curve At can read and a
// streams bound that is a finite count.
func FuzzReadCalibration(f *testing.F) {
	var buf bytes.Buffer
	c := &Calibration{Version: CalibrationVersion, Model: "m", Replicas: 1, Objectives: ObjectivesJSON{TTFTSeconds: 2, ITLSeconds: 0.05, Quantile: 0.95},
		Curve:  testCurve(testBin(10, 0.99, 1, 100, 500), testBin(20, 0.9, 0.9, 150, 500)),
		Levels: []Level{{Concurrency: 2, Requests: 50, TTFTP95Seconds: 0.3, ITLP95Seconds: 0.03}, {Concurrency: 4, Requests: 60, ITLP95Seconds: 0.07}}}
	c.Curve.Stall = []StallBin{testStall(1000, 0.99, 500), testStall(4000, 0.5, 500)}
	c.Curve.Prefill = testMix
	_ = c.Write(&buf)
	f.Add(buf.Bytes())
	f.Add([]byte(`{"version":2}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := ReadCalibration(bytes.NewReader(data))
		if err != nil {
			return
		}
		if s, ok := c.StreamsBound(testObjectives); ok && (!(s >= 0) || math.IsInf(s, 0)) {
			t.Fatalf("held streams %v", s)
		}
		for _, load := range []float64{0.5, 3, 1e6} {
			if r, ok := c.RateBound(testObjectives, load); ok && (!(r >= 0) || math.IsInf(r, 0)) {
				t.Fatalf("rate bound %v at load %v", r, load)
			}
		}
		at, err := c.Curve.At(testObjectives)
		if err == nil && (at.Concurrency < 0 || math.IsNaN(at.Concurrency) || math.IsNaN(at.OutputTokensPerSec) ||
			math.IsNaN(at.PrefillBoundTokensPerSec) || math.IsInf(at.PrefillBoundTokensPerSec, 0) ||
			math.IsNaN(at.StallBoundTokensPerSec) || math.IsInf(at.StallBoundTokensPerSec, 0) || at.StallBoundTokensPerSec < 0) {
			t.Fatalf("bad capacity %+v", at)
		}
	})
}

func TestRatesAt(t *testing.T) {
	// bins at (load, output rate) points, 10 s each, prompt rates 10
	// times the output's.
	bins := func(pts ...[2]float64) []*Bin {
		var out []*Bin
		for _, p := range pts {
			b := testBin(p[0], 1, 1, p[1], 400)
			b.PromptTokensPerSec = 10 * p[1]
			out = append(out, &b)
		}
		return out
	}
	for _, tc := range []struct {
		name string
		bins []*Bin
		at   float64
		want float64
	}{
		{"rising: between the bins", bins([2]float64{4, 400}, [2]float64{8, 800}), 6, 600},
		{"below the first bin: from an idle engine's 0", bins([2]float64{4, 400}, [2]float64{8, 800}), 2, 200},
		{"beyond the last bin: flat", bins([2]float64{4, 400}, [2]float64{8, 800}), 12, 800},
		{"a high bin among flat ones pools with the loads after it",
			bins([2]float64{16, 632}, [2]float64{17, 615}, [2]float64{18, 694}, [2]float64{19, 637}, [2]float64{20, 618}),
			18, (694 + 637 + 618) / 3.0},
		{"a rate falling under overload reads below its peak",
			bins([2]float64{4, 400}, [2]float64{8, 800}, [2]float64{12, 600}), 12, 700},
		{"weighted by time", []*Bin{
			{Concurrency: 4, OutputTokensPerSec: 400, Seconds: 10},
			{Concurrency: 8, OutputTokensPerSec: 900, Seconds: 30},
			{Concurrency: 12, OutputTokensPerSec: 500, Seconds: 10},
		}, 12, (900*30 + 500*10) / 40.0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, prompt := ratesAt(tc.bins, tc.at)
			require.InDelta(t, tc.want, out, 1e-9)
			if tc.bins[0].PromptTokensPerSec > 0 {
				require.InDelta(t, 10*tc.want, prompt, 1e-9, "the prompt rate is fitted alike")
			}
		})
	}
}

// A non-finite figure anywhere in a window keeps the window from every
// estimator: the curve stays finite and valid, and where the window's
// length is the broken figure (so not even the recent rates take its
// time) the curve is the one learnt without it.
func TestAddNonFinite(t *testing.T) {
	good := func(running float64) Window {
		return Window{Seconds: 1, Running: running, Waiting: 1, WaitingMin: 1, KVUsage: 0.5,
			NewPromptTokensPerSec: 900, FirstTokens: 2, ConcurrencyNow: running + 1,
			OutputTokensPerSec: running * 30, PromptTokensPerSec: 1000,
			TTFTBounds: testTTFTBounds, ITLBounds: testITLBounds,
			ITL:  Histogram{Counts: []float64{0, 95, 100}, Count: 100, Sum: 3},
			TTFT: Histogram{Counts: []float64{5, 10, 10}, Count: 10, Sum: 4}}
	}
	feed := func(bad *Window) Curve {
		l := NewLearner(time.Minute)
		for i := range 3 * MinWindows {
			l.Add(good(float64(2 + i%5)))
			if bad != nil && i == MinWindows {
				l.Add(*bad)
			}
		}
		return l.Curve()
	}
	want := feed(nil)
	fields := map[string]func(w *Window, v float64){
		"Seconds":               func(w *Window, v float64) { w.Seconds = v },
		"Running":               func(w *Window, v float64) { w.Running = v },
		"Waiting":               func(w *Window, v float64) { w.Waiting = v },
		"KVUsage":               func(w *Window, v float64) { w.KVUsage = v },
		"WaitingMin":            func(w *Window, v float64) { w.WaitingMin = v },
		"NewPromptTokensPerSec": func(w *Window, v float64) { w.NewPromptTokensPerSec = v },
		"FirstTokens":           func(w *Window, v float64) { w.FirstTokens = v },
		"ConcurrencyNow":        func(w *Window, v float64) { w.ConcurrencyNow = v },
		"OutputTokensPerSec":    func(w *Window, v float64) { w.OutputTokensPerSec = v },
		"PromptTokensPerSec":    func(w *Window, v float64) { w.PromptTokensPerSec = v },
		"TTFT.Count":            func(w *Window, v float64) { w.TTFT.Count = v },
		"TTFT.Sum":              func(w *Window, v float64) { w.TTFT.Sum = v },
		"TTFT.Counts":           func(w *Window, v float64) { w.TTFT.Counts = []float64{v, 10, 10} },
		"ITL.Count":             func(w *Window, v float64) { w.ITL.Count = v },
		"ITL.Sum":               func(w *Window, v float64) { w.ITL.Sum = v },
		"ITL.Counts":            func(w *Window, v float64) { w.ITL.Counts = []float64{0, v, 100} },
	}
	for name, set := range fields {
		for _, v := range []float64{math.NaN(), math.Inf(1), math.Inf(-1)} {
			t.Run(fmt.Sprintf("%s=%v", name, v), func(t *testing.T) {
				bad := good(4)
				set(&bad, v)
				got := feed(&bad)
				require.NoError(t, got.Validate())
				_, err := json.Marshal(got)
				require.NoError(t, err, "a NaN or an infinity reached the curve")
				if name == "Seconds" {
					require.Equal(t, want, got)
				}
			})
		}
	}
}

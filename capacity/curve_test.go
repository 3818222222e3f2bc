package capacity

import (
	"bytes"
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
	return Bin{Running: running, Seconds: 10, OutputTokensPerSec: tps,
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

func TestCurveAt(t *testing.T) {
	for _, tc := range []struct {
		name    string
		curve   Curve
		running float64
		tps     float64
		limit   string
		err     bool
	}{
		{"itl breaks between two bins", testCurve(testBin(10, 0.99, 1, 100, 500), testBin(20, 0.97, 1, 180, 500), testBin(30, 0.93, 1, 240, 500)),
			25, 210, LimitITL, false},
		{"ttft breaks first", testCurve(testBin(10, 0.99, 0.99, 100, 500), testBin(20, 0.99, 0.90, 180, 500)),
			10 + 10*0.04/0.09, 100 + 80*0.04/0.09, LimitTTFT, false},
		{"never breaks: stops at the largest measured batch", testCurve(testBin(4, 1, 1, 50, 500), testBin(8, 0.99, 1, 90, 500)),
			8, 90, LimitMeasured, false},
		{"first bin breaks: nothing to sell", testCurve(testBin(4, 0.5, 1, 50, 500), testBin(8, 0.4, 1, 90, 500)),
			0, 0, LimitITL, false},
		{"a noisy good bin past a bad one does not raise capacity", testCurve(testBin(10, 0.99, 1, 100, 500), testBin(20, 0.90, 1, 180, 500), testBin(30, 0.99, 1, 240, 100)),
			0, 0, LimitITL, false},
		{"bins with too few samples are not read", testCurve(testBin(10, 0.99, 1, 100, MinSamples-1)), 0, 0, "", true},
		{"no bins", testCurve(), 0, 0, "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			at, err := tc.curve.At(testObjectives)
			if tc.err {
				require.ErrorIs(t, err, ErrNoData)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.limit, at.Limit)
			if tc.name == "a noisy good bin past a bad one does not raise capacity" {
				// Pooled with the noisy bin, the 20-bin still breaks; the
				// crossing stays between 10 and 20.
				require.Greater(t, at.Running, 10.0)
				require.Less(t, at.Running, 20.0)
				return
			}
			require.InDelta(t, tc.running, at.Running, 1e-9)
			require.InDelta(t, tc.tps, at.OutputTokensPerSec, 1e-9)
		})
	}
	_, err := testCurve(testBin(1, 1, 1, 1, 500)).At(Objectives{TTFT: time.Second, ITL: time.Second})
	require.ErrorContains(t, err, "quantile")
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
	require.NoError(t, c.Validate())

	// Another engine's buckets start the curve over.
	other := w(5, 2)
	other.ITLBounds = []float64{0.01, 0.02, 0.04}
	l.Add(other)
	require.Len(t, l.Curve().Bins, 1)

	// The copy is deep.
	c = l.Curve()
	c.Bins[0].ITL.Counts[0] = 42
	require.NotEqual(t, 42.0, l.Curve().Bins[0].ITL.Counts[0])
}

func TestMergeAndPool(t *testing.T) {
	live := testCurve(testBin(10, 0.99, 1, 100, 500), testBin(20, 0.9, 1, 150, 10))
	cal := testCurve(testBin(20, 0.97, 1, 180, 500), testBin(30, 0.93, 1, 240, 500))
	m, err := live.Merge(cal)
	require.NoError(t, err)
	require.Len(t, m.Bins, 3)
	require.Equal(t, 0.97*500, m.Bins[1].ITL.Counts[1], "a bin live has too little of is the calibration's")
	at, err := m.At(testObjectives)
	require.NoError(t, err)
	require.InDelta(t, 25, at.Running, 1e-9)

	_, err = live.Merge(Curve{ITLBounds: []float64{1, 2, 3}, TTFTBounds: testTTFTBounds, Bins: cal.Bins})
	require.Error(t, err)

	p, skipped := Pool([]Curve{live, cal, {}, {ITLBounds: []float64{9}, Bins: []Bin{testBin(1, 1, 1, 1, 1)}}})
	require.Equal(t, 1, skipped)
	require.Len(t, p.Bins, 3)
	require.Equal(t, 510.0, p.Bins[1].ITL.Count)
	require.NoError(t, p.Validate())
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
		{"wrong version", `{"version":2}`, "version"},
		{"no curve", `{"version":1,"model":"m","replicas":1,"objectives":{"ttft_seconds":2,"itl_seconds":0.05,"quantile":0.95}}`, "empty curve"},
		{"decreasing counts", `{"version":1,"model":"m","replicas":1,"objectives":{"ttft_seconds":2,"itl_seconds":0.05,"quantile":0.95},
			"curve":{"itl_bounds":[0.05,0.1],"ttft_bounds":[1],"bins":[{"running":1,"itl":{"counts":[5,3],"count":5}}]}}`, "decrease"},
		{"negative running", `{"version":1,"model":"m","replicas":1,"objectives":{"ttft_seconds":2,"itl_seconds":0.05,"quantile":0.95},
			"curve":{"itl_bounds":[0.05],"ttft_bounds":[1],"bins":[{"running":-1}]}}`, "negative"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ReadCalibration(strings.NewReader(tc.doc))
			require.ErrorContains(t, err, tc.want)
		})
	}
}

// FuzzReadCalibration: a calibration file is outside input; whatever it
// holds, reading it either fails or yields a curve At can read.
func FuzzReadCalibration(f *testing.F) {
	var buf bytes.Buffer
	c := &Calibration{Version: 1, Model: "m", Replicas: 1, Objectives: ObjectivesJSON{TTFTSeconds: 2, ITLSeconds: 0.05, Quantile: 0.95},
		Curve: testCurve(testBin(10, 0.99, 1, 100, 500), testBin(20, 0.9, 0.9, 150, 500))}
	_ = c.Write(&buf)
	f.Add(buf.Bytes())
	f.Add([]byte(`{"version":1}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := ReadCalibration(bytes.NewReader(data))
		if err != nil {
			return
		}
		at, err := c.Curve.At(testObjectives)
		if err == nil && (at.Running < 0 || math.IsNaN(at.Running) || math.IsNaN(at.OutputTokensPerSec)) {
			t.Fatalf("bad capacity %+v", at)
		}
	})
}

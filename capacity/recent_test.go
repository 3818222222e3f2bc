package capacity

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"
)

// A queue draining after an overload passes through the bins of lighter
// loads; its first tokens waited through the overload and are charged to
// the load they waited under, while its inter-token latencies stay with
// the batch that produced them.
func TestLearnerKeysFirstTokensByTheLoadTheyWaitedUnder(t *testing.T) {
	w := func(running, waiting, within, meanTTFT float64) Window {
		return Window{Seconds: 1, Running: running, Waiting: waiting, OutputTokensPerSec: running * 30,
			TTFTBounds: testTTFTBounds, ITLBounds: testITLBounds,
			ITL:  Histogram{Counts: []float64{0, 100, 100}, Count: 100, Sum: 4},
			TTFT: Histogram{Counts: []float64{within, within, within}, Count: 10, Sum: 10 * meanTTFT}}
	}
	l := NewLearner(0)
	for range 20 {
		l.Add(w(10, 0, 10, 0.2)) // steady: every first token within 1 s
	}
	for range 10 {
		l.Add(w(20, 30, 0, 8)) // overloaded: first tokens after 8 s
	}
	for _, waiting := range []float64{30, 20, 10, 0} {
		l.Add(w(10, waiting, 0, 8)) // the drain, down to the steady load
	}
	c := l.Curve()
	require.NoError(t, c.Validate())
	var ttft, itl float64
	for _, b := range c.Bins {
		ttft += b.TTFT.Count
		itl += b.ITL.Count
	}
	require.InDelta(t, 340, ttft, 1e-9, "every first token is kept")
	ttft = 0
	for _, b := range c.pooled() {
		ttft += b.TTFT.Count
	}
	require.InDelta(t, 340, ttft, 1e-9, "and pooled, with the bins that hold first tokens only")
	require.InDelta(t, 3400, itl, 1e-9)
	steady := c.Bins[0]
	require.InDelta(t, 10, steady.Concurrency, 1e-9)
	require.InDelta(t, 2100, steady.ITL.Count, 1e-9, "the drain's last window decodes a batch of 10")
	require.InDelta(t, 200, steady.TTFT.Count, 1e-9, "its first tokens waited under the overload")
	require.Equal(t, 1.0, steady.TTFT.Within(c.TTFTBounds, 1))
	// The last window's first tokens waited 8 s: 4 s of the drain (40,
	// 30, 20, 10 requests) and 5 s of the overload (50).
	want := binIndex((10 + 20 + 30 + 40 + 5*50) / 9.0)
	var keyed float64
	for _, b := range c.Bins {
		if binIndex(b.Concurrency) == want {
			keyed = b.TTFT.Count
		}
	}
	require.GreaterOrEqual(t, keyed, 10.0)
}

func TestLearnerOutputRate(t *testing.T) {
	type span struct{ seconds, rate, running float64 }
	for _, tc := range []struct {
		name  string
		spans []span
		want  float64
	}{
		{"nothing yet", nil, 0},
		{"bursts average out", func() []span {
			var s []span
			for i := range 60 {
				s = append(s, span{1, 2000 * float64(i%2), 4})
			}
			return s
		}(), 1000},
		{"only the last 30 s", []span{{60, 500, 4}, {30, 1000, 4}}, 1000},
		{"a window straddling the span counts in part", []span{{20, 500, 4}, {15, 1000, 4}}, 750},
		{"one long window", []span{{40, 300, 4}}, 300},
		{"less than the span held", []span{{10, 300, 4}}, 300},
		{"idle windows count", []span{{30, 1000, 4}, {15, 0, 0}}, 500},
		{"garbage counts as nothing", []span{{30, 1000, 4}, {15, math.NaN(), 4}}, 500},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := NewLearner(0)
			for _, s := range tc.spans {
				// Many short windows or one long one: the rate is the same.
				n := max(int(s.seconds), 1)
				if s.seconds <= 2 {
					n = 1
				}
				for range n {
					l.Add(Window{Seconds: s.seconds / float64(n), Running: s.running, OutputTokensPerSec: s.rate,
						TTFTBounds: testTTFTBounds, ITLBounds: testITLBounds})
				}
			}
			require.InDelta(t, tc.want, l.OutputRate(), 1e-6)
		})
	}
	l := NewLearner(0)
	l.Add(Window{Seconds: 30, Running: 3, Waiting: 1, OutputTokensPerSec: 300})
	l.Add(Window{Seconds: 15})
	require.InDelta(t, 2, l.Load(), 1e-9, "the requests in the engine over the span, idle windows included")
	l = NewLearner(0)
	l.Add(Window{Seconds: 40, Running: 4, OutputTokensPerSec: 300})
	require.InDelta(t, 300, l.OutputRate(), 1e-9, "a window longer than the span")
	l.Add(Window{Seconds: 0, Running: 4, OutputTokensPerSec: 900})
	l.Add(Window{Seconds: math.Inf(1), Running: 4, OutputTokensPerSec: 900})
	require.InDelta(t, 300, l.OutputRate(), 1e-9, "windows of no or infinite length are not remembered")
}

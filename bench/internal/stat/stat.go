// Package stat holds the percentile arithmetic the bench's harnesses share.
package stat

import (
	"math"
	"sort"
	"time"
)

// Percentile returns the p-th percentile (0-100) of sorted values by linear
// interpolation between closest ranks (NumPy's default); NaN when empty.
func Percentile(sorted []float64, p float64) float64 {
	n := len(sorted)
	if n == 0 {
		return math.NaN()
	}
	if p <= 0 {
		return sorted[0]
	}
	if p >= 100 {
		return sorted[n-1]
	}
	pos := p / 100 * float64(n-1)
	lo := int(math.Floor(pos))
	hi := min(lo+1, n-1)
	return sorted[lo] + (sorted[hi]-sorted[lo])*(pos-float64(lo))
}

// SortedMillis converts durations to sorted milliseconds, multiplied by
// scale (wall to model time for simulated fleets).
func SortedMillis(ds []time.Duration, scale float64) []float64 {
	out := make([]float64, len(ds))
	for i, d := range ds {
		out[i] = float64(d) / float64(time.Millisecond) * scale
	}
	sort.Float64s(out)
	return out
}

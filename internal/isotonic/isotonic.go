// Package isotonic holds the monotone least-squares fit (pool adjacent
// violators) that the capacity curve and the bench's capacity proof use to
// read noisy measurements against load.
package isotonic

import "math"

// NonIncreasing replaces v by its weighted least-squares non-increasing
// fit (pool adjacent violators).
func NonIncreasing(v, w []float64) {
	type block struct {
		sum, w float64
		n      int
	}
	var st []block
	for i := range v {
		wi := math.Max(w[i], 1e-9)
		st = append(st, block{v[i] * wi, wi, 1})
		for len(st) > 1 {
			a, b := st[len(st)-2], st[len(st)-1]
			if a.sum/a.w >= b.sum/b.w {
				break
			}
			st = append(st[:len(st)-2], block{a.sum + b.sum, a.w + b.w, a.n + b.n})
		}
	}
	i := 0
	for _, b := range st {
		for range b.n {
			v[i] = b.sum / b.w
			i++
		}
	}
}

// NonDecreasing replaces v by its weighted least-squares non-decreasing
// fit.
func NonDecreasing(v, w []float64) {
	for i := range v {
		v[i] = -v[i]
	}
	NonIncreasing(v, w)
	for i := range v {
		v[i] = -v[i]
	}
}

// Unimodal replaces v by its weighted least-squares fit that does not
// decrease up to some point and does not increase after it: the best of
// every split into a non-decreasing and a non-increasing part, each fitted
// alone (n splits of linear fits; meant for the few dozen points of a
// curve).
func Unimodal(v, w []float64) {
	n := len(v)
	best, fit := math.Inf(1), make([]float64, n)
	trial := make([]float64, n)
	for k := 1; k <= n; k++ {
		copy(trial, v)
		NonDecreasing(trial[:k], w[:k])
		NonIncreasing(trial[k:], w[k:])
		var sse float64
		for i := range v {
			d := trial[i] - v[i]
			sse += math.Max(w[i], 1e-9) * d * d
		}
		if sse < best {
			best = sse
			copy(fit, trial)
		}
	}
	copy(v, fit)
}

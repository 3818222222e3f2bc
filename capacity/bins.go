package capacity

import (
	"slices"
	"sort"
)

// between is x moved the share w of the way to y: a mean weighted by
// time, kept within [x, y] where rounding would leave it: the sum form
// (x*wx+y*wy)/(wx+wy) can round two means a hair under 4 up to 4.0, a
// bin equal to the next one, which Validate refuses
// (TestPoolKeepsBinsApart).
func between(x, y, w float64) float64 {
	return min(max(x+(y-x)*w, min(x, y)), max(x, y))
}

func equalBounds(a, b []float64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// pool is pooled for any kind of bin.
func pool[B any](bins []B, readable func(*B) bool, add func(b, o *B), clone func(B) B) []*B {
	var out []*B
	var acc *B
	for i := range bins {
		b := &bins[i]
		if acc == nil {
			if readable(b) {
				out = append(out, b)
				continue
			}
			nb := clone(*b)
			acc = &nb
		} else {
			add(acc, b)
		}
		if readable(acc) {
			out = append(out, acc)
			acc = nil
		}
	}
	if acc != nil && len(out) > 0 {
		last := clone(*out[len(out)-1])
		add(&last, acc)
		out[len(out)-1] = &last
	}
	return out
}

// mergeBins returns live with other's bins added where live has no bin of
// the same index, or one too thin to stand alone (replaced rather than
// mixing two regimes), ascending by index.
func mergeBins[B any](live, other []B, index func(*B) int, readable func(*B) bool, clone func(B) B) []B {
	have := make(map[int]int, len(live))
	for i := range live {
		have[index(&live[i])] = i
	}
	for _, b := range other {
		if i, ok := have[index(&b)]; ok {
			if !readable(&live[i]) {
				live[i] = clone(b)
			}
			continue
		}
		live = append(live, clone(b))
	}
	sort.Slice(live, func(i, j int) bool { return index(&live[i]) < index(&live[j]) })
	return live
}

// binOf returns bins with a bin of index k, b inserted in order where
// there was none, and its position; bins are ascending by index.
func binOf[B any](bins []B, k int, index func(*B) int, b B) ([]B, int) {
	i := sort.Search(len(bins), func(i int) bool { return index(&bins[i]) >= k })
	if i == len(bins) || index(&bins[i]) != k {
		bins = slices.Insert(bins, i, b)
	}
	return bins, i
}

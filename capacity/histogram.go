package capacity

import (
	"errors"
	"math"
)

// Histogram is a cumulative latency histogram on the curve's shared
// bounds: Counts[i] observations at or below the i-th bound, Count all of
// them (observations above the last bound are Count minus the last
// cumulative count).
type Histogram struct {
	Counts []float64 `json:"counts"`
	Count  float64   `json:"count"`
	Sum    float64   `json:"sum"`
}

// Within is the share of observations at or below x, interpolating
// linearly inside the bucket that holds x (as Prometheus'
// histogram_quantile does). 1 for an empty histogram.
func (h *Histogram) Within(bounds []float64, x float64) float64 {
	if h.Count <= 0 {
		return 1
	}
	lo, below := 0.0, 0.0
	for i, b := range bounds {
		if i >= len(h.Counts) {
			break
		}
		c := h.Counts[i]
		if x <= b {
			if b > lo {
				below += (c - below) * (x - lo) / (b - lo)
			}
			return math.Min(below/h.Count, 1)
		}
		lo, below = b, c
	}
	// Past the last bound: the +Inf bucket has no width to interpolate in,
	// so only what is known to be below counts.
	return math.Min(below/h.Count, 1)
}

func (h *Histogram) add(o *Histogram, scale float64) {
	if len(h.Counts) < len(o.Counts) {
		h.Counts = append(h.Counts, make([]float64, len(o.Counts)-len(h.Counts))...)
	}
	for i, c := range o.Counts {
		h.Counts[i] += c * scale
	}
	h.Count += o.Count * scale
	h.Sum += o.Sum * scale
}

func (h *Histogram) scale(f float64) {
	for i := range h.Counts {
		h.Counts[i] *= f
	}
	h.Count *= f
	h.Sum *= f
}

func (h *Histogram) validate(bounds []float64) error {
	if len(h.Counts) > len(bounds) {
		return errors.New("more counts than bounds")
	}
	last := 0.0
	for _, c := range h.Counts {
		if !(c >= last) || math.IsInf(c, 0) {
			return errors.New("cumulative counts decrease or are not finite")
		}
		last = c
	}
	if !(h.Count >= last) || math.IsInf(h.Count, 0) || math.IsNaN(h.Sum) || math.IsInf(h.Sum, 0) {
		return errors.New("count is below the buckets or not finite")
	}
	return nil
}

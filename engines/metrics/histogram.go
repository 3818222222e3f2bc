package metrics

import (
	"bytes"
	"errors"
	"math"
	"strconv"
)

// MaxBuckets bounds the finite buckets kept per histogram: vLLM's and
// SGLang's latency histograms have 19 to 23. A histogram with more keeps
// the first MaxBuckets bounds it meets, which is coarser but still correct
// because buckets are cumulative.
const MaxBuckets = 32

// Histogram is a cumulative latency histogram as the engines expose it:
// Counts[i] observations at or below Bounds[i] (ascending, finite), Count
// and Sum over all of them. Series of one name are summed bucket by bucket,
// so data-parallel ranks behind one endpoint add up. It is a value type
// with fixed arrays so parsing allocates nothing.
type Histogram struct {
	N      int
	Bounds [MaxBuckets]float64
	Counts [MaxBuckets]float64
	Count  float64
	Sum    float64
}

// Empty reports whether the histogram holds no observation.
func (h *Histogram) Empty() bool { return h.Count <= 0 }

// addBucket adds v to the bucket with upper bound le, inserting it in order.
func (h *Histogram) addBucket(le, v float64) {
	i := 0
	for i < h.N && h.Bounds[i] < le {
		i++
	}
	if i < h.N && h.Bounds[i] == le {
		h.Counts[i] += v
		return
	}
	if h.N == MaxBuckets {
		return
	}
	copy(h.Bounds[i+1:h.N+1], h.Bounds[i:h.N])
	copy(h.Counts[i+1:h.N+1], h.Counts[i:h.N])
	h.Bounds[i], h.Counts[i] = le, v
	h.N++
}

// Delta returns h minus prev, the observations made between two scrapes.
// ok is false when the two are not comparable (different buckets) or the
// counts went down (an engine restart); the window then says nothing.
func (h *Histogram) Delta(prev *Histogram) (d Histogram, ok bool) {
	if prev.Count == 0 && prev.N == 0 {
		return *h, true
	}
	if h.N != prev.N || h.Bounds != prev.Bounds || h.Count < prev.Count {
		return Histogram{}, false
	}
	d.N, d.Bounds = h.N, h.Bounds
	for i := range h.N {
		c := h.Counts[i] - prev.Counts[i]
		if c < 0 {
			return Histogram{}, false
		}
		d.Counts[i] = c
	}
	d.Count, d.Sum = h.Count-prev.Count, h.Sum-prev.Sum
	return d, true
}

// histPart says which line of a histogram a series name is.
type histPart uint8

const (
	partBucket histPart = iota
	partSum
	partCount
)

// histogram names the engines' latency histograms (base name without the
// _bucket/_sum/_count suffix). Switching on string(b) does not allocate.
func histogram(s *Signals, base []byte) (*Histogram, string) {
	switch string(base) {
	case "vllm:time_to_first_token_seconds":
		return &s.TTFT, EngineVLLM
	case "sglang:time_to_first_token_seconds":
		return &s.TTFT, EngineSGLang
	case "vllm:inter_token_latency_seconds":
		return &s.ITL, EngineVLLM
	case "sglang:inter_token_latency_seconds":
		return &s.ITL, EngineSGLang
	case "vllm:time_per_output_token_seconds":
		// The older name of the per-token interval; used only when the
		// engine does not expose inter_token_latency (see Parse).
		return &s.tpot, EngineVLLM
	case "sglang:time_per_output_token_seconds":
		return &s.tpot, EngineSGLang
	}
	return nil, ""
}

var (
	suffixBucket = []byte("_bucket")
	suffixSum    = []byte("_sum")
	suffixCount  = []byte("_count")
)

// lookupHistogram matches a histogram line's name.
func lookupHistogram(s *Signals, name []byte) (*Histogram, histPart, string) {
	var part histPart
	switch {
	case bytes.HasSuffix(name, suffixBucket):
		part, name = partBucket, name[:len(name)-len(suffixBucket)]
	case bytes.HasSuffix(name, suffixSum):
		part, name = partSum, name[:len(name)-len(suffixSum)]
	case bytes.HasSuffix(name, suffixCount):
		part, name = partCount, name[:len(name)-len(suffixCount)]
	default:
		return nil, 0, ""
	}
	h, engine := histogram(s, name)
	return h, part, engine
}

var errNoLe = errors.New("histogram bucket without a numeric le label")

// addHistogramLine adds one parsed line to h.
func addHistogramLine(h *Histogram, part histPart, labels []byte, v float64) error {
	switch part {
	case partSum:
		h.Sum += v
	case partCount:
		h.Count += v
	case partBucket:
		le := math.NaN()
		if err := eachLabel(labels, func(k, val []byte) error {
			if string(k) == "le" {
				if string(val) == "+Inf" {
					le = math.Inf(1)
					return nil
				}
				f, err := strconv.ParseFloat(string(val), 64)
				if err != nil {
					return errNoLe
				}
				le = f
			}
			return nil
		}); err != nil {
			return err
		}
		if math.IsNaN(le) || le < 0 {
			return errNoLe
		}
		if !math.IsInf(le, 1) {
			h.addBucket(le, v)
		}
	}
	return nil
}

package capacity

import (
	"errors"
	"fmt"
	"math"
	"sort"

	"github.com/omnious/provider-node/internal/isotonic"
)

// Bin is the engine's behaviour at one load: every scrape window whose
// mean count of requests in the engine (running or waiting) fell in the
// bin, accumulated. Means are weighted by window time.
//
// The key counts waiting requests as well as the batch because an engine
// past what it can admit (KV full, its prefill budget spent) holds its
// batch and grows its queue: keyed by the batch alone, the windows of an
// overload would land among those of a light load and charge their times
// to first token to it. A window's times to first token go to the bin of
// the load they waited under (Learner.queuedLoad), which may be another
// bin than its own.
type Bin struct {
	// Concurrency is the mean number of requests in the engine, running
	// plus waiting: the key.
	Concurrency float64 `json:"concurrency"`
	// Running is the mean number of running requests (the batch size).
	Running float64 `json:"running"`
	// Seconds is the window time accumulated and Windows the number of
	// scrape windows, both decayed with age.
	Seconds float64 `json:"seconds"`
	Windows float64 `json:"windows"`
	// Waiting and KVUsage are the mean queue depth and KV usage (0..1).
	Waiting float64 `json:"waiting"`
	KVUsage float64 `json:"kv_usage"`
	// OutputTokensPerSec and PromptTokensPerSec are the mean token rates.
	OutputTokensPerSec float64 `json:"output_tokens_per_sec"`
	PromptTokensPerSec float64 `json:"prompt_tokens_per_sec"`
	// TTFT and ITL are the latencies observed in the windows.
	TTFT Histogram `json:"ttft"`
	ITL  Histogram `json:"itl"`
}

// Curve is what one engine (or, for calibration, one replica's share of a
// fleet) did at each load it ran: its latency against its load, the
// data the capacity at an objective is read from.
type Curve struct {
	// TTFTBounds and ITLBounds are the histograms' finite bucket bounds in
	// seconds, the engine's own.
	TTFTBounds []float64 `json:"ttft_bounds"`
	ITLBounds  []float64 `json:"itl_bounds"`
	// Bins are ascending by Concurrency; only bins with data are present.
	Bins []Bin `json:"bins"`
	// Prefill is the engine's prefill rate and the traffic's mix, which
	// bound the request rate the curve is read at.
	Prefill Prefill `json:"prefill"`
	// Dispersion is the engine's request count's variance over its mean, measured
	// over the replica's recent busy scrapes: 1 for the Poisson occupancy
	// of independent arrivals, less when a router balances load. 0 means
	// not measured (read as 1). A merged curve keeps the live one's and a
	// pooled one (calibration) has none: calibration's closed loop says
	// nothing about the spread of the market's traffic.
	Dispersion float64 `json:"dispersion,omitempty"`
	// Stall is the inter-token latency against the prefill load,
	// ascending by NewTokensPerSec (StallBin, Curve.StallBound).
	Stall []StallBin `json:"stall,omitempty"`
	// Sustained is the load the engine held against its output rate over
	// spans of busy time, ascending by Concurrency (SustainedBin): the
	// concurrency a quote's rate comes with.
	Sustained []SustainedBin `json:"sustained,omitempty"`
}

// binIndex maps a concurrency to its bin: one bin per request up to 16,
// then bins 1/16 wide (about 6%), so a capacity is read to within a few
// percent at any size.
func binIndex(concurrency float64) int {
	if concurrency < 16 {
		return int(concurrency)
	}
	return 16 + int(math.Log(concurrency/16)/math.Log1p(1.0/16))
}

// addBinWindow forgets the bins by f, then adds the window to the bin of
// its load, its times to first token to the bin of the load they waited
// under (queuedLoad) where that is another.
func (l *Learner) addBinWindow(w *Window, f float64) {
	for i := range l.curve.Bins {
		scaleBin(&l.curve.Bins[i], f)
	}
	conc := w.Running + w.Waiting
	own := *w
	if q := l.queuedLoad(w); binIndex(q) != binIndex(conc) {
		l.bin(q).TTFT.add(&w.TTFT, 1)
		own.TTFT = Histogram{}
	}
	addWindow(l.bin(conc), &own)
}

// queuedLoad is the load the window's first tokens waited under, the key
// of its times to first token: the mean requests in the engine over the
// window and, before it, the window's mean time to first token. A queue
// draining after an overload passes through the bins of lighter loads
// with first tokens that waited through the overload; keyed by the
// window's own load, they would charge to a light load what the overload
// did.
func (l *Learner) queuedLoad(w *Window) float64 {
	wait := 0.0
	if h := &w.TTFT; h.Count > 0 && h.Sum > 0 && !math.IsInf(h.Sum, 0) {
		wait = h.Sum / h.Count
	}
	return l.recent.loadOver(w.Seconds + wait)
}

// bin returns the bin of concurrency c, made empty where there is none.
func (l *Learner) bin(c float64) *Bin {
	k := binIndex(c)
	i := sort.SearchInts(l.idx, k)
	if i == len(l.idx) || l.idx[i] != k {
		l.idx = append(l.idx, 0)
		copy(l.idx[i+1:], l.idx[i:])
		l.idx[i] = k
		l.curve.Bins = append(l.curve.Bins, Bin{})
		copy(l.curve.Bins[i+1:], l.curve.Bins[i:])
		l.curve.Bins[i] = Bin{Concurrency: c}
	}
	return &l.curve.Bins[i]
}

// Clone returns a deep copy.
func (c Curve) Clone() Curve {
	out := Curve{TTFTBounds: append([]float64(nil), c.TTFTBounds...), ITLBounds: append([]float64(nil), c.ITLBounds...),
		Bins: make([]Bin, len(c.Bins)), Dispersion: c.Dispersion, Prefill: c.Prefill}
	for i, b := range c.Bins {
		out.Bins[i] = cloneBin(b)
	}
	if c.Stall != nil {
		out.Stall = make([]StallBin, len(c.Stall))
		for i, b := range c.Stall {
			out.Stall[i] = cloneStall(b)
		}
	}
	out.Sustained = append([]SustainedBin(nil), c.Sustained...)
	return out
}

func addWindow(b *Bin, w *Window) {
	addBin(b, &Bin{Concurrency: w.Running + w.Waiting, Running: w.Running, Seconds: w.Seconds, Windows: 1, Waiting: w.Waiting, KVUsage: w.KVUsage,
		OutputTokensPerSec: w.OutputTokensPerSec, PromptTokensPerSec: w.PromptTokensPerSec, TTFT: w.TTFT, ITL: w.ITL})
}

// addBin adds o's observations to b, its means weighted by window time.
// A bin of no time (first tokens keyed to a load no window of which has
// been seen) adds its observations and leaves the means alone.
func addBin(b, o *Bin) {
	if t := b.Seconds + o.Seconds; t > 0 {
		mean := func(x, y float64) float64 { return between(x, y, o.Seconds/t) }
		b.Concurrency = mean(b.Concurrency, o.Concurrency)
		b.Running = mean(b.Running, o.Running)
		b.Waiting = mean(b.Waiting, o.Waiting)
		b.KVUsage = mean(b.KVUsage, o.KVUsage)
		b.OutputTokensPerSec = mean(b.OutputTokensPerSec, o.OutputTokensPerSec)
		b.PromptTokensPerSec = mean(b.PromptTokensPerSec, o.PromptTokensPerSec)
		b.Seconds = t
	}
	b.Windows += o.Windows
	b.TTFT.add(&o.TTFT, 1)
	b.ITL.add(&o.ITL, 1)
}

func scaleBin(b *Bin, f float64) {
	b.Seconds *= f
	b.Windows *= f
	b.TTFT.scale(f)
	b.ITL.scale(f)
}

// AtObjectives is a curve read at objectives: the most an engine can run
// while the objectives hold.
type AtObjectives struct {
	// Concurrency is the mean number of requests in the engine (running
	// or waiting) at which the first objective stops holding,
	// interpolated between the bins either side, or the load the engine
	// held at the output rate read there (HeldConcurrency) when that is
	// less.
	Concurrency float64 `json:"concurrency"`
	// OutputTokensPerSec and PromptTokensPerSec are the engine's token
	// rates at that concurrency, read from their non-decreasing fits
	// against the load.
	OutputTokensPerSec float64 `json:"output_tokens_per_sec"`
	PromptTokensPerSec float64 `json:"prompt_tokens_per_sec"`
	// Limit names what bounds it: "ttft" or "itl" (that objective breaks
	// there), "measured" (no measured concurrency broke an objective,
	// so the capacity stops where the measurements do: never
	// extrapolated), "prefill" (the rate the engine prefills the mix
	// at, Prefill.Bound), "prefill-itl" (the stalls the mix's prefill
	// puts into decoding, Curve.StallBound), "admission" (the load at
	// which the EPP starts to queue, Curve.AtAdmitted) or "kv" (what the
	// free KV cache takes, BoundKV).
	Limit string `json:"limit"`
	// MaxMeasured is the largest concurrency with enough data.
	MaxMeasured float64 `json:"max_measured"`
	// PrefillBoundTokensPerSec is Prefill.Bound, when measured.
	PrefillBoundTokensPerSec float64 `json:"prefill_bound_tokens_per_sec,omitempty"`
	// StallBoundTokensPerSec is Curve.StallBound, when measured.
	StallBoundTokensPerSec float64 `json:"stall_bound_tokens_per_sec,omitempty"`
	// AdmissionBoundConcurrency and AdmissionBoundTokensPerSec are
	// Curve.AdmissionBound, when read (Curve.AtAdmitted).
	AdmissionBoundConcurrency  float64 `json:"admission_bound_concurrency,omitempty"`
	AdmissionBoundTokensPerSec float64 `json:"admission_bound_tokens_per_sec,omitempty"`
	// KVBoundStreams is the replica's KV bound (BoundKV), when read.
	KVBoundStreams float64 `json:"kv_bound_streams,omitempty"`
	// HeldConcurrency is the load the engine held over its sustained spans
	// at OutputTokensPerSec (Curve.heldAt), when any were measured.
	HeldConcurrency float64 `json:"held_concurrency,omitempty"`
	// Streams is how many requests a client may keep in flight at once,
	// each sent as the last ends, within the objectives: the largest load
	// at which the shares within both objectives, read at that load alone,
	// reach the quantile, at most the load at which the EPP starts to
	// queue (AdmissionBoundConcurrency, read by Curve.AtAdmitted).
	//
	// Such a client holds the load it keeps, so no spread is mixed in,
	// and it cannot outrun the engine's prefill: what it sends past that
	// waits in the engine, in the load the bins are keyed by, so the rate
	// bounds (prefill, prefill-itl) and the held load bound Concurrency,
	// not Streams. Arrivals from many independent clients at
	// OutputTokensPerSec hold fewer (Concurrency): they bunch, and the
	// engine must keep room for their bursts. Read so, Streams is a load
	// the bins themselves held within both objectives, never past the
	// largest load measured (TestCurveAt).
	//
	// Past the crossing a client's further requests wait in the EPP's
	// queue, and that wait is not sold: a saturated pool serves fewer
	// requests a second than at the crossing, so the rate at the crossing
	// does not say how long the queue takes to drain. Streams is at most
	// the crossing (TestAtAdmittedStreams).
	Streams float64 `json:"streams"`
}

// lower scales the capacity down to bound output tokens per second, the
// concurrency and prompt rate with it, naming limit as what bounds it;
// nothing changes when the capacity is already within bound.
func (a *AtObjectives) lower(bound float64, limit string) {
	if a.OutputTokensPerSec > bound {
		f := bound / a.OutputTokensPerSec
		a.Concurrency *= f
		a.OutputTokensPerSec = bound
		a.PromptTokensPerSec *= f
		a.Limit = limit
	}
}

// Limits reported by At.
const (
	LimitTTFT      = "ttft"
	LimitITL       = "itl"
	LimitMeasured  = "measured"
	LimitPrefill   = "prefill"
	LimitStall     = "prefill-itl"
	LimitAdmission = "admission"
)

// MinSamples is the inter-token observations a bin needs before it is
// read, fewer say too little about a 95th percentile; MinWindows the
// scrape windows, so that one window straddling a change of load (its
// mean load between two levels, its first tokens a burst) is not read
// alone. Counted in windows, not seconds: how long a window is depends on
// the scrape interval, and what a straddling window can spoil is its
// share of the bin.
const (
	MinSamples = 100
	MinWindows = 4
)

// readable reports whether the bin has enough data to be read.
func (b *Bin) readable() bool { return b.ITL.Count >= MinSamples && b.Windows >= MinWindows }

// ErrNoData means the curve has no bin with enough observations.
var ErrNoData = errors.New("no load measured with enough observations")

// At reads the curve at the objectives: the largest mean concurrency an
// engine can hold while the objectives hold for its traffic as a whole.
//
// A bin counts once it has MinSamples inter-token observations over
// MinWindows scrape windows; adjacent thinner bins are pooled until they
// do (Curve.pooled). The share of observations within each objective is
// made non-increasing in concurrency (weighted pool-adjacent-violators),
// so one noisy bin cannot make capacity jump, and interpolated linearly
// between bins.
//
// Traffic from many independent clients does not hold the load at its
// mean: a continuously batching engine below saturation serves every
// request at once, so its concurrency is the occupancy of an M/G/infinity
// queue, Poisson distributed around the mean; a router that balances load
// narrows that spread, so the concurrency is modelled as d times a
// Poisson(m/d) count, d the dispersion measured on the replica
// (Curve.Dispersion, 1 when unknown, never above 1). The share within an
// objective at mean m is the mixture of the bins' shares over that
// distribution, inter-token latencies weighted by concurrency (below
// saturation nearly every request runs, and a step of batch k yields k of
// them) and times to first token by arrival. A concurrency above the
// largest measured bin counts as breaking both objectives: the curve is
// never extrapolated, so a mean with real probability of reaching
// unmeasured loads is not sold. The answer is the largest mean at which
// both mixtures reach the quantile, found by bisection (both are
// non-increasing in the mean), scaled down, concurrency with it, where the
// prefill bounds allow fewer output tokens per second (Prefill.Bound for
// times to first token, Curve.StallBound for inter-token latencies).
//
// That mean is a load the engine can hold within the objectives, not one
// an open stream of arrivals at its rate stays at: so the concurrency is
// at most the load the engine held over its sustained spans, within that
// mean, at the output rate read (Curve.heldAt). Streams reads both shares
// at one load, without the mixture, the prefill bounds or the held load
// (AtObjectives.Streams).
func (c Curve) At(o Objectives) (AtObjectives, error) {
	return reading{}.at(c, o, nil, 0)
}

// bound is one of the bounds a reading of a curve applies: an objective
// read from the bins (ttft, itl), the end of the measurements (measured),
// the prefill bounds (prefill, prefill-itl), flow control (admission)
// and the load held at the rate read (held). Each only ever lowers the
// capacity (TestAblation).
type bound uint

const (
	boundTTFT bound = iota
	boundITL
	boundMeasured
	boundPrefill
	boundStall
	boundAdmission
	boundHeld
)

// reading reads a curve with every bound on but those in off. Every
// reading the package exports is the zero reading, all bounds on; only
// tests switch one off, to see what it earns (TestAblation).
type reading struct{ off uint }

// on reports whether the reading applies b.
func (r reading) on(b bound) bool { return r.off&(1<<b) == 0 }

// at is At, and with adm AtAdmitted, as r reads them.
func (r reading) at(c Curve, o Objectives, adm *Admission, pool int) (AtObjectives, error) {
	at, err := r.atObjectives(c, o)
	if err != nil {
		return at, err
	}
	if adm != nil && r.on(boundAdmission) {
		at.admit(c, *adm, o.Quantile, pool)
	}
	if r.on(boundHeld) {
		at.hold(c)
	}
	return at, nil
}

// atObjectives is At before flow control and the held load bound its
// concurrency.
func (r reading) atObjectives(c Curve, o Objectives) (AtObjectives, error) {
	bins := c.pooled()
	if len(bins) == 0 {
		return AtObjectives{}, ErrNoData
	}
	if o.Quantile <= 0 || o.Quantile >= 1 {
		return AtObjectives{}, fmt.Errorf("quantile %v is not in (0, 1)", o.Quantile)
	}
	n := len(bins)
	x := make([]float64, n)
	itl, ttft := make([]float64, n), make([]float64, n)
	wi, wt := make([]float64, n), make([]float64, n)
	for i, b := range bins {
		x[i] = b.Concurrency
		itl[i], wi[i] = b.ITL.Within(c.ITLBounds, o.ITL.Seconds()), b.ITL.Count
		ttft[i], wt[i] = b.TTFT.Within(c.TTFTBounds, o.TTFT.Seconds()), b.TTFT.Count
		if !r.on(boundITL) {
			itl[i] = 1
		}
		if !r.on(boundTTFT) {
			ttft[i] = 1
		}
	}
	isotonic.NonIncreasing(itl, wi)
	isotonic.NonIncreasing(ttft, wt)
	maxMeasured := x[n-1]
	out := AtObjectives{MaxMeasured: maxMeasured}
	// share(k) of a curve at concurrency k; beyond the last bin it is
	// unknown, which counts as 0 unless assumeBeyond says otherwise.
	share := func(s []float64, k float64, beyond float64) float64 {
		switch {
		case k > maxMeasured:
			return beyond
		case k <= x[0]:
			return s[0]
		}
		j := sort.SearchFloat64s(x, k)
		a, b := x[j-1], x[j]
		return s[j-1] + (s[j]-s[j-1])*(k-a)/(b-a)
	}
	// The load is d times a Poisson(m/d) count (readDispersion).
	d := readDispersion(c.Dispersion)
	// mix is the mixture of both shares over that load.
	mix := func(m, beyond float64) (fi, ft float64) {
		var wI, wT float64
		poisson(m/d, func(j int, p float64) {
			kf := d * float64(j)
			fi += p * kf * share(itl, kf, beyond)
			ft += p * share(ttft, kf, beyond)
			wI += p * kf
			wT += p
		})
		if wI > 0 {
			fi /= wI
		} else {
			fi = share(itl, 0, beyond)
		}
		return fi, ft / wT
	}
	// Loads past the measurements count as breaking both objectives.
	beyond := 0.0
	if !r.on(boundMeasured) {
		beyond = 1
	}
	holds := func(m float64) bool {
		fi, ft := mix(m, beyond)
		return fi >= o.Quantile && ft >= o.Quantile
	}
	const smallest = 1e-3
	if !holds(smallest) {
		out.Limit = limitAt(mix, smallest, o.Quantile)
		return out, nil
	}
	lo, hi := bisect(smallest, maxMeasured, holds)
	out.Concurrency = lo
	out.Limit = limitAt(mix, hi, o.Quantile)
	out.OutputTokensPerSec, out.PromptTokensPerSec = ratesAt(bins, lo)
	if bound, ok := c.Prefill.Bound(o); ok && r.on(boundPrefill) {
		out.PrefillBoundTokensPerSec = bound
		out.lower(bound, LimitPrefill)
	}
	if bound, ok := c.StallBound(o); ok && r.on(boundStall) {
		out.StallBoundTokensPerSec = bound
		out.lower(bound, LimitStall)
	}
	// Streams: the shares read at the load alone, as a client's streams
	// hold it.
	steady := func(k float64) bool {
		return share(itl, k, 0) >= o.Quantile && share(ttft, k, 0) >= o.Quantile
	}
	switch {
	case steady(maxMeasured):
		out.Streams = maxMeasured
		return out, nil
	case !steady(smallest):
		return out, nil
	}
	out.Streams, _ = bisect(smallest, maxMeasured, steady)
	return out, nil
}

// bisect narrows [lo, hi] to a thousandth of hi around where ok, true at
// lo and false at hi, turns false.
func bisect(lo, hi float64, ok func(float64) bool) (float64, float64) {
	for hi-lo > 1e-3*max(1, hi) {
		mid := (lo + hi) / 2
		if ok(mid) {
			lo = mid
		} else {
			hi = mid
		}
	}
	return lo, hi
}

// pooled returns the curve's bins with each run of adjacent bins too thin
// to be read alone added together until the sum can be: loads an
// engine visits rarely (the top of its range, the tail of its spread) still
// count with what was measured there rather than as unmeasured. What is
// left at the top too thin even pooled joins the last readable group.
func (c Curve) pooled() []*Bin { return pool(c.Bins, (*Bin).readable, addBin, cloneBin) }

// limitAt names what breaks at mean m: the measured region's ITL or TTFT,
// or, when both would hold if the unmeasured sizes were fine, the end of
// the measurements.
func limitAt(mix func(m, beyond float64) (float64, float64), m, q float64) string {
	fi, ft := mix(m, 1)
	switch {
	case fi >= q && ft >= q:
		return LimitMeasured
	case ft < fi:
		return LimitTTFT
	}
	return LimitITL
}

// poisson calls f with each k whose Poisson(m) probability matters
// (within 8 standard deviations of m) and that probability.
func poisson(m float64, f func(k int, p float64)) {
	if m <= 0 {
		f(0, 1)
		return
	}
	sd := math.Sqrt(m)
	lo, hi := max(0, int(m-8*sd-1)), int(m+8*sd+2)
	lg, _ := math.Lgamma(float64(lo) + 1)
	logp := float64(lo)*math.Log(m) - m - lg
	for k := lo; k <= hi; k++ {
		if k > lo {
			logp += math.Log(m) - math.Log(float64(k))
		}
		f(k, math.Exp(logp))
	}
}

// ratesAt reads the engine's output and prompt token rates at load x from
// their fits against the load, non-decreasing and weighted by each bin's
// time. A continuously batching engine serves more requests at once as its
// load rises, and past saturation its rates hold; a bin's rate is the
// mean of a few windows, and read raw one high bin next to the load a
// quote stops at would sell what its neighbours did not show: it pools
// with the loads after it. A rate that falls under overload pools with
// the lighter loads before it, which reads below the peak, never above
// (TestRatesAt).
func ratesAt(bins []*Bin, x float64) (output, prompt float64) {
	n := len(bins)
	load, out, in, w := make([]float64, n), make([]float64, n), make([]float64, n), make([]float64, n)
	for i, b := range bins {
		load[i], out[i], in[i], w[i] = b.Concurrency, b.OutputTokensPerSec, b.PromptTokensPerSec, b.Seconds
	}
	isotonic.NonDecreasing(out, w)
	isotonic.NonDecreasing(in, w)
	return interpolate(load, out, x), interpolate(load, in, x)
}

// interpolate reads y linearly between the points either side of x (load
// is ascending), from 0 at no load and flat beyond the last point.
func interpolate(load, y []float64, x float64) float64 {
	if x <= load[0] {
		return y[0] * x / load[0]
	}
	for i := 1; i < len(load); i++ {
		if x <= load[i] {
			return y[i-1] + (y[i]-y[i-1])*(x-load[i-1])/(load[i]-load[i-1])
		}
	}
	return y[len(y)-1]
}

// Merge returns c with o's bins added where c has too few observations of
// its own: a replica's live curve over a calibration, so what the engine
// does now wins wherever it has been measured. Bounds must match; a curve
// with other bounds (another engine) is not merged and the error says so.
func (c Curve) Merge(o Curve) (Curve, error) {
	if len(o.Bins) == 0 {
		return c.Clone(), nil
	}
	if len(c.Bins) == 0 {
		out := o.Clone()
		out.Dispersion = c.Dispersion
		out.Prefill = c.Prefill.over(o.Prefill)
		out.Sustained = c.heldOver(o)
		return out, nil
	}
	if !equalBounds(c.TTFTBounds, o.TTFTBounds) || !equalBounds(c.ITLBounds, o.ITLBounds) {
		return c.Clone(), errors.New("curves have different histogram buckets (another engine)")
	}
	out := c.Clone()
	out.Prefill = c.Prefill.over(o.Prefill)
	out.Bins = mergeBins(out.Bins, o.Bins, func(b *Bin) int { return binIndex(b.Concurrency) }, (*Bin).readable, cloneBin)
	out.Stall = mergeBins(out.Stall, o.Stall, func(b *StallBin) int { return stallIndex(b.NewTokensPerSec) }, (*StallBin).readable, cloneStall)
	out.Sustained = c.heldOver(o)
	return out, nil
}

func cloneBin(b Bin) Bin {
	b.TTFT.Counts = append([]float64(nil), b.TTFT.Counts...)
	b.ITL.Counts = append([]float64(nil), b.ITL.Counts...)
	return b
}

// Validate reports whether a curve read from outside (a calibration
// file, the EPP) is well formed: ascending positive bounds, bins ascending
// with finite non-negative values and cumulative counts that do not
// decrease or exceed their totals.
func (c Curve) Validate() error {
	if !(c.Dispersion >= 0) || math.IsInf(c.Dispersion, 0) {
		return errors.New("dispersion is negative or not finite")
	}
	if err := c.Prefill.validate(); err != nil {
		return err
	}
	for _, bs := range [][]float64{c.TTFTBounds, c.ITLBounds} {
		for i, b := range bs {
			if !(b > 0) || math.IsInf(b, 0) || (i > 0 && b <= bs[i-1]) {
				return fmt.Errorf("histogram bounds %v are not ascending positive numbers", bs)
			}
		}
	}
	prev := -1.0
	for i, b := range c.Bins {
		for _, v := range []float64{b.Concurrency, b.Running, b.Seconds, b.Windows, b.Waiting, b.KVUsage, b.OutputTokensPerSec, b.PromptTokensPerSec} {
			if !(v >= 0) || math.IsInf(v, 0) {
				return fmt.Errorf("bin %d has a negative or non-finite value", i)
			}
		}
		if b.Concurrency <= prev {
			return fmt.Errorf("bin %d: concurrencies are not ascending", i)
		}
		prev = b.Concurrency
		for name, h := range map[string]struct {
			h      *Histogram
			bounds []float64
		}{"ttft": {&c.Bins[i].TTFT, c.TTFTBounds}, "itl": {&c.Bins[i].ITL, c.ITLBounds}} {
			if err := h.h.validate(h.bounds); err != nil {
				return fmt.Errorf("bin %d %s: %w", i, name, err)
			}
		}
	}
	if err := validateStall(c.Stall, c.ITLBounds); err != nil {
		return err
	}
	return validateSustained(c.Sustained)
}

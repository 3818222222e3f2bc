package capacity

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"time"

	"github.com/omnious/provider-node/internal/isotonic"
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

// Prefill is what an engine's prefill did, apart from the bins. A curve
// keyed by the requests in the engine cannot see an engine whose prefill
// is its bottleneck: once arrivals need more new prompt tokens per second
// than it computes, its queue grows at whatever concurrency, and a queue
// passing through a bin leaves times to first token there that no steady
// load at that rate would see. So the request rate a curve is read at is
// bounded by the measured prefill rate over the new (uncached) prompt
// tokens each request of the current mix brings (Curve.At).
type Prefill struct {
	// QueuedSeconds, QueuedWindows and QueuedTokens are the time and
	// number of the windows of saturated runs, and the new prompt tokens
	// the engine took into prefill in them: their ratio is its prefill
	// rate. A run is consecutive windows with a request waiting at every
	// scrape and the KV cache below kvRoomy, at least MinWindows of them
	// over minRunSeconds; the engine then spends its token budget on every
	// step. Engines count a prompt's tokens when they admit it, not as
	// they compute them, so a window's own count says little: a long
	// prompt admitted before the window is computed in it uncounted. Over
	// a run those ends cancel on average; selecting windows by a deeper
	// queue at both ends would not, as it picks the windows in which no
	// request was admitted. A queue for want of KV below kvRoomy, or of
	// sequence slots, takes in fewer tokens, which errs on the safe side.
	// Decayed as the bins are.
	QueuedSeconds float64 `json:"queued_seconds"`
	QueuedWindows float64 `json:"queued_windows"`
	QueuedTokens  float64 `json:"queued_tokens"`
	// Requests, NewTokens and OutputTokens are the first tokens, new
	// prompt tokens and output tokens of the busy windows: the mix. They
	// forget faster than the bins, by mixHalfLife of busy time, so that
	// the mix is the current traffic's rather than a calibration run's or
	// yesterday's. Every busy window counts: the engines count a request's
	// prompt when they admit it and the request when its first token
	// comes, so keeping some windows and not others (those of a queue,
	// say) keeps some requests' tokens and other requests' first tokens.
	Requests     float64 `json:"requests"`
	NewTokens    float64 `json:"new_tokens"`
	OutputTokens float64 `json:"output_tokens"`
}

// kvRoomy is the KV usage below which a queue is not for want of KV;
// minRunSeconds the shortest saturated run that counts: long against one
// request's prefill, so that a run's ends matter little, and against the
// instants a request waits for the next step while the engine keeps up.
const (
	kvRoomy       = 0.9
	minRunSeconds = 5
)

// mixHalfLife is how fast the mix forgets, in busy time: a few hundred
// requests at the loads a quote is read at.
const mixHalfLife = 2 * time.Minute

// MinRequests is the first tokens the mix needs before it bounds a curve.
const MinRequests = 20

func (p *Prefill) add(o *Prefill) {
	p.addRate(o)
	p.addMix(o)
}

func (p *Prefill) addRate(o *Prefill) {
	p.QueuedSeconds += o.QueuedSeconds
	p.QueuedWindows += o.QueuedWindows
	p.QueuedTokens += o.QueuedTokens
}

func (p *Prefill) addMix(o *Prefill) {
	p.Requests += o.Requests
	p.NewTokens += o.NewTokens
	p.OutputTokens += o.OutputTokens
}

func (p *Prefill) scaleRate(f float64) {
	p.QueuedSeconds *= f
	p.QueuedWindows *= f
	p.QueuedTokens *= f
}

func (p *Prefill) scaleMix(f float64) {
	p.Requests *= f
	p.NewTokens *= f
	p.OutputTokens *= f
}

// addMixWindow adds a window's mix after forgetting by mixHalfLife over
// its time.
func (p *Prefill) addMixWindow(w *Window) {
	p.scaleMix(math.Exp2(-w.Seconds / mixHalfLife.Seconds()))
	p.Requests += w.FirstTokens
	p.NewTokens += w.newTokens()
	p.OutputTokens += w.OutputTokensPerSec * w.Seconds
}

// prefillRun is a saturated run under way: its windows' rate sums.
type prefillRun struct{ p Prefill }

func (r *prefillRun) add(w *Window) {
	r.p.QueuedSeconds += w.Seconds
	r.p.QueuedWindows++
	r.p.QueuedTokens += w.newTokens()
}

// counts reports whether the run is long enough to measure the rate.
func (r *prefillRun) counts() bool {
	return r.p.QueuedWindows >= MinWindows && r.p.QueuedSeconds >= minRunSeconds
}

// saturated reports whether the window belongs to a saturated run.
func (w *Window) saturated() bool { return w.WaitingMin >= 1 && w.KVUsage < kvRoomy }

func (w *Window) newTokens() float64 { return w.NewPromptTokensPerSec * w.Seconds }

// rateMeasured and mixMeasured report whether each half has enough data.
func (p *Prefill) rateMeasured() bool { return p.QueuedWindows >= MinWindows && p.QueuedSeconds > 0 }
func (p *Prefill) mixMeasured() bool  { return p.Requests >= MinRequests }

// Bound is the output tokens per second an engine can be sold while its
// prefill keeps times to first token within the objective, and whether
// it was measured (both the rate and the mix). With mu the requests per
// second the engine prefills (its rate over the mix's new tokens per
// request), its prefill is taken as one first-come-first-served server, as
// vLLM's and SGLang's schedulers admit waiting requests in order: an
// M/M/1 queue, whose time in system is exponential with rate mu - lambda,
// keeps the quantile within the objective while
//
//	lambda <= mu - ln(1/(1-q)) / TTFT
//
// That lambda times the mix's output tokens per request is the bound; 0
// when even one request alone would miss. A mix with no new tokens (every
// prompt cached) leaves prefill unbounded.
func (p *Prefill) Bound(o Objectives) (tokensPerSec float64, ok bool) {
	if !p.rateMeasured() || !p.mixMeasured() || p.NewTokens <= 0 || o.TTFT <= 0 || o.Quantile <= 0 || o.Quantile >= 1 {
		return 0, false
	}
	rate := p.QueuedTokens / p.QueuedSeconds
	mu := rate / (p.NewTokens / p.Requests)
	lambda := mu - math.Log(1/(1-o.Quantile))/o.TTFT.Seconds()
	b := max(lambda, 0) * p.OutputTokens / p.Requests
	if math.IsNaN(b) || math.IsInf(b, 0) {
		return 0, false
	}
	return b, true
}

// Window is one scrape interval of one engine, the unit a Learner takes.
type Window struct {
	Seconds                   float64
	Running, Waiting, KVUsage float64
	// WaitingMin is the smaller of the waiting counts at the window's two
	// ends.
	WaitingMin float64
	// NewPromptTokensPerSec is the prompt tokens the engine computed
	// (prefix-cache queries minus hits) per second, and FirstTokens the
	// requests whose prefill ended in the window.
	NewPromptTokensPerSec float64
	FirstTokens           float64
	// ConcurrencyNow is the engine's running plus waiting count at the
	// window's end, one sample of the load's spread.
	ConcurrencyNow        float64
	OutputTokensPerSec    float64
	PromptTokensPerSec    float64
	TTFTBounds, ITLBounds []float64
	TTFT, ITL             Histogram
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

// Learner accumulates an engine's windows into a Curve, forgetting with a
// half-life counted in busy time, so the curve follows the current
// prompt/output mix and an idle engine keeps what it last learnt. It is
// not safe for concurrent use.
type Learner struct {
	halfLife time.Duration
	curve    Curve
	idx      []int // bin index of curve.Bins[i]
	// mean and sq are exponentially weighted moments of ConcurrencyNow over
	// the last dispersionSamples busy scrapes; n counts them up to that.
	mean, sq float64
	n        int
	run      prefillRun // the saturated run under way, if any
	// prefillLoad is the new-token rate averaged over stallSmoothing, the
	// key of the window's stall bin.
	prefillLoad float64
	recent      recent
	span        SustainedBin // the sustained span under way
}

// dispersionSamples is how many recent busy scrapes the load's spread is
// measured over: enough for a variance, few enough to follow the load.
const dispersionSamples = 32

// NewLearner returns a learner whose data halves every halfLife of busy
// time (0: never forgets).
func NewLearner(halfLife time.Duration) *Learner {
	return &Learner{halfLife: halfLife}
}

// Add records one window. Idle windows (no request in the engine) carry
// no latency-versus-load information and are dropped, as are windows whose
// histogram buckets differ from the curve's (the engine was replaced): the
// curve then starts over.
func (l *Learner) Add(w Window) {
	if w.Seconds > 0 && !math.IsInf(w.Seconds, 0) {
		if x := w.NewPromptTokensPerSec; x >= 0 && !math.IsInf(x, 0) {
			l.prefillLoad += -math.Expm1(-w.Seconds/stallSmoothing.Seconds()) * (x - l.prefillLoad)
		}
		l.recent.add(&w)
	}
	conc := w.Running + w.Waiting
	if w.Seconds <= 0 || w.Running < 0 || w.Waiting < 0 || !(conc > 0) || math.IsInf(conc, 0) {
		if conc == 0 {
			l.endRun() // idle: no queue
		}
		return
	}
	if !equalBounds(l.curve.TTFTBounds, w.TTFTBounds) || !equalBounds(l.curve.ITLBounds, w.ITLBounds) {
		l.curve = Curve{TTFTBounds: append([]float64(nil), w.TTFTBounds...), ITLBounds: append([]float64(nil), w.ITLBounds...)}
		l.idx = l.idx[:0]
		l.run = prefillRun{}
		l.span = SustainedBin{}
	}
	if l.halfLife > 0 {
		f := math.Exp2(-w.Seconds / l.halfLife.Seconds())
		for i := range l.curve.Bins {
			scaleBin(&l.curve.Bins[i], f)
		}
		for i := range l.curve.Stall {
			scaleStall(&l.curve.Stall[i], f)
		}
		l.curve.Prefill.scaleRate(f)
	}
	if w.saturated() {
		l.run.add(&w)
	} else {
		l.endRun()
	}
	l.curve.Prefill.addMixWindow(&w)
	l.addSustainedWindow(&w)
	if x := w.ConcurrencyNow; x >= 0 && !math.IsNaN(x) && !math.IsInf(x, 0) {
		l.n = min(l.n+1, dispersionSamples)
		a := 1 / float64(l.n)
		l.mean += a * (x - l.mean)
		l.sq += a * (x*x - l.sq)
	}
	if q := l.queuedLoad(&w); binIndex(q) != binIndex(conc) {
		l.bin(q).TTFT.add(&w.TTFT, 1)
		w.TTFT = Histogram{}
	}
	addWindow(l.bin(conc), &w)
	l.curve.addStallWindow(&w, l.prefillLoad)
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

// endRun ends the saturated run under way, which measures the prefill
// rate if it lasted long enough.
func (l *Learner) endRun() {
	if l.run.counts() {
		l.curve.Prefill.addRate(&l.run.p)
	}
	l.run = prefillRun{}
}

// Curve returns a copy of what has been learnt, with the dispersion of
// the recent busy scrapes once there are enough of them and a saturated
// run under way that counts already.
func (l *Learner) Curve() Curve {
	c := l.curve.Clone()
	c.Dispersion = l.Summary().Dispersion
	if l.run.counts() {
		c.Prefill.addRate(&l.run.p)
	}
	return c
}

// OutputRate is the engine's output tokens per second over its last
// RateSpan of scrapes, idle ones included.
func (l *Learner) OutputRate() float64 { return l.recent.rate() }

// Load is the mean number of requests in the engine, running or waiting,
// over the last RateSpan of scrapes, idle ones included.
func (l *Learner) Load() float64 { return l.recent.loadOver(RateSpan.Seconds()) }

// Summary is what a learner has, for its metrics.
type Summary struct {
	// Largest is the largest concurrency a bin has enough data to be read
	// at; Dispersion what Curve would report (0 when not measured);
	// PrefillTokensPerSec the prefill rate measured while requests were
	// queued (0 when not measured).
	Largest, Dispersion, PrefillTokensPerSec float64
}

// Summary is what the learner has, without copying its curve.
func (l *Learner) Summary() Summary {
	var s Summary
	if bins := l.curve.pooled(); len(bins) > 0 {
		s.Largest = bins[len(bins)-1].Concurrency
	}
	if l.n >= dispersionSamples/2 && l.mean >= 1 {
		s.Dispersion = max(l.sq-l.mean*l.mean, 0) / l.mean
	}
	p := l.curve.Prefill
	if l.run.counts() {
		p.addRate(&l.run.p)
	}
	if p.rateMeasured() {
		s.PrefillTokensPerSec = p.QueuedTokens / p.QueuedSeconds
	}
	return s
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

// between is x moved the share w of the way to y: a mean weighted by
// time, kept within [x, y] where rounding would leave it. The sum form
// (x*wx+y*wy)/(wx+wy) turned two windows of a hair under 4 into 4.0, a
// bin equal to the next one, and a pooled curve that failed Validate.
func between(x, y, w float64) float64 {
	return min(max(x+(y-x)*w, min(x, y)), max(x, y))
}

func scaleBin(b *Bin, f float64) {
	b.Seconds *= f
	b.Windows *= f
	b.TTFT.scale(f)
	b.ITL.scale(f)
}

func (h *Histogram) scale(f float64) {
	for i := range h.Counts {
		h.Counts[i] *= f
	}
	h.Count *= f
	h.Sum *= f
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
	// engine must keep room for their bursts. Read so, Streams is still
	// on the safe side of a closed loop: on a Mooncake proof (moon33 in
	// quoter/PROOFS.md) the replicas read 11.0 to 20.1 streams, 106.3
	// for the fleet, against a closed-loop edge of 109.5 (106 streams
	// held 2 of 3 steps, 111 broke 2 of 3).
	//
	// Past the crossing a client's further requests wait in the EPP's
	// queue, and that wait is not sold: a saturated pool serves fewer
	// requests a second than at the crossing (on a demo proof, 38 to 41
	// QPS with 81 to 98 streams against 54 at 65, its prefix hits down
	// from 0.89 to 0.69 to 0.72), so the rate at the crossing does not say
	// how long the queue takes to drain.
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
	at, err := c.atObjectives(o)
	if err == nil {
		at.hold(c)
	}
	return at, err
}

// atObjectives is At before the held load bounds its concurrency.
func (c Curve) atObjectives(o Objectives) (AtObjectives, error) {
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
	// The load is d times a Poisson(m/d) count: mean m, variance d*m.
	// d is at most 1: a measured spread wider than Poisson comes mostly
	// from the load changing under the measurement (a step ending, a
	// queue draining), and read as such it sold half the capacity in the
	// bench's proof. It is at least 0.25, so a noisy estimate cannot make
	// the load look steadier than a router could hold it.
	d := c.Dispersion
	if !(d > 0) || math.IsInf(d, 0) {
		d = 1
	}
	d = min(max(d, 0.25), 1)
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
	holds := func(m float64) bool {
		fi, ft := mix(m, 0)
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
	if bound, ok := c.Prefill.Bound(o); ok {
		out.PrefillBoundTokensPerSec = bound
		out.lower(bound, LimitPrefill)
	}
	if bound, ok := c.StallBound(o); ok {
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
// quote stops at sold what its neighbours did not show (a demo replica:
// 694 output tokens/s at 18.8 requests between 615 at 17.4 and 637 at
// 19.9). A rate that falls under overload pools with the lighter loads
// before it, which reads below the peak, never above.
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

// over is p with each half o has and p has not measured taken from o.
func (p Prefill) over(o Prefill) Prefill {
	if !p.rateMeasured() {
		p.QueuedSeconds, p.QueuedWindows, p.QueuedTokens = o.QueuedSeconds, o.QueuedWindows, o.QueuedTokens
	}
	if !p.mixMeasured() {
		p.Requests, p.NewTokens, p.OutputTokens = o.Requests, o.NewTokens, o.OutputTokens
	}
	return p
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
	p := c.Prefill
	for _, v := range []float64{p.QueuedSeconds, p.QueuedWindows, p.QueuedTokens, p.Requests, p.NewTokens, p.OutputTokens} {
		if !(v >= 0) || math.IsInf(v, 0) {
			return errors.New("prefill has a negative or non-finite value")
		}
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
	prev = -1
	for i, b := range c.Stall {
		for _, v := range []float64{b.NewTokensPerSec, b.Seconds, b.Windows} {
			if !(v >= 0) || math.IsInf(v, 0) {
				return fmt.Errorf("stall bin %d has a negative or non-finite value", i)
			}
		}
		if b.NewTokensPerSec <= prev {
			return fmt.Errorf("stall bin %d: new-token rates are not ascending", i)
		}
		prev = b.NewTokensPerSec
		if err := c.Stall[i].ITL.validate(c.ITLBounds); err != nil {
			return fmt.Errorf("stall bin %d itl: %w", i, err)
		}
	}
	prev = -1
	for i, b := range c.Sustained {
		for _, v := range []float64{b.Concurrency, b.OutputTokensPerSec, b.Seconds, b.Spans} {
			if !(v >= 0) || math.IsInf(v, 0) {
				return fmt.Errorf("sustained bin %d has a negative or non-finite value", i)
			}
		}
		if b.Concurrency <= prev {
			return fmt.Errorf("sustained bin %d: concurrencies are not ascending", i)
		}
		prev = b.Concurrency
	}
	return nil
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

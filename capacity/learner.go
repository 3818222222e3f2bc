package capacity

import (
	"math"
	"time"
)

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

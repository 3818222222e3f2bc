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
	// The estimators' state under way, apart from what curve holds.
	run         prefillRun   // the saturated run under way, if any
	span        SustainedBin // the sustained span under way
	prefillLoad float64      // the new-token rate stall bins are keyed by
	dispersion  dispersion
	recent      recent
}

// NewLearner returns a learner whose data halves every halfLife of busy
// time (0: never forgets).
func NewLearner(halfLife time.Duration) *Learner {
	return &Learner{halfLife: halfLife}
}

// Add records one window. Idle windows (no request in the engine) carry
// no latency-versus-load information and are dropped, as are windows whose
// histogram buckets differ from the curve's (the engine was replaced): the
// curve then starts over. A window with a figure that is not finite (a NaN
// or an infinity scraped from a broken exposition) still passes its time
// in the recent rates, as time with nothing counted, but is not evidence
// for the curve: it cannot poison what was learnt (TestAddNonFinite).
func (l *Learner) Add(w Window) {
	if w.Seconds > 0 && !math.IsInf(w.Seconds, 0) {
		l.addPrefillLoad(&w) // the new-token rate stalls are keyed by
		l.recent.add(&w)     // the last windows' loads and output rates
	}
	conc := w.Running + w.Waiting
	if !w.finite() || w.Seconds <= 0 || w.Running < 0 || w.Waiting < 0 || !(conc > 0) {
		if conc == 0 {
			l.endRun() // idle: no queue
		}
		return
	}
	if !equalBounds(l.curve.TTFTBounds, w.TTFTBounds) || !equalBounds(l.curve.ITLBounds, w.ITLBounds) {
		l.reset(&w)
	}
	f := l.forget(w.Seconds)
	l.addRunWindow(&w, f)              // the prefill rate, over saturated runs
	l.curve.Prefill.addMixWindow(&w)   // the mix: tokens a request brings and yields
	l.addSustainedWindow(&w)           // the load held at an output rate over spans
	l.dispersion.add(w.ConcurrencyNow) // the spread of the load around its mean
	l.addBinWindow(&w, f)              // the latencies at each load
	l.addStallWindow(&w, f)            // the inter-token latency at each prefill load
}

// finite reports whether every figure of w is a finite number; the
// buckets' bounds may end in +Inf and are not figures.
func (w *Window) finite() bool {
	for _, v := range [...]float64{w.Seconds, w.Running, w.Waiting, w.KVUsage, w.WaitingMin,
		w.NewPromptTokensPerSec, w.FirstTokens, w.ConcurrencyNow, w.OutputTokensPerSec,
		w.PromptTokensPerSec, w.TTFT.Count, w.TTFT.Sum, w.ITL.Count, w.ITL.Sum} {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return false
		}
	}
	for _, h := range [...]*Histogram{&w.TTFT, &w.ITL} {
		for _, v := range h.Counts {
			if math.IsNaN(v) || math.IsInf(v, 0) {
				return false
			}
		}
	}
	return true
}

// reset starts the curve over on w's histogram buckets, another engine's:
// its latencies are not this one's. The load's spread, the smoothed
// prefill load and the recent windows are the engine's traffic, not its
// latencies, and stay.
func (l *Learner) reset(w *Window) {
	l.curve = Curve{TTFTBounds: append([]float64(nil), w.TTFTBounds...), ITLBounds: append([]float64(nil), w.ITLBounds...)}
	l.idx = l.idx[:0]
	l.run = prefillRun{}
	l.span = SustainedBin{}
}

// forget is the factor the bins, the stall bins and the prefill rate keep
// over seconds of busy time: they halve every halfLife, and never forget
// when it is 0.
func (l *Learner) forget(seconds float64) float64 {
	if l.halfLife <= 0 {
		return 1
	}
	return math.Exp2(-seconds / l.halfLife.Seconds())
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
	s.Dispersion = l.dispersion.value()
	p := l.curve.Prefill
	if l.run.counts() {
		p.addRate(&l.run.p)
	}
	if p.rateMeasured() {
		s.PrefillTokensPerSec = p.QueuedTokens / p.QueuedSeconds
	}
	return s
}

package capacity

import (
	"errors"
	"math"
	"time"
)

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

// addRunWindow forgets the prefill rate by f, then adds the window to
// the saturated run under way, or ends the run when the window is not
// saturated.
func (l *Learner) addRunWindow(w *Window, f float64) {
	l.curve.Prefill.scaleRate(f)
	if w.saturated() {
		l.run.add(w)
	} else {
		l.endRun()
	}
}

// endRun ends the saturated run under way, which measures the prefill
// rate if it lasted long enough.
func (l *Learner) endRun() {
	if l.run.counts() {
		l.curve.Prefill.addRate(&l.run.p)
	}
	l.run = prefillRun{}
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

// validate reports a negative or non-finite sum (Curve.Validate).
func (p *Prefill) validate() error {
	for _, v := range []float64{p.QueuedSeconds, p.QueuedWindows, p.QueuedTokens, p.Requests, p.NewTokens, p.OutputTokens} {
		if !(v >= 0) || math.IsInf(v, 0) {
			return errors.New("prefill has a negative or non-finite value")
		}
	}
	return nil
}

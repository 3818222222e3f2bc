package capacity

import (
	"fmt"
	"math"
	"time"

	"github.com/omnious/provider-node/internal/isotonic"
)

// SustainedBin is what an engine held and produced over spans of
// sustainSpan of busy time whose mean load fell in the bin: the load that
// went with an output rate while the traffic ran, not for one window.
//
// The concurrency bins key each scrape window by the load in it, and a
// window's load is as often a queue forming or draining as a load the
// traffic holds. Read at the objectives, they say how much load an engine
// can hold for a moment; an open stream of arrivals at the rate that
// load produces does not stay there but queues. How many requests such
// arrivals keep in flight at a rate is what the engine held over spans
// long enough for those moments to come and go (Curve.heldAt): the
// capacity's Concurrency, where Streams is what a client holding its
// requests open may hold (TestAtHoldsTheSustainedLoad).
type SustainedBin struct {
	// Concurrency is the mean number of requests in the engine over the
	// spans, running or waiting: the key. OutputTokensPerSec is the mean
	// output rate over the same time.
	Concurrency        float64 `json:"concurrency"`
	OutputTokensPerSec float64 `json:"output_tokens_per_sec"`
	// Seconds and Spans are the time and spans accumulated, decayed as
	// the mix is: the load that goes with a rate is the current traffic's.
	Seconds float64 `json:"seconds"`
	Spans   float64 `json:"spans"`
}

// sustainSpan is the busy time a sustained point averages over: long
// against a request's life (seconds), so that the queues a steady stream
// of arrivals forms and drains come and go within it; short against how
// long a level of traffic holds, so that few spans straddle two.
const sustainSpan = 15 * time.Second

func addSustained(b, o *SustainedBin) {
	t := b.Seconds + o.Seconds
	if t <= 0 {
		return
	}
	b.Concurrency = between(b.Concurrency, o.Concurrency, o.Seconds/t)
	b.OutputTokensPerSec = between(b.OutputTokensPerSec, o.OutputTokensPerSec, o.Seconds/t)
	b.Seconds = t
	b.Spans += o.Spans
}

func cloneSustained(b SustainedBin) SustainedBin { return b }

// heldOver is c's spans, or o's where c has none: the load that goes with
// a rate is one mix's, so a replica's own spans are not mixed with a
// calibration run's.
func (c Curve) heldOver(o Curve) []SustainedBin {
	if len(c.Sustained) > 0 {
		return append([]SustainedBin(nil), c.Sustained...)
	}
	return append([]SustainedBin(nil), o.Sustained...)
}

// addSustainedWindow adds a busy window to the span under way, and the
// span to the curve once it is long enough, after forgetting by
// mixHalfLife over the window's time.
func (l *Learner) addSustainedWindow(w *Window) {
	f := math.Exp2(-w.Seconds / mixHalfLife.Seconds())
	for i := range l.curve.Sustained {
		b := &l.curve.Sustained[i]
		b.Seconds *= f
		b.Spans *= f
	}
	addSustained(&l.span, &SustainedBin{Concurrency: w.Running + w.Waiting, OutputTokensPerSec: orZero(w.OutputTokensPerSec), Seconds: w.Seconds})
	if l.span.Seconds < sustainSpan.Seconds() {
		return
	}
	s := l.span
	s.Spans = 1
	l.span = SustainedBin{}
	var i int
	l.curve.Sustained, i = binOf(l.curve.Sustained, binIndex(s.Concurrency), func(b *SustainedBin) int { return binIndex(b.Concurrency) }, SustainedBin{})
	addSustained(&l.curve.Sustained[i], &s)
}

// heldAt is the mean load at which the engine has held output rate r
// with at most upTo requests in it, and whether anything was held. An
// engine's rate rises with its load up to saturation and may fall past it
// (a queue for KV, prompts evicted and prefilled again): the spans' rates
// are fitted so (least squares, rising then falling, weighted by time)
// and the lightest load at which the fit reaches r is read, interpolated
// from the span before and from no load at no rate. Fitted through every
// span, the slower overload would pool with the saturated loads before it
// and push the reading onto the overload; read from the fastest spans
// alone, one that happened to run fast reads too light a load. Spans past
// upTo (the load the capacity stops at) are left out: there the engine
// ran a queue the capacity does not sell, its batch full and its rate on
// the plateau, and where a full batch ran faster than the saturated spans
// the fit would rise through them and read the overload's load for a
// rate the engine held with far fewer (TestHeldAt). Past the fastest
// rate held the load is the peak's scaled up in proportion: no request
// takes longer than it did there, which reads fewer than a fuller engine
// would hold, the side a promise errs on. Spans forgotten to less than
// minHeldSpans are another mix's and left out.
func (c Curve) heldAt(r, upTo float64) (float64, bool) {
	if !(r > 0) || math.IsInf(r, 0) {
		return 0, false
	}
	var load, out, w []float64
	for _, b := range c.Sustained {
		if b.Spans >= minHeldSpans && b.Concurrency <= upTo {
			load, out, w = append(load, b.Concurrency), append(out, b.OutputTokensPerSec), append(w, b.Seconds)
		}
	}
	isotonic.Unimodal(out, w)
	// x0 is the last load read, y0 the fit there, xp the peak's load and
	// yp its rate.
	var x0, y0, xp, yp float64
	for i, x := range load {
		if out[i] >= r {
			return x0 + (x-x0)*(r-y0)/(out[i]-y0), true
		}
		x0, y0 = x, out[i]
		if y0 > yp {
			xp, yp = x0, y0
		}
	}
	if !(yp > 0) {
		return 0, false
	}
	return xp * r / yp, true
}

// minHeldSpans is the weight below which a sustained bin is forgotten:
// four half-lives of the mix, 8 minutes of busy time since it was held.
const minHeldSpans = 1.0 / 16

// hold bounds the capacity's concurrency by the load the engine held at
// its output rate within that concurrency (Curve.heldAt); the rate stays
// as read.
func (a *AtObjectives) hold(c Curve) {
	if held, ok := c.heldAt(a.OutputTokensPerSec, a.Concurrency); ok {
		a.HeldConcurrency = held
		a.Concurrency = min(a.Concurrency, held)
	}
}

// validateSustained reports sustained bins that are not ascending by
// load with finite non-negative values (Curve.Validate).
func validateSustained(held []SustainedBin) error {
	prev := -1.0
	for i, b := range held {
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

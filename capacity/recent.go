package capacity

import (
	"math"
	"time"
)

// recent is a learner's last scrape windows, newest last, for what one
// window's own numbers cannot say: the load its first tokens waited under,
// and the output rate of the load over longer than a scrape.
type recent struct {
	w    [recentWindows]recentWindow
	next int // where the next window goes
	n    int // windows held, up to recentWindows
}

type recentWindow struct {
	seconds float64
	load    float64 // mean requests in the engine, running or waiting
	tokens  float64 // output tokens
}

// recentWindows bounds the history: busyRateSpan and a long queue's wait
// at scrape intervals down to a few hundred milliseconds.
const recentWindows = 256

// busyRateSpan is what the load's output rate is averaged over. A quote
// holds for minutes, and one scrape window's rate swings by half or more
// on a mix of long prompts, whose prefill stalls every decoding request
// in turn: the headroom left beside a load is its capacity minus the
// load's sustained rate, while its burst is bounded by the requests it
// holds.
const busyRateSpan = 30 * time.Second

func (r *recent) add(w *Window) {
	load := w.Running + w.Waiting
	if !(load >= 0) || math.IsInf(load, 0) {
		load = 0
	}
	tokens := w.OutputTokensPerSec * w.Seconds
	if !(tokens >= 0) || math.IsInf(tokens, 0) {
		tokens = 0
	}
	r.w[r.next] = recentWindow{seconds: w.Seconds, load: load, tokens: tokens}
	r.next = (r.next + 1) % recentWindows
	r.n = min(r.n+1, recentWindows)
}

// back calls f with each window from the newest, and the share of it
// within span seconds of the newest's end, until span is covered.
func (r *recent) back(span float64, f func(w *recentWindow, share float64)) {
	for i := range r.n {
		w := &r.w[(r.next-1-i+2*recentWindows)%recentWindows]
		if w.seconds >= span {
			f(w, span/w.seconds)
			return
		}
		f(w, 1)
		span -= w.seconds
	}
}

// loadOver is the mean load over the last span seconds.
func (r *recent) loadOver(span float64) float64 {
	var t, sum float64
	r.back(span, func(w *recentWindow, share float64) {
		t += w.seconds * share
		sum += w.load * w.seconds * share
	})
	if t <= 0 {
		return 0
	}
	return sum / t
}

// rate is the output tokens per second over the last busyRateSpan, or
// over what is held when that is less.
func (r *recent) rate() float64 {
	var t, sum float64
	r.back(busyRateSpan.Seconds(), func(w *recentWindow, share float64) {
		t += w.seconds * share
		sum += w.tokens * share
	})
	if t <= 0 {
		return 0
	}
	return sum / t
}

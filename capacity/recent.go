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
	rate    float64 // output tokens per second
}

// recentWindows bounds the history: RateSpan and a long queue's wait
// at scrape intervals down to a few hundred milliseconds.
const recentWindows = 256

// RateSpan is what the load's output rate is averaged over, in wall time
// (the scrapes'). A quote holds for minutes, and one scrape window's rate
// swings by half or more on a mix of long prompts, whose prefill stalls
// every decoding request in turn: the headroom left beside a load is its
// capacity minus the load's sustained rate, while its burst is bounded by
// the requests it holds.
const RateSpan = 30 * time.Second

func (r *recent) add(w *Window) {
	r.w[r.next] = recentWindow{seconds: w.Seconds, load: orZero(w.Running + w.Waiting), rate: orZero(w.OutputTokensPerSec)}
	r.next = (r.next + 1) % recentWindows
	r.n = min(r.n+1, recentWindows)
}

// orZero is x, or 0 where x is negative or not finite.
func orZero(x float64) float64 {
	if !(x >= 0) || math.IsInf(x, 0) {
		return 0
	}
	return x
}

// mean is v's mean over the windows of the last span seconds, weighted
// by their time within it, or over what is held when that is less.
func (r *recent) mean(span float64, v func(*recentWindow) float64) float64 {
	var t, sum float64
	for i := range r.n {
		w := &r.w[(r.next-1-i+recentWindows)%recentWindows]
		in := min(w.seconds, span)
		t += in
		sum += v(w) * in
		if span -= in; span <= 0 {
			break
		}
	}
	if t <= 0 {
		return 0
	}
	return sum / t
}

// loadOver is the mean load over the last span seconds.
func (r *recent) loadOver(span float64) float64 {
	return r.mean(span, func(w *recentWindow) float64 { return w.load })
}

// rate is the output tokens per second over the last RateSpan.
func (r *recent) rate() float64 {
	return r.mean(RateSpan.Seconds(), func(w *recentWindow) float64 { return w.rate })
}

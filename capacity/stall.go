package capacity

import (
	"fmt"
	"math"
	"sort"
	"time"

	"github.com/omnious/provider-node/internal/isotonic"
)

// StallBin is the inter-token latency an engine's decoding saw while it
// prefilled new prompt tokens at one rate: every scrape window whose
// smoothed new-token rate fell in the bin, accumulated.
//
// A chunked-prefill engine (vLLM) puts a prompt's chunk into the step that
// decodes the batch, and an engine that alternates (SGLang) runs it
// between two decode steps: either way every request decoding waits for
// the prefill, once per step that carries some. Those gaps are the tail of
// the inter-token latency, and how many there are follows the new prompt
// tokens the engine computes per second, not the requests it holds: the
// same batch decodes at its own pace with nothing to prefill and stalls
// behind every chunk of a long prompt. The concurrency bins cannot tell
// the two apart (a queue draining, with nothing new to prefill, runs the
// batch of a steady load that prefills all the time), so this second
// curve keys the inter-token latency by the prefill load.
type StallBin struct {
	// NewTokensPerSec is the bin's mean smoothed new-token rate, weighted
	// by window time: the key.
	NewTokensPerSec float64 `json:"new_tokens_per_sec"`
	// Seconds and Windows are the window time and scrape windows
	// accumulated, decayed as the concurrency bins are.
	Seconds float64 `json:"seconds"`
	Windows float64 `json:"windows"`
	// ITL is the inter-token latencies observed in the windows.
	ITL Histogram `json:"itl"`
}

// stallSmoothing is the time constant of the moving average a window's
// new-token rate is keyed by. Engines count a prompt's tokens when they
// admit it, and its prefill then stalls the batch for as long as it takes:
// seconds for one long prompt, over ten for the longest prompts of
// long-context traffic. Averaged over about as long as the longest, the
// rate a window is keyed by counts the prompts stalling it, not a burst
// of admissions in one window and none in the next.
const stallSmoothing = 15 * time.Second

// stallIndex maps a smoothed new-token rate to its bin: bins 1/16 wide
// (about 6%) from 64 tokens/s, everything below in bin 0, so the break is
// read to within a few percent whatever the engine's prefill rate.
func stallIndex(tokensPerSec float64) int {
	if !(tokensPerSec >= 64) {
		return 0
	}
	return 1 + int(math.Log(tokensPerSec/64)/math.Log1p(1.0/16))
}

func (b *StallBin) readable() bool { return b.ITL.Count >= MinSamples && b.Windows >= MinWindows }

// addStall adds o's observations to b, as addBin does: one of no time
// adds its observations and leaves the mean rate alone.
func addStall(b, o *StallBin) {
	if t := b.Seconds + o.Seconds; t > 0 {
		b.NewTokensPerSec = between(b.NewTokensPerSec, o.NewTokensPerSec, o.Seconds/t)
		b.Seconds = t
	}
	b.Windows += o.Windows
	b.ITL.add(&o.ITL, 1)
}

func scaleStall(b *StallBin, f float64) {
	b.Seconds *= f
	b.Windows *= f
	b.ITL.scale(f)
}

func cloneStall(b StallBin) StallBin {
	b.ITL.Counts = append([]float64(nil), b.ITL.Counts...)
	return b
}

// addPrefillLoad moves the smoothed new-token rate, the key of the
// window's stall bin, towards the window's over stallSmoothing.
func (l *Learner) addPrefillLoad(w *Window) {
	if x := w.NewPromptTokensPerSec; x >= 0 && !math.IsInf(x, 0) {
		l.prefillLoad += -math.Expm1(-w.Seconds/stallSmoothing.Seconds()) * (x - l.prefillLoad)
	}
}

// addStallWindow forgets the stall bins by f, then adds a window's
// inter-token latencies to the stall bin of the smoothed new-token rate.
func (l *Learner) addStallWindow(w *Window, f float64) {
	for i := range l.curve.Stall {
		scaleStall(&l.curve.Stall[i], f)
	}
	if w.ITL.Count <= 0 {
		return
	}
	x := l.prefillLoad
	var i int
	l.curve.Stall, i = binOf(l.curve.Stall, stallIndex(x), func(b *StallBin) int { return stallIndex(b.NewTokensPerSec) }, StallBin{NewTokensPerSec: x})
	addStall(&l.curve.Stall[i], &StallBin{NewTokensPerSec: x, Seconds: w.Seconds, Windows: 1, ITL: w.ITL})
}

// StallBound is the output tokens per second an engine can be sold while
// the stalls its prefill puts into decoding keep the inter-token latency
// within the objective, and whether the curve measured where they stop
// doing so. The stall bins' shares within the objective, made
// non-increasing in the prefill load (weighted pool-adjacent-violators),
// give the largest new-token rate at which the quantile still holds,
// interpolated between the bins either side of the crossing; over the
// mix's new tokens per request that is a request rate, and times its
// output tokens per request the bound. Read at the mean rate: the bins
// hold windows, whose smoothed rates already spread around the mean of
// the load that produced them. No bound when no measured rate breaks the
// objective (the concurrency bins stop where the measurements do), when
// even the lightest one does (what breaks it then is not the prefill: a
// batch decoding slowly, read by the concurrency bins) or when the mix is
// unmeasured.
func (c Curve) StallBound(o Objectives) (tokensPerSec float64, ok bool) {
	p := c.Prefill
	if !p.mixMeasured() || p.NewTokens <= 0 || o.ITL <= 0 || o.Quantile <= 0 || o.Quantile >= 1 {
		return 0, false
	}
	bins := pool(c.Stall, (*StallBin).readable, addStall, cloneStall)
	if len(bins) == 0 {
		return 0, false
	}
	share, w := make([]float64, len(bins)), make([]float64, len(bins))
	for i, b := range bins {
		share[i], w[i] = b.ITL.Within(c.ITLBounds, o.ITL.Seconds()), b.ITL.Count
	}
	isotonic.NonIncreasing(share, w)
	j := sort.Search(len(bins), func(i int) bool { return share[i] < o.Quantile })
	if j == 0 || j == len(bins) {
		return 0, false
	}
	a, b := bins[j-1].NewTokensPerSec, bins[j].NewTokensPerSec
	x := a + (b-a)*(share[j-1]-o.Quantile)/(share[j-1]-share[j])
	lambda := x / (p.NewTokens / p.Requests)
	bound := lambda * p.OutputTokens / p.Requests
	if math.IsNaN(bound) || math.IsInf(bound, 0) {
		return 0, false
	}
	return bound, true
}

// validateStall reports stall bins that are not ascending by new-token
// rate with finite non-negative values and well-formed histograms on
// itlBounds (Curve.Validate).
func validateStall(stall []StallBin, itlBounds []float64) error {
	prev := -1.0
	for i, b := range stall {
		for _, v := range []float64{b.NewTokensPerSec, b.Seconds, b.Windows} {
			if !(v >= 0) || math.IsInf(v, 0) {
				return fmt.Errorf("stall bin %d has a negative or non-finite value", i)
			}
		}
		if b.NewTokensPerSec <= prev {
			return fmt.Errorf("stall bin %d: new-token rates are not ascending", i)
		}
		prev = b.NewTokensPerSec
		if err := stall[i].ITL.validate(itlBounds); err != nil {
			return fmt.Errorf("stall bin %d itl: %w", i, err)
		}
	}
	return nil
}

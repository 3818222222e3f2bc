package capacity

import "math"

// LimitKV names the KV cache as what bounds a capacity (AtObjectives.BoundKV).
const LimitKV = "kv"

// KVTokensPerRequest is the KV cache one more request of the mix takes
// beyond what is cached already: its new (uncached) prompt tokens and its
// output tokens, and whether the mix is measured. The part of its prompt
// the prefix cache already holds is shared with whatever holds it, so a
// mix of long shared prompts is not counted as holding each prompt whole
// (TestKVTokensPerRequest). It can read light where a hit is on blocks
// no running request holds (what a finished request left): then the
// bound is looser than the cache, never tighter.
func (p *Prefill) KVTokensPerRequest() (float64, bool) {
	if !p.mixMeasured() {
		return 0, false
	}
	t := (p.NewTokens + p.OutputTokens) / p.Requests
	if !(t > 0) || math.IsInf(t, 0) {
		return 0, false
	}
	return t, true
}

// BoundKV bounds the capacity by the replica's KV cache now: the busy
// requests it holds and, for the mix's requests (KVTokensPerRequest),
// as many more as its free KV tokens take. Streams and Concurrency are
// at most that, the token rates scaled down with Concurrency, and
// KVBoundStreams records it; nothing changes when the mix is not
// measured or the cache's size is unknown (totalKV 0).
func (a *AtObjectives) BoundKV(busy float64, freeKV, totalKV int64, mix Prefill) {
	per, ok := mix.KVTokensPerRequest()
	if !ok || totalKV <= 0 || freeKV < 0 {
		return
	}
	bound := max(busy, 0) + float64(freeKV)/per
	a.KVBoundStreams = bound
	a.Streams = min(a.Streams, bound)
	if a.CapConcurrency(bound) {
		a.Limit = LimitKV
	}
}

// CapConcurrency lowers Concurrency to bound where it is more, the token
// rates scaled down with it, and reports whether it did. Streams and
// Limit are the caller's to set.
func (a *AtObjectives) CapConcurrency(bound float64) bool {
	if a.Concurrency <= bound {
		return false
	}
	f := bound / a.Concurrency
	a.OutputTokensPerSec *= f
	a.PromptTokensPerSec *= f
	a.Concurrency = bound
	return true
}

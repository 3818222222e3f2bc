package engine

import (
	"context"
	"time"

	"github.com/omnious/provider-node/internal/opt"
)

// Timing is the step-time model, in model time. One engine step is one
// forward pass and costs
//
//	prefill part P (only when the step has prefill tokens):
//	    PrefillBase + PrefillPerToken * new_prefill_tokens
//	weight read W (only when the step has decoding requests):
//	    DecodeBase
//	max(P, W) + DecodePerSeq * decode_batch + KVTerm * kv_occupancy
//	plus CPULoadPerToken * tokens loaded from the CPU tier.
//
// A step that mixes prefill and decode (vLLM's chunked prefill) reads the
// weights once for both: its linear layers take the longer of the prefill
// chunk's compute and the weight read, so decodes ride on a long chunk and
// a short chunk rides on the decodes' read (SARATHI, Agrawal et al., OSDI
// 2024: a matmul costs max(T_math, T_mem); decodes piggybacked on a
// prefill chunk); charging both would count the weights twice.
// Prefill-only and decode-only steps are the two curves measured alone.
//
// Defaults are calibrated to Qwen3-32B (bf16) with tensor parallelism 2 on two
// H100 80GB: about 0.063 ms per prefill token, and an inter-token latency of
// about 11 ms for a single request rising to about 29 ms with 64 requests
// decoding 2k-token contexts. BenchmarkEngineLoadCurve prints the resulting
// curve.
//
// Every coefficient may be 0 (that cost is left out), so the fields are
// pointers: nil takes the default.
type Timing struct {
	// PrefillBase is the fixed cost of a step that runs prefill (launch,
	// weight reads when the chunk is small). Default 5ms.
	PrefillBase *time.Duration `yaml:"prefill_base"`
	// PrefillPerToken is the compute cost of one new prompt token; prefix-cache
	// hits cost nothing. Default 63µs (about 16k tokens/s).
	PrefillPerToken *time.Duration `yaml:"prefill_per_token"`
	// DecodeBase is the cost of a decode step with a tiny batch: reading the
	// 32 GB of weights per GPU at HBM bandwidth. Default 10.5ms.
	DecodeBase *time.Duration `yaml:"decode_base"`
	// DecodePerSeq is the extra cost per decoding request (MLP compute,
	// sampling, scheduling). Default 190µs, so a batch of 64 adds about 12ms.
	DecodePerSeq *time.Duration `yaml:"decode_per_seq"`
	// KVTerm is the attention cost of reading a completely full KV cache
	// (about 36 GB per GPU); it is scaled by the used fraction. Default 12ms.
	KVTerm *time.Duration `yaml:"kv_term"`
	// CPULoadPerToken is the cost of loading one token's KV from the CPU tier
	// over PCIe (about 128 KB per GPU per token at ~45 GB/s), about 5% of
	// recomputing it. Default 3µs.
	CPULoadPerToken *time.Duration `yaml:"cpu_load_per_token"`
}

// DefaultTiming is the default model with every coefficient set.
func DefaultTiming() Timing { return Timing{}.withDefaults() }

func (t Timing) withDefaults() Timing {
	t.PrefillBase = opt.Or(t.PrefillBase, 5*time.Millisecond)
	t.PrefillPerToken = opt.Or(t.PrefillPerToken, 63*time.Microsecond)
	t.DecodeBase = opt.Or(t.DecodeBase, 10500*time.Microsecond)
	t.DecodePerSeq = opt.Or(t.DecodePerSeq, 190*time.Microsecond)
	t.KVTerm = opt.Or(t.KVTerm, 12*time.Millisecond)
	t.CPULoadPerToken = opt.Or(t.CPULoadPerToken, 3*time.Microsecond)
	return t
}

// coefficients are the fields in order, for validation.
// timingKeys are the YAML keys of coefficients, in its order.
var timingKeys = []string{"prefill_base", "prefill_per_token", "decode_base", "decode_per_seq", "kv_term", "cpu_load_per_token"}

func (t Timing) coefficients() []*time.Duration {
	return []*time.Duration{t.PrefillBase, t.PrefillPerToken, t.DecodeBase, t.DecodePerSeq, t.KVTerm, t.CPULoadPerToken}
}

// StepTime returns the model duration of a step with the given work.
// kvOccupancy is the fraction (0-1) of GPU blocks referenced by requests.
// t must be defaulted (Config.WithDefaults).
func (t Timing) StepTime(prefillTokens, decodeSeqs int, kvOccupancy float64, cpuLoadTokens int) time.Duration {
	var prefill, weights, d time.Duration
	if prefillTokens > 0 {
		prefill = *t.PrefillBase + time.Duration(prefillTokens)**t.PrefillPerToken
	}
	if decodeSeqs > 0 {
		weights = *t.DecodeBase
		d += time.Duration(decodeSeqs)**t.DecodePerSeq + time.Duration(kvOccupancy*float64(*t.KVTerm))
	}
	return d + max(prefill, weights) + time.Duration(cpuLoadTokens)**t.CPULoadPerToken
}

// Clock is the engine's source of wall time. Tests and benchmarks substitute
// a fake so the step loop runs without real sleeping.
type Clock interface {
	Now() time.Time
	// SleepUntil returns at t, or earlier when ctx is done.
	SleepUntil(ctx context.Context, t time.Time)
}

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

func (realClock) SleepUntil(ctx context.Context, t time.Time) {
	d := time.Until(t)
	if d <= 0 {
		return
	}
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-tm.C:
	case <-ctx.Done():
	}
}

// Option adjusts an Engine at construction.
type Option func(*Engine)

// WithClock replaces the wall clock (default: the system clock).
func WithClock(c Clock) Option {
	return func(e *Engine) { e.clock = c }
}

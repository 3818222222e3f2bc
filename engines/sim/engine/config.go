package engine

import (
	"errors"
	"fmt"

	"github.com/omnious/provider-node/internal/opt"
)

// Engine flavours.
const (
	FlavourVLLM   = "vllm"
	FlavourSGLang = "sglang"
)

// DefaultKVTokens is the default KV capacity in tokens: Qwen3-32B keeps
// 256 KiB of bf16 KV per token (64 layers x 8 KV heads x 128 x 2 x 2 B), split
// over two H100s at TP 2, and about 36 GB per GPU is left for KV at a memory
// utilisation of 0.9.
const DefaultKVTokens = 281_600

// Config configures one simulated engine replica.
type Config struct {
	// Flavour is "vllm" (default) or "sglang"; it selects hashing, event
	// granularity and metric names.
	Flavour string `yaml:"flavour"`
	// Model is the served model name used in metric labels. Default "Qwen/Qwen3-32B".
	Model string `yaml:"model"`
	// BlockSize is the tokens per KV block (SGLang's page size). Default 16
	// (vLLM's default; SGLang's own default page size is 1).
	BlockSize int `yaml:"block_size"`
	// NumGPUBlocks is the GPU cache size as the engine reports it. For vllm
	// it counts, as vLLM's num_gpu_blocks does, the null block vLLM reserves
	// and never allocates, so NumGPUBlocks-1 blocks hold KV (at least 2);
	// for sglang every block does. Default DefaultKVTokens / BlockSize.
	NumGPUBlocks int `yaml:"num_gpu_blocks"`
	// NumCPUBlocks is the CPU offload tier size; 0 (default) disables it.
	// Blocks evicted from the GPU are offloaded there (medium "CPU", SGLang
	// "CPU_PINNED"), evicted LRU, and a hit there costs
	// Timing.CPULoadPerToken per token instead of a prefill.
	NumCPUBlocks int `yaml:"num_cpu_blocks"`
	// RadixEvictionPolicy is SGLang's --radix-eviction-policy: "lru"
	// (the default) or "priority", which evicts the blocks of
	// lower-priority requests first (the request's priority field), LRU
	// within a priority. Only "lru" for vllm, which has no such option.
	RadixEvictionPolicy string `yaml:"radix_eviction_policy"`
	// MaxNumSeqs caps the running requests. Default 256.
	MaxNumSeqs int `yaml:"max_num_seqs"`
	// MaxNumBatchedTokens is the per-step token budget. Default 8192.
	MaxNumBatchedTokens int `yaml:"max_num_batched_tokens"`
	// DisablePrefixCaching turns prefix caching (and KV events) off; caching
	// is on by default, as in vLLM v1 and SGLang.
	DisablePrefixCaching bool `yaml:"disable_prefix_caching"`
	// Seed is the hash seed (vLLM's PYTHONHASHSEED); NONE_HASH is the sha256
	// of its decimal string. 0 is a seed like any other, so the field is a
	// pointer: unset, the simulator's seed is used. A negative value is a
	// seed too. Default 0.
	Seed *int64 `yaml:"seed"`
	// TimeScale speeds the simulation up: wall time = model time / TimeScale.
	// Default 1.
	TimeScale float64 `yaml:"time_scale"`
	// Timing is the step-time model; unset (nil) fields take the documented
	// defaults.
	Timing Timing `yaml:"timing"`
}

// WithDefaults returns c with every unset field at its default. For the
// int fields zero is never legal and means unset.
func (c Config) WithDefaults() Config {
	opt.Zero(&c.Flavour, FlavourVLLM)
	opt.Zero(&c.Model, "Qwen/Qwen3-32B")
	opt.Zero(&c.BlockSize, 16)
	if c.NumGPUBlocks == 0 && c.BlockSize > 0 {
		c.NumGPUBlocks = DefaultKVTokens / c.BlockSize
	}
	opt.Zero(&c.RadixEvictionPolicy, "lru")
	opt.Zero(&c.MaxNumSeqs, 256)
	opt.Zero(&c.MaxNumBatchedTokens, 8192)
	c.Seed = opt.Or(c.Seed, 0)
	opt.Zero(&c.TimeScale, 1)
	c.Timing = c.Timing.withDefaults()
	return c
}

// usableGPUBlocks is how many GPU blocks can hold KV: vLLM's BlockPool
// keeps block 0 as its null block (padding for skipped and sliding-window
// blocks) and never allocates or caches it (TestNullBlock).
func (c Config) usableGPUBlocks() int {
	if c.Flavour == FlavourVLLM {
		return c.NumGPUBlocks - 1
	}
	return c.NumGPUBlocks
}

// Validate reports every invalid setting of a completed config.
func (c Config) Validate() error {
	var errs []error
	if c.Flavour != FlavourVLLM && c.Flavour != FlavourSGLang {
		errs = append(errs, fmt.Errorf("flavour %q: want %q or %q", c.Flavour, FlavourVLLM, FlavourSGLang))
	}
	switch {
	case c.RadixEvictionPolicy != "lru" && c.RadixEvictionPolicy != "priority":
		errs = append(errs, fmt.Errorf("radix_eviction_policy %q: want lru or priority", c.RadixEvictionPolicy))
	case c.RadixEvictionPolicy == "priority" && c.Flavour != FlavourSGLang:
		errs = append(errs, errors.New("radix_eviction_policy priority is SGLang's; vllm has only lru"))
	}
	if c.BlockSize > 4096 {
		errs = append(errs, fmt.Errorf("block_size %d: want 1..4096", c.BlockSize))
	}
	errs = append(errs, opt.DefaultNonNegative("block_size", c.BlockSize, 16),
		opt.NonNegative("num_cpu_blocks", c.NumCPUBlocks),
		opt.DefaultNonNegative("max_num_seqs", c.MaxNumSeqs, 256),
		opt.DefaultNonNegative("max_num_batched_tokens", c.MaxNumBatchedTokens, 8192),
		opt.DefaultNonNegative("time_scale", c.TimeScale, 1))
	if c.NumGPUBlocks < 0 {
		errs = append(errs, fmt.Errorf("num_gpu_blocks %d is negative; give a positive value, or 0 for the default (DefaultKVTokens / block_size)", c.NumGPUBlocks))
	}
	if c.Flavour == FlavourVLLM && c.NumGPUBlocks == 1 {
		errs = append(errs, errors.New("num_gpu_blocks 1 leaves vLLM no block besides its null block; give at least 2"))
	}
	if c.TimeScale > 1e6 {
		errs = append(errs, fmt.Errorf("time_scale %v: want at most 1e6", c.TimeScale))
	}
	if c.Seed == nil {
		errs = append(errs, errors.New("seed unset: Validate wants a config from WithDefaults"))
	}
	for i, d := range c.Timing.coefficients() {
		if d == nil {
			errs = append(errs, errors.New("timing: a duration is unset: Validate wants a config from WithDefaults"))
			break
		}
		errs = append(errs, opt.NonNegative("timing."+timingKeys[i], *d))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("invalid engine config: %w", err)
	}
	return nil
}

// Package sim is the engine simulator's serving layer: the OpenAI API as vLLM
// and SGLang serve it (models, chat completions with tools and streaming,
// completions, tokenize, health, metrics), the KV-event publisher wiring,
// fault injection and an admin view of the simulated cache. The continuous
// batching engine itself lives in engines/sim/engine.
package sim

import (
	"errors"
	"fmt"
	"os"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/omnious/provider-node/engines/kvevents"
	"github.com/omnious/provider-node/engines/sim/engine"
	"github.com/omnious/provider-node/internal/opt"
)

// Config configures one simulated replica (or several data-parallel ranks).
// Every default is applied in WithDefaults. A field whose zero is a legal
// setting is a pointer (nil = unset); for the other fields zero means
// unset.
type Config struct {
	// Listen is the HTTP address of rank 0; rank r listens on port+r.
	// Default "127.0.0.1:8000".
	Listen string `yaml:"listen"`
	// Model is the served model name. Default "Qwen/Qwen3-32B".
	Model string `yaml:"model"`
	// MaxModelLen is the longest prompt plus output, in tokens. Default 40960.
	MaxModelLen int `yaml:"max_model_len"`
	// MaxBodyBytes bounds a request body; larger ones get 413. Default (0)
	// 32 MiB.
	MaxBodyBytes int64 `yaml:"max_body_bytes"`
	// DataParallelSize runs that many independent ranks on consecutive HTTP,
	// KV-event and replay ports, as llm-d deploys data parallelism. Default 1.
	DataParallelSize int `yaml:"data_parallel_size"`
	// EnableAutoToolChoice mirrors vLLM's --enable-auto-tool-choice. Default true.
	EnableAutoToolChoice *bool `yaml:"enable_auto_tool_choice"`
	// ToolCallParser mirrors --tool-call-parser; the simulator speaks the
	// Hermes format. Default "hermes".
	ToolCallParser string `yaml:"tool_call_parser"`
	// Seed makes outputs deterministic; any value, negative too, is a seed.
	// Default 0.
	Seed int64 `yaml:"seed"`
	// Engine is the batching engine and KV cache (flavour, blocks, timing).
	Engine engine.Config `yaml:"engine"`
	// KVEvents configures the ZMQ publisher.
	KVEvents KVEventsConfig `yaml:"kv_events"`
	// Faults are injected from the start; the admin API changes them live.
	Faults Faults `yaml:"faults"`
}

// KVEventsConfig mirrors vLLM's --kv-events-config (and SGLang's keys).
type KVEventsConfig struct {
	// Enabled turns publishing on. Default true.
	Enabled *bool `yaml:"enable_kv_cache_events"`
	// Endpoint is rank 0's PUB endpoint; rank r uses port+r.
	// Default "tcp://127.0.0.1:5557".
	Endpoint string `yaml:"endpoint"`
	// Connect makes the PUB socket connect to Endpoint (a router's bound
	// socket, as llm-d's centralized mode and vLLM with an endpoint without
	// "*" do) instead of binding it; Topic should then name the replica,
	// kv@<ip>:<port>@<model>. As vLLM's, it redials until the router
	// listens (kvevents.PublisherConfig.Dial). Default false (bind).
	Connect bool `yaml:"connect"`
	// ReplayEndpoint is rank 0's ROUTER endpoint; rank r uses port+r.
	// Default "" (off, as in vLLM; 5558 is customary when one rank runs).
	ReplayEndpoint string `yaml:"replay_endpoint"`
	// Topic is the ZMQ topic. Default "" (vLLM's default).
	Topic string `yaml:"topic"`
	// BufferSteps is how many batches are kept for replay. Positive.
	// Default 10000.
	BufferSteps int `yaml:"buffer_steps"`
	// Format is "map" (vLLM 0.26+ tagged maps), "array" (vLLM's legacy
	// positional arrays), "sglang" (SGLang 0.5.23's tagged maps) or
	// "sglang-array" (the positional arrays of SGLang 0.4.8 to 0.5.16).
	// Default "map" for vllm, "sglang" for sglang.
	Format string `yaml:"format"`
	// Hashes is "uint64", "int64" or "bytes". Default "uint64" for vllm,
	// "int64" for sglang.
	Hashes string `yaml:"hashes"`
	// ReplayLayout is "topic-seq" (vLLM 0.26+, SGLang 0.5.23: topic frame in
	// replies) or "seq" (older vLLM, SGLang up to 0.5.16). Default
	// "topic-seq".
	ReplayLayout string `yaml:"replay_layout"`
}

// Faults are the injectable failures.
type Faults struct {
	// ErrorRate is the share of requests answered with ErrorStatus (0-1).
	ErrorRate float64 `yaml:"error_rate" json:"error_rate"`
	// ErrorStatus is the HTTP status of injected errors. Default 500.
	ErrorStatus int `yaml:"error_status" json:"error_status"`
	// Latency is added before a request is admitted. Default 0s (none).
	Latency time.Duration `yaml:"latency" json:"latency"`
	// StallAfterTokens stalls a streamed response after that many chunks
	// (0 = no stall) for StallFor (0 = until the client goes away).
	StallAfterTokens int           `yaml:"stall_after_tokens" json:"stall_after_tokens"`
	StallFor         time.Duration `yaml:"stall_for" json:"stall_for"`
	// RejectAutoToolChoice answers tool_choice "auto" with vLLM's 400, as a
	// server started without --enable-auto-tool-choice does.
	RejectAutoToolChoice bool `yaml:"reject_auto_tool_choice" json:"reject_auto_tool_choice"`
	// MetricsHang makes GET /metrics hang until the scraper gives up (or
	// the fault is cleared) while requests are still served: a wedged
	// metrics exporter, which only the scraper's timeout notices.
	MetricsHang bool `yaml:"metrics_hang" json:"metrics_hang"`
}

// LoadConfig reads a YAML file into a Config (unknown keys are an error, so
// a typo does not silently fall back to a default).
func LoadConfig(path string) (Config, error) {
	var c Config
	f, err := os.Open(path)
	if err != nil {
		return c, fmt.Errorf("cannot open config: %w", err)
	}
	defer f.Close()
	dec := yaml.NewDecoder(f)
	dec.KnownFields(true)
	if err := dec.Decode(&c); err != nil {
		return c, fmt.Errorf("cannot parse config %s: %w", path, err)
	}
	return c, nil
}

// WithDefaults fills every unset field: a nil pointer, or a zero where
// zero is never a legal setting.
func (c Config) WithDefaults() Config {
	opt.Zero(&c.Listen, "127.0.0.1:8000")
	opt.Zero(&c.Model, "Qwen/Qwen3-32B")
	opt.Zero(&c.MaxModelLen, 40960)
	opt.Zero(&c.MaxBodyBytes, 32<<20)
	opt.Zero(&c.DataParallelSize, 1)
	c.EnableAutoToolChoice = opt.Or(c.EnableAutoToolChoice, true)
	opt.Zero(&c.ToolCallParser, "hermes")
	opt.Zero(&c.Engine.Model, c.Model)
	c.Engine.Seed = opt.Or(c.Engine.Seed, c.Seed)
	c.Engine = c.Engine.WithDefaults()
	k := &c.KVEvents
	k.Enabled = opt.Or(k.Enabled, true)
	opt.Zero(&k.Endpoint, "tcp://127.0.0.1:5557")
	opt.Zero(&k.BufferSteps, 10000)
	sglang := c.Engine.Flavour == engine.FlavourSGLang
	opt.Zero(&k.Format, pick(sglang, "sglang", "map"))
	opt.Zero(&k.Hashes, pick(sglang, "int64", "uint64"))
	opt.Zero(&k.ReplayLayout, "topic-seq")
	opt.Zero(&c.Faults.ErrorStatus, 500)
	return c
}

func pick(cond bool, a, b string) string {
	if cond {
		return a
	}
	return b
}

// Validate reports every problem with a defaulted config.
func (c Config) Validate() error {
	var errs []error
	if c.MaxModelLen < 16 {
		errs = append(errs, fmt.Errorf("max_model_len %d is below 16", c.MaxModelLen))
	}
	if c.MaxBodyBytes < 1 {
		errs = append(errs, fmt.Errorf("max_body_bytes %d is not positive", c.MaxBodyBytes))
	}
	if c.DataParallelSize < 1 || c.DataParallelSize > 64 {
		errs = append(errs, fmt.Errorf("data_parallel_size %d is outside 1..64", c.DataParallelSize))
	}
	if c.EnableAutoToolChoice == nil || c.KVEvents.Enabled == nil {
		errs = append(errs, errors.New("enable_auto_tool_choice or kv_events.enable_kv_cache_events unset: Validate wants a config from WithDefaults"))
	}
	if c.KVEvents.BufferSteps < 1 {
		errs = append(errs, fmt.Errorf("kv_events.buffer_steps %d is not positive", c.KVEvents.BufferSteps))
	}
	if err := c.Engine.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("engine: %w", err))
	}
	if _, err := c.KVEvents.format(); err != nil {
		errs = append(errs, err)
	}
	if _, err := c.KVEvents.hashes(); err != nil {
		errs = append(errs, err)
	}
	if _, err := c.KVEvents.replayLayout(); err != nil {
		errs = append(errs, err)
	}
	if c.Faults.ErrorRate < 0 || c.Faults.ErrorRate > 1 {
		errs = append(errs, fmt.Errorf("faults.error_rate %v is outside 0..1", c.Faults.ErrorRate))
	}
	errs = append(errs, opt.NonNegative("faults.latency", c.Faults.Latency),
		opt.NonNegative("faults.stall_after_tokens", c.Faults.StallAfterTokens), opt.NonNegative("faults.stall_for", c.Faults.StallFor))
	if c.Faults.ErrorStatus < 400 || c.Faults.ErrorStatus > 599 {
		errs = append(errs, fmt.Errorf("faults.error_status %d is not an HTTP error status", c.Faults.ErrorStatus))
	}
	return errors.Join(errs...)
}

func (k KVEventsConfig) format() (kvevents.Format, error) {
	switch k.Format {
	case "map":
		return kvevents.FormatMap, nil
	case "array":
		return kvevents.FormatArray, nil
	case "sglang":
		return kvevents.FormatMapSGLang, nil
	case "sglang-array":
		return kvevents.FormatArraySGLang, nil
	}
	return 0, fmt.Errorf("kv_events.format %q is not map, array, sglang or sglang-array", k.Format)
}

func (k KVEventsConfig) hashes() (kvevents.HashEncoding, error) {
	switch k.Hashes {
	case "uint64":
		return kvevents.HashUint64, nil
	case "int64":
		return kvevents.HashInt64, nil
	case "bytes":
		return kvevents.HashBytes, nil
	}
	return 0, fmt.Errorf("kv_events.hashes %q is not uint64, int64 or bytes", k.Hashes)
}

func (k KVEventsConfig) replayLayout() (kvevents.ReplayLayout, error) {
	for _, l := range []kvevents.ReplayLayout{kvevents.ReplayLayoutSeq, kvevents.ReplayLayoutTopicSeq} {
		if k.ReplayLayout == l.String() {
			return l, nil
		}
	}
	return 0, fmt.Errorf("kv_events.replay_layout %q is not seq or topic-seq", k.ReplayLayout)
}

// Package metrics owns what the router reads from an engine's Prometheus
// endpoint: a line-oriented parser that extracts only the vLLM and SGLang
// series the scheduler uses into a small Signals struct (no expfmt, no
// per-series allocation), and a Scraper that polls a set of URLs on an
// interval over one shared http.Client, keeps the last good Signals with
// their timestamps and derives counter rates between scrapes.
//
// Series of one name are combined: gauges and counters are summed over
// label sets (data-parallel engines behind one endpoint), KV usage is
// averaged, cache_config_info keeps the first series and lora_requests_info
// the newest (its value is a timestamp).
package metrics

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"strconv"
)

// Engine families a Signals value was read from.
const (
	EngineUnknown = ""
	EngineVLLM    = "vllm"
	EngineSGLang  = "sglang"
)

// Field bits in Signals.Has: which series the exposition carried.
const (
	HasRunning uint32 = 1 << iota
	HasWaiting
	HasKVUsage
	HasPrefixQueries
	HasPrefixHits
	HasPromptTokens
	HasGenerationTokens
	HasCacheConfig
	HasMaxTotalTokens
	HasLoRA
	HasTTFT
	HasITL
)

// Signals is what one scrape of one engine says.
type Signals struct {
	// Engine is EngineVLLM or EngineSGLang, from the first recognised name.
	Engine string
	// Running and Waiting are requests being decoded/prefilled and queued.
	Running, Waiting float64
	// KVUsage is the share of KV cache in use, 0..1 (vLLM
	// kv_cache_usage_perc, SGLang token_usage).
	KVUsage float64
	// PrefixQueries and PrefixHits are prefix-cache counters in tokens. For
	// SGLang, queries are its prompt tokens and hits its cached tokens.
	PrefixQueries, PrefixHits float64
	// PromptTokens and GenerationTokens are cumulative token counters.
	PromptTokens, GenerationTokens float64
	// BlockSize and NumGPUBlocks come from cache_config_info (SGLang:
	// page_size and num_pages).
	BlockSize    int
	NumGPUBlocks int64
	// MaxTotalTokens is SGLang's KV capacity in tokens (0 for vLLM, where it
	// is BlockSize*NumGPUBlocks).
	MaxTotalTokens int64
	// MaxLoRA, RunningLoRA and WaitingLoRA come from the newest
	// vllm:lora_requests_info series; the adapter lists are comma-joined.
	MaxLoRA                  int
	RunningLoRA, WaitingLoRA string
	// TTFT and ITL are the engines' time-to-first-token and inter-token
	// latency histograms, cumulative since the engine started.
	TTFT, ITL Histogram
	// Has says which fields were present (Has* bits).
	Has uint32

	tpot Histogram

	kvSeries int
	loraTS   float64
}

// KVCapacityTokens is the engine's KV capacity in tokens, 0 when unknown.
func (s *Signals) KVCapacityTokens() int64 {
	if s.MaxTotalTokens > 0 {
		return s.MaxTotalTokens
	}
	return int64(s.BlockSize) * s.NumGPUBlocks
}

// HasAdapter reports whether adapter is in the running or waiting LoRA lists.
func (s *Signals) HasAdapter(adapter string) bool {
	return adapter != "" && (inList(s.RunningLoRA, adapter) || inList(s.WaitingLoRA, adapter))
}

func inList(list, name string) bool {
	for len(list) > 0 {
		i := 0
		for i < len(list) && list[i] != ',' {
			i++
		}
		if list[:i] == name {
			return true
		}
		if i == len(list) {
			return false
		}
		list = list[i+1:]
	}
	return false
}

// ErrNoSignals means the exposition carried none of the recognised series:
// the URL is probably not an engine's metrics endpoint.
var ErrNoSignals = errors.New("no vLLM or SGLang series in the exposition")

// metric identifies a recognised series name.
type metric uint8

const (
	mNone metric = iota
	mRunning
	mWaiting
	mKVUsage
	mPrefixQueries
	mPrefixHits
	mPromptTokens
	mGenerationTokens
	mCacheConfig
	mMaxTotalTokens
	mLoRA
)

// lookup maps a series name (without labels) to the metric it feeds.
// Switching on string(b) does not allocate.
func lookup(name []byte) (metric, string) {
	switch string(name) {
	case "vllm:num_requests_running":
		return mRunning, EngineVLLM
	case "vllm:num_requests_waiting":
		return mWaiting, EngineVLLM
	case "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc":
		return mKVUsage, EngineVLLM
	case "vllm:prefix_cache_queries_total", "vllm:prefix_cache_queries",
		"vllm:gpu_prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries":
		return mPrefixQueries, EngineVLLM
	case "vllm:prefix_cache_hits_total", "vllm:prefix_cache_hits",
		"vllm:gpu_prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits":
		return mPrefixHits, EngineVLLM
	case "vllm:prompt_tokens_total", "vllm:prompt_tokens":
		return mPromptTokens, EngineVLLM
	case "vllm:generation_tokens_total", "vllm:generation_tokens":
		return mGenerationTokens, EngineVLLM
	case "vllm:cache_config_info":
		return mCacheConfig, EngineVLLM
	case "vllm:lora_requests_info":
		return mLoRA, EngineVLLM
	case "sglang:num_running_reqs":
		return mRunning, EngineSGLang
	case "sglang:num_queue_reqs":
		return mWaiting, EngineSGLang
	case "sglang:token_usage":
		return mKVUsage, EngineSGLang
	case "sglang:cached_tokens_total", "sglang:cached_tokens":
		return mPrefixHits, EngineSGLang
	case "sglang:prompt_tokens_total", "sglang:prompt_tokens":
		return mPromptTokens, EngineSGLang
	case "sglang:generation_tokens_total", "sglang:generation_tokens":
		return mGenerationTokens, EngineSGLang
	case "sglang:cache_config_info":
		return mCacheConfig, EngineSGLang
	case "sglang:max_total_num_tokens":
		return mMaxTotalTokens, EngineSGLang
	}
	return mNone, ""
}

// Parse reads a Prometheus (or OpenMetrics) text exposition and fills s,
// which it resets first. Unrecognised series, comments and malformed lines of
// unrecognised series are skipped; a malformed line of a recognised series
// is an error. It allocates only for the LoRA adapter lists.
func Parse(data []byte, s *Signals) error {
	*s = Signals{}
	for lineNo := 1; len(data) > 0; lineNo++ {
		var line []byte
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			line, data = data[:i], data[i+1:]
		} else {
			line, data = data, nil
		}
		if err := parseLine(line, s); err != nil {
			return fmt.Errorf("cannot parse metrics line %d: %w", lineNo, err)
		}
	}
	if s.ITL.Empty() && s.ITL.N == 0 {
		s.ITL = s.tpot
	}
	s.tpot = Histogram{}
	if s.TTFT.N > 0 {
		s.Has |= HasTTFT
	}
	if s.ITL.N > 0 {
		s.Has |= HasITL
	}
	if s.Has == 0 {
		return ErrNoSignals
	}
	if s.kvSeries > 1 {
		s.KVUsage /= float64(s.kvSeries)
	}
	if s.Engine == EngineSGLang && s.Has&HasPrefixQueries == 0 && s.Has&HasPromptTokens != 0 {
		s.PrefixQueries = s.PromptTokens
		s.Has |= HasPrefixQueries
	}
	return nil
}

func parseLine(line []byte, s *Signals) error {
	line = trimSpace(line)
	if len(line) == 0 || line[0] == '#' {
		return nil
	}
	end := 0
	for end < len(line) && line[end] != '{' && line[end] != ' ' && line[end] != '\t' {
		end++
	}
	m, engine := lookup(line[:end])
	var hist *Histogram
	var part histPart
	if m == mNone {
		if hist, part, engine = lookupHistogram(s, line[:end]); hist == nil {
			return nil
		}
	}
	if s.Engine == EngineUnknown {
		s.Engine = engine
	}
	rest := line[end:]
	var labels []byte
	if len(rest) > 0 && rest[0] == '{' {
		n, err := labelsEnd(rest)
		if err != nil {
			return err
		}
		labels, rest = rest[1:n-1], rest[n:]
	}
	rest = trimSpace(rest)
	// Drop an optional timestamp after the value.
	for i := 0; i < len(rest); i++ {
		if rest[i] == ' ' || rest[i] == '\t' {
			rest = rest[:i]
			break
		}
	}
	v, err := parseValue(rest)
	if err != nil {
		return err
	}
	if hist != nil {
		return addHistogramLine(hist, part, labels, v)
	}
	switch m {
	case mRunning:
		s.Running += v
		s.Has |= HasRunning
	case mWaiting:
		s.Waiting += v
		s.Has |= HasWaiting
	case mKVUsage:
		s.KVUsage += clamp01(v)
		s.kvSeries++
		s.Has |= HasKVUsage
	case mPrefixQueries:
		s.PrefixQueries += v
		s.Has |= HasPrefixQueries
	case mPrefixHits:
		s.PrefixHits += v
		s.Has |= HasPrefixHits
	case mPromptTokens:
		s.PromptTokens += v
		s.Has |= HasPromptTokens
	case mGenerationTokens:
		s.GenerationTokens += v
		s.Has |= HasGenerationTokens
	case mMaxTotalTokens:
		s.MaxTotalTokens += int64(v)
		s.Has |= HasMaxTotalTokens
	case mCacheConfig:
		if s.Has&HasCacheConfig == 0 {
			s.Has |= HasCacheConfig
			return eachLabel(labels, func(k, val []byte) error {
				switch string(k) {
				case "block_size", "page_size":
					s.BlockSize = atoiOr(val, s.BlockSize)
				case "num_gpu_blocks", "num_pages":
					s.NumGPUBlocks = int64(atoiOr(val, int(s.NumGPUBlocks)))
				case "max_total_num_tokens":
					s.MaxTotalTokens = int64(atoiOr(val, int(s.MaxTotalTokens)))
				}
				return nil
			})
		}
	case mLoRA:
		if s.Has&HasLoRA != 0 && v < s.loraTS {
			return nil
		}
		s.Has |= HasLoRA
		s.loraTS = v
		return eachLabel(labels, func(k, val []byte) error {
			switch string(k) {
			case "max_lora":
				s.MaxLoRA = atoiOr(val, 0)
			case "running_lora_adapters":
				s.RunningLoRA = string(val)
			case "waiting_lora_adapters":
				s.WaitingLoRA = string(val)
			}
			return nil
		})
	}
	return nil
}

// labelsEnd returns the length of the "{...}" block at the start of b,
// honouring quoted values with escapes.
func labelsEnd(b []byte) (int, error) {
	inQuote := false
	for i := 1; i < len(b); i++ {
		switch c := b[i]; {
		case inQuote && c == '\\':
			i++
		case c == '"':
			inQuote = !inQuote
		case !inQuote && c == '}':
			return i + 1, nil
		}
	}
	return 0, errors.New("unterminated label set")
}

// eachLabel calls f for each name="value" pair of a label block (without
// braces). Values with escapes are passed raw: the labels read here never
// need them.
func eachLabel(b []byte, f func(k, v []byte) error) error {
	for {
		b = trimLeft(b)
		if len(b) == 0 {
			return nil
		}
		eq := bytes.IndexByte(b, '=')
		if eq < 0 {
			return errors.New("label without '='")
		}
		k := trimSpace(b[:eq])
		b = trimLeft(b[eq+1:])
		if len(b) == 0 || b[0] != '"' {
			return errors.New("label value is not quoted")
		}
		end := -1
		for i := 1; i < len(b); i++ {
			if b[i] == '\\' {
				i++
				continue
			}
			if b[i] == '"' {
				end = i
				break
			}
		}
		if end < 0 {
			return errors.New("unterminated label value")
		}
		if err := f(k, b[1:end]); err != nil {
			return err
		}
		b = trimLeft(b[end+1:])
		if len(b) > 0 && b[0] == ',' {
			b = b[1:]
		}
	}
}

func parseValue(b []byte) (float64, error) {
	switch string(b) {
	case "":
		return 0, errors.New("missing value")
	case "NaN", "+Inf", "-Inf":
		// A NaN or infinite gauge says nothing usable; count it as 0.
		return 0, nil
	}
	v, err := strconv.ParseFloat(string(b), 64)
	if err != nil {
		return 0, fmt.Errorf("bad value %q", b)
	}
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return 0, nil
	}
	return v, nil
}

// atoiOr parses a label value such as "16" or "16.0"; def when it is not a
// number ("None").
func atoiOr(b []byte, def int) int {
	v, err := strconv.ParseFloat(string(b), 64)
	if err != nil || v < 0 || v > math.MaxInt32 || math.IsNaN(v) {
		return def
	}
	return int(v)
}

func clamp01(v float64) float64 {
	switch {
	case v < 0:
		return 0
	case v > 1:
		return 1
	}
	return v
}

func trimLeft(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t') {
		b = b[1:]
	}
	return b
}

func trimSpace(b []byte) []byte {
	b = trimLeft(b)
	for len(b) > 0 && (b[len(b)-1] == ' ' || b[len(b)-1] == '\t' || b[len(b)-1] == '\r') {
		b = b[:len(b)-1]
	}
	return b
}

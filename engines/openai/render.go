package openai

import "encoding/json"

// TokenizeResponse is the body of vLLM's POST /tokenize answer.
type TokenizeResponse struct {
	Count       int      `json:"count"`
	MaxModelLen int      `json:"max_model_len"`
	Tokens      []uint32 `json:"tokens"`
	TokenStrs   []string `json:"token_strs"`
}

// DetokenizeRequest is the body of vLLM's POST /detokenize.
type DetokenizeRequest struct {
	Model  string  `json:"model"`
	Tokens []int64 `json:"tokens"`
}

// DetokenizeResponse is the answer of POST /detokenize.
type DetokenizeResponse struct {
	Prompt string `json:"prompt"`
}

// GenerateRequest is what vLLM's render endpoints (POST
// /v1/chat/completions/render, one; POST /v1/completions/render, a list)
// answer: the request as the engine would run it, tokens in. Every field is
// present, null when unset, in vLLM's order.
type GenerateRequest struct {
	RequestID string   `json:"request_id"`
	TokenIDs  []uint32 `json:"token_ids"`
	// Features are multimodal hashes and placeholders; null for text.
	Features         json.RawMessage      `json:"features"`
	SamplingParams   SamplingParams       `json:"sampling_params"`
	Model            *string              `json:"model"`
	Stream           bool                 `json:"stream"`
	StreamOptions    *RenderStreamOptions `json:"stream_options"`
	CacheSalt        *string              `json:"cache_salt"`
	Priority         int                  `json:"priority"`
	KVTransferParams json.RawMessage      `json:"kv_transfer_params"`
}

// RenderStreamOptions is stream_options as a GenerateRequest carries it:
// both fields always, include_usage true unless the client said false.
type RenderStreamOptions struct {
	IncludeUsage         bool `json:"include_usage"`
	ContinuousUsageStats bool `json:"continuous_usage_stats"`
}

// SamplingParams is vLLM's SamplingParams as the render endpoints encode
// it: only the fields whose value differs from the field's default (vLLM
// omits defaults), in vLLM's field order. Stop, StopTokenIDs and BadWords
// are lists once vLLM has normalised them, so they are always present.
// The fields are those the OpenAI requests set.
type SamplingParams struct {
	N                      *int     `json:"n,omitempty"`                  // default 1
	PresencePenalty        *float64 `json:"presence_penalty,omitempty"`   // default 0
	FrequencyPenalty       *float64 `json:"frequency_penalty,omitempty"`  // default 0
	RepetitionPenalty      *float64 `json:"repetition_penalty,omitempty"` // default 1
	Temperature            *float64 `json:"temperature,omitempty"`        // default 1
	TopP                   *float64 `json:"top_p,omitempty"`              // default 1
	TopK                   *int     `json:"top_k,omitempty"`              // default 0
	MinP                   *float64 `json:"min_p,omitempty"`              // default 0
	Seed                   *int64   `json:"seed,omitempty"`               // default none
	Stop                   []string `json:"stop"`
	StopTokenIDs           []uint32 `json:"stop_token_ids"`
	IgnoreEOS              bool     `json:"ignore_eos,omitempty"`
	MaxTokens              *int     `json:"max_tokens,omitempty"` // default 16
	MinTokens              int      `json:"min_tokens,omitempty"`
	SkipSpecialTokens      *bool    `json:"skip_special_tokens,omitempty"` // default true
	IncludeStopStrInOutput bool     `json:"include_stop_str_in_output,omitempty"`
	// OutputKind is 1 (deltas) for a streamed request, 2 (final only)
	// otherwise.
	OutputKind             int      `json:"output_kind,omitempty"`
	SkipClone              bool     `json:"skip_clone,omitempty"`
	OutputTextBufferLength int      `json:"output_text_buffer_length,omitempty"`
	BadWords               []string `json:"bad_words"`
	// SkipReadingPrefixCache defaults to none; vLLM sets it, false unless
	// prompt logprobs are asked for.
	SkipReadingPrefixCache bool `json:"skip_reading_prefix_cache"`
}

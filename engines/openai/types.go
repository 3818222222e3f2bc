// Package openai owns the OpenAI-compatible request and response shapes as
// vLLM and SGLang serve them: chat completions, completions, tool calls,
// streamed chunks, usage and the error body; and Events, the one reader
// of a streamed answer's server-sent events, which times each line's
// arrival before anything decodes it.
package openai

import (
	"bytes"
	"encoding/json"
	"fmt"
	"unsafe"

	"github.com/omnious/provider-node/internal/jsonstr"
)

// ChatRequest is the body of POST /v1/chat/completions. Fields the engines
// accept but the project does not interpret are left in the raw body.
type ChatRequest struct {
	Model         string          `json:"model"`
	Messages      []Message       `json:"messages"`
	Tools         []Tool          `json:"tools,omitempty"`
	ToolChoice    json.RawMessage `json:"tool_choice,omitempty"`
	Stream        bool            `json:"stream,omitempty"`
	StreamOptions *StreamOptions  `json:"stream_options,omitempty"`
	MaxTokens     *int            `json:"max_tokens,omitempty"`
	// MaxCompletionTokens is the newer name for MaxTokens; it wins when both are set.
	MaxCompletionTokens *int     `json:"max_completion_tokens,omitempty"`
	MinTokens           int      `json:"min_tokens,omitempty"`
	IgnoreEOS           bool     `json:"ignore_eos,omitempty"`
	Temperature         *float64 `json:"temperature,omitempty"`
	Seed                *int64   `json:"seed,omitempty"`
	User                string   `json:"user,omitempty"`
	CacheSalt           string   `json:"cache_salt,omitempty"`
	// Priority is the request priority (vLLM's scheduling priority;
	// SGLang's, which its priority radix eviction also reads).
	Priority *int `json:"priority,omitempty"`
	// AddGenerationPrompt defaults to true in vLLM's chat endpoint.
	AddGenerationPrompt *bool `json:"add_generation_prompt,omitempty"`
}

// CompletionRequest is the body of POST /v1/completions. Prompt is either a
// string or a list of token ids (vLLM accepts both).
type CompletionRequest struct {
	Model         string          `json:"model"`
	Prompt        json.RawMessage `json:"prompt"`
	Stream        bool            `json:"stream,omitempty"`
	StreamOptions *StreamOptions  `json:"stream_options,omitempty"`
	MaxTokens     *int            `json:"max_tokens,omitempty"`
	MinTokens     int             `json:"min_tokens,omitempty"`
	IgnoreEOS     bool            `json:"ignore_eos,omitempty"`
	Seed          *int64          `json:"seed,omitempty"`
	User          string          `json:"user,omitempty"`
	CacheSalt     string          `json:"cache_salt,omitempty"`
	Priority      *int            `json:"priority,omitempty"`
}

// StreamOptions is stream_options.
type StreamOptions struct {
	IncludeUsage         bool `json:"include_usage"`
	ContinuousUsageStats bool `json:"continuous_usage_stats,omitempty"`
}

// Message is one chat message. Content is kept raw because it is either a
// string or a list of content parts; ContentText flattens it.
type Message struct {
	Role       string          `json:"role"`
	Content    json.RawMessage `json:"content,omitempty"`
	Name       string          `json:"name,omitempty"`
	ToolCalls  []ToolCall      `json:"tool_calls,omitempty"`
	ToolCallID string          `json:"tool_call_id,omitempty"`
}

// ContentText returns the message's text: the string content, or the text
// parts of a content list joined in order. Non-text parts are skipped.
func (m *Message) ContentText() (string, error) {
	b, err := m.AppendContentText(nil)
	if err != nil {
		return "", err
	}
	return unsafe.String(unsafe.SliceData(b), len(b)), nil // b is new and never written again
}

// AppendContentText appends ContentText to dst; on error dst is returned
// unchanged. A renderer builds a prompt with it without a copy of each
// message's text.
func (m *Message) AppendContentText(dst []byte) ([]byte, error) {
	c := bytes.TrimSpace(m.Content)
	if len(c) == 0 || bytes.Equal(c, []byte("null")) {
		return dst, nil
	}
	if c[0] == '"' {
		out, err := jsonstr.AppendDecode(dst, c)
		if err != nil {
			return dst, fmt.Errorf("cannot decode message content: %w", err)
		}
		return out, nil
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(c, &parts); err != nil {
		return dst, fmt.Errorf("message content must be a string or a list of parts: %w", err)
	}
	for _, p := range parts {
		switch p.Type {
		case "text", "input_text", "output_text": // the last two as in Responses API items
			dst = append(dst, p.Text...)
		}
	}
	return dst, nil
}

// Tool is one entry of tools. Parameters stay raw so that the key order of
// the client's schema survives into the prompt, as engines render it.
type Tool struct {
	Type     string       `json:"type"`
	Function ToolFunction `json:"function"`
}

// ToolFunction describes a callable function.
type ToolFunction struct {
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	Parameters  json.RawMessage `json:"parameters,omitempty"`
	Strict      *bool           `json:"strict,omitempty"`
}

// ToolCall is a tool call in an assistant message or a response.
type ToolCall struct {
	ID       string           `json:"id"`
	Type     string           `json:"type"`
	Function ToolCallFunction `json:"function"`
}

// ToolCallFunction is the called function and its JSON-encoded arguments.
type ToolCallFunction struct {
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

// ToolChoiceKind is the decoded form of tool_choice.
type ToolChoiceKind uint8

const (
	ToolChoiceAuto ToolChoiceKind = iota
	ToolChoiceNone
	ToolChoiceRequired
	ToolChoiceNamed
)

// ParseToolChoice decodes tool_choice: "auto", "none", "required" or
// {"type":"function","function":{"name":...}}. An absent value means auto
// when tools are present and none otherwise, as in the OpenAI API.
func ParseToolChoice(raw json.RawMessage, haveTools bool) (ToolChoiceKind, string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		if haveTools {
			return ToolChoiceAuto, "", nil
		}
		return ToolChoiceNone, "", nil
	}
	if raw[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return 0, "", fmt.Errorf("cannot decode tool_choice: %w", err)
		}
		switch s {
		case "auto":
			return ToolChoiceAuto, "", nil
		case "none":
			return ToolChoiceNone, "", nil
		case "required":
			return ToolChoiceRequired, "", nil
		}
		return 0, "", fmt.Errorf("tool_choice %q is not one of auto, none, required", s)
	}
	var named struct {
		Type     string `json:"type"`
		Function struct {
			Name string `json:"name"`
		} `json:"function"`
	}
	if err := json.Unmarshal(raw, &named); err != nil {
		return 0, "", fmt.Errorf("cannot decode tool_choice: %w", err)
	}
	if named.Type != "function" || named.Function.Name == "" {
		return 0, "", fmt.Errorf("named tool_choice needs type \"function\" and function.name")
	}
	return ToolChoiceNamed, named.Function.Name, nil
}

// Usage is the token accounting of a response.
type Usage struct {
	PromptTokens        int                  `json:"prompt_tokens"`
	TotalTokens         int                  `json:"total_tokens"`
	CompletionTokens    int                  `json:"completion_tokens"`
	PromptTokensDetails *PromptTokensDetails `json:"prompt_tokens_details"`
}

// PromptTokensDetails carries the prefix-cache hit count.
type PromptTokensDetails struct {
	CachedTokens int `json:"cached_tokens"`
}

// ErrorResponse is the error body vLLM returns: {"error": {...}}.
type ErrorResponse struct {
	Error ErrorBody `json:"error"`
}

// ErrorBody is the inner error object.
type ErrorBody struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    int     `json:"code"`
}

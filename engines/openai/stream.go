package openai

import "encoding/json"

// Null is a JSON null for fields that engines always send as null.
var Null = json.RawMessage("null")

// Chunk is one streamed event of chat completions ("chat.completion.chunk")
// or completions ("text_completion"). Field order follows vLLM's output.
type Chunk struct {
	ID      string        `json:"id"`
	Object  string        `json:"object"`
	Created int64         `json:"created"`
	Model   string        `json:"model"`
	Choices []ChunkChoice `json:"choices"`
	Usage   *Usage        `json:"usage,omitempty"`
}

// ChunkChoice is a streamed choice: Delta for chat, Text for completions.
type ChunkChoice struct {
	Index        int             `json:"index"`
	Delta        *Delta          `json:"delta,omitempty"`
	Text         *string         `json:"text,omitempty"`
	Logprobs     json.RawMessage `json:"logprobs"`
	FinishReason *string         `json:"finish_reason"`
	// StopReason is present (as null) on the chunk that finishes a choice.
	StopReason json.RawMessage `json:"stop_reason,omitempty"`
}

// Delta is the incremental message of a chat chunk.
type Delta struct {
	Role      string          `json:"role,omitempty"`
	Content   *string         `json:"content,omitempty"`
	ToolCalls []DeltaToolCall `json:"tool_calls,omitempty"`
}

// DeltaToolCall is a streamed tool-call fragment: the first carries id, type
// and function name; later ones only argument text.
type DeltaToolCall struct {
	ID       string        `json:"id,omitempty"`
	Type     string        `json:"type,omitempty"`
	Index    int           `json:"index"`
	Function DeltaFunction `json:"function"`
}

// DeltaFunction is the function part of a DeltaToolCall.
type DeltaFunction struct {
	Name      string  `json:"name,omitempty"`
	Arguments *string `json:"arguments,omitempty"`
}

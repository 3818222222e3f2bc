package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
)

// ResponsesRequest is the body of POST /v1/responses: the fields the
// simulator serves and the router reads.
type ResponsesRequest struct {
	Model string `json:"model"`
	// Input is a string or a list of items.
	Input              json.RawMessage `json:"input"`
	Instructions       json.RawMessage `json:"instructions,omitempty"` // a string or null
	PreviousResponseID *string         `json:"previous_response_id,omitempty"`
	// Tools are Responses tools: {"type":"function","name",...}, flat.
	Tools           []ResponsesTool `json:"tools,omitempty"`
	Stream          bool            `json:"stream,omitempty"`
	MaxOutputTokens *int            `json:"max_output_tokens,omitempty"`
	User            string          `json:"user,omitempty"`
	CacheSalt       string          `json:"cache_salt,omitempty"`
}

// ResponsesTool is a function tool of the Responses API.
type ResponsesTool struct {
	Type        string          `json:"type"`
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	Parameters  json.RawMessage `json:"parameters,omitempty"`
}

// responsesItem is one input item: a message, a function call, or a
// function call's output.
type responsesItem struct {
	Type      string          `json:"type"`
	Role      string          `json:"role"`
	Content   json.RawMessage `json:"content"`
	CallID    string          `json:"call_id"`
	Name      string          `json:"name"`
	Arguments string          `json:"arguments"`
	Output    json.RawMessage `json:"output"`
}

// ResponsesMessages returns the chat messages vLLM builds from a Responses
// request before it applies the chat template (non-harmony models):
// instructions as a system message, a string input as a user message, and
// input items as messages: message items as they are, function_call as an
// assistant tool call, function_call_output as a tool message. Other item
// types (reasoning, built-in tool calls) are an error. instructions and
// input are raw JSON as in the request (instructions absent, null or a
// string); contents stay raw, to be decoded once when rendered.
func ResponsesMessages(instructions, input json.RawMessage) ([]Message, error) {
	var msgs []Message
	switch ins := bytes.TrimSpace(instructions); {
	case len(ins) == 0 || bytes.Equal(ins, Null) || bytes.Equal(ins, []byte(`""`)):
	case ins[0] != '"':
		return nil, errors.New("instructions must be a string")
	default:
		msgs = append(msgs, Message{Role: "system", Content: ins})
	}
	input = bytes.TrimSpace(input)
	switch {
	case len(input) == 0 || bytes.Equal(input, Null):
		return nil, errors.New("the request has no input")
	case input[0] == '"':
		return append(msgs, Message{Role: "user", Content: input}), nil
	case input[0] != '[':
		return nil, errors.New("input must be a string or a list of items")
	}
	var items []responsesItem
	if err := json.Unmarshal(input, &items); err != nil {
		return nil, fmt.Errorf("cannot decode input items: %w", err)
	}
	for i, it := range items {
		switch it.Type {
		case "", "message":
			if it.Role == "" {
				return nil, fmt.Errorf("input item %d: a message item needs a role", i)
			}
			msgs = append(msgs, Message{Role: it.Role, Content: it.Content})
		case "function_call":
			msgs = append(msgs, Message{Role: "assistant", ToolCalls: []ToolCall{{ID: it.CallID, Type: "function",
				Function: ToolCallFunction{Name: it.Name, Arguments: it.Arguments}}}})
		case "function_call_output":
			msgs = append(msgs, Message{Role: "tool", Content: it.Output, ToolCallID: it.CallID})
		default:
			return nil, fmt.Errorf("input item %d: item type %q is not rendered by the chat template", i, it.Type)
		}
	}
	return msgs, nil
}

// ChatTools converts Responses function tools to chat tools.
func ChatTools(tools []ResponsesTool) ([]Tool, error) {
	out := make([]Tool, 0, len(tools))
	for _, t := range tools {
		if t.Type != "function" {
			return nil, fmt.Errorf("tool type %q is not supported", t.Type)
		}
		out = append(out, Tool{Type: "function", Function: ToolFunction{Name: t.Name, Description: t.Description, Parameters: t.Parameters}})
	}
	return out, nil
}

package vllm

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omnious/provider-node/engines/tokenizer"
	"github.com/omnious/provider-node/extproc"
)

// weatherTool is an OpenAI function tool, as clients send it.
var weatherTool = map[string]any{
	"type": "function",
	"function": map[string]any{
		"name":        "get_weather",
		"description": "Get the current weather in a city.",
		"parameters": map[string]any{
			"type":       "object",
			"properties": map[string]any{"city": map[string]any{"type": "string", "description": "City name"}},
			"required":   []string{"city"},
		},
	},
}

// tokenizeChats are chats whose prompts our tokenizer and vLLM's must
// agree on: system prompts, tools, several turns, an assistant tool call
// and its result, non-ASCII text.
var tokenizeChats = []struct {
	name  string
	msgs  []map[string]any
	tools []any
}{
	{name: "system+user", msgs: []map[string]any{
		{"role": "system", "content": "You are a terse assistant. Answer in one sentence."},
		{"role": "user", "content": "What is the capital of France?"},
	}},
	{name: "no-system", msgs: []map[string]any{
		{"role": "user", "content": "Hello there!"},
	}},
	{name: "several-turns", msgs: []map[string]any{
		{"role": "system", "content": "You are a helpful assistant."},
		{"role": "user", "content": "Name a prime number."},
		{"role": "assistant", "content": "Seven."},
		{"role": "user", "content": "And one larger than 100?"},
		{"role": "assistant", "content": "101."},
		{"role": "user", "content": "Thanks — ¿y en español? 谢谢 🙂"},
	}},
	{name: "tools", tools: []any{weatherTool}, msgs: []map[string]any{
		{"role": "system", "content": "You can call tools."},
		{"role": "user", "content": "What's the weather in Paris?"},
	}},
	{name: "tool-call-and-result", tools: []any{weatherTool}, msgs: []map[string]any{
		{"role": "system", "content": "You can call tools."},
		{"role": "user", "content": "What's the weather in Paris?"},
		{"role": "assistant", "content": "", "tool_calls": []any{map[string]any{
			"id": "call_1", "type": "function",
			"function": map[string]any{"name": "get_weather", "arguments": `{"city": "Paris"}`},
		}}},
		{"role": "tool", "tool_call_id": "call_1", "content": `{"temp_c": 18, "sky": "clear"}`},
		{"role": "user", "content": "And in Lyon?"},
	}},
	{name: "tools-no-system", tools: []any{weatherTool}, msgs: []map[string]any{
		{"role": "user", "content": "Weather in Rome, please."},
	}},
}

// TestTokenizeMatchesVLLM: the token ids the EPP computes for a chat (the
// model's chat template rendered by our engine, our tokenizer) equal the
// ids vLLM's /tokenize gives for the same chat.
func TestTokenizeMatchesVLLM(t *testing.T) {
	f := getFleet(t)
	tok, err := tokenizer.Load(model, f.model)
	require.NoError(t, err)
	tmpl, err := tok.NewChatTemplate()
	require.NoError(t, err)
	p := extproc.NewTokenPrompter(map[string]extproc.ModelTokenizer{model: {Tokenizer: tok, Template: tmpl}}, nil)
	for _, tc := range tokenizeChats {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			body := map[string]any{"model": model, "messages": tc.msgs, "add_generation_prompt": true}
			if tc.tools != nil {
				body["tools"] = tc.tools
			}
			var got struct {
				Tokens []uint32 `json:"tokens"`
			}
			require.NoError(t, postJSON(ctx, f.replicas[0].base()+"/tokenize", body, &got))
			msgs, err := json.Marshal(tc.msgs)
			require.NoError(t, err)
			in := &extproc.PromptInput{API: extproc.APIChat, Messages: msgs, AddGenerationPrompt: true}
			if tc.tools != nil {
				in.Tools, err = json.Marshal(tc.tools)
				require.NoError(t, err)
			}
			ours, ok := p.Prompt(model, in)
			require.True(t, ok, "our prompter could not render the chat")
			require.Equal(t, got.Tokens, ours, "our prompt tokens differ from vLLM's /tokenize")
		})
	}
}

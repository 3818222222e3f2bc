package tokenizer

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/omnious/provider-node/engines/openai"
)

func TestStandInPieces(t *testing.T) {
	tok := NewStandIn()
	tests := []struct {
		name string
		text string
		want int
	}{
		{"empty", "", 0},
		{"one word", "hello", 1},
		{"word with space", " hello", 1},
		{"long word splits every six letters", "internationalization", 4},
		{"sentence", "The cat sat on the mat.", 7},
		{"digits in threes", "1234567", 3},
		{"specials are one token", "<|im_start|>user\nhi<|im_end|>", 5},
		{"cjk one per ideograph", "你好世界", 4},
		{"double space keeps the word's space", "a  b", 3},
		{"newline run", "a\n\n\nb", 3},
		{"unknown angle bracket", "<b>", 3},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			require.Len(t, tok.Encode(nil, tc.text), tc.want)
		})
	}
}

func TestStandInDeterministicAndSpecialIDs(t *testing.T) {
	tok := NewStandIn()
	a := tok.Encode(nil, "<|im_start|>system\nYou are helpful.<|im_end|>")
	b := tok.Encode(nil, "<|im_start|>system\nYou are helpful.<|im_end|>")
	require.Equal(t, a, b)
	require.Equal(t, StandInIMStart, a[0])
	require.Equal(t, StandInIMEnd, a[len(a)-1])
	for _, id := range a[1 : len(a)-1] {
		require.Less(t, id, uint32(standInVocab))
	}
	// Encode appends.
	c := tok.Encode([]uint32{7}, "hello")
	require.Equal(t, uint32(7), c[0])
	require.Len(t, c, 2)
}

func TestStandInRatioOnEnglish(t *testing.T) {
	text := strings.Repeat("Prefix caching lets the engine skip prefill for blocks it already holds. ", 50)
	n := len(NewStandIn().Encode(nil, text))
	ratio := float64(len(text)) / float64(n)
	require.InDelta(t, 4.0, ratio, 1.0, "about four characters per token")
}

func TestRenderStandInChatTurnsArePrefixes(t *testing.T) {
	msg := func(role, content string) openai.Message {
		raw, _ := json.Marshal(content)
		return openai.Message{Role: role, Content: raw}
	}
	tools := []openai.Tool{{Type: "function", Function: openai.ToolFunction{Name: "get_weather",
		Description: "Weather", Parameters: json.RawMessage(`{"type":"object","properties":{"z":{"type":"string"},"a":{"type":"integer"}}}`)}}}
	turn1 := []openai.Message{msg("system", "Be brief."), msg("user", "Weather in Paris?")}
	p1, err := RenderStandInChat(turn1, tools, true)
	require.NoError(t, err)
	require.Contains(t, p1, `"parameters": {"type":"object","properties":{"z":{"type":"string"},"a":{"type":"integer"}}}`,
		"tool schema keeps the client's key order")
	require.True(t, strings.HasSuffix(p1, "<|im_start|>assistant\n"))

	turn2 := append(turn1, openai.Message{Role: "assistant", ToolCalls: []openai.ToolCall{{ID: "c1", Type: "function",
		Function: openai.ToolCallFunction{Name: "get_weather", Arguments: `{"z": "Paris"}`}}}},
		msg("tool", "sunny"))
	p2, err := RenderStandInChat(turn2, tools, true)
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(p2, p1), "turn 2 extends turn 1")
	require.Contains(t, p2, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"z\": \"Paris\"}}\n</tool_call><|im_end|>")
	require.Contains(t, p2, "<tool_response>\nsunny\n</tool_response>")

	tok := NewStandIn()
	ids1, ids2 := tok.Encode(nil, p1), tok.Encode(nil, p2)
	require.Equal(t, ids1, ids2[:len(ids1)], "token ids of turn 1 are a prefix of turn 2's")

	_, err = RenderStandInChat([]openai.Message{{Role: "wizard"}}, nil, true)
	require.ErrorContains(t, err, "unknown role")
	_, err = RenderStandInChat([]openai.Message{{Role: "user", Content: json.RawMessage(`{"bad":1}`)}}, nil, true)
	require.Error(t, err)
}

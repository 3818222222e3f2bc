package tokenizer

import (
	"encoding/json"
	"math/rand/v2"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

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

// BenchmarkStandInEncode is the stand-in's cost on about 32 KiB of English
// text with newlines, digits and punctuation (the EPP and the simulator
// tokenize every prompt with it when no real tokenizer is loaded).
func BenchmarkStandInEncode(b *testing.B) {
	text := strings.Repeat("The router sends request 1234 to a replica whose cache holds its prefix.\nIt's fast; isn't it? ", 340)
	tok := NewStandIn()
	var dst []uint32
	b.SetBytes(int64(len(text)))
	b.ReportAllocs()
	for b.Loop() {
		dst = tok.Encode(dst[:0], text)
	}
	b.ReportMetric(float64(len(dst)), "tokens/op")
}

// refStandInEncode is the stand-in as first written, rune by rune with
// Unicode predicates: the table-driven Encode must give the same ids.
func refStandInEncode(text string) []uint32 {
	isLetter := func(r rune) bool {
		return (unicode.IsLetter(r) || unicode.IsMark(r)) && !unicode.Is(unicode.Han, r)
	}
	run := func(s string, ok func(rune) bool, max int) int {
		n, count := 0, 0
		for n < len(s) && count < max {
			r, size := utf8.DecodeRuneInString(s[n:])
			if !ok(r) {
				break
			}
			n += size
			count++
		}
		if n == 0 {
			_, n = utf8.DecodeRuneInString(s)
		}
		return n
	}
	startsWord := func(s string) bool {
		r, _ := utf8.DecodeRuneInString(s)
		return s != "" && isLetter(r)
	}
	var dst []uint32
	for len(text) > 0 {
		if id, n := matchStandInSpecial(text); text[0] == '<' && n > 0 {
			dst = append(dst, id)
			text = text[n:]
			continue
		}
		r, size := utf8.DecodeRuneInString(text)
		n := size
		switch {
		case r == ' ' && startsWord(text[1:]):
			n = 1 + run(text[1:], isLetter, standInMaxPiece)
		case isLetter(r):
			n = run(text, isLetter, standInMaxPiece)
		case unicode.IsDigit(r):
			n = run(text, unicode.IsDigit, standInMaxDigits)
		case unicode.IsSpace(r):
			n = run(text, unicode.IsSpace, len(text))
			if n > 1 && text[n-1] == ' ' && startsWord(text[n:]) {
				n--
			}
		}
		dst = append(dst, standInPieceID(text[:n]))
		text = text[n:]
	}
	return dst
}

var standInAlphabet = []string{"a", "Z", "é", "e\u0301", "ß", "Ж", "你", "か", "٣", "7", "0", " ", "  ", "\n", "\t", "\u00a0", "\u0085", "\u3000",
	".", "'", "<", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>", "<|endoftext|>", "\xff", "\xe4\xbd", "😀", "_", "-"}

func TestStandInMatchesReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	tok := NewStandIn()
	for range 3000 {
		var b strings.Builder
		for n := rng.IntN(40); n > 0; n-- {
			b.WriteString(standInAlphabet[rng.IntN(len(standInAlphabet))])
		}
		text := b.String()
		require.Equal(t, refStandInEncode(text), tok.Encode(nil, text), "%q", text)
	}
}

func FuzzStandInMatchesReference(f *testing.F) {
	for _, s := range standInAlphabet {
		f.Add(s + " word 123 " + s)
	}
	f.Fuzz(func(t *testing.T, text string) {
		require.Equal(t, refStandInEncode(text), NewStandIn().Encode(nil, text))
	})
}

// TestRenderStandInChatGolden pins the whole rendering of a conversation
// with every role, content parts, escapes, tools and tool calls (with and
// without text, with empty arguments): the ChatML Qwen's template gives.
func TestRenderStandInChatGolden(t *testing.T) {
	got, err := RenderStandInChat(goldenChat(), goldenTools(), true)
	require.NoError(t, err)
	require.Equal(t, "<|im_start|>system\nYou are \"terse\".\nBe brief.\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Weather \\\"now\\\"\", \"parameters\": {\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}}}}}\n</tools><|im_end|>\n<|im_start|>developer\nUse metric units.<|im_end|>\n<|im_start|>user\nWeather in Paris and Oslo? é😀<|im_end|>\n<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n18C\n</tool_response><|im_end|>\n<|im_start|>assistant\nChecking Oslo.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call><|im_end|>\n<|im_start|>assistant\n", got)
	noGen, err := RenderStandInChat(goldenChat(), goldenTools(), false)
	require.NoError(t, err)
	require.Equal(t, strings.TrimSuffix(got, "<|im_start|>assistant\n"), noGen)
}

func goldenChat() []openai.Message {
	return []openai.Message{
		{Role: "system", Content: json.RawMessage(`"You are \"terse\".\nBe brief."`)},
		{Role: "developer", Content: json.RawMessage(`[{"type":"text","text":"Use "},{"type":"image_url"},{"type":"input_text","text":"metric units."}]`)},
		{Role: "user", Content: json.RawMessage(`"Weather in Paris and Oslo? \u00e9\ud83d\ude00"`)},
		{Role: "assistant", Content: json.RawMessage(`null`), ToolCalls: []openai.ToolCall{
			{Function: openai.ToolCallFunction{Name: "get_weather", Arguments: `{"city": "Paris"}`}},
			{Function: openai.ToolCallFunction{Name: "get_weather", Arguments: ``}}}},
		{Role: "tool", Content: json.RawMessage(`"18C"`), ToolCallID: "a"},
		{Role: "assistant", Content: json.RawMessage(`"Checking Oslo."`), ToolCalls: []openai.ToolCall{
			{Function: openai.ToolCallFunction{Name: "get_weather", Arguments: `{"city": "Oslo"}`}}}},
	}
}

func goldenTools() []openai.Tool {
	return []openai.Tool{{Type: "function", Function: openai.ToolFunction{Name: "get_weather", Description: `Weather "now"`,
		Parameters: json.RawMessage(`{"type":"object","properties":{"city":{"type":"string"}}}`)}}}
}

// TestAppendStandInChat: appending to a buffer gives RenderStandInChat's
// text after what the buffer held, reusing a buffer leaves nothing of the
// previous text, and an error leaves the buffer's length as it was.
func TestAppendStandInChat(t *testing.T) {
	long := []openai.Message{{Role: "user", Content: json.RawMessage(`"` + strings.Repeat("many words here ", 4000) + `"`)}}
	bad := []openai.Message{{Role: "user", Content: json.RawMessage(`"ok"`)}, {Role: "wizard"}}
	for _, tc := range []struct {
		name  string
		msgs  []openai.Message
		tools []openai.Tool
		gen   bool
	}{
		{"golden with tools", goldenChat(), goldenTools(), true},
		{"golden, no generation prompt", goldenChat(), nil, false},
		{"long message", long, nil, true},
		{"empty", nil, nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want, err := RenderStandInChat(tc.msgs, tc.tools, tc.gen)
			require.NoError(t, err)
			got, err := AppendStandInChat([]byte("prefix"), tc.msgs, tc.tools, tc.gen)
			require.NoError(t, err)
			require.Equal(t, "prefix"+want, string(got))
			// A buffer that held a longer text.
			buf := append(make([]byte, 0, 8), strings.Repeat("x", 300000)...)
			got, err = AppendStandInChat(buf[:0], tc.msgs, tc.tools, tc.gen)
			require.NoError(t, err)
			require.Equal(t, want, string(got))
			got, err = AppendStandInChat(got[:3], bad, tc.tools, tc.gen)
			require.Error(t, err)
			require.Len(t, got, 3)
		})
	}
}

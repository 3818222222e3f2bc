package sim

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/omnious/provider-node/engines/openai"
	"github.com/omnious/provider-node/engines/tokenizer"
)

func keysOf(m map[string]json.RawMessage) []string {
	var k []string
	for key := range m {
		k = append(k, key)
	}
	sort.Strings(k)
	return k
}

// generateRequestKeys are the fields of vLLM's GenerateRequest, every one
// present in a render answer.
var generateRequestKeys = []string{"cache_salt", "features", "kv_transfer_params", "model", "priority", "request_id",
	"sampling_params", "stream", "stream_options", "token_ids"}

// TestChatRender: the chat render endpoint answers vLLM's GenerateRequest
// with the tokens the replica caches when it serves the same chat.
func TestChatRender(t *testing.T) {
	r := startReplica(t, nil)
	msgs := []any{map[string]any{"role": "system", "content": strings.Repeat("You answer questions about caches. ", 12)},
		userMsg("What is prefix caching?")}
	code, body := post(t, r, "/v1/chat/completions/render", map[string]any{"model": testModel, "messages": msgs})
	require.Equal(t, http.StatusOK, code, string(body))
	var raw map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(body, &raw))
	require.Equal(t, generateRequestKeys, keysOf(raw))
	var g openai.GenerateRequest
	require.NoError(t, json.Unmarshal(body, &g))
	require.True(t, strings.HasPrefix(g.RequestID, "chatcmpl-"), g.RequestID)
	require.Equal(t, testModel, *g.Model)
	require.False(t, g.Stream)
	require.Nil(t, g.StreamOptions)
	require.Nil(t, g.CacheSalt)
	require.Equal(t, "null", string(raw["features"]))
	require.Equal(t, "null", string(raw["kv_transfer_params"]))
	require.Equal(t, tokenizer.StandInIMStart, g.TokenIDs[0])
	// Only what differs from SamplingParams' defaults: max_tokens is the
	// room the context leaves, output_kind FINAL_ONLY.
	n := len(g.TokenIDs)
	require.JSONEq(t, `{"stop":[],"stop_token_ids":[],"max_tokens":`+itoa(r.cfg.MaxModelLen-n)+
		`,"output_kind":2,"skip_clone":true,"bad_words":[],"skip_reading_prefix_cache":false}`, string(raw["sampling_params"]))

	// /tokenize agrees, and so does the chat the replica serves: its usage
	// counts these tokens and its cache holds their full blocks.
	code, body = post(t, r, "/tokenize", map[string]any{"model": testModel, "messages": msgs})
	require.Equal(t, http.StatusOK, code, string(body))
	var tok openai.TokenizeResponse
	require.NoError(t, json.Unmarshal(body, &tok))
	require.Equal(t, g.TokenIDs, tok.Tokens)
	code, body = post(t, r, "/v1/chat/completions", map[string]any{"model": testModel, "messages": msgs, "max_tokens": 2})
	require.Equal(t, http.StatusOK, code, string(body))
	var resp chatResponse
	require.NoError(t, json.Unmarshal(body, &resp))
	require.Equal(t, n, resp.Usage.PromptTokens)
	_, body = get(t, r, "/admin/blocks")
	var view residentView
	require.NoError(t, json.Unmarshal(body, &view))
	cached := 0
	for i := 0; i+16 <= n; i += 16 {
		for _, b := range view.Blocks {
			if slices.Equal(b.TokenIDs, g.TokenIDs[i:i+16]) {
				cached++
				break
			}
		}
	}
	require.Equal(t, n/16, cached, "every full block of the rendered prompt is a block the replica cached")
}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }

// TestChatRenderFields: sampling parameters come back as vLLM normalises
// them, stream fields are kept, the tool choice is checked as chat checks it.
func TestChatRenderFields(t *testing.T) {
	r := startReplica(t, nil)
	msgs := []any{userMsg("Test sampling params")}
	render := func(extra map[string]any) (int, openai.GenerateRequest, map[string]json.RawMessage, string) {
		req := map[string]any{"model": testModel, "messages": msgs}
		for k, v := range extra {
			req[k] = v
		}
		code, body := post(t, r, "/v1/chat/completions/render", req)
		var g openai.GenerateRequest
		var sp map[string]json.RawMessage
		if code == http.StatusOK {
			require.NoError(t, json.Unmarshal(body, &g))
			var raw map[string]json.RawMessage
			require.NoError(t, json.Unmarshal(body, &raw))
			require.NoError(t, json.Unmarshal(raw["sampling_params"], &sp))
		}
		return code, g, sp, string(body)
	}

	code, g, sp, body := render(map[string]any{"temperature": 0.123, "top_p": 0.456, "frequency_penalty": 1.1, "max_tokens": 30,
		"seed": 5, "stop": "END", "cache_salt": "s1", "priority": 2})
	require.Equal(t, http.StatusOK, code, body)
	require.JSONEq(t, "0.123", string(sp["temperature"]))
	require.JSONEq(t, "0.456", string(sp["top_p"]))
	require.JSONEq(t, "1.1", string(sp["frequency_penalty"]))
	require.JSONEq(t, "30", string(sp["max_tokens"]))
	require.JSONEq(t, "5", string(sp["seed"]))
	require.JSONEq(t, `["END"]`, string(sp["stop"]))
	require.JSONEq(t, "2", string(sp["output_text_buffer_length"]), "len(END)-1 characters held back")
	require.NotContains(t, sp, "top_k", "a default is omitted")
	require.NotContains(t, sp, "_all_stop_token_ids")
	require.Equal(t, "s1", *g.CacheSalt)
	require.Equal(t, 2, g.Priority)

	// Greedy sampling drops top_p; a tiny temperature is raised to 0.01.
	_, _, sp, _ = render(map[string]any{"temperature": 0, "top_p": 0.5})
	require.JSONEq(t, "0", string(sp["temperature"]))
	require.NotContains(t, sp, "top_p")
	_, _, sp, _ = render(map[string]any{"temperature": 0.001})
	require.JSONEq(t, "0.01", string(sp["temperature"]))

	code, g, sp, body = render(map[string]any{"stream": true, "stream_options": map[string]any{"continuous_usage_stats": true}})
	require.Equal(t, http.StatusOK, code, body)
	require.True(t, g.Stream)
	require.Equal(t, &openai.RenderStreamOptions{IncludeUsage: true, ContinuousUsageStats: true}, g.StreamOptions)
	require.JSONEq(t, "1", string(sp["output_kind"]), "streamed: deltas")

	for _, tc := range []struct {
		extra map[string]any
		code  int
		msg   string
	}{
		{map[string]any{"model": "nope"}, http.StatusNotFound, "The model `nope` does not exist."},
		{map[string]any{"use_beam_search": true}, http.StatusBadRequest, "Beam search is not supported by the render endpoint"},
		{map[string]any{"temperature": 3}, http.StatusBadRequest, "temperature must be in [0, 2], got 3.0."},
		{map[string]any{"top_p": 0}, http.StatusBadRequest, "top_p must be in (0, 1], got 0.0."},
		{map[string]any{"n": 2, "temperature": 0}, http.StatusBadRequest, "n must be 1 when using greedy sampling, got 2."},
		{map[string]any{"stop": []string{"a", ""}}, http.StatusBadRequest, "stop cannot contain an empty string."},
		{map[string]any{"max_tokens": 50000}, http.StatusBadRequest, "'max_tokens' or 'max_completion_tokens' is too large"},
		{map[string]any{"messages": []any{}}, http.StatusBadRequest, "Field required: messages"},
		{map[string]any{"tools": []any{map[string]any{"type": "function", "function": map[string]any{"name": "f"}}}},
			http.StatusOK, ""},
		{map[string]any{"continue_final_message": true, "add_generation_prompt": true}, http.StatusBadRequest,
			"Cannot set both `continue_final_message` and `add_generation_prompt` to True."},
	} {
		code, _, _, body := render(tc.extra)
		require.Equal(t, tc.code, code, "%v: %s", tc.extra, body)
		if tc.msg != "" {
			var e openai.ErrorResponse
			require.NoError(t, json.Unmarshal([]byte(body), &e))
			require.Contains(t, e.Error.Message, tc.msg)
			require.Equal(t, tc.code, e.Error.Code)
		}
	}
	// With auto tool choice off, vLLM refuses tools with an auto choice.
	off := startReplica(t, func(c *Config) { c.EnableAutoToolChoice = new(false) })
	code, body2 := post(t, off, "/v1/chat/completions/render", map[string]any{"model": testModel, "messages": msgs,
		"tools": []any{map[string]any{"type": "function", "function": map[string]any{"name": "f"}}}})
	require.Equal(t, http.StatusBadRequest, code)
	require.Contains(t, string(body2), `\"auto\" tool choice requires --enable-auto-tool-choice`)
}

// TestCompletionRender: one GenerateRequest per prompt, max_tokens
// defaulting to the completions API's 16 (SamplingParams' default, so
// omitted), token-id prompts passed through.
func TestCompletionRender(t *testing.T) {
	r := startReplica(t, nil)
	render := func(req map[string]any) (int, []openai.GenerateRequest, []map[string]json.RawMessage, string) {
		code, body := post(t, r, "/v1/completions/render", req)
		var out []openai.GenerateRequest
		var raws []map[string]json.RawMessage
		if code == http.StatusOK {
			require.NoError(t, json.Unmarshal(body, &out))
			require.NoError(t, json.Unmarshal(body, &raws))
		}
		return code, out, raws, string(body)
	}
	prompt := "When should a chat-completions handler return an empty string?"
	code, out, raws, body := render(map[string]any{"model": testModel, "prompt": prompt})
	require.Equal(t, http.StatusOK, code, body)
	require.Len(t, out, 1)
	require.Equal(t, generateRequestKeys, keysOf(raws[0]))
	require.True(t, strings.HasPrefix(out[0].RequestID, "cmpl-"), out[0].RequestID)
	require.Equal(t, r.tok.Encode(nil, prompt), out[0].TokenIDs)
	var sp map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(raws[0]["sampling_params"], &sp))
	require.NotContains(t, sp, "max_tokens", "16 is SamplingParams' default")

	code, body2 := post(t, r, "/v1/completions", map[string]any{"model": testModel, "prompt": prompt, "max_tokens": 1})
	require.Equal(t, http.StatusOK, code, string(body2))
	var resp chatResponse
	require.NoError(t, json.Unmarshal(body2, &resp))
	require.Equal(t, len(out[0].TokenIDs), resp.Usage.PromptTokens)

	code, out, _, body = render(map[string]any{"model": testModel, "prompt": []string{"Hello world", "Goodbye world"}, "max_tokens": 5})
	require.Equal(t, http.StatusOK, code, body)
	require.Len(t, out, 2)
	require.NotEqual(t, out[0].RequestID, out[1].RequestID)
	require.Equal(t, 5, *out[1].SamplingParams.MaxTokens)
	code, out, _, body = render(map[string]any{"prompt": [][]int{{1, 2, 3}, {4}}})
	require.Equal(t, http.StatusOK, code, body)
	require.Equal(t, []uint32{1, 2, 3}, out[0].TokenIDs)
	require.Nil(t, out[0].Model, "no model asked, none named")

	for _, tc := range []struct {
		req  map[string]any
		code int
		msg  string
	}{
		{map[string]any{"model": "invalid-model-name", "prompt": "Hello"}, http.StatusNotFound, "does not exist"},
		{map[string]any{"prompt": "x", "suffix": "y"}, http.StatusBadRequest, "suffix is not currently supported"},
		{map[string]any{"prompt": ""}, http.StatusBadRequest, "prompt cannot be empty"},
		{map[string]any{"prompt": []any{"a", 3}}, http.StatusBadRequest, "prompt must be"},
		{map[string]any{}, http.StatusBadRequest, "Field required: prompt"},
		{map[string]any{"prompt": strings.Repeat("word ", 50000)}, http.StatusBadRequest, "maximum context length"},
	} {
		code, _, _, body := render(tc.req)
		require.Equal(t, tc.code, code, "%v: %s", tc.req, body)
		require.Contains(t, body, tc.msg)
	}
}

// TestDetokenize: what the simulated model writes decodes back to its
// text; the special tokens decode; a prompt piece's hash does not.
func TestDetokenize(t *testing.T) {
	r := startReplica(t, nil)
	code, body := post(t, r, "/v1/completions", map[string]any{"model": testModel, "prompt": "Tell me about caches", "max_tokens": 12})
	require.Equal(t, http.StatusOK, code, string(body))
	var resp chatResponse
	require.NoError(t, json.Unmarshal(body, &resp))
	answer := resp.Choices[0].Text
	require.NotEmpty(t, answer)
	code, body = post(t, r, "/tokenize", map[string]any{"prompt": answer})
	require.Equal(t, http.StatusOK, code, string(body))
	var tok openai.TokenizeResponse
	require.NoError(t, json.Unmarshal(body, &tok))
	require.Equal(t, 12, tok.Count)
	decode := func(ids any) (int, string) {
		code, body := post(t, r, "/detokenize", map[string]any{"model": testModel, "tokens": ids})
		if code != http.StatusOK {
			return code, string(body)
		}
		var d openai.DetokenizeResponse
		require.NoError(t, json.Unmarshal(body, &d))
		return code, d.Prompt
	}
	code, text := decode(tok.Tokens)
	require.Equal(t, http.StatusOK, code, text)
	require.Equal(t, answer, text)
	code, text = decode([]uint32{tokenizer.StandInIMStart, tokenizer.StandInIMEnd})
	require.Equal(t, http.StatusOK, code, text)
	require.Equal(t, "<|im_start|><|im_end|>", text)

	code, text = decode(r.tok.Encode(nil, "zqxjv"))
	require.Equal(t, http.StatusBadRequest, code)
	require.Contains(t, text, "decodes only the ids its model writes")
	code, text = decode([]int{-1})
	require.Equal(t, http.StatusBadRequest, code)
	require.Contains(t, text, "greater than or equal to 0")
	code, body = post(t, r, "/detokenize", map[string]any{"model": testModel})
	require.Equal(t, http.StatusBadRequest, code)
	require.Contains(t, string(body), "Field required: tokens")
	code, body = post(t, r, "/detokenize", map[string]any{"model": "other", "tokens": []int{}})
	require.Equal(t, http.StatusNotFound, code, string(body))
}

// TestTokenizeContinueFinalMessage: the final message is left open, as Hugging Face
// templates cut it; the chat endpoint renders it the same way.
func TestTokenizeContinueFinalMessage(t *testing.T) {
	r := startReplica(t, nil)
	msgs := []any{userMsg("Count to three."), map[string]any{"role": "assistant", "content": "One, two,"}}
	code, body := post(t, r, "/tokenize", map[string]any{"messages": msgs, "continue_final_message": true, "add_generation_prompt": false})
	require.Equal(t, http.StatusOK, code, string(body))
	var open openai.TokenizeResponse
	require.NoError(t, json.Unmarshal(body, &open))
	full, err := tokenizer.RenderStandInChat([]openai.Message{{Role: "user", Content: json.RawMessage(`"Count to three."`)},
		{Role: "assistant", Content: json.RawMessage(`"One, two,"`)}}, nil, false)
	require.NoError(t, err)
	cut := full[:strings.LastIndex(full, "One, two,")+len("One, two,")]
	require.Equal(t, r.tok.Encode(nil, cut), open.Tokens)
	require.NotContains(t, open.Tokens[len(open.Tokens)-1:], tokenizer.StandInIMEnd)

	code, body = post(t, r, "/v1/chat/completions", map[string]any{"model": testModel, "messages": msgs,
		"continue_final_message": true, "add_generation_prompt": false, "max_tokens": 1})
	require.Equal(t, http.StatusOK, code, string(body))
	var resp chatResponse
	require.NoError(t, json.Unmarshal(body, &resp))
	require.Equal(t, open.Count, resp.Usage.PromptTokens)

	code, body = post(t, r, "/tokenize", map[string]any{"messages": msgs, "continue_final_message": true})
	require.Equal(t, http.StatusBadRequest, code)
	require.Contains(t, string(body), "not compatible")
	code, body = post(t, r, "/tokenize", map[string]any{"prompt": "x", "return_token_strs": true})
	require.Equal(t, http.StatusBadRequest, code)
	require.Contains(t, string(body), "no token strings")
}

// FuzzTokenizerEndpoints: any body to the tokenize, detokenize and render
// endpoints gets a JSON answer, a 200 or a client error in vLLM's error
// body, never a 500 or a panic.
func FuzzTokenizerEndpoints(f *testing.F) {
	r := startReplica(f, nil)
	h := r.routes()
	paths := []string{"/tokenize", "/detokenize", "/v1/chat/completions/render", "/v1/completions/render"}
	for i, body := range []string{`{"prompt":"hi"}`, `{"tokens":[151644,3]}`,
		`{"messages":[{"role":"user","content":"x"}],"temperature":0,"n":2}`, `{"prompt":[[1,2],"a b"],"stop":["",1]}`,
		`{"messages":[{"role":"assistant","content":"a"}],"continue_final_message":true,"add_generation_prompt":false}`,
		`{"prompt":"x","max_tokens":-1,"min_tokens":5}`} {
		f.Add(uint8(i), []byte(body))
	}
	f.Fuzz(func(t *testing.T, which uint8, body []byte) {
		path := paths[int(which)%len(paths)]
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, path, bytes.NewReader(body)))
		if rec.Code != http.StatusOK && (rec.Code < 400 || rec.Code >= 500) {
			t.Fatalf("%s %q: status %d: %s", path, body, rec.Code, rec.Body)
		}
		if !json.Valid(rec.Body.Bytes()) {
			t.Fatalf("%s %q: not JSON: %s", path, body, rec.Body)
		}
		if rec.Code != http.StatusOK {
			var e openai.ErrorResponse
			if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil || e.Error.Message == "" || e.Error.Code != rec.Code {
				t.Fatalf("%s %q: error body %s", path, body, rec.Body)
			}
		}
	})
}

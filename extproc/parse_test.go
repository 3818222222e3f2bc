package extproc

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/omnious/provider-node/engines/openai"
)

func TestParseRequestBody(t *testing.T) {
	tests := []struct {
		name, body string
		err        string
		model      string
		stream     bool
		asked      bool
		user, salt string
		messages   string
		prompt     string
	}{
		{name: "chat", body: `{"model":"m","messages":[{"role":"user","content":"a\"b"}],"stream":true}`,
			model: "m", stream: true, messages: `[{"role":"user","content":"a\"b"}]`},
		{name: "whitespace and escapes", body: " {\n \"model\" : \"m\\u00e9\" ,\"user\":\"u\\n\", \"cache_salt\":\"s\", \"prompt\": [1, 2.5e3, -0.1, true, null, {}]} \n",
			model: "mé", user: "u\n", salt: "s", prompt: `[1, 2.5e3, -0.1, true, null, {}]`},
		{name: "escaped key", body: `{"mod\u0065l":"m"}`, model: "m"},
		{name: "usage asked", body: `{"model":"m","stream":true,"stream_options":{"include_usage":true}}`, model: "m", stream: true, asked: true},
		{name: "stream false", body: `{"model":"m","stream":false}`, model: "m"},
		{name: "no model", body: `{"messages":[]}`},
		{name: "empty", body: ``, err: "JSON object"},
		{name: "array", body: `[1]`, err: "JSON object"},
		{name: "truncated", body: `{"model":"m","messages":[{"role":"u`, err: "unexpected end"},
		{name: "trailing garbage", body: `{"model":"m"} x`, err: "after the JSON object"},
		{name: "missing colon", body: `{"model" "m"}`, err: "expected ':'"},
		{name: "bad literal", body: `{"model":"m","stream":tru}`, err: "invalid literal"},
		{name: "bad number", body: `{"model":"m","max_tokens":01}`, err: "after object member"},
		{name: "bad escape", body: `{"model":"m\x"}`, err: "invalid escape"},
		{name: "bad unicode escape", body: `{"model":"\u12G4"}`, err: "invalid \\u escape"},
		{name: "model not a string", body: `{"model":7}`, err: "model must be a string"},
		{name: "too deep", body: `{"a":` + strings.Repeat("[", 300) + strings.Repeat("]", 300) + `}`, err: "too deeply"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var rb requestBody
			err := parseRequestBody([]byte(tc.body), &rb)
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			require.True(t, json.Valid([]byte(tc.body)), "test body must be valid JSON")
			b := []byte(tc.body)
			require.Equal(t, tc.model, rb.modelName)
			require.Equal(t, tc.stream, rb.stream)
			require.Equal(t, tc.asked, rb.usageAsked)
			require.Equal(t, tc.user, rb.user)
			require.Equal(t, tc.salt, rb.cacheSalt)
			if tc.messages != "" {
				require.Equal(t, tc.messages, string(rb.messages.of(b)))
			}
			if tc.prompt != "" {
				require.Equal(t, tc.prompt, string(rb.prompt.of(b)))
			}
		})
	}
}

func TestUsageEdit(t *testing.T) {
	tests := []struct{ in, want string }{
		{`{"model":"m","stream":true}`, `{"stream_options":{"include_usage":true},"model":"m","stream":true}`},
		{`{"model":"m","stream":true,"stream_options":null}`, `{"model":"m","stream":true,"stream_options":{"include_usage":true}}`},
		{`{"model":"m","stream":true,"stream_options":{ }}`, `{"model":"m","stream":true,"stream_options":{"include_usage":true }}`},
		{`{"model":"m","stream":true,"stream_options":{"include_usage":false}}`, `{"model":"m","stream":true,"stream_options":{"include_usage":true}}`},
		{`{"model":"m","stream":true,"stream_options":{"continuous_usage_stats":true}}`, `{"model":"m","stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":true}}`},
	}
	for _, tc := range tests {
		var rb requestBody
		require.NoError(t, parseRequestBody([]byte(tc.in), &rb))
		e, ok := usageEdit([]byte(tc.in), &rb)
		require.True(t, ok)
		got := applyEdits(nil, []byte(tc.in), []edit{e})
		require.Equal(t, tc.want, string(got))
		require.True(t, json.Valid(got))
	}
	var rb requestBody
	in := []byte(`{"model":"m","stream":true,"stream_options":"x"}`)
	require.NoError(t, parseRequestBody(in, &rb))
	_, ok := usageEdit(in, &rb)
	require.False(t, ok, "a malformed stream_options is left for the engine to reject")
}

func TestSSEChunks(t *testing.T) {
	crlf := strings.ReplaceAll(ev1, "\n", "\r\n")
	tests := []struct {
		name    string
		r       respState
		chunks  []string
		want    []string
		prompt  int
		noUsage bool
	}{
		{name: "split events held until complete", chunks: []string{ev1[:7], ev1[7:] + evUsage[:3], evUsage[3:] + evDone},
			want: []string{"", ev1, evUsage + evDone}, prompt: 5},
		{name: "strip usage event", r: respState{strip: true}, chunks: []string{ev1 + evUsage + evDone}, want: []string{ev1 + evDone}, prompt: 5},
		{name: "rewrite model", r: respState{rewrite: `"client"`}, chunks: []string{ev1},
			want: []string{strings.Replace(ev1, `"m1"`, `"client"`, 1)}, noUsage: true},
		{name: "CRLF events", chunks: []string{crlf[:len(crlf)-2], crlf[len(crlf)-2:]}, want: []string{"", crlf}, noUsage: true},
		{name: "incomplete tail flushed at end", chunks: []string{"data: {\"x\":1}"}, want: []string{"data: {\"x\":1}"}, noUsage: true},
		{name: "responses API completed event", chunks: []string{"event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"model\":\"m1\",\"usage\":{\"input_tokens\":5,\"output_tokens\":2,\"input_tokens_details\":{\"cached_tokens\":1}}}}\n\n"},
			want: []string{"event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"model\":\"m1\",\"usage\":{\"input_tokens\":5,\"output_tokens\":2,\"input_tokens_details\":{\"cached_tokens\":1}}}}\n\n"}, prompt: 5},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := tc.r
			for i, c := range tc.chunks {
				out := r.sseChunk([]byte(c), i == len(tc.chunks)-1)
				require.Equal(t, tc.want[i], string(out), "chunk %d", i)
			}
			require.Equal(t, !tc.noUsage, r.usage.seen)
			require.Equal(t, tc.prompt, r.usage.prompt)
		})
	}
}

func TestJSONResponse(t *testing.T) {
	r := respState{rewrite: `"client"`}
	out := r.jsonBody([]byte(jsonResp))
	require.Equal(t, strings.Replace(jsonResp, `"m1"`, `"client"`, 1), string(out))
	require.Equal(t, usage{prompt: 5, cached: 2, completion: 3, seen: true}, r.usage)
	r = respState{}
	require.Equal(t, "not json", string(r.jsonBody([]byte("not json"))))
	require.False(t, r.usage.seen)
}

func TestConfigValidate(t *testing.T) {
	require.NoError(t, Config{}.WithDefaults().Validate())
	bad := Config{ChunkSize: 70000, DefaultBodyMode: "STREAMED", MaxEndpoints: new(-1), MaxRecvMsgSize: 1 << 20}.WithDefaults()
	err := bad.Validate()
	for _, s := range []string{"chunk_size", "default_body_mode", "max_endpoints", "max_recv_msg_size"} {
		require.ErrorContains(t, err, s)
	}
}

// TestDecodeMessages compares the scanner-based decoder with encoding/json
// on the shapes clients send; they differ only where encoding/json is
// looser than the engines (keys matched case-insensitively).
func TestDecodeMessages(t *testing.T) {
	same := []struct{ name, raw string }{
		{"empty", `[]`},
		{"string contents", `[{"role":"system","content":"You are \"helpful\".\n"},{"role":"user","content":"caf\u00e9 你好"}]`},
		{"parts and null", `[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"x"}}]},{"role":"assistant","content":null}]`},
		{"tool call and result", `[{"role":"assistant","content":"","tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{\"x\":1}"}}]},{"role":"tool","tool_call_id":"c1","name":"f","content":"42"}]`},
		{"unknown keys and whitespace", " [ {\"role\" : \"user\", \"x\": [1, {\"y\": null}], \"content\" : \"hi\" } ] "},
		{"repeated key keeps the last", `[{"role":"user","content":"a","content":"b"}]`},
		{"null name", `[{"role":"user","name":null,"content":"a"}]`},
	}
	for _, tc := range same {
		t.Run(tc.name, func(t *testing.T) {
			var want []openai.Message
			require.NoError(t, json.Unmarshal([]byte(tc.raw), &want))
			got, err := decodeMessages([]byte(tc.raw))
			require.NoError(t, err)
			require.Len(t, got, len(want))
			for i := range want {
				require.Equal(t, want[i].Role, got[i].Role)
				require.Equal(t, want[i].Name, got[i].Name)
				require.Equal(t, want[i].ToolCallID, got[i].ToolCallID)
				require.Equal(t, want[i].ToolCalls, got[i].ToolCalls)
				wt, werr := want[i].ContentText()
				gt, gerr := got[i].ContentText()
				require.Equal(t, werr == nil, gerr == nil)
				require.Equal(t, wt, gt)
			}
		})
	}
	bad := []struct{ name, raw string }{
		{"not an array", `{"role":"user"}`},
		{"element not an object", `["hi"]`},
		{"role not a string", `[{"role":1,"content":"a"}]`},
		{"bad tool_calls", `[{"role":"assistant","tool_calls":{"id":1}}]`},
		{"unterminated", `[{"role":"user","content":"a"}`},
		{"trailing garbage", `[{"role":"user"}] x`},
		{"missing comma", `[{"role":"user"} {"role":"user"}]`},
	}
	for _, tc := range bad {
		t.Run(tc.name, func(t *testing.T) {
			_, err := decodeMessages([]byte(tc.raw))
			require.Error(t, err)
		})
	}
}

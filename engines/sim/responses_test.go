package sim

import (
	"bufio"
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

type responseObject struct {
	ID     string `json:"id"`
	Object string `json:"object"`
	Model  string `json:"model"`
	Status string `json:"status"`
	Output []struct {
		Type    string `json:"type"`
		Role    string `json:"role"`
		Content []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		} `json:"content"`
	} `json:"output"`
	Usage struct {
		InputTokens        int `json:"input_tokens"`
		OutputTokens       int `json:"output_tokens"`
		InputTokensDetails struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"input_tokens_details"`
	} `json:"usage"`
}

// TestResponses: /v1/responses answers as the chat its request becomes (the
// same prompt tokens as the equivalent chat, the same cache), streamed as
// typed events that end in response.completed with the whole text and
// usage, and refuses what it cannot serve.
func TestResponses(t *testing.T) {
	r := startReplica(t, nil)
	long := strings.Repeat("The replica keeps recently used blocks in its cache. ", 30)
	req := map[string]any{"model": testModel, "instructions": "Be brief.", "input": long, "max_output_tokens": 12}

	code, body := post(t, r, "/v1/responses", req)
	require.Equal(t, http.StatusOK, code, string(body))
	var first responseObject
	require.NoError(t, json.Unmarshal(body, &first))
	require.Equal(t, "response", first.Object)
	require.Equal(t, testModel, first.Model)
	require.Contains(t, []string{"completed", "incomplete"}, first.Status)
	require.Len(t, first.Output, 1)
	require.Equal(t, "message", first.Output[0].Type)
	require.Equal(t, "output_text", first.Output[0].Content[0].Type)
	require.NotEmpty(t, first.Output[0].Content[0].Text)
	require.LessOrEqual(t, first.Usage.OutputTokens, 12)

	// The same prompt as the equivalent chat request: its tokens count the
	// same and its blocks are already cached.
	chat := map[string]any{"model": testModel, "max_tokens": 1,
		"messages": []any{map[string]any{"role": "system", "content": "Be brief."}, userMsg(long)}}
	code, body = post(t, r, "/v1/chat/completions", chat)
	require.Equal(t, http.StatusOK, code, string(body))
	var c chatResponse
	require.NoError(t, json.Unmarshal(body, &c))
	require.Equal(t, first.Usage.InputTokens, c.Usage.PromptTokens)
	require.Equal(t, c.Usage.PromptTokens/16*16, c.Usage.PromptTokensDetails.CachedTokens)

	// Streamed: the typed events in order, text deltas that add up to the
	// non-streamed text, usage in response.completed.
	req["stream"] = true
	raw, err := json.Marshal(req)
	require.NoError(t, err)
	resp, err := http.Post("http://"+r.Addr()+"/v1/responses", "application/json", bytes.NewReader(raw))
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var types []string
	var deltas strings.Builder
	var done responseObject
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "event: "):
			types = append(types, strings.TrimPrefix(line, "event: "))
		case strings.HasPrefix(line, "data: "):
			var ev struct {
				Type     string          `json:"type"`
				Delta    string          `json:"delta"`
				Response json.RawMessage `json:"response"`
			}
			require.NoError(t, json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &ev))
			require.Equal(t, types[len(types)-1], ev.Type, "event line and data agree")
			deltas.WriteString(ev.Delta)
			if ev.Type == "response.completed" || ev.Type == "response.incomplete" {
				require.NoError(t, json.Unmarshal(ev.Response, &done))
			}
		}
	}
	require.NoError(t, sc.Err())
	require.Equal(t, []string{"response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"}, types[:4])
	require.Equal(t, "response.output_text.done", types[len(types)-4])
	require.Contains(t, []string{"response.completed", "response.incomplete"}, types[len(types)-1])
	require.Equal(t, first.Output[0].Content[0].Text, deltas.String())
	require.Equal(t, first.Output[0].Content[0].Text, done.Output[0].Content[0].Text)
	require.Equal(t, first.Usage.InputTokens, done.Usage.InputTokens)
	require.Equal(t, first.Usage.InputTokens/16*16, done.Usage.InputTokensDetails.CachedTokens)

	for _, bad := range []struct {
		name string
		body map[string]any
	}{
		{"stored conversation", map[string]any{"model": testModel, "previous_response_id": "resp_1", "input": "and then?"}},
		{"no input", map[string]any{"model": testModel}},
		{"instructions not a string", map[string]any{"model": testModel, "instructions": 5, "input": "hi"}},
		{"reasoning item", map[string]any{"model": testModel, "input": []any{map[string]any{"type": "reasoning", "summary": []any{}}}}},
		{"built-in tool", map[string]any{"model": testModel, "input": "hi", "tools": []any{map[string]any{"type": "web_search"}}}},
	} {
		t.Run(bad.name, func(t *testing.T) {
			code, body := post(t, r, "/v1/responses", bad.body)
			require.Equal(t, http.StatusBadRequest, code, string(body))
		})
	}
}

package sim

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/omnious/provider-node/engines/kvevents"
	"github.com/omnious/provider-node/engines/openai"
)

const testModel = "Qwen/Qwen3-32B"

// startReplica runs one rank on free loopback ports until the test ends.
func startReplica(t testing.TB, mutate func(*Config)) *Replica {
	t.Helper()
	c := Config{Listen: "127.0.0.1:0", Seed: 7}
	c.KVEvents.Endpoint = "tcp://127.0.0.1:0"
	c.KVEvents.ReplayEndpoint = "tcp://127.0.0.1:0"
	c.Engine.TimeScale = 100
	c.Engine.NumGPUBlocks = 2048
	if mutate != nil {
		mutate(&c)
	}
	c = c.WithDefaults()
	require.NoError(t, c.Validate())
	r, err := NewReplica(c, 0, zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	return r
}

func post(t *testing.T, r *Replica, path string, body any) (int, []byte) {
	t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case string:
		rd = strings.NewReader(b)
	default:
		raw, err := json.Marshal(b)
		require.NoError(t, err)
		rd = bytes.NewReader(raw)
	}
	resp, err := http.Post("http://"+r.Addr()+path, "application/json", rd)
	require.NoError(t, err)
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, out
}

func get(t *testing.T, r *Replica, path string) (int, []byte) {
	t.Helper()
	resp, err := http.Get("http://" + r.Addr() + path)
	require.NoError(t, err)
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, out
}

func userMsg(text string) map[string]any { return map[string]any{"role": "user", "content": text} }

var weatherTool = map[string]any{"type": "function", "function": map[string]any{
	"name": "get_weather", "description": "Current weather",
	"parameters": json.RawMessage(`{"type":"object","properties":{"city":{"type":"string"},"unit":{"type":"string","enum":["c","f"]},"days":{"type":"integer"}},"required":["city","unit"]}`),
}}

var timeTool = map[string]any{"type": "function", "function": map[string]any{
	"name": "get_time", "parameters": json.RawMessage(`{"type":"object","properties":{"tz":{"type":"string"}}}`),
}}

type chatResponse struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Model   string `json:"model"`
	Choices []struct {
		Message struct {
			Role      string            `json:"role"`
			Content   *string           `json:"content"`
			ToolCalls []openai.ToolCall `json:"tool_calls"`
		} `json:"message"`
		Text         string `json:"text"`
		FinishReason string `json:"finish_reason"`
	} `json:"choices"`
	Usage openai.Usage `json:"usage"`
}

func TestModelsHealthTokenize(t *testing.T) {
	r := startReplica(t, nil)
	code, _ := get(t, r, "/health")
	require.Equal(t, http.StatusOK, code)

	code, body := get(t, r, "/v1/models")
	require.Equal(t, http.StatusOK, code)
	var models struct {
		Object string `json:"object"`
		Data   []struct {
			ID          string `json:"id"`
			OwnedBy     string `json:"owned_by"`
			MaxModelLen int    `json:"max_model_len"`
		} `json:"data"`
	}
	require.NoError(t, json.Unmarshal(body, &models))
	require.Equal(t, "list", models.Object)
	require.Len(t, models.Data, 1)
	require.Equal(t, testModel, models.Data[0].ID)
	require.Equal(t, "vllm", models.Data[0].OwnedBy)

	code, body = post(t, r, "/tokenize", map[string]any{"model": testModel, "prompt": "hello world"})
	require.Equal(t, http.StatusOK, code, string(body))
	var tok struct {
		Count  int      `json:"count"`
		Tokens []uint32 `json:"tokens"`
	}
	require.NoError(t, json.Unmarshal(body, &tok))
	require.Equal(t, 2, tok.Count)
	require.Len(t, tok.Tokens, 2)

	// The chat form counts exactly the prompt tokens a chat request reports.
	msgs := []any{userMsg("What is prefix caching?")}
	_, body = post(t, r, "/tokenize", map[string]any{"model": testModel, "messages": msgs})
	require.NoError(t, json.Unmarshal(body, &tok))
	code, body = post(t, r, "/v1/chat/completions", map[string]any{"model": testModel, "messages": msgs, "max_tokens": 3})
	require.Equal(t, http.StatusOK, code, string(body))
	var resp chatResponse
	require.NoError(t, json.Unmarshal(body, &resp))
	require.Equal(t, tok.Count, resp.Usage.PromptTokens)
}

func TestChatDeterministicAndCached(t *testing.T) {
	r := startReplica(t, nil)
	long := strings.Repeat("The replica keeps recently used blocks in its cache. ", 40)
	req := map[string]any{"model": testModel, "messages": []any{userMsg(long)}, "max_tokens": 20, "ignore_eos": true}
	var first, second chatResponse
	code, body := post(t, r, "/v1/chat/completions", req)
	require.Equal(t, http.StatusOK, code, string(body))
	require.NoError(t, json.Unmarshal(body, &first))
	code, body = post(t, r, "/v1/chat/completions", req)
	require.Equal(t, http.StatusOK, code, string(body))
	require.NoError(t, json.Unmarshal(body, &second))

	require.Equal(t, "chat.completion", first.Object)
	require.Equal(t, testModel, first.Model)
	require.Equal(t, *first.Choices[0].Message.Content, *second.Choices[0].Message.Content, "same seed, same answer")
	require.Equal(t, 20, first.Usage.CompletionTokens)
	require.Equal(t, "length", first.Choices[0].FinishReason)
	require.Equal(t, 0, first.Usage.PromptTokensDetails.CachedTokens)
	// Every full block of the prompt is a hit the second time.
	p := first.Usage.PromptTokens
	require.Equal(t, p/16*16, second.Usage.PromptTokensDetails.CachedTokens)
	require.Greater(t, p, 300)
}

// sseEvents reads a streamed response into its data payloads.
func sseEvents(t *testing.T, r *Replica, path string, body any) []string {
	t.Helper()
	raw, err := json.Marshal(body)
	require.NoError(t, err)
	resp, err := http.Post("http://"+r.Addr()+path, "application/json", bytes.NewReader(raw))
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Contains(t, resp.Header.Get("Content-Type"), "text/event-stream")
	var events []string
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		require.True(t, strings.HasPrefix(line, "data: "), "line %q", line)
		events = append(events, strings.TrimPrefix(line, "data: "))
	}
	require.NoError(t, sc.Err())
	return events
}

func TestChatStreamMatchesNonStream(t *testing.T) {
	r := startReplica(t, nil)
	msgs := []any{userMsg("Tell me about KV caches.")}
	code, body := post(t, r, "/v1/chat/completions", map[string]any{"model": testModel, "messages": msgs, "max_tokens": 30, "ignore_eos": true})
	require.Equal(t, http.StatusOK, code)
	var full chatResponse
	require.NoError(t, json.Unmarshal(body, &full))

	events := sseEvents(t, r, "/v1/chat/completions", map[string]any{"model": testModel, "messages": msgs, "max_tokens": 30,
		"ignore_eos": true, "stream": true, "stream_options": map[string]any{"include_usage": true}})
	require.Equal(t, "[DONE]", events[len(events)-1])
	var text strings.Builder
	var usage *openai.Usage
	finishes := 0
	for i, ev := range events[:len(events)-1] {
		var c openai.Chunk
		require.NoError(t, json.Unmarshal([]byte(ev), &c), ev)
		require.Equal(t, "chat.completion.chunk", c.Object)
		if i == 0 {
			require.Equal(t, "assistant", c.Choices[0].Delta.Role)
		}
		if len(c.Choices) == 0 {
			usage = c.Usage
			continue
		}
		require.Nil(t, c.Usage, "usage only in the final chunk")
		if c.Choices[0].Delta.Content != nil {
			text.WriteString(*c.Choices[0].Delta.Content)
		}
		if c.Choices[0].FinishReason != nil {
			finishes++
			require.Equal(t, "length", *c.Choices[0].FinishReason)
		}
	}
	require.Equal(t, 1, finishes)
	require.Equal(t, *full.Choices[0].Message.Content, text.String())
	require.NotNil(t, usage)
	require.Equal(t, 30, usage.CompletionTokens)
	require.Equal(t, full.Usage.PromptTokens, usage.PromptTokens)
	require.NotNil(t, usage.PromptTokensDetails)

	// Without include_usage there is no usage chunk.
	events = sseEvents(t, r, "/v1/chat/completions", map[string]any{"model": testModel, "messages": msgs, "max_tokens": 5, "stream": true})
	for _, ev := range events[:len(events)-1] {
		var c openai.Chunk
		require.NoError(t, json.Unmarshal([]byte(ev), &c))
		require.NotEmpty(t, c.Choices)
	}
}

// streamedToolCall assembles streamed tool-call deltas, checking their shape
// as OpenAI clients expect it.
func streamedToolCall(t *testing.T, events []string) (openai.ToolCall, string) {
	t.Helper()
	var call openai.ToolCall
	var finish string
	heads := 0
	for _, ev := range events[:len(events)-1] {
		var c openai.Chunk
		require.NoError(t, json.Unmarshal([]byte(ev), &c), ev)
		if len(c.Choices) == 0 {
			continue
		}
		ch := c.Choices[0]
		if ch.FinishReason != nil {
			finish = *ch.FinishReason
		}
		for _, d := range ch.Delta.ToolCalls {
			require.Equal(t, 0, d.Index)
			if d.ID != "" {
				heads++
				require.Equal(t, "function", d.Type)
				require.NotEmpty(t, d.Function.Name)
				require.Empty(t, call.Function.Arguments, "the head delta comes before any arguments")
				call.ID, call.Type, call.Function.Name = d.ID, d.Type, d.Function.Name
				continue
			}
			require.Empty(t, d.Function.Name, "later deltas carry only arguments")
			require.NotNil(t, d.Function.Arguments)
			call.Function.Arguments += *d.Function.Arguments
		}
	}
	require.Equal(t, 1, heads)
	return call, finish
}

func TestToolCalls(t *testing.T) {
	r := startReplica(t, nil)
	tools := []any{weatherTool, timeTool}
	ask := []any{userMsg("What's the weather in Paris and the time?")}
	named := map[string]any{"type": "function", "function": map[string]any{"name": "get_weather"}}
	tests := []struct {
		name       string
		choice     any
		wantFinish string
		wantName   string
	}{
		{"auto", "auto", "tool_calls", ""},
		{"absent means auto", nil, "tool_calls", ""},
		{"required", "required", "tool_calls", ""},
		{"named", named, "stop", "get_weather"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req := map[string]any{"model": testModel, "messages": ask, "tools": tools}
			if tc.choice != nil {
				req["tool_choice"] = tc.choice
			}
			code, body := post(t, r, "/v1/chat/completions", req)
			require.Equal(t, http.StatusOK, code, string(body))
			var resp chatResponse
			require.NoError(t, json.Unmarshal(body, &resp))
			msg := resp.Choices[0].Message
			require.Nil(t, msg.Content)
			require.Len(t, msg.ToolCalls, 1)
			require.Equal(t, tc.wantFinish, resp.Choices[0].FinishReason)
			full := msg.ToolCalls[0]
			require.True(t, strings.HasPrefix(full.ID, "chatcmpl-tool-"))
			if tc.wantName != "" {
				require.Equal(t, tc.wantName, full.Function.Name)
			}
			var args map[string]any
			require.NoError(t, json.Unmarshal([]byte(full.Function.Arguments), &args), full.Function.Arguments)
			if full.Function.Name == "get_weather" {
				require.Contains(t, args, "city")
				require.Contains(t, []any{"c", "f"}, args["unit"])
				require.NotContains(t, args, "days", "only required properties")
				require.True(t, strings.HasPrefix(full.Function.Arguments, `{"city": `), "schema order kept")
			}

			req["stream"] = true
			call, finish := streamedToolCall(t, sseEvents(t, r, "/v1/chat/completions", req))
			require.Equal(t, tc.wantFinish, finish)
			require.Equal(t, full.Function, call.Function, "streamed call equals the non-streamed one")
		})
	}

	t.Run("auto answers in text after a tool result", func(t *testing.T) {
		msgs := append(ask, map[string]any{"role": "assistant", "tool_calls": []any{map[string]any{"id": "c1", "type": "function",
			"function": map[string]any{"name": "get_weather", "arguments": `{"city": "Paris", "unit": "c"}`}}}},
			map[string]any{"role": "tool", "tool_call_id": "c1", "content": "18 C and sunny"})
		code, body := post(t, r, "/v1/chat/completions", map[string]any{"model": testModel, "messages": msgs, "tools": tools, "max_tokens": 10})
		require.Equal(t, http.StatusOK, code, string(body))
		var resp chatResponse
		require.NoError(t, json.Unmarshal(body, &resp))
		require.Empty(t, resp.Choices[0].Message.ToolCalls)
		require.NotEmpty(t, *resp.Choices[0].Message.Content)
	})
}

func TestCompletions(t *testing.T) {
	r := startReplica(t, nil)
	for _, prompt := range []any{"Once upon a time", []int{1, 2, 3, 4, 5}, []any{"Once upon a time"}} {
		code, body := post(t, r, "/v1/completions", map[string]any{"model": testModel, "prompt": prompt, "max_tokens": 7})
		require.Equal(t, http.StatusOK, code, string(body))
		var resp chatResponse
		require.NoError(t, json.Unmarshal(body, &resp))
		require.Equal(t, "text_completion", resp.Object)
		require.Equal(t, 7, resp.Usage.CompletionTokens)
		require.NotEmpty(t, resp.Choices[0].Text)
	}
	code, body := post(t, r, "/v1/completions", map[string]any{"model": testModel, "prompt": []int{9, 9, 9, 9}, "max_tokens": 3})
	require.Equal(t, http.StatusOK, code)
	var resp chatResponse
	require.NoError(t, json.Unmarshal(body, &resp))
	require.Equal(t, 4, resp.Usage.PromptTokens, "token-id prompts are taken as given")

	events := sseEvents(t, r, "/v1/completions", map[string]any{"model": testModel, "prompt": "abc def", "max_tokens": 4, "stream": true,
		"stream_options": map[string]any{"include_usage": true}})
	var c openai.Chunk
	require.NoError(t, json.Unmarshal([]byte(events[len(events)-2]), &c))
	require.Equal(t, "text_completion", c.Object)
	require.Equal(t, 4, c.Usage.CompletionTokens)
}

func TestBadInput(t *testing.T) {
	r := startReplica(t, func(c *Config) { c.MaxBodyBytes = 4096; c.MaxModelLen = 256 })
	tools := []any{weatherTool}
	tests := []struct {
		name    string
		path    string
		body    any
		status  int
		errType string
		msg     string
	}{
		{"malformed JSON", "/v1/chat/completions", `{"model": `, 400, "BadRequestError", "JSON decode error"},
		{"not an object", "/v1/chat/completions", `[1,2]`, 400, "BadRequestError", "JSON decode error"},
		{"no model", "/v1/chat/completions", map[string]any{"messages": []any{userMsg("x")}}, 400, "BadRequestError", "model"},
		{"unknown model", "/v1/chat/completions", map[string]any{"model": "nope", "messages": []any{userMsg("x")}}, 404, "NotFoundError", "The model `nope` does not exist."},
		{"no messages", "/v1/chat/completions", map[string]any{"model": testModel}, 400, "BadRequestError", "messages"},
		{"bad role", "/v1/chat/completions", map[string]any{"model": testModel, "messages": []any{map[string]any{"role": "wizard", "content": "x"}}}, 400, "BadRequestError", "unknown role"},
		{"oversize body", "/v1/chat/completions", map[string]any{"model": testModel, "messages": []any{userMsg(strings.Repeat("a", 5000))}}, 413, "RequestEntityTooLarge", "larger than"},
		{"prompt too long", "/v1/chat/completions", map[string]any{"model": testModel, "messages": []any{userMsg(strings.Repeat("word ", 300))}}, 400, "BadRequestError", "maximum context length is 256 tokens"},
		{"max_tokens too large", "/v1/chat/completions", map[string]any{"model": testModel, "messages": []any{userMsg("hi")}, "max_tokens": 1000}, 400, "BadRequestError", "too large"},
		{"named tool not passed", "/v1/chat/completions", map[string]any{"model": testModel, "messages": []any{userMsg("x")}, "tools": tools,
			"tool_choice": map[string]any{"type": "function", "function": map[string]any{"name": "other"}}}, 400, "BadRequestError", "Tool 'other' has not been passed"},
		{"required without tools", "/v1/chat/completions", map[string]any{"model": testModel, "messages": []any{userMsg("x")}, "tool_choice": "required"}, 400, "BadRequestError", "tools"},
		{"bad tool_choice", "/v1/chat/completions", map[string]any{"model": testModel, "messages": []any{userMsg("x")}, "tools": tools, "tool_choice": "sometimes"}, 400, "BadRequestError", "tool_choice"},
		{"completion without prompt", "/v1/completions", map[string]any{"model": testModel}, 400, "BadRequestError", "prompt"},
		{"completion empty ids", "/v1/completions", map[string]any{"model": testModel, "prompt": []int{}}, 400, "BadRequestError", "empty"},
		{"tokenize nothing", "/tokenize", map[string]any{"model": testModel}, 400, "BadRequestError", "prompt or messages"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, body := post(t, r, tc.path, tc.body)
			require.Equal(t, tc.status, code, string(body))
			var e openai.ErrorResponse
			require.NoError(t, json.Unmarshal(body, &e), string(body))
			require.Equal(t, tc.errType, e.Error.Type)
			require.Equal(t, tc.status, e.Error.Code)
			require.Contains(t, e.Error.Message, tc.msg)
		})
	}
	code, _ := get(t, r, "/v1/nothing")
	require.Equal(t, http.StatusNotFound, code)
	// The replica still serves after all of that.
	code, _ = post(t, r, "/v1/chat/completions", map[string]any{"model": testModel, "messages": []any{userMsg("hi")}, "max_tokens": 2})
	require.Equal(t, http.StatusOK, code)
}

func TestFaults(t *testing.T) {
	r := startReplica(t, nil)
	chat := map[string]any{"model": testModel, "messages": []any{userMsg("hi")}, "max_tokens": 2}

	code, body := post(t, r, "/admin/faults", map[string]any{"error_rate": 1, "error_status": 503})
	require.Equal(t, http.StatusOK, code, string(body))
	code, body = post(t, r, "/v1/chat/completions", chat)
	require.Equal(t, 503, code)
	require.Contains(t, string(body), "injected fault")

	code, _ = post(t, r, "/admin/faults", map[string]any{"error_rate": 2})
	require.Equal(t, http.StatusBadRequest, code, "invalid faults are refused")

	code, _ = post(t, r, "/admin/faults", map[string]any{"reject_auto_tool_choice": true})
	require.Equal(t, http.StatusOK, code)
	code, body = post(t, r, "/v1/chat/completions", map[string]any{"model": testModel, "messages": []any{userMsg("x")}, "tools": []any{weatherTool}})
	require.Equal(t, http.StatusBadRequest, code)
	require.Contains(t, string(body), `\"auto\" tool choice requires --enable-auto-tool-choice`)
	code, _ = post(t, r, "/v1/chat/completions", map[string]any{"model": testModel, "messages": []any{userMsg("x")}, "tools": []any{weatherTool}, "tool_choice": "required"})
	require.Equal(t, http.StatusOK, code, "required still works")

	code, _ = post(t, r, "/admin/faults", map[string]any{"latency": "150ms"})
	require.Equal(t, http.StatusOK, code)
	start := time.Now()
	code, _ = post(t, r, "/v1/chat/completions", chat)
	require.Equal(t, http.StatusOK, code)
	require.GreaterOrEqual(t, time.Since(start), 150*time.Millisecond)

	// A stall mid-stream holds the response until the client gives up.
	code, _ = post(t, r, "/admin/faults", map[string]any{"stall_after_tokens": 2})
	require.Equal(t, http.StatusOK, code)
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	raw, _ := json.Marshal(map[string]any{"model": testModel, "messages": []any{userMsg("hi")}, "max_tokens": 50, "stream": true})
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+r.Addr()+"/v1/chat/completions", bytes.NewReader(raw))
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	_, err = io.ReadAll(resp.Body)
	resp.Body.Close()
	require.ErrorIs(t, err, context.DeadlineExceeded, "the stream stalls instead of finishing")

	code, _ = post(t, r, "/admin/faults", map[string]any{})
	require.Equal(t, http.StatusOK, code)
	code, _ = post(t, r, "/v1/chat/completions", chat)
	require.Equal(t, http.StatusOK, code, "faults cleared")

	// Refusing connections closes the port, then serves again.
	code, _ = post(t, r, "/admin/refuse", map[string]any{"for": "300ms"})
	require.Equal(t, http.StatusOK, code)
	require.Eventually(t, func() bool {
		_, err := http.Get("http://" + r.Addr() + "/health")
		return err != nil
	}, time.Second, 10*time.Millisecond, "connections refused")
	require.Eventually(t, func() bool {
		resp, err := http.Get("http://" + r.Addr() + "/health")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, 3*time.Second, 20*time.Millisecond, "serving again")
}

// collector records what a subscriber delivers.
type collector struct {
	mu     sync.Mutex
	events []kvevents.Event
	seqs   []uint64
	resets []string
}

func (c *collector) HandleBatch(_ string, pos kvevents.Position, b *kvevents.Batch) {
	seq := pos.Seq
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seqs = append(c.seqs, seq)
	for _, ev := range b.Events {
		ev.BlockHashes = append([]uint64(nil), ev.BlockHashes...)
		ev.TokenIDs = append([]uint32(nil), ev.TokenIDs...)
		c.events = append(c.events, ev)
	}
}

func (c *collector) HandleReset(_ string, reason string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.resets = append(c.resets, reason)
}

func (c *collector) snapshot() ([]kvevents.Event, []uint64, []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]kvevents.Event(nil), c.events...), append([]uint64(nil), c.seqs...), append([]string(nil), c.resets...)
}

func subscribe(t *testing.T, r *Replica) *collector {
	t.Helper()
	pub, replay := r.KVEndpoints()
	require.NotEmpty(t, pub)
	c := &collector{}
	sub, err := kvevents.NewSubscriber(kvevents.SubscriberConfig{Endpoint: pub, ReplayEndpoint: replay}, c, zap.NewNop())
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = sub.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done; _ = sub.Close() })
	// ZMQ drops what is published before a subscription is connected: wait
	// until a probe request's events arrive live (the replay at start may
	// deliver them first, and says nothing of the live subscription).
	probe := 0
	sendProbe := func() {
		probe++ // a new prompt each time: cache hits publish nothing
		post(t, r, "/v1/completions", map[string]any{"model": testModel, "prompt": strings.Repeat(fmt.Sprintf("probe %d ", probe), 40), "max_tokens": 1})
	}
	require.Eventually(t, func() bool {
		sendProbe()
		return sub.Stats().Received.Load() > 0
	}, 5*time.Second, 50*time.Millisecond)
	// One more probe applied: the first live batch's check is over.
	applied := sub.Stats().Applied.Load()
	sendProbe()
	require.Eventually(t, func() bool { return sub.Stats().Applied.Load() > applied }, 5*time.Second, 20*time.Millisecond)
	// Events published before the subscription connected are lost; a
	// restart clears the cache so the test starts from a state it saw. Its
	// first batch (the engine's AllBlocksCleared) goes back in sequence.
	code, _ := post(t, r, "/admin/restart", map[string]any{})
	require.Equal(t, http.StatusOK, code)
	require.Eventually(t, func() bool {
		evs, _, resets := c.snapshot()
		return len(resets) > 0 && slices.ContainsFunc(evs, func(ev kvevents.Event) bool { return ev.Kind == kvevents.KindAllBlocksCleared })
	}, 5*time.Second, 20*time.Millisecond)
	c.mu.Lock()
	c.events, c.seqs, c.resets = nil, nil, nil
	c.mu.Unlock()
	return c
}

type residentView struct {
	BlockSize int `json:"block_size"`
	Blocks    []struct {
		Hash     uint64   `json:"hash"`
		TokenIDs []uint32 `json:"token_ids"`
		Medium   string   `json:"medium"`
	} `json:"blocks"`
}

// replayEvents applies events to a set of resident GPU hashes.
func replayEvents(evs []kvevents.Event) map[uint64]bool {
	set := map[uint64]bool{}
	for _, ev := range evs {
		if ev.Medium != "" && ev.Medium != "GPU" {
			continue
		}
		switch ev.Kind {
		case kvevents.KindBlockStored:
			for _, h := range ev.BlockHashes {
				set[h] = true
			}
		case kvevents.KindBlockRemoved:
			for _, h := range ev.BlockHashes {
				delete(set, h)
			}
		case kvevents.KindAllBlocksCleared:
			clear(set)
		}
	}
	return set
}

func TestKVEventsMatchResidentBlocks(t *testing.T) {
	for _, flavour := range []string{"vllm", "sglang"} {
		t.Run(flavour, func(t *testing.T) {
			// A small cache so that eviction happens.
			r := startReplica(t, func(c *Config) { c.Engine.Flavour = flavour; c.Engine.NumGPUBlocks = 40 })
			col := subscribe(t, r)
			for i := 0; i < 12; i++ {
				prompt := strings.Repeat(fmt.Sprintf("topic %d shares words with others. ", i%4), 20+i)
				code, body := post(t, r, "/v1/completions", map[string]any{"model": testModel, "prompt": prompt, "max_tokens": 8})
				require.Equal(t, http.StatusOK, code, string(body))
			}
			var view residentView
			require.Eventually(t, func() bool {
				_, body := get(t, r, "/admin/blocks")
				view = residentView{}
				require.NoError(t, json.Unmarshal(body, &view))
				evs, _, _ := col.snapshot()
				got := replayEvents(evs)
				want := map[uint64]bool{}
				for _, b := range view.Blocks {
					if b.Medium == "GPU" {
						want[b.Hash] = true
					}
				}
				if len(want) == 0 || fmt.Sprint(want) != fmt.Sprint(got) {
					t.Logf("resident %d, from events %d", len(want), len(got))
					return false
				}
				return true
			}, 5*time.Second, 50*time.Millisecond, "events replayed into a set equal the resident GPU blocks")
			evs, seqs, resets := col.snapshot()
			require.Empty(t, resets)
			removed := 0
			for _, ev := range evs {
				if ev.Kind == kvevents.KindBlockRemoved {
					removed++
				}
				if ev.Kind == kvevents.KindBlockStored {
					require.Equal(t, 16, ev.BlockSize)
					require.Len(t, ev.TokenIDs, 16*len(ev.BlockHashes))
				}
			}
			require.Positive(t, removed, "the small cache evicted")
			for i := 1; i < len(seqs); i++ {
				require.Equal(t, seqs[i-1]+1, seqs[i])
			}

			// Restart: AllBlocksCleared and a sequence that starts again.
			code, _ := post(t, r, "/admin/restart", map[string]any{})
			require.Equal(t, http.StatusOK, code)
			post(t, r, "/v1/completions", map[string]any{"model": testModel, "prompt": strings.Repeat("after restart ", 30), "max_tokens": 2})
			require.Eventually(t, func() bool {
				_, _, resets := col.snapshot()
				return len(resets) > 0
			}, 5*time.Second, 20*time.Millisecond, "the subscriber saw the sequence go down")
			_, body := get(t, r, "/admin/blocks")
			require.NoError(t, json.Unmarshal(body, &view))
			require.NotEmpty(t, view.Blocks)
		})
	}
}

func TestDropEventsIsFilledByReplay(t *testing.T) {
	r := startReplica(t, nil)
	col := subscribe(t, r)
	code, _ := post(t, r, "/admin/drop-events", map[string]any{"batches": 2})
	require.Equal(t, http.StatusOK, code)
	for i := 0; i < 4; i++ {
		post(t, r, "/v1/completions", map[string]any{"model": testModel, "prompt": strings.Repeat(fmt.Sprintf("gap %d ", i), 40), "max_tokens": 2})
	}
	require.Eventually(t, func() bool {
		_, body := get(t, r, "/admin/blocks")
		var view residentView
		require.NoError(t, json.Unmarshal(body, &view))
		evs, _, _ := col.snapshot()
		return len(replayEvents(evs)) == len(view.Blocks)
	}, 5*time.Second, 50*time.Millisecond)
	_, seqs, resets := col.snapshot()
	require.Empty(t, resets, "the gap was filled by replay, not reset")
	for i := 1; i < len(seqs); i++ {
		require.Equal(t, seqs[i-1]+1, seqs[i], "every sequence number delivered in order")
	}
	code, _ = post(t, r, "/admin/drop-events", map[string]any{"batches": 0})
	require.Equal(t, http.StatusBadRequest, code)
}

func TestMetricsNames(t *testing.T) {
	for _, tc := range []struct {
		flavour string
		names   []string
	}{
		{"vllm", []string{"vllm:num_requests_running{", "vllm:num_requests_waiting{", "vllm:kv_cache_usage_perc{",
			"vllm:prefix_cache_queries_total{", "vllm:prefix_cache_hits_total{", "vllm:cache_config_info{",
			"vllm:time_to_first_token_seconds_bucket{", "vllm:inter_token_latency_seconds_bucket{"}},
		{"sglang", []string{"sglang:num_running_reqs{", "sglang:num_queue_reqs{", "sglang:token_usage{",
			"sglang:cache_hit_rate{", "sglang:cache_config_info{"}},
	} {
		t.Run(tc.flavour, func(t *testing.T) {
			r := startReplica(t, func(c *Config) { c.Engine.Flavour = tc.flavour })
			post(t, r, "/v1/completions", map[string]any{"model": testModel, "prompt": "metrics please", "max_tokens": 3})
			code, body := get(t, r, "/metrics")
			require.Equal(t, http.StatusOK, code)
			for _, n := range tc.names {
				require.Contains(t, string(body), n)
			}
		})
	}
}

func TestConfigValidation(t *testing.T) {
	good := Config{}.WithDefaults()
	require.NoError(t, good.Validate())
	tests := []struct {
		name   string
		mutate func(*Config)
		msg    string
	}{
		{"format", func(c *Config) { c.KVEvents.Format = "xml" }, "kv_events.format"},
		{"hashes", func(c *Config) { c.KVEvents.Hashes = "md5" }, "kv_events.hashes"},
		{"layout", func(c *Config) { c.KVEvents.ReplayLayout = "new" }, "kv_events.replay_layout"},
		{"flavour", func(c *Config) { c.Engine.Flavour = "tgi" }, "flavour"},
		{"error rate", func(c *Config) { c.Faults.ErrorRate = -1 }, "error_rate"},
		{"dp", func(c *Config) { c.DataParallelSize = 100 }, "data_parallel_size"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := good
			tc.mutate(&c)
			require.ErrorContains(t, c.Validate(), tc.msg)
		})
	}
}

func TestLoadConfig(t *testing.T) {
	c, err := LoadConfig("testdata/sglang.yaml")
	require.NoError(t, err)
	c = c.WithDefaults()
	require.NoError(t, c.Validate())
	require.Equal(t, "sglang", c.Engine.Flavour)
	require.Equal(t, 32, c.Engine.BlockSize)
	require.Equal(t, 70*time.Microsecond, *c.Engine.Timing.PrefillPerToken)
	require.Equal(t, 12*time.Millisecond, *c.Engine.Timing.DecodeBase)
	require.Equal(t, 5*time.Millisecond, c.Faults.Latency)
	require.Equal(t, "sglang", c.KVEvents.Format, "SGLang flavour defaults to SGLang's event layout")
	require.Equal(t, "int64", c.KVEvents.Hashes)
	require.Equal(t, "topic-seq", c.KVEvents.ReplayLayout, "SGLang 0.5.23 replays with the topic frame")

	bad := t.TempDir() + "/bad.yaml"
	require.NoError(t, os.WriteFile(bad, []byte("engine:\n  blok_size: 16\n"), 0o600))
	_, err = LoadConfig(bad)
	require.ErrorContains(t, err, "blok_size")
	_, err = LoadConfig(t.TempDir() + "/missing.yaml")
	require.Error(t, err)
}

// TestMetricsHang checks the metrics_hang fault: scrapes hang until the
// client gives up while requests are served, and clearing it releases
// them.
func TestMetricsHang(t *testing.T) {
	r := startReplica(t, nil)
	code, _ := post(t, r, "/admin/faults", map[string]any{"metrics_hang": true})
	require.Equal(t, http.StatusOK, code)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+r.Addr()+"/metrics", nil)
	_, err := http.DefaultClient.Do(req)
	require.ErrorIs(t, err, context.DeadlineExceeded, "the scrape hangs")
	code, _ = post(t, r, "/v1/completions", map[string]any{"model": testModel, "prompt": "still serving", "max_tokens": 2})
	require.Equal(t, http.StatusOK, code, "requests are served while metrics hang")

	// A scrape already hanging is released when the fault is cleared.
	got := make(chan int, 1)
	go func() {
		resp, err := http.Get("http://" + r.Addr() + "/metrics")
		if err != nil {
			got <- 0
			return
		}
		resp.Body.Close()
		got <- resp.StatusCode
	}()
	time.Sleep(100 * time.Millisecond)
	code, _ = post(t, r, "/admin/faults", map[string]any{})
	require.Equal(t, http.StatusOK, code)
	select {
	case c := <-got:
		require.Equal(t, http.StatusOK, c)
	case <-time.After(5 * time.Second):
		t.Fatal("the hanging scrape was not released")
	}
}

// TestKVEventsOutageIsFilledByReplay checks POST /admin/kv-events-outage:
// the publisher's ports close and reopen, and what was published while it
// was gone reaches the subscriber by replay, without a reset.
func TestKVEventsOutageIsFilledByReplay(t *testing.T) {
	r := startReplica(t, nil)
	col := subscribe(t, r)
	code, body := post(t, r, "/admin/kv-events-outage", map[string]any{"for": "300ms"})
	require.Equal(t, http.StatusOK, code, string(body))
	code, _ = post(t, r, "/admin/kv-events-outage", map[string]any{"for": "300ms"})
	require.Equal(t, http.StatusConflict, code, "already gone")
	for i := 0; i < 3; i++ { // stored while the publisher is gone
		post(t, r, "/v1/completions", map[string]any{"model": testModel, "prompt": strings.Repeat(fmt.Sprintf("outage %d ", i), 40), "max_tokens": 2})
	}
	i := 0
	require.Eventually(t, func() bool {
		i++ // later requests reveal the gap once the subscriber is back
		post(t, r, "/v1/completions", map[string]any{"model": testModel, "prompt": strings.Repeat(fmt.Sprintf("back %d ", i), 40), "max_tokens": 2})
		_, body := get(t, r, "/admin/blocks")
		var view residentView
		require.NoError(t, json.Unmarshal(body, &view))
		evs, _, _ := col.snapshot()
		return len(replayEvents(evs)) == len(view.Blocks)
	}, 10*time.Second, 100*time.Millisecond)
	_, seqs, resets := col.snapshot()
	require.Empty(t, resets, "the outage was filled by replay, not reset")
	for i := 1; i < len(seqs); i++ {
		require.Equal(t, seqs[i-1]+1, seqs[i], "every sequence number delivered in order")
	}
	code, _ = post(t, r, "/admin/kv-events-outage", map[string]any{"for": "0s"})
	require.Equal(t, http.StatusBadRequest, code)
}

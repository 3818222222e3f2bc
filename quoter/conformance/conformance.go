// Package conformance checks that a serving URL honours the OpenAI chat
// contract the Omnious market relies on: plain and streamed completions,
// model identity, and tool calling (a real streamed automatic call,
// tool_choice "required" and a forced named function). The quoter runs the
// quick suite before its first quote and as its canary; the Helm test and
// the canary CronJob run the full one.
package conformance

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/omnious/provider-node/engines/openai"
	"github.com/omnious/provider-node/internal/opt"
)

// Check names, as they appear in reports.
const (
	CheckModels    = "model-identity"
	CheckChat      = "chat"
	CheckStream    = "stream"
	CheckToolAuto  = "tool-auto-stream"
	CheckRequired  = "tool-required"
	CheckNamedTool = "tool-named"
)

// Suite selects which checks run.
type Suite int

const (
	// Full runs every check.
	Full Suite = iota
	// Quick is the pre-quote gate and canary: identity, plain chat and the
	// streamed automatic tool call (the check real failures hit first).
	Quick
)

// Checks names the checks the suite runs, in order.
func (s Suite) Checks() []string {
	if s == Quick {
		return []string{CheckModels, CheckChat, CheckToolAuto}
	}
	return []string{CheckModels, CheckChat, CheckStream, CheckToolAuto, CheckRequired, CheckNamedTool}
}

// Config says what to check.
type Config struct {
	// URL is the exact serving base URL (the production proxy path);
	// requests go to URL + "/v1/...". A trailing "/v1" is accepted.
	URL string
	// Model is the model id the provider sells.
	Model string
	// HTTP is the client. Default: a client with a 60 s timeout.
	HTTP *http.Client
	// CheckTimeout bounds each check. Default 60s.
	CheckTimeout time.Duration
	// MaxTokens bounds every generation. Default 256.
	MaxTokens int
	// Attempts is how often the automatic tool call is tried before
	// failing, since a real model may answer in text. Default 2.
	Attempts int
}

// defaults are Config's defaults, written once.
var defaults = Config{CheckTimeout: 60 * time.Second, MaxTokens: 256, Attempts: 2}

// Validate refuses a negative field of a defaulted config.
func (c Config) Validate() error {
	return errors.Join(
		opt.DefaultNonNegative("--timeout", c.CheckTimeout, defaults.CheckTimeout),
		opt.DefaultNonNegative("MaxTokens", c.MaxTokens, defaults.MaxTokens),
		opt.DefaultNonNegative("Attempts", c.Attempts, defaults.Attempts))
}

// WithDefaults returns c with every unset field at its default and URL
// without a trailing "/" or "/v1".
func (c Config) WithDefaults() Config {
	if c.HTTP == nil {
		c.HTTP = &http.Client{Timeout: 60 * time.Second}
	}
	opt.Zero(&c.CheckTimeout, defaults.CheckTimeout)
	opt.Zero(&c.MaxTokens, defaults.MaxTokens)
	opt.Zero(&c.Attempts, defaults.Attempts)
	c.URL = strings.TrimSuffix(strings.TrimSuffix(c.URL, "/"), "/v1")
	return c
}

// Result is the outcome of one check.
type Result struct {
	Name     string        `json:"name"`
	OK       bool          `json:"ok"`
	Error    string        `json:"error,omitempty"`
	Duration time.Duration `json:"duration_ns"`
}

// Report is the outcome of a suite.
type Report struct {
	URL     string   `json:"url"`
	Model   string   `json:"model"`
	Results []Result `json:"results"`
}

// Passed is true when every check passed.
func (r Report) Passed() bool {
	for _, res := range r.Results {
		if !res.OK {
			return false
		}
	}
	return len(r.Results) > 0
}

// Failed names the failed checks.
func (r Report) Failed() []string {
	var out []string
	for _, res := range r.Results {
		if !res.OK {
			out = append(out, res.Name)
		}
	}
	return out
}

// Err is nil when the suite passed, else an error naming each failed check.
func (r Report) Err() error {
	if r.Passed() {
		return nil
	}
	var errs []error
	for _, res := range r.Results {
		if !res.OK {
			errs = append(errs, fmt.Errorf("%s: %s", res.Name, res.Error))
		}
	}
	if len(errs) == 0 {
		return errors.New("no checks ran")
	}
	return fmt.Errorf("conformance failed: %w", errors.Join(errs...))
}

// String is the human-readable report.
func (r Report) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "conformance: %s model %s\n", r.URL, r.Model)
	for _, res := range r.Results {
		status := "PASS"
		if !res.OK {
			status = "FAIL"
		}
		fmt.Fprintf(&b, "  %-4s %-17s %6dms", status, res.Name, res.Duration.Milliseconds())
		if res.Error != "" {
			fmt.Fprintf(&b, "  %s", res.Error)
		}
		b.WriteByte('\n')
	}
	if r.Passed() {
		fmt.Fprintf(&b, "result: PASS (%d checks)\n", len(r.Results))
	} else {
		fmt.Fprintf(&b, "result: FAIL (%s)\n", strings.Join(r.Failed(), ", "))
	}
	return b.String()
}

// Run executes the suite; it never stops early, so the report lists every
// failure at once.
func Run(ctx context.Context, cfg Config, suite Suite) Report {
	cfg = cfg.WithDefaults()
	rep := Report{URL: cfg.URL, Model: cfg.Model}
	c := &client{cfg: cfg}
	for _, name := range suite.Checks() {
		start := time.Now()
		cctx, cancel := context.WithTimeout(ctx, cfg.CheckTimeout)
		err := c.run(cctx, name)
		cancel()
		res := Result{Name: name, OK: err == nil, Duration: time.Since(start)}
		if err != nil {
			res.Error = err.Error()
		}
		rep.Results = append(rep.Results, res)
	}
	return rep
}

type client struct{ cfg Config }

func (c *client) run(ctx context.Context, name string) error {
	switch name {
	case CheckModels:
		return c.checkModels(ctx)
	case CheckChat:
		return c.checkChat(ctx)
	case CheckStream:
		return c.checkStream(ctx)
	case CheckToolAuto:
		var err error
		for range c.cfg.Attempts {
			if err = c.checkToolAuto(ctx); err == nil || ctx.Err() != nil {
				return err
			}
		}
		return err
	case CheckRequired:
		return c.checkToolForced(ctx, "required")
	case CheckNamedTool:
		return c.checkToolForced(ctx, map[string]any{"type": "function", "function": map[string]any{"name": "get_weather"}})
	}
	return fmt.Errorf("unknown check %q", name)
}

// tools offered in tool checks: two, so "required" must pick and a named
// choice must be honoured rather than happen to be the only option.
var tools = []map[string]any{
	{"type": "function", "function": map[string]any{
		"name": "get_weather", "description": "Get the current weather for a city.",
		"parameters": map[string]any{"type": "object", "required": []string{"city"},
			"properties": map[string]any{"city": map[string]any{"type": "string", "description": "City name"}}}}},
	{"type": "function", "function": map[string]any{
		"name": "get_time", "description": "Get the current local time for a city.",
		"parameters": map[string]any{"type": "object", "required": []string{"city"},
			"properties": map[string]any{"city": map[string]any{"type": "string", "description": "City name"}}}}},
}

func toolNames() map[string]bool { return map[string]bool{"get_weather": true, "get_time": true} }

func userMessages(text string) []map[string]any {
	return []map[string]any{{"role": "user", "content": text}}
}

// httpError is a non-2xx answer, with the server's message.
func httpError(resp *http.Response) error {
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 2048))
	msg := strings.TrimSpace(string(body))
	var e struct {
		Error struct {
			Message string `json:"message"`
		} `json:"error"`
		Message string `json:"message"`
	}
	if json.Unmarshal(body, &e) == nil {
		if e.Error.Message != "" {
			msg = e.Error.Message
		} else if e.Message != "" {
			msg = e.Message
		}
	}
	return fmt.Errorf("HTTP %d: %s", resp.StatusCode, msg)
}

func (c *client) do(ctx context.Context, method, path string, body any) (*http.Response, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, fmt.Errorf("cannot encode request: %w", err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.cfg.URL+path, rd)
	if err != nil {
		return nil, fmt.Errorf("cannot build request: %w", err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.cfg.HTTP.Do(req)
	if err != nil {
		return nil, fmt.Errorf("request failed: %w", err)
	}
	if resp.StatusCode/100 != 2 {
		defer resp.Body.Close()
		return nil, httpError(resp)
	}
	return resp, nil
}

func (c *client) getJSON(ctx context.Context, path string, v any) error {
	resp, err := c.do(ctx, http.MethodGet, path, nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(io.LimitReader(resp.Body, 8<<20)).Decode(v); err != nil {
		return fmt.Errorf("cannot decode response: %w", err)
	}
	return nil
}

func (c *client) postJSON(ctx context.Context, path string, body, v any) error {
	resp, err := c.do(ctx, http.MethodPost, path, body)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(io.LimitReader(resp.Body, 8<<20)).Decode(v); err != nil {
		return fmt.Errorf("cannot decode response: %w", err)
	}
	return nil
}

func (c *client) checkModels(ctx context.Context) error {
	var list struct {
		Object string `json:"object"`
		Data   []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := c.getJSON(ctx, "/v1/models", &list); err != nil {
		return fmt.Errorf("GET /v1/models: %w", err)
	}
	ids := make([]string, 0, len(list.Data))
	for _, m := range list.Data {
		if m.ID == c.cfg.Model {
			return nil
		}
		ids = append(ids, m.ID)
	}
	return fmt.Errorf("/v1/models does not list %q (got %v)", c.cfg.Model, ids)
}

type chatToolCall struct {
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

type chatResponse struct {
	Object  string `json:"object"`
	Model   string `json:"model"`
	Choices []struct {
		Message struct {
			Role      string         `json:"role"`
			Content   *string        `json:"content"`
			ToolCalls []chatToolCall `json:"tool_calls"`
		} `json:"message"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
}

func (c *client) chatRequest(text string, extra map[string]any) map[string]any {
	req := map[string]any{"model": c.cfg.Model, "messages": userMessages(text), "max_tokens": c.cfg.MaxTokens,
		"temperature": 0}
	for k, v := range extra {
		req[k] = v
	}
	return req
}

func (c *client) checkChat(ctx context.Context) error {
	var resp chatResponse
	if err := c.postJSON(ctx, "/v1/chat/completions", c.chatRequest("Say hello in one short sentence.", nil), &resp); err != nil {
		return fmt.Errorf("POST /v1/chat/completions: %w", err)
	}
	if resp.Model != c.cfg.Model {
		return fmt.Errorf("response.model is %q, want %q", resp.Model, c.cfg.Model)
	}
	if resp.Object != "chat.completion" {
		return fmt.Errorf("object is %q, want chat.completion", resp.Object)
	}
	if len(resp.Choices) != 1 {
		return fmt.Errorf("got %d choices, want 1", len(resp.Choices))
	}
	ch := resp.Choices[0]
	if ch.Message.Role != "assistant" {
		return fmt.Errorf("message.role is %q, want assistant", ch.Message.Role)
	}
	if ch.Message.Content == nil || strings.TrimSpace(*ch.Message.Content) == "" {
		return errors.New("message.content is empty")
	}
	if ch.FinishReason == nil || (*ch.FinishReason != "stop" && *ch.FinishReason != "length") {
		return fmt.Errorf("finish_reason is %v, want stop or length", deref(ch.FinishReason))
	}
	return nil
}

func deref(s *string) string {
	if s == nil {
		return "null"
	}
	return fmt.Sprintf("%q", *s)
}

// streamChunk is one chat.completion.chunk, with raw tool-call deltas so
// absent and empty fields can be told apart.
type streamChunk struct {
	Object  string `json:"object"`
	Model   string `json:"model"`
	Choices []struct {
		Index int `json:"index"`
		Delta struct {
			Role      string          `json:"role"`
			Content   *string         `json:"content"`
			ToolCalls []deltaToolCall `json:"tool_calls"`
		} `json:"delta"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Error *struct {
		Message string `json:"message"`
	} `json:"error"`
}

type deltaToolCall struct {
	Index    *int    `json:"index"`
	ID       *string `json:"id"`
	Type     *string `json:"type"`
	Function *struct {
		Name      *string `json:"name"`
		Arguments *string `json:"arguments"`
	} `json:"function"`
}

// streamResult is a whole streamed answer reassembled.
type streamResult struct {
	content string
	finish  string
	calls   []*assembledCall
}

type assembledCall struct {
	id, typ, name string
	args          strings.Builder
}

// readStream parses SSE chunks, checking the model and the tool-call delta
// shape: the first delta of each call carries index, id, type "function"
// and the name; later deltas only add argument fragments.
func (c *client) readStream(ctx context.Context, body map[string]any) (*streamResult, error) {
	body["stream"] = true
	resp, err := c.do(ctx, http.MethodPost, "/v1/chat/completions", body)
	if err != nil {
		return nil, fmt.Errorf("POST /v1/chat/completions (stream): %w", err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
		return nil, fmt.Errorf("Content-Type is %q, want text/event-stream", ct)
	}
	return parseStream(resp.Body, c.cfg.Model)
}

// parseStream reads server-sent chat chunks up to data: [DONE].
func parseStream(r io.Reader, model string) (*streamResult, error) {
	res := &streamResult{}
	byIndex := map[int]*assembledCall{}
	done, chunks := false, 0
	for ev, err := range openai.Events(r, 4<<20) {
		if err != nil {
			return nil, fmt.Errorf("stream broke after %d chunks: %w", chunks, err)
		}
		if ev.Done {
			done = true
			break
		}
		var ch streamChunk
		if err := json.Unmarshal(ev.Data, &ch); err != nil {
			return nil, fmt.Errorf("chunk %d is not JSON: %w", chunks, err)
		}
		chunks++
		if ch.Error != nil {
			return nil, fmt.Errorf("error event in stream: %s", ch.Error.Message)
		}
		if ch.Object != "chat.completion.chunk" {
			return nil, fmt.Errorf("chunk %d object is %q, want chat.completion.chunk", chunks, ch.Object)
		}
		if ch.Model != model {
			return nil, fmt.Errorf("chunk %d model is %q, want %q", chunks, ch.Model, model)
		}
		for _, choice := range ch.Choices {
			if choice.Delta.Content != nil {
				res.content += *choice.Delta.Content
			}
			for _, d := range choice.Delta.ToolCalls {
				if err := assemble(byIndex, &res.calls, d); err != nil {
					return nil, fmt.Errorf("chunk %d: %w", chunks, err)
				}
			}
			if choice.FinishReason != nil {
				res.finish = *choice.FinishReason
			}
		}
	}
	if !done {
		return nil, fmt.Errorf("stream ended after %d chunks without data: [DONE]", chunks)
	}
	if res.finish == "" {
		return nil, errors.New("no chunk carried a finish_reason")
	}
	return res, nil
}

func assemble(byIndex map[int]*assembledCall, order *[]*assembledCall, d deltaToolCall) error {
	if d.Index == nil {
		return errors.New("tool_calls delta without index")
	}
	call, seen := byIndex[*d.Index]
	if !seen {
		switch {
		case d.ID == nil || *d.ID == "":
			return fmt.Errorf("first delta of tool call %d has no id", *d.Index)
		case d.Type == nil || *d.Type != "function":
			return fmt.Errorf("first delta of tool call %d has type %v, want \"function\"", *d.Index, deref(d.Type))
		case d.Function == nil || d.Function.Name == nil || *d.Function.Name == "":
			return fmt.Errorf("first delta of tool call %d has no function.name", *d.Index)
		}
		call = &assembledCall{id: *d.ID, typ: *d.Type, name: *d.Function.Name}
		byIndex[*d.Index] = call
		*order = append(*order, call)
	} else {
		if d.ID != nil && *d.ID != "" && *d.ID != call.id {
			return fmt.Errorf("tool call %d changed id from %q to %q", *d.Index, call.id, *d.ID)
		}
		if d.Function != nil && d.Function.Name != nil && *d.Function.Name != "" && *d.Function.Name != call.name {
			return fmt.Errorf("tool call %d changed name from %q to %q", *d.Index, call.name, *d.Function.Name)
		}
	}
	if d.Function != nil && d.Function.Arguments != nil {
		call.args.WriteString(*d.Function.Arguments)
	}
	return nil
}

func validArguments(name, args string) error {
	var v map[string]any
	if err := json.Unmarshal([]byte(args), &v); err != nil {
		return fmt.Errorf("arguments of %s are not a JSON object (%q): %w", name, truncate(args, 120), err)
	}
	return nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

func (c *client) checkStream(ctx context.Context) error {
	res, err := c.readStream(ctx, c.chatRequest("Count from one to five in words.",
		map[string]any{"stream_options": map[string]any{"include_usage": true}}))
	if err != nil {
		return err
	}
	if strings.TrimSpace(res.content) == "" {
		return errors.New("streamed content is empty")
	}
	if res.finish != "stop" && res.finish != "length" {
		return fmt.Errorf("finish_reason is %q, want stop or length", res.finish)
	}
	return nil
}

func (c *client) checkToolAuto(ctx context.Context) error {
	res, err := c.readStream(ctx, c.chatRequest(
		"What is the weather in Paris right now? Use the get_weather tool.",
		map[string]any{"tools": tools, "tool_choice": "auto"}))
	if err != nil {
		return err
	}
	if len(res.calls) == 0 {
		return fmt.Errorf("no tool call produced (finish_reason %q, content %q)", res.finish, truncate(res.content, 120))
	}
	names := toolNames()
	for _, call := range res.calls {
		if !names[call.name] {
			return fmt.Errorf("tool call names unknown function %q", call.name)
		}
		if err := validArguments(call.name, call.args.String()); err != nil {
			return err
		}
	}
	if res.finish != "tool_calls" {
		return fmt.Errorf("finish_reason is %q after a tool call, want tool_calls", res.finish)
	}
	return nil
}

// checkToolForced checks tool_choice "required" or a named function
// (non-streamed: these are enforced by structured outputs, not a parser).
func (c *client) checkToolForced(ctx context.Context, choice any) error {
	var resp chatResponse
	err := c.postJSON(ctx, "/v1/chat/completions", c.chatRequest(
		"What is the weather in Paris right now?", map[string]any{"tools": tools, "tool_choice": choice}), &resp)
	if err != nil {
		return fmt.Errorf("POST /v1/chat/completions: %w", err)
	}
	if resp.Model != c.cfg.Model {
		return fmt.Errorf("response.model is %q, want %q", resp.Model, c.cfg.Model)
	}
	if len(resp.Choices) != 1 {
		return fmt.Errorf("got %d choices, want 1", len(resp.Choices))
	}
	calls := resp.Choices[0].Message.ToolCalls
	if len(calls) == 0 {
		return fmt.Errorf("no tool call returned (finish_reason %s)", deref(resp.Choices[0].FinishReason))
	}
	names := toolNames()
	for _, call := range calls {
		if call.ID == "" || call.Type != "function" {
			return fmt.Errorf("tool call has id %q type %q, want an id and type function", call.ID, call.Type)
		}
		if !names[call.Function.Name] {
			return fmt.Errorf("tool call names unknown function %q", call.Function.Name)
		}
		if err := validArguments(call.Function.Name, call.Function.Arguments); err != nil {
			return err
		}
	}
	if named, ok := choice.(map[string]any); ok {
		want := named["function"].(map[string]any)["name"].(string)
		if calls[0].Function.Name != want {
			return fmt.Errorf("forced function %q but the call is to %q", want, calls[0].Function.Name)
		}
	}
	return nil
}

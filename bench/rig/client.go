package rig

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/omnious/provider-node/bench/internal/loopback"
	"github.com/omnious/provider-node/engines/openai"
)

// Result is one request's measurements, in wall time.
type Result struct {
	Stage   int
	Session int // -1 outside chat
	Turn    int
	Start   time.Time
	TTFT    time.Duration
	E2E     time.Duration
	ITL     []time.Duration
	Output  int // completion tokens (usage, else content chunks)
	Prompt  int // prompt tokens (usage)
	Cached  int // usage.prompt_tokens_details.cached_tokens
	Status  int // the HTTP status (0: no response)
	Err     error
	// RetryAfter is a refusal's Retry-After (0: none or unreadable);
	// Retried marks a refused call the client sent again (closed-loop
	// agents), so it ends nothing.
	RetryAfter time.Duration
	Retried    bool
	content    strings.Builder
	calls      []toolCall
}

type toolCall struct {
	ID   string `json:"id"`
	Type string `json:"type"`
	Func struct {
		Name string `json:"name"`
		Args string `json:"arguments"`
	} `json:"function"`
}

// Client sends requests to one target and measures them.
type Client struct {
	http  *http.Client
	base  string
	model string
}

// NewClient is a client of the OpenAI API at base (through a gateway)
// that asks for model.
func NewClient(base, model string) *Client {
	return &Client{http: &http.Client{Transport: loopback.Transport()}, base: strings.TrimRight(base, "/"), model: model}
}

// Close closes the client's idle connections.
func (c *Client) Close() { c.http.CloseIdleConnections() }

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

type completionBody struct {
	Model         string        `json:"model"`
	Prompt        any           `json:"prompt"`
	MaxTokens     int           `json:"max_tokens"`
	IgnoreEOS     bool          `json:"ignore_eos"`
	Stream        bool          `json:"stream"`
	StreamOptions streamOptions `json:"stream_options"`
}

type chatMessage struct {
	Role       string     `json:"role"`
	Content    string     `json:"content"`
	ToolCalls  []toolCall `json:"tool_calls,omitempty"`
	ToolCallID string     `json:"tool_call_id,omitempty"`
}

type chatBody struct {
	Model         string          `json:"model"`
	Messages      []chatMessage   `json:"messages"`
	MaxTokens     int             `json:"max_tokens"`
	IgnoreEOS     bool            `json:"ignore_eos"`
	Stream        bool            `json:"stream"`
	StreamOptions streamOptions   `json:"stream_options"`
	Tools         json.RawMessage `json:"tools,omitempty"`
	ToolChoice    string          `json:"tool_choice,omitempty"`
}

// weatherTool is the tool offered by chat sessions with tools.
var weatherTool = json.RawMessage(`[{"type":"function","function":{"name":"get_weather","description":"Current weather in a city","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}]`)

// Completion sends one /v1/completions request and measures it.
func (c *Client) Completion(ctx context.Context, r *Request) *Result {
	body := completionBody{Model: c.model, MaxTokens: r.MaxTokens, IgnoreEOS: true, Stream: true,
		StreamOptions: streamOptions{IncludeUsage: true}}
	if r.Tokens != nil {
		body.Prompt = r.Tokens
	} else {
		body.Prompt = r.Text
	}
	res := &Result{Stage: r.Stage, Session: -1}
	b, err := json.Marshal(body)
	if err != nil {
		res.Err = fmt.Errorf("cannot encode request: %w", err)
		return res
	}
	c.post(ctx, "/v1/completions", b, res, "")
	return res
}

// chat sends one /v1/chat/completions request.
func (c *Client) chat(ctx context.Context, msgs []chatMessage, s *Session, stage int) *Result {
	body := chatBody{Model: c.model, Messages: msgs, MaxTokens: s.MaxTokens, IgnoreEOS: true, Stream: true,
		StreamOptions: streamOptions{IncludeUsage: true}}
	if s.Tools {
		body.Tools, body.ToolChoice = weatherTool, "auto"
	}
	res := &Result{Stage: stage}
	b, err := json.Marshal(body)
	if err != nil {
		res.Err = fmt.Errorf("cannot encode request: %w", err)
		return res
	}
	c.post(ctx, "/v1/chat/completions", b, res, "")
	return res
}

// SessionHeader carries an agent session's id (the EPP's default
// extproc session_header).
const SessionHeader = "x-session-id"

// agentCall sends one call of an agent session: a tool call is required
// unless final, when the answer must be text.
func (c *Client) agentCall(ctx context.Context, msgs []chatMessage, a *AgentSession, final bool, stage int) *Result {
	body := chatBody{Model: c.model, Messages: msgs, MaxTokens: a.ToolCallMax, Stream: true,
		StreamOptions: streamOptions{IncludeUsage: true}, Tools: a.Tools, ToolChoice: "required"}
	if final {
		body.MaxTokens, body.IgnoreEOS, body.ToolChoice = a.OutputLen, true, "none"
	}
	res := &Result{Stage: stage}
	b, err := json.Marshal(body)
	if err != nil {
		res.Err = fmt.Errorf("cannot encode request: %w", err)
		return res
	}
	c.post(ctx, "/v1/chat/completions", b, res, a.ID)
	return res
}

// streamChunk is the part of a completions or chat SSE chunk the bench reads.
type streamChunk struct {
	Choices []struct {
		Text  string `json:"text"`
		Delta struct {
			Content   string `json:"content"`
			Reasoning string `json:"reasoning_content"`
			ToolCalls []struct {
				Index    int    `json:"index"`
				ID       string `json:"id"`
				Type     string `json:"type"`
				Function struct {
					Name      string `json:"name"`
					Arguments string `json:"arguments"`
				} `json:"function"`
			} `json:"tool_calls"`
		} `json:"delta"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens        int `json:"prompt_tokens"`
		CompletionTokens    int `json:"completion_tokens"`
		PromptTokensDetails *struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
	Error *struct {
		Message string `json:"message"`
	} `json:"error"`
}

// post sends body and reads the SSE stream into res; session, when set,
// goes in the session header.
func (c *Client) post(ctx context.Context, path string, body []byte, res *Result, session string) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+path, bytes.NewReader(body))
	if err != nil {
		res.Err = fmt.Errorf("cannot build request: %w", err)
		return
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	if session != "" {
		req.Header.Set(SessionHeader, session)
	}
	res.Start = time.Now()
	resp, err := c.http.Do(req)
	if err != nil {
		res.Err = fmt.Errorf("request failed: %w", err)
		return
	}
	defer resp.Body.Close()
	res.Status = resp.StatusCode
	if resp.StatusCode != http.StatusOK {
		res.RetryAfter = retryAfter(resp.Header.Get("Retry-After"), time.Now())
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		res.Err = fmt.Errorf("status %d: %s", resp.StatusCode, strings.TrimSpace(string(msg)))
		return
	}
	var last time.Time
	var broken error
	chunks, done := 0, false
	for ev, err := range openai.Events(resp.Body, 16<<20) {
		if err != nil {
			broken = err
			break
		}
		if ev.Done {
			done = true
			break
		}
		var ch streamChunk
		if err := json.Unmarshal(ev.Data, &ch); err != nil {
			res.Err = fmt.Errorf("bad stream chunk: %w", err)
			return
		}
		if ch.Error != nil {
			res.Err = fmt.Errorf("stream error: %s", ch.Error.Message)
			return
		}
		if ch.Usage != nil {
			res.Prompt, res.Output = ch.Usage.PromptTokens, ch.Usage.CompletionTokens
			if ch.Usage.PromptTokensDetails != nil {
				res.Cached = ch.Usage.PromptTokensDetails.CachedTokens
			}
		}
		content := false
		for _, choice := range ch.Choices {
			if choice.Text != "" || choice.Delta.Content != "" || choice.Delta.Reasoning != "" || len(choice.Delta.ToolCalls) > 0 {
				content = true
			}
			res.content.WriteString(choice.Text)
			res.content.WriteString(choice.Delta.Content)
			for _, tc := range choice.Delta.ToolCalls {
				for len(res.calls) <= tc.Index {
					res.calls = append(res.calls, toolCall{Type: "function"})
				}
				call := &res.calls[tc.Index]
				if tc.ID != "" {
					call.ID = tc.ID
				}
				call.Func.Name += tc.Function.Name
				call.Func.Args += tc.Function.Arguments
			}
		}
		if !content {
			continue
		}
		chunks++
		if last.IsZero() {
			res.TTFT = ev.At.Sub(res.Start)
		} else {
			res.ITL = append(res.ITL, ev.At.Sub(last))
		}
		last = ev.At
	}
	res.E2E = time.Since(res.Start)
	if broken != nil {
		res.Err = fmt.Errorf("stream broken: %w", broken)
		return
	}
	if !done {
		res.Err = errors.New("stream ended without [DONE]")
		return
	}
	if chunks == 0 {
		if res.Output == 0 {
			res.Err = errors.New("stream had no content")
			return
		}
		// Tokens were generated but nothing streamed: a tool call cut by
		// max_tokens, which the parser never emits. The answer arrived at
		// the end.
		res.TTFT = res.E2E
	}
	if res.Output == 0 {
		res.Output = chunks
	}
}

// retryAfter reads a Retry-After header, seconds or an HTTP date, as a
// wait from now; 0 when absent, unreadable or past. It is bounded to
// maxRetryAfter, so a server cannot park an agent for ever.
func retryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	var d time.Duration
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		if n <= 0 {
			return 0
		}
		d = time.Duration(min(n, int64(maxRetryAfter/time.Second))) * time.Second
	} else if t, err := http.ParseTime(v); err == nil {
		d = t.Sub(now)
	}
	return min(max(d, 0), maxRetryAfter)
}

// maxRetryAfter bounds the wait a Retry-After can ask of an agent.
const maxRetryAfter = 10 * time.Minute

// Replay sends the workload to base and returns every request's result. It
// is open-loop: requests start at their arrival times whatever the answers'
// pace, up to maxInFlight at once; a closed-loop agent workload
// (Workload.Closed) runs its agents instead, which bound what is in
// flight. tick is called after each result.
func Replay(ctx context.Context, c *Client, w *Workload, maxInFlight int, timeout time.Duration, tick func()) []*Result {
	var (
		mu  sync.Mutex
		out []*Result
		wg  sync.WaitGroup
	)
	add := func(r *Result) {
		mu.Lock()
		out = append(out, r)
		mu.Unlock()
		if tick != nil {
			tick()
		}
	}
	if w.Closed != nil {
		replayClosed(ctx, c, w, timeout, add)
		return out
	}
	sem := make(chan struct{}, maxInFlight)
	start := time.Now()
	timer := time.NewTimer(0)
	defer timer.Stop()
	<-timer.C
loop:
	for i := range w.Requests {
		r := &w.Requests[i]
		if d := time.Until(start.Add(r.At)); d > 0 {
			timer.Reset(d)
			select {
			case <-ctx.Done():
				break loop
			case <-timer.C:
			}
		}
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			break loop
		}
		wg.Add(1)
		go func(idx int) {
			defer wg.Done()
			defer func() { <-sem }()
			rctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			if r.Session != nil {
				runSession(rctx, c, r, idx, add)
				return
			}
			if r.Agent != nil {
				runAgent(rctx, c, r, idx, add, nil)
				return
			}
			add(c.Completion(rctx, r))
		}(i)
	}
	wg.Wait()
	return out
}

// runSession runs one conversation turn by turn; each turn sends the whole
// conversation, including the previous answers (and tool exchanges).
func runSession(ctx context.Context, c *Client, r *Request, idx int, add func(*Result)) {
	s := r.Session
	msgs := []chatMessage{{Role: "system", Content: s.System}}
	for turn, u := range s.Users {
		msgs = append(msgs, chatMessage{Role: "user", Content: u})
		res := c.chat(ctx, msgs, s, r.Stage)
		res.Session, res.Turn = idx, turn
		add(res)
		if res.Err != nil {
			return // the conversation cannot go on without its answer
		}
		msgs = append(msgs, chatMessage{Role: "assistant", Content: res.content.String(), ToolCalls: res.calls})
		for i, call := range res.calls {
			id := call.ID
			if id == "" {
				id = fmt.Sprintf("call_%d_%d_%d", idx, turn, i)
				msgs[len(msgs)-1].ToolCalls[i].ID = id
			}
			msgs = append(msgs, chatMessage{Role: "tool", ToolCallID: id, Content: `{"temperature_c": 21, "sky": "clear"}`})
		}
		if turn < len(s.Users)-1 && s.Think > 0 {
			t := time.NewTimer(s.Think)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
		}
	}
}

// replayClosed runs w.Closed's agents: agent k starts at k ramps, and
// each takes the next session not yet taken whenever it is free, until
// every session has been taken (TestReplayClosedLoop).
func replayClosed(ctx context.Context, c *Client, w *Workload, timeout time.Duration, add func(*Result)) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for k := range w.Closed.Agents {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if !sleep(ctx, time.Duration(k)*w.Closed.Ramp) {
				return
			}
			for ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= len(w.Requests) {
					return
				}
				r := &w.Requests[i]
				if r.Agent == nil {
					continue
				}
				rctx, cancel := context.WithTimeout(ctx, timeout)
				runAgent(rctx, c, r, i, add, w.Closed)
				cancel()
			}
		}()
	}
	wg.Wait()
}

// sleep waits d, or less if ctx ends first; false when it did.
func sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// backoff is the wait before retry n (0 first) of a refused call: the
// refusal's Retry-After when it gave one, else base doubled per retry up
// to 8 times base.
func backoff(res *Result, base time.Duration, n int) time.Duration {
	if res.RetryAfter > 0 {
		return res.RetryAfter
	}
	return base << min(n, 3)
}

// runAgent runs one agent session call by call: each call sends the whole
// history; after a tool call the session waits the tool's time and
// appends its result. With closed set, a refused call (429) is sent again
// after its backoff, up to closed.Retries times, each refusal recorded
// as Retried.
func runAgent(ctx context.Context, c *Client, r *Request, idx int, add func(*Result), closed *ClosedLoop) {
	a := r.Agent
	msgs := []chatMessage{{Role: "system", Content: a.System}, {Role: "user", Content: a.Task}}
	for call := range a.Calls() {
		final := call == a.Calls()-1
		var res *Result
		var first time.Time
		for n := 0; ; n++ {
			res = c.agentCall(ctx, msgs, a, final, r.Stage)
			res.Session, res.Turn = idx, call
			if n == 0 {
				first = res.Start
			}
			if res.Status != http.StatusTooManyRequests || closed == nil || n >= closed.Retries {
				break
			}
			res.Retried = true
			add(res)
			if !sleep(ctx, backoff(res, closed.Backoff, n)) {
				return
			}
		}
		// A call refused and sent again is one call from its first send:
		// its TTFT and E2E include the refusals and backoffs, so waiting
		// never looks like goodput (TestReplayClosedLoop).
		if wait := res.Start.Sub(first); wait > 0 {
			res.Start, res.E2E = first, res.E2E+wait
			if res.Err == nil {
				res.TTFT += wait
			}
		}
		add(res)
		if res.Err != nil || final {
			return // a session cannot go on without its answer
		}
		if !sleep(ctx, a.Gaps[call]) {
			return
		}
		msgs = append(msgs, chatMessage{Role: "assistant", Content: res.content.String(), ToolCalls: res.calls})
		if len(res.calls) == 0 {
			// No call parsed (cut by max_tokens): the result goes back
			// as the user's message.
			msgs = append(msgs, chatMessage{Role: "user", Content: a.Results[call]})
			continue
		}
		for i, tc := range res.calls {
			id := tc.ID
			if id == "" {
				id = fmt.Sprintf("call_%d_%d_%d", idx, call, i)
				msgs[len(msgs)-1].ToolCalls[i].ID = id
			}
			content := `{"ok": true}`
			if i == 0 {
				content = a.Results[call]
			}
			msgs = append(msgs, chatMessage{Role: "tool", ToolCallID: id, Content: content})
		}
	}
}

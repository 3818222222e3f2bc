package rig

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// agentServer is a fake OpenAI endpoint for agent sessions: it answers a
// tool call when one is required and text otherwise, refuses the first
// call of each session refuse times (429, with retryAfter when set), and
// records how many sessions were active at once.
type agentServer struct {
	mu             sync.Mutex
	refuse         int
	retryAfter     string
	refused        map[string]int
	active         map[string]bool
	maxActive      int
	calls, refusal int
}

func (s *agentServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var body chatBody
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	id := r.Header.Get(SessionHeader)
	s.mu.Lock()
	if !s.active[id] && s.refused[id] < s.refuse {
		s.refused[id]++
		s.refusal++
		s.mu.Unlock()
		if s.retryAfter != "" {
			w.Header().Set("Retry-After", s.retryAfter)
		}
		http.Error(w, `{"error":{"message":"session queue TTL"}}`, http.StatusTooManyRequests)
		return
	}
	s.calls++
	s.active[id] = true
	s.maxActive = max(s.maxActive, len(s.active))
	final := body.ToolChoice == "none"
	if final {
		delete(s.active, id)
	}
	s.mu.Unlock()
	w.Header().Set("Content-Type", "text/event-stream")
	chunk := `{"choices":[{"delta":{"tool_calls":[{"index":0,"id":"c1","type":"function","function":{"name":"bash","arguments":"{}"}}]}}]}`
	if final {
		chunk = `{"choices":[{"delta":{"content":"done"}}]}`
	}
	fmt.Fprintf(w, "data: %s\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":3}}\n\ndata: [DONE]\n\n", chunk)
}

// TestReplayClosedLoop: closed-loop agents run every session, never more
// sessions at once than there are agents, and send a refused call again
// (each refusal recorded as Retried) until their retries run out, when
// the session is given up and the agent takes the next one.
func TestReplayClosedLoop(t *testing.T) {
	for _, tc := range []struct {
		name            string
		agents, retries int
		refuse          int
		wantRetried     int // per session
		wantCompleted   bool
	}{
		{"no refusals", 3, 2, 0, 0, true},
		{"refused then admitted", 3, 2, 2, 2, true},
		{"given up", 2, 1, 3, 1, false},
		{"one agent", 1, 0, 0, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := &agentServer{refuse: tc.refuse, refused: map[string]int{}, active: map[string]bool{}}
			hs := httptest.NewServer(srv)
			defer hs.Close()
			o := Options{Fleet: FleetOptions{TimeScale: 4}, Workload: WorkloadOptions{Kind: WorkloadAgents, Agents: AgentOptions{
				Sessions: 8, SessionRate: 1000, Calls: 3, CallsMax: 4, Gap: time.Millisecond, GapMax: 2 * time.Millisecond,
				Concurrency: new(tc.agents), Retries: new(tc.retries), RetryBackoff: 4 * time.Millisecond}}}.WithDefaults()
			require.NoError(t, o.Validate())
			w, err := BuildWorkload(o)
			require.NoError(t, err)
			require.NotNil(t, w.Closed)
			require.Equal(t, ClosedLoop{Agents: tc.agents, Ramp: 250 * time.Microsecond, Retries: tc.retries, Backoff: time.Millisecond}, *w.Closed)
			c := NewClient(hs.URL, "m")
			defer c.Close()
			res := Replay(context.Background(), c, w, 1, time.Minute, nil)

			retried, ok := map[int]int{}, map[int]int{}
			type call struct{ session, turn int }
			refusals := map[call][]*Result{}
			for _, r := range res {
				if r.Retried {
					require.Equal(t, http.StatusTooManyRequests, r.Status)
					retried[r.Session]++
					refusals[call{r.Session, r.Turn}] = append(refusals[call{r.Session, r.Turn}], r)
					continue
				}
				if r.Err == nil {
					ok[r.Session]++
				}
				// A retried call counts from its first send: its TTFT
				// includes the refusals and the backoffs between them.
				if rs := refusals[call{r.Session, r.Turn}]; len(rs) > 0 {
					require.Equal(t, rs[0].Start, r.Start, "session %d call %d starts at its first send", r.Session, r.Turn)
					wait := rs[len(rs)-1].Start.Sub(rs[0].Start) + rs[len(rs)-1].E2E
					require.Greater(t, r.E2E, wait, "session %d call %d", r.Session, r.Turn)
					if r.Err == nil {
						require.Greater(t, r.TTFT, wait, "session %d call %d", r.Session, r.Turn)
					}
				}
			}
			require.LessOrEqual(t, srv.maxActive, tc.agents, "never more sessions at once than agents")
			for i, r := range w.Requests {
				require.Equal(t, tc.wantRetried, retried[i], "session %d", i)
				if tc.wantCompleted {
					require.Equal(t, r.Agent.Calls(), ok[i], "session %d answered in full", i)
				} else {
					require.Zero(t, ok[i], "session %d given up", i)
				}
			}
		})
	}
}

// TestRetryAfter: a refusal's Retry-After, in seconds or as a date, is
// the wait before the retry, bounded; without one the backoff doubles
// from its base up to 8 times it.
func TestRetryAfter(t *testing.T) {
	now := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		in   string
		want time.Duration
	}{
		{"", 0},
		{"3", 3 * time.Second},
		{" 7 ", 7 * time.Second},
		{"0", 0},
		{"-5", 0},
		{"soon", 0},
		{"99999999999999", maxRetryAfter},
		{now.Add(90 * time.Second).Format(http.TimeFormat), 90 * time.Second},
		{now.Add(-time.Hour).Format(http.TimeFormat), 0},
		{now.Add(48 * time.Hour).Format(http.TimeFormat), maxRetryAfter},
	} {
		require.Equal(t, tc.want, retryAfter(tc.in, now), "%q", tc.in)
	}
	base := 100 * time.Millisecond
	for n, want := range []time.Duration{base, 2 * base, 4 * base, 8 * base, 8 * base, 8 * base} {
		require.Equal(t, want, backoff(&Result{}, base, n), "retry %d", n)
	}
	require.Equal(t, 3*time.Second, backoff(&Result{RetryAfter: 3 * time.Second}, base, 5))
}

// TestValidateClosedLoop: negative agents, retries or backoff are refused
// with the flag's name; 0 agents is the open loop, 0 retries legal.
func TestValidateClosedLoop(t *testing.T) {
	for _, tc := range []struct {
		name    string
		mut     func(*AgentOptions)
		wantErr string
	}{
		{"open loop", func(a *AgentOptions) { a.Concurrency = new(0) }, ""},
		{"no retries", func(a *AgentOptions) { a.Concurrency, a.Retries = new(4), new(0) }, ""},
		{"negative agents", func(a *AgentOptions) { a.Concurrency = new(-1) }, "agent-concurrency"},
		{"negative retries", func(a *AgentOptions) { a.Retries = new(-1) }, "agent-retries"},
		{"negative backoff", func(a *AgentOptions) { a.RetryBackoff = -time.Second }, "agent-retry-backoff"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := Options{Workload: WorkloadOptions{Kind: WorkloadAgents}}
			tc.mut(&o.Workload.Agents)
			o = o.WithDefaults()
			err := o.Validate()
			if tc.wantErr == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tc.wantErr)
		})
	}
}

// FuzzRetryAfter: whatever a server sends, the wait is between 0 and
// maxRetryAfter.
func FuzzRetryAfter(f *testing.F) {
	now := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	for _, s := range []string{"", "3", "-1", "99999999999999999999", now.Add(time.Hour).Format(http.TimeFormat), "Sun, 06 Dec 2026"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		d := retryAfter(v, now)
		require.True(t, d >= 0 && d <= maxRetryAfter, "%q: %v", v, d)
	})
}

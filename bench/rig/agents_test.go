package rig

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"
)

// TestAgentSessionsWorkload: the agent workload is the same per seed,
// every session shares the system prompt and tools and has a task of its
// own, calls and results stay within their caps, gaps are in wall time,
// and session ids are sent unless turned off.
func TestAgentSessionsWorkload(t *testing.T) {
	for _, tc := range []struct {
		name  string
		opts  AgentOptions
		noIDs bool
	}{
		{"defaults", AgentOptions{}, false},
		{"no session ids", AgentOptions{NoSessionIDs: true}, true},
		{"tight caps", AgentOptions{Sessions: 30, Calls: 6, CallsMax: 8, ResultLen: 50, ResultMax: 60, Gap: time.Second, GapMax: 2 * time.Second, Tools: 2, SchemaLen: 40}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := Options{Fleet: FleetOptions{TimeScale: 4}, Workload: WorkloadOptions{Kind: WorkloadAgents, Agents: tc.opts}}.WithDefaults()
			require.NoError(t, o.Validate())
			a := o.Workload.Agents
			w, err := BuildWorkload(o)
			require.NoError(t, err)
			again, err := BuildWorkload(o)
			require.NoError(t, err)
			require.Equal(t, w.Requests, again.Requests, "same seed, same workload")
			require.Len(t, w.Requests, a.Sessions)
			var tools []struct {
				Function struct{ Description string } `json:"function"`
			}
			require.NoError(t, json.Unmarshal(w.Requests[0].Agent.Tools, &tools))
			require.Len(t, tools, a.Tools)
			descWords := 0
			for _, tl := range tools {
				descWords += len(strings.Fields(tl.Function.Description))
			}
			require.Equal(t, a.SchemaLen, descWords)
			tasks := map[string]bool{}
			var last time.Duration
			for i, r := range w.Requests {
				s := r.Agent
				require.NotNil(t, s)
				require.GreaterOrEqual(t, r.At, last, "sessions start in order")
				last = r.At
				require.Equal(t, w.Requests[0].Agent.System, s.System)
				require.Equal(t, string(w.Requests[0].Agent.Tools), string(s.Tools))
				require.False(t, tasks[s.Task], "session %d has a task of its own", i)
				tasks[s.Task] = true
				require.Equal(t, tc.noIDs, s.ID == "")
				require.GreaterOrEqual(t, s.Calls(), 2)
				require.LessOrEqual(t, s.Calls(), a.CallsMax)
				require.Len(t, s.Gaps, s.Calls()-1)
				for k, res := range s.Results {
					n := len(strings.Fields(res))
					require.True(t, n >= 1 && n <= a.ResultMax, "result of %d words", n)
					require.LessOrEqual(t, s.Gaps[k], time.Duration(float64(a.GapMax)/o.Fleet.TimeScale))
				}
			}
		})
	}
}

func TestValidateAgentOptions(t *testing.T) {
	for _, tc := range []struct {
		name string
		mut  func(*AgentOptions)
	}{
		{"one call", func(a *AgentOptions) { a.Calls = 1 }},
		{"max below median", func(a *AgentOptions) { a.CallsMax = a.Calls - 1 }},
		{"negative gap", func(a *AgentOptions) { a.Gap = -time.Second }},
		{"negative sigma", func(a *AgentOptions) { a.Sigma = -1 }},
		{"result max below median", func(a *AgentOptions) { a.ResultMax = a.ResultLen - 1 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := Options{Workload: WorkloadOptions{Kind: WorkloadAgents}}.WithDefaults()
			tc.mut(&o.Workload.Agents)
			require.ErrorContains(t, o.Validate(), "agents:")
		})
	}
}

// TestAgentMaxContext: no call of a session passes the context window
// (prompt, counted as words plus agentCallOverhead a call, plus the
// larger output budget); a session that would ends with the call before
// as its answer, its calls a prefix of the same session's under a wider
// window; the sessions cut are counted; and a window the first call
// cannot fit, or a negative one, is refused.
func TestAgentMaxContext(t *testing.T) {
	wide := Options{Fleet: FleetOptions{TimeScale: 4}, Workload: WorkloadOptions{Kind: WorkloadAgents,
		Agents: AgentOptions{Sessions: 128, MaxContext: 1 << 30}}}.WithDefaults()
	all, err := BuildWorkload(wide)
	require.NoError(t, err)
	require.Zero(t, all.ContextEnded)
	for _, tc := range []struct {
		name      string
		window    int // AgentOptions.MaxContext (0: default)
		modelLen  int // FleetOptions.MaxModelLen
		want      int // the window in force
		wantErr   string
		wantEnded bool
	}{
		{"default", 0, 0, 40960, "", true},
		{"fleet's max_model_len", 0, 20000, 20000, "", true},
		{"explicit", 12000, 40960, 12000, "", true},
		{"only the first call", 3400, 0, 3400, "", true},
		{"below the first call", 3300, 0, 0, "the first call alone needs 3376 tokens", false},
		{"negative", -1, 0, 0, "agent-max-context -1", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := wide
			o.Fleet.MaxModelLen = tc.modelLen
			o.Workload.Agents.MaxContext = tc.window
			o.Workload.Agents.Concurrency = nil
			o = o.WithDefaults()
			if tc.wantErr != "" {
				require.ErrorContains(t, o.Validate(), tc.wantErr)
				return
			}
			require.NoError(t, o.Validate())
			a := o.Workload.Agents
			require.Equal(t, tc.want, a.MaxContext)
			w, err := BuildWorkload(o)
			require.NoError(t, err)
			require.LessOrEqual(t, w.MaxLen, a.MaxContext)
			ended := 0
			for i, r := range w.Requests {
				s, full := r.Agent, all.Requests[i].Agent
				require.Equal(t, full.Task, s.Task)
				require.Equal(t, append([]string(nil), full.Results[:len(s.Results)]...), s.Results, "session %d: the calls that fit are the same", i)
				require.Equal(t, append([]time.Duration(nil), full.Gaps[:len(s.Gaps)]...), s.Gaps)
				h := a.SystemLen + a.SchemaLen + a.TaskLen
				for k := range s.Calls() {
					require.LessOrEqual(t, agentCallTokens(h, k+1, a.Tools)+max(a.OutputLen, a.ToolCallMax), a.MaxContext, "session %d call %d", i, k)
					if k < len(s.Results) {
						h += len(strings.Fields(s.Results[k])) + a.ToolCallMax
					}
				}
				if s.Calls() < full.Calls() {
					ended++
					next := h + len(strings.Fields(full.Results[len(s.Results)])) + a.ToolCallMax
					require.Greater(t, agentCallTokens(next, s.Calls()+1, a.Tools)+max(a.OutputLen, a.ToolCallMax), a.MaxContext,
						"session %d ended though its next call fit", i)
				}
			}
			require.Equal(t, ended, w.ContextEnded)
			require.Equal(t, tc.wantEnded, ended > 0)
			require.Contains(t, w.Name, fmt.Sprintf("%d ended at the %d-token context", ended, a.MaxContext))
		})
	}
}

// TestAgentMaxContextFitsEngine: against a simulated replica whose
// max_model_len is the window, every session's every call is served: the
// workload's count of a prompt bounds the engine's (agentCallOverhead and agentToolOverhead
// are enough for the chat template and the tools' and tool calls' JSON),
// with few tools or many.
func TestAgentMaxContextFitsEngine(t *testing.T) {
	const window = 6000
	for _, tools := range []int{1, 4, 8} {
		t.Run(fmt.Sprintf("%d tools", tools), func(t *testing.T) {
			o := Options{Seed: 5, Log: zaptest.NewLogger(t), Fleet: FleetOptions{Replicas: 1, TimeScale: 200, MaxModelLen: window},
				Workload: WorkloadOptions{Kind: WorkloadAgents, Agents: AgentOptions{Sessions: 6, SessionRate: 100, Calls: 12, Tools: tools,
					ResultLen: 400, Gap: 10 * time.Millisecond, GapMax: 20 * time.Millisecond, Concurrency: new(6)}}}.WithDefaults()
			require.NoError(t, o.Validate())
			require.Equal(t, window, o.Workload.Agents.MaxContext)
			w, err := BuildWorkload(o)
			require.NoError(t, err)
			require.Positive(t, w.ContextEnded, "the window cuts sessions")
			f, err := StartFleet(context.Background(), o.Fleet, o.Seed, w.MaxLen, o.Log)
			require.NoError(t, err)
			defer func() { require.NoError(t, f.Stop()) }()
			c := NewClient("http://"+f.Endpoints()[0].Addr, f.Endpoints()[0].Model)
			defer c.Close()
			res := Replay(context.Background(), c, w, 1, time.Minute, nil)
			calls := 0
			for _, r := range w.Requests {
				calls += r.Agent.Calls()
			}
			require.Len(t, res, calls)
			a := o.Workload.Agents
			for _, r := range res {
				require.NoError(t, r.Err, "session %d call %d", r.Session, r.Turn)
				s := w.Requests[r.Session].Agent
				h := a.SystemLen + a.SchemaLen + a.TaskLen
				for k := range r.Turn {
					h += len(strings.Fields(s.Results[k])) + a.ToolCallMax
				}
				require.LessOrEqual(t, r.Prompt, agentCallTokens(h, r.Turn+1, a.Tools), "session %d call %d", r.Session, r.Turn)
			}
		})
	}
}

package rig

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
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

package scheduler

import (
	"fmt"
	"math"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/omnious/provider-node/engines/metrics"
)

// TestAgentRule is the stay/move rule on its own: stay on the least-worked
// holder within the objective, else the least-worked candidate, a move
// only when there were holders to leave.
func TestAgentRule(t *testing.T) {
	const obj = 2.0 // seconds
	v := func(pending, uncached, rate float64, holder bool) agentView {
		return agentView{pending: pending, uncached: uncached, rate: rate, holder: holder}
	}
	for _, tc := range []struct {
		name          string
		views         []agentView
		best          int
		stayed, moved bool
	}{
		{"holder idle stays", []agentView{v(0, 100, 1000, true), v(0, 5000, 1000, false)}, 0, true, false},
		{"holder busier than others but within the bound stays",
			[]agentView{v(1500, 100, 1000, true), v(0, 5000, 1000, false), v(0, 5000, 1000, false)}, 0, true, false},
		{"holder exactly at the bound stays", []agentView{v(1900, 100, 1000, true), v(0, 5000, 1000, false)}, 0, true, false},
		{"holder over the bound moves to the least work",
			[]agentView{v(1950, 100, 1000, true), v(300, 1000, 1000, false), v(0, 1000, 1000, false)}, 2, false, true},
		{"a faster holder's bound is larger", []agentView{v(3500, 100, 2000, true), v(0, 100, 1000, false)}, 0, true, false},
		{"least-worked of two holders", []agentView{v(1000, 100, 1000, true), v(200, 100, 1000, true), v(0, 4000, 1000, false)}, 1, true, false},
		{"over the bound but the holder is still the least work: no move",
			[]agentView{v(2500, 100, 1000, true), v(9000, 5000, 1000, false)}, 0, false, false},
		{"no holder: least work, no move", []agentView{v(500, 4000, 1000, false), v(0, 4000, 1000, false)}, 1, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			best, stayed, moved := agentRule(tc.views, obj, func(int) int { return 1 })
			require.Equal(t, tc.best, best)
			require.Equal(t, tc.stayed, stayed, "stayed")
			require.Equal(t, tc.moved, moved, "moved")
		})
	}
}

// agentEnv is a 3-replica scheduler with the agent policy and idle,
// fresh signals.
func agentEnv(t *testing.T) *testEnv {
	e := newEnv(t, 3, func(c *Config) { c.Policy = PolicyAgent; c.Sessions.PrefillRate = 1000 })
	e.freshAll()
	return e
}

// TestAgentStayMove: a session stays on the replica holding its history,
// however much another would score for load, until that replica's pending
// prefill work passes rate × objective (1000 tokens/s × 2s); then it moves
// to the least-worked replica and the move is counted.
func TestAgentStayMove(t *testing.T) {
	for _, tc := range []struct {
		name    string
		pending int64 // on the holder, tokens
		key     string
		stay    bool
		reason  string
	}{
		{"by key, idle holder", 0, "s1", true, ReasonSession},
		{"by key, holder busy within the bound", 1500, "s1", true, ReasonSession},
		{"by key, holder over the bound", 2500, "s1", false, ReasonSessionMove},
		{"by prefix, idle holder", 0, "", true, ReasonPrefix},
		{"by prefix, holder over the bound", 2500, "", false, ReasonSessionMove},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := agentEnv(t)
			system := tokens(1024, 7)
			for i := range 3 {
				e.store(i, system) // the shared system prompt is everywhere
			}
			// The first call: a new session goes where work is least.
			first, err := e.s.admitPick(ctx, &Request{Model: testModel, Tokens: system, SessionKey: tc.key})
			require.NoError(t, err)
			require.Equal(t, ReasonCold, first.Reason)
			first.Done(DoneInfo{Status: 200})
			holder := indexOf(t, primary(first))
			history := append(append([]uint32{}, system...), tokens(2048, 9)...)
			e.store(holder, history)
			e.rep(holder).pending.Add(tc.pending)
			next := append(append([]uint32{}, history...), tokens(100, 11)...)
			d, err := e.s.admitPick(ctx, &Request{Model: testModel, Tokens: next, SessionKey: tc.key})
			require.NoError(t, err)
			require.Equal(t, tc.reason, d.Reason)
			if tc.stay {
				require.Equal(t, addr(holder), primary(d))
			} else {
				require.NotEqual(t, addr(holder), primary(d))
			}
			moves := 0.0
			if !tc.stay {
				moves = 1
			}
			require.Equal(t, moves, testutil.ToFloat64(e.s.m.sessionMoves))
			// The call's uncached work is pending where it went until Done.
			r := e.s.snap.Load().byAddr[primary(d)]
			require.Positive(t, r.pending.Load())
			d.Done(DoneInfo{Status: 200})
			require.Equal(t, map[bool]int64{true: tc.pending, false: 0}[r == e.rep(holder)], r.pending.Load())
		})
	}
}

// TestAgentInfersSessionByPrefix: without session ids two interleaved
// sessions each keep to the replica holding their own history, told
// apart by the longest prefix held, not by the shared system prompt.
func TestAgentInfersSessionByPrefix(t *testing.T) {
	e := agentEnv(t)
	system := tokens(1024, 7)
	for i := range 3 {
		e.store(i, system)
	}
	histories := [][]uint32{append(append([]uint32{}, system...), tokens(1024, 21)...),
		append(append([]uint32{}, system...), tokens(1024, 22)...)}
	e.store(0, histories[0])
	e.store(2, histories[1])
	for turn := range 4 {
		for s, want := range []int{0, 2} {
			histories[s] = append(histories[s], tokens(64, uint32(100+10*turn+s))...)
			d, err := e.s.admitPick(ctx, &Request{Model: testModel, Tokens: histories[s]})
			require.NoError(t, err)
			require.Equal(t, addr(want), primary(d), "session %d turn %d", s, turn)
			require.Equal(t, ReasonPrefix, d.Reason)
			d.Done(DoneInfo{Status: 200})
			e.store(want, histories[s])
		}
	}
	require.Zero(t, testutil.ToFloat64(e.s.m.sessionMoves))
}

// TestAgentUsesMeasuredRate: the bound uses the capacity curve's measured
// prefill rate once there is one, the configured rate before.
func TestAgentUsesMeasuredRate(t *testing.T) {
	e := agentEnv(t)
	system := tokens(1024, 7)
	for i := range 3 {
		e.store(i, system)
	}
	history := append(append([]uint32{}, system...), tokens(2048, 9)...)
	e.store(1, history)
	e.rep(1).pending.Add(2500) // over 1000 tokens/s × 2s
	d, err := e.s.admitPick(ctx, &Request{Model: testModel, Tokens: history})
	require.NoError(t, err)
	require.Equal(t, ReasonSessionMove, d.Reason, "inferred by prefix, then moved")
	d.Done(DoneInfo{Status: 200})

	e2 := agentEnv(t)
	for i := range 3 {
		e2.store(i, system)
	}
	e2.store(1, history)
	e2.rep(1).pending.Add(2500)
	e2.rep(1).prefillRate.Store(math.Float64bits(4000)) // measured: bound 8000 tokens
	d, err = e2.s.admitPick(ctx, &Request{Model: testModel, Tokens: history})
	require.NoError(t, err)
	require.Equal(t, addr(1), primary(d))
	require.Equal(t, ReasonPrefix, d.Reason)
	d.Done(DoneInfo{Status: 200})
}

// TestAgentKeepsFullHolder: the KV-ceiling filter does not take a
// session's holder away under the agent policy.
func TestAgentKeepsFullHolder(t *testing.T) {
	e := agentEnv(t)
	e.setSignals(1, metrics.Signals{Engine: metrics.EngineVLLM, KVUsage: 0.99})
	history := tokens(3000, 5)
	e.store(1, history)
	d, err := e.s.admitPick(ctx, &Request{Model: testModel, Tokens: history})
	require.NoError(t, err)
	require.Equal(t, addr(1), primary(d))
	d.Done(DoneInfo{Status: 200})
}

func indexOf(t *testing.T, a string) int {
	for i := range 16 {
		if addr(i) == a {
			return i
		}
	}
	t.Fatalf("unknown address %s", a)
	return -1
}

// TestAgentSpreadsNewSessions: new sessions are not piled onto the
// replica that happens to hold the shared prefix; they spread by the
// sessions placed, with or without keys.
func TestAgentSpreadsNewSessions(t *testing.T) {
	for _, keyed := range []bool{true, false} {
		t.Run(map[bool]string{true: "keys", false: "no keys"}[keyed], func(t *testing.T) {
			e := agentEnv(t)
			system := tokens(2048, 7)
			// Replicas 0 and 1 hold the shared prefix: no reason to
			// pile new sessions onto them.
			e.store(0, system)
			e.store(1, system)
			per := map[string]int{}
			for s := range 9 {
				prompt := append(append([]uint32{}, system...), tokens(300, uint32(50+s))...)
				key := ""
				if keyed {
					key = fmt.Sprint("s", s)
				}
				d, err := e.s.admitPick(ctx, &Request{Model: testModel, Tokens: prompt, SessionKey: key})
				require.NoError(t, err)
				per[primary(d)]++
				d.Done(DoneInfo{Status: 200})
			}
			require.Equal(t, map[string]int{addr(0): 3, addr(1): 3, addr(2): 3}, per)
		})
	}
}

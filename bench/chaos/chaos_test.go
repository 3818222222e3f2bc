package chaos

import (
	"bytes"
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/omnious/provider-node/bench/internal/launch/launchtest"
	"github.com/omnious/provider-node/engines/sim/simtest"
)

// TestChaosScenarios runs a fast subset of the chaos suite against
// enginesim processes (the whole suite is make chaos). Each scenario's own
// checks decide; the test then requires that every process it started is
// gone (its ports free again).
func TestChaosScenarios(t *testing.T) {
	names := []string{"engine-kill", "engine-crash-idle", "client-cancel", "event-gap", "kv-publisher-outage", "metrics-hang",
		"epp-kill-one-of-two"}
	if testing.Short() {
		names = []string{"engine-kill", "engine-crash-idle", "event-gap"}
	}
	b := bins{enginesim: simtest.Binary(t)}
	byName := map[string]scenario{}
	for _, s := range scenarios() {
		byName[s.name] = s
	}
	for _, name := range names {
		if byName[name].setup.eppProcesses > 0 && b.epp == "" {
			b.epp = launchtest.EPPBinary(t)
		}
	}
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			s, ok := byName[name]
			require.True(t, ok)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			env, err := newWorld(ctx, b, s.setup, zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)))
			require.NoError(t, err)
			t.Cleanup(func() { _ = env.Close() })
			var o outcome
			runErr := s.run(ctx, env, &o)
			require.NoError(t, env.Close())
			require.NoError(t, runErr)
			require.Empty(t, o.failed, "observed: %s", strings.Join(o.observed, "; "))
			require.NotEmpty(t, o.recoveryOf, "a scenario reports a recovery time")
			require.Positive(t, o.recovery)
			for _, p := range env.sims {
				requireFree(t, p.Addr())
				requireFree(t, strings.TrimPrefix(p.Config.KVEvents.Endpoint, "tcp://"))
				requireFree(t, strings.TrimPrefix(p.Config.KVEvents.ReplayEndpoint, "tcp://"))
			}
			for _, e := range env.epps {
				requireFree(t, e.GRPCAddr())
				requireFree(t, strings.TrimPrefix(strings.TrimSuffix(e.MetricsURL(), "/metrics"), "http://"))
				requireFree(t, strings.TrimPrefix(e.AdminURL(), "http://"))
			}
		})
	}
}

func TestRunChaosRejects(t *testing.T) {
	tests := []struct {
		name string
		opts Options
		want string
	}{
		{"missing binary", Options{EnginesimBin: "/nonexistent/enginesim"}, "cannot find enginesim"},
		{"unknown scenario", Options{EnginesimBin: "true", Scenarios: []string{"engine-kill", "nope"}}, `unknown chaos scenario "nope"`},
		{"missing EPP binary", Options{EnginesimBin: "true", EPPBin: "/nonexistent/epp", Scenarios: []string{"engine-kill", "epp-rollout"}},
			`cannot find the EPP binary "/nonexistent/epp"`},
		{"no EPP next to enginesim", Options{EnginesimBin: "true", Scenarios: []string{"epp-kill-one-of-two"}}, "cannot find the EPP binary"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, err := Run(context.Background(), tt.opts)
			require.ErrorContains(t, err, tt.want)
			require.Empty(t, res, "nothing runs before the options are valid")
		})
	}
}

func TestChaosTable(t *testing.T) {
	tests := []struct {
		name    string
		results []Result
		passed  bool
		want    []string
	}{
		{"none", nil, false, []string{"| scenario | expected | observed | result | recovery |"}},
		{"pass", []Result{{Scenario: "a", Expected: "x|y", Observed: "ok", Pass: true, Recovery: 1500 * time.Millisecond, RecoveryOf: "fault → back"}},
			true, []string{"| a | x/y | ok | pass | 1.50 s (fault → back) |"}},
		{"one fails", []Result{{Scenario: "a", Pass: true}, {Scenario: "b", Observed: "bad", Recovery: 20 * time.Millisecond, RecoveryOf: "r"}},
			false, []string{"| a |  |  | pass | - |", "| b |  | bad | **FAIL** | 20 ms (r) |"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b bytes.Buffer
			require.NoError(t, WriteTable(&b, tt.results))
			for _, w := range tt.want {
				require.Contains(t, b.String(), w)
			}
			require.Equal(t, tt.passed, Passed(tt.results))
		})
	}
}

func requireFree(t *testing.T, hostport string) {
	t.Helper()
	l, err := net.Listen("tcp", hostport)
	require.NoError(t, err, "port %s still bound", hostport)
	require.NoError(t, l.Close())
}

func TestDecisionsSince(t *testing.T) {
	tests := []struct {
		name      string
		prev, cur decisions
		share     float64
		n         int
		others    string
	}{
		{"none", decisions{}, decisions{}, 0, 0, ""},
		{"all prefix", decisions{"prefix": 10}, decisions{"prefix": 30}, 1, 20, ""},
		{"some overridden", decisions{"prefix": 5, "cold": 1}, decisions{"prefix": 23, "cold": 1, "load_balance_override": 2},
			0.9, 20, "2 load_balance_override"},
		{"several reasons", decisions{}, decisions{"prefix": 1, "session": 1, "cold": 2}, 0.25, 4, "1 session, 2 cold"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			share, n, others := tt.cur.since(tt.prev)
			require.InDelta(t, tt.share, share, 1e-9)
			require.Equal(t, tt.n, n)
			require.Equal(t, tt.others, others)
		})
	}
}

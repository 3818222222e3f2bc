package bench

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/omnious/provider-node/engines/sim/simtest"
)

// TestChaosScenarios runs a fast subset of the chaos suite against
// enginesim processes (the whole suite is make chaos). Each scenario's own
// checks decide; the test then requires that every process it started is
// gone (its ports free again).
func TestChaosScenarios(t *testing.T) {
	scenarios := []string{"engine-kill", "engine-crash-idle", "event-gap", "kv-publisher-outage", "metrics-hang"}
	if testing.Short() {
		scenarios = []string{"engine-kill", "engine-crash-idle", "event-gap"}
	}
	bin := simtest.Binary(t)
	byName := map[string]chaosScenario{}
	for _, s := range chaosScenarios() {
		byName[s.name] = s
	}
	for _, name := range scenarios {
		t.Run(name, func(t *testing.T) {
			s, ok := byName[name]
			require.True(t, ok)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			env, err := newChaosEnv(ctx, bin, s.setup, zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)))
			require.NoError(t, err)
			t.Cleanup(func() { _ = env.Close() })
			var o chaosOutcome
			runErr := s.run(ctx, env, &o)
			require.NoError(t, env.Close())
			require.NoError(t, runErr)
			require.Empty(t, o.failed, "observed: %s", strings.Join(o.observed, "; "))
			require.NotEmpty(t, o.recoveryOf, "a scenario reports a recovery time")
			require.Positive(t, o.recovery)
			for _, p := range env.sims {
				requireFree(t, p.addr)
				requireFree(t, strings.TrimPrefix(p.kvEvents, "tcp://"))
				requireFree(t, strings.TrimPrefix(p.kvReplay, "tcp://"))
			}
			requireFree(t, env.eppCfg.GRPCAddr)
			requireFree(t, env.eppCfg.AdminAddr)
		})
	}
}

func TestRunChaosRejects(t *testing.T) {
	tests := []struct {
		name string
		opts ChaosOptions
		want string
	}{
		{"missing binary", ChaosOptions{EnginesimBin: "/nonexistent/enginesim"}, "cannot find enginesim"},
		{"unknown scenario", ChaosOptions{EnginesimBin: "true", Scenarios: []string{"engine-kill", "nope"}}, `unknown chaos scenario "nope"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, err := RunChaos(context.Background(), tt.opts)
			require.ErrorContains(t, err, tt.want)
			require.Empty(t, res, "nothing runs before the options are valid")
		})
	}
}

func TestChaosTable(t *testing.T) {
	tests := []struct {
		name    string
		results []ChaosResult
		passed  bool
		want    []string
	}{
		{"none", nil, false, []string{"| scenario | expected | observed | result | recovery |"}},
		{"pass", []ChaosResult{{Scenario: "a", Expected: "x|y", Observed: "ok", Pass: true, Recovery: 1500 * time.Millisecond, RecoveryOf: "fault → back"}},
			true, []string{"| a | x/y | ok | pass | 1.50 s (fault → back) |"}},
		{"one fails", []ChaosResult{{Scenario: "a", Pass: true}, {Scenario: "b", Observed: "bad", Recovery: 20 * time.Millisecond, RecoveryOf: "r"}},
			false, []string{"| a |  |  | pass | - |", "| b |  | bad | **FAIL** | 20 ms (r) |"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b bytes.Buffer
			require.NoError(t, WriteChaosTable(&b, tt.results))
			for _, w := range tt.want {
				require.Contains(t, b.String(), w)
			}
			require.Equal(t, tt.passed, ChaosPassed(tt.results))
		})
	}
}

package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestAgentsChartArgs: bench agents-chart charts a run whose contract
// names its agents or is given them with @AGENTS, and refuses a bad
// count, a missing file and an open-loop-only set.
func TestAgentsChartArgs(t *testing.T) {
	dir := t.TempDir()
	res := `"results":[{"policy":"agent","hit_rate":0.8,"sessions":{"goodput_tok_per_s":100,"started":2,"completed":2,"refused":0,"retries":0,"completed_per_min":1,"completion_p50_s":1,"completion_p90_s":1,"moves":0}}]}`
	closed := filepath.Join(dir, "closed.json")
	old := filepath.Join(dir, "old.json")
	require.NoError(t, os.WriteFile(closed, []byte(`{"scenario":"agents","replicas":4,"agents":8,`+res), 0o600))
	require.NoError(t, os.WriteFile(old, []byte(`{"scenario":"agents","replicas":4,`+res), 0o600))
	out := filepath.Join(dir, "chart.html")
	for _, tc := range []struct {
		name    string
		args    []string
		wantErr string
	}{
		{"agents in the contract", []string{closed}, ""},
		{"agents given", []string{old + "@16", closed}, ""},
		{"open loop only", []string{old}, "no closed-loop agents run"},
		{"bad count", []string{old + "@0"}, "positive count"},
		{"missing", []string{filepath.Join(dir, "none.json")}, "no such file"},
		{"no runs", nil, "give the runs"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := runAgentsChart(append([]string{"-html", out}, tc.args...))
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			b, err := os.ReadFile(out)
			require.NoError(t, err)
			require.Contains(t, string(b), "Goodput vs offered agents")
		})
	}
}

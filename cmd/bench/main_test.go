package main

import (
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestEPPRun runs two policies through the real EPP and test gateway on a
// small shared-prefix workload: precise routing keeps each group on the
// replica holding its prefix, round-robin scatters it.
func TestEPPRun(t *testing.T) {
	bound, results := runComparison(t)
	rr, precise := results[0], results[1]
	require.Equal(t, "precise", precise.Policy)
	for _, r := range results {
		require.Positive(t, r.Decision, "decision latency is measured through the EPP")
	}
	require.Greater(t, precise.HitRate, rr.HitRate, "precise prefix routing beats round-robin on cache hits")
	require.Greater(t, precise.HitRate, 0.8*bound)
}

// TestEnvoyRun: the same comparison with the real Envoy on the shipped
// two-EPP config in front of two EPPs (scripts/pyenv.sh envoy installs it).
func TestEnvoyRun(t *testing.T) {
	_, results := runComparison(t, "-gateway", "envoy", "-epps", "2")
	require.Greater(t, results[1].HitRate, results[0].HitRate, "precise beats round-robin through Envoy too")
}

// comparisonResult is one policy's row of the comparison's JSON report.
type comparisonResult struct {
	Policy   string  `json:"policy"`
	Requests int     `json:"requests"`
	Errors   int     `json:"errors"`
	HitRate  float64 `json:"hit_rate"`
	Decision float64 `json:"decision_p99_us"`
}

// runComparison runs round-robin and precise over a small shared-prefix
// workload, with extra flags, and returns the bound hit rate and the two
// policies' rows, each of which served requests without an error.
func runComparison(t *testing.T, extra ...string) (float64, []comparisonResult) {
	t.Helper()
	out := filepath.Join(t.TempDir(), "out.json")
	args := append(extra, "-policies", "round-robin,precise", "-replicas", "3", "-time-scale", "4", "-groups", "6",
		"-system-len", "600", "-question-len", "40", "-output-len", "8", "-qps", "6", "-stage-duration", "3s",
		"-json", out, "-html", "", "-log-level", "error")
	require.NoError(t, run(args))
	b, err := os.ReadFile(out)
	require.NoError(t, err)
	var doc struct {
		Bound   float64            `json:"bound_hit_rate"`
		Results []comparisonResult `json:"results"`
	}
	require.NoError(t, json.Unmarshal(b, &doc))
	require.Len(t, doc.Results, 2)
	for _, r := range doc.Results {
		require.Positive(t, r.Requests)
		require.Zero(t, r.Errors, r.Policy)
	}
	return doc.Bound, doc.Results
}

func TestDirectRun(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "out.json")
	err := run([]string{"-direct", "-replicas", "2", "-time-scale", "4", "-groups", "2", "-system-len", "100",
		"-question-len", "20", "-output-len", "4", "-qps", "20", "-stage-duration", "1s",
		"-json", out, "-html", filepath.Join(dir, "r.html")})
	require.NoError(t, err)
	b, err := os.ReadFile(out)
	require.NoError(t, err)
	var doc struct {
		Replicas int `json:"replicas"`
		Results  []struct {
			Policy string `json:"policy"`
			Errors int    `json:"errors"`
		} `json:"results"`
	}
	require.NoError(t, json.Unmarshal(b, &doc))
	require.Equal(t, 2, doc.Replicas)
	require.Len(t, doc.Results, 2)
	require.Equal(t, "random", doc.Results[0].Policy)
	require.Zero(t, doc.Results[0].Errors)
	_, err = os.Stat(filepath.Join(dir, "r.html"))
	require.NoError(t, err)
}

func TestBadFlags(t *testing.T) {
	require.ErrorContains(t, run([]string{"-direct", "-qps", "x"}), "bad -qps")
	require.ErrorContains(t, run([]string{"-direct", "-scenario", "nope"}), "unknown scenario")
	require.ErrorContains(t, run([]string{"sweep", "-direct", "-base", "precise"}), "no params")
	require.ErrorContains(t, run([]string{"-gateway", "istio"}), `-gateway "istio": want builtin or envoy`)
	require.ErrorContains(t, run([]string{"-envoy", "/bin/true"}), "-envoy needs -gateway envoy")
	require.ErrorContains(t, run([]string{"-direct", "-gateway", "envoy"}), "the direct proxy has no EPP")
	require.ErrorContains(t, run([]string{"-gateway", "envoy", "-envoy", filepath.Join(t.TempDir(), "none")}), "envoy binary")
}

func TestCheckFails(t *testing.T) {
	// No policy reaches twice the bound: the check must fail the command.
	err := run([]string{"-direct", "-policies", "round-robin", "-replicas", "2", "-time-scale", "4", "-groups", "2",
		"-system-len", "100", "-question-len", "20", "-output-len", "4", "-qps", "20", "-stage-duration", "1s",
		"-html", "", "-check", "round-robin", "-check-bound", "2"})
	require.ErrorContains(t, err, "acceptance checks failed for round-robin")
	err = run([]string{"-direct", "-policies", "round-robin", "-replicas", "1", "-groups", "1", "-system-len", "10",
		"-question-len", "5", "-output-len", "2", "-qps", "5", "-stage-duration", "1s", "-html", "", "-check", "precise"})
	require.ErrorContains(t, err, "not in the report")
}

func TestSplitPolicies(t *testing.T) {
	tests := []struct {
		in   string
		want []string
	}{
		{"precise, random", []string{"precise", "random"}},
		{"precise,exec:llmd=./epp --a 1,2 --b", []string{"precise", "exec:llmd=./epp --a 1,2 --b"}},
		{" exec:./epp -x,y ", []string{"exec:./epp -x,y"}},
		{"addr:127.0.0.1:9002,precise", []string{"addr:127.0.0.1:9002", "precise"}},
		{",,", nil},
	}
	for _, tc := range tests {
		require.Equal(t, tc.want, splitPolicies(tc.in), tc.in)
	}
}

// TestExternalPolicyFlags: -policies is repeatable and an exec: policy
// keeps its commas; a bad one is refused before anything starts.
func TestExternalPolicyFlags(t *testing.T) {
	f := &compareFlags{}
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	f.register(fs)
	require.NoError(t, fs.Parse([]string{"-policies", "precise,random", "-policies", "exec:peer=./epp --ports 1,2"}))
	f.set = map[string]bool{"policies": true}
	opts, err := f.options(false)
	require.NoError(t, err)
	require.Equal(t, []string{"precise", "random", "exec:peer=./epp --ports 1,2"}, opts.Policies)

	require.ErrorContains(t, run([]string{"-policies", "exec:", "-html", ""}), "exec: needs a command")
	require.ErrorContains(t, run([]string{"-policies", "addr:127.0.0.1:9002", "-html", ""}), "race it with -urls")
}

// TestUsage: bench -h lists every user subcommand, and not the internal
// floor server.
func TestUsage(t *testing.T) {
	var b strings.Builder
	usage(&b)
	out := b.String()
	for _, c := range []string{"sweep", "chaos", "load", "capacity", "windows"} {
		require.Contains(t, out, "bench "+c+" [flags]")
	}
	require.NotContains(t, out, floorCommand)
}

// TestFloorIsInternal: bench floor, which bench load -floor starts as a
// child process, still answers to its name and flags.
func TestFloorIsInternal(t *testing.T) {
	require.ErrorContains(t, run([]string{floorCommand, "extra"}), "bench floor: want -dest and no arguments")
}

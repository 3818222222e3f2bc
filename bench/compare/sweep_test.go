package compare

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/omnious/provider-node/bench/rig"
	"github.com/omnious/provider-node/endpoint"
)

func TestGridPointsAndConfig(t *testing.T) {
	var g Grid
	g.Base = "precise"
	require.NoError(t, g.ParseSet("scoring.weights.prefix=1,3"))
	require.NoError(t, g.ParseSet("prefix.ttl=2s,10m"))
	require.Error(t, g.ParseSet("novalue"))
	pts := g.points()
	require.Len(t, pts, 4)
	require.Equal(t, "prefix.ttl=2s,scoring.weights.prefix=1", pointLabel(pts[0]))
	require.Equal(t, "prefix.ttl=10m,scoring.weights.prefix=3", pointLabel(pts[3]))

	b, err := pointConfig("precise", pts[1])
	require.NoError(t, err)
	var doc map[string]any
	require.NoError(t, yaml.Unmarshal(b, &doc))
	require.Equal(t, map[string]any{"policy": "precise", "prefix": map[string]any{"ttl": "2s"},
		"scoring": map[string]any{"weights": map[string]any{"prefix": 3}},
		"signals": map[string]any{"scrape_interval": "250ms", "scrape_timeout": "250ms"}}, doc)

	// A base file keeps its keys; overrides go on top.
	base := filepath.Join(t.TempDir(), "base.yaml")
	require.NoError(t, os.WriteFile(base, []byte("policy: precise\nscoring:\n  kv_ceiling: 0.8\n  weights:\n    queue: 2\n"), 0o644))
	b, err = pointConfig(base, pts[0])
	require.NoError(t, err)
	doc = nil
	require.NoError(t, yaml.Unmarshal(b, &doc))
	require.Equal(t, map[string]any{"policy": "precise", "prefix": map[string]any{"ttl": "2s"},
		"scoring": map[string]any{"kv_ceiling": 0.8, "weights": map[string]any{"queue": 2, "prefix": 1}}}, doc)

	// An override cannot descend into a scalar.
	_, err = pointConfig(base, []override{{"policy.x", 1}})
	require.ErrorContains(t, err, "not a mapping")

	// The file form.
	gridPath := filepath.Join(t.TempDir(), "grid.yaml")
	require.NoError(t, os.WriteFile(gridPath, []byte("base: precise\nparams:\n  prefix.balance_rel: [1.25, 2]\n"), 0o644))
	g2, err := LoadGrid(gridPath)
	require.NoError(t, err)
	require.Len(t, g2.points(), 2)
	require.NoError(t, os.WriteFile(gridPath, []byte("params:\n  a: [1]\n"), 0o644))
	_, err = LoadGrid(gridPath)
	require.ErrorContains(t, err, "base")
}

func TestParetoFront(t *testing.T) {
	rs := []PolicyResult{
		{TTFTP90: 100, OutputTokPS: 50}, // dominated by 1
		{TTFTP90: 90, OutputTokPS: 60},  // front
		{TTFTP90: 50, OutputTokPS: 40},  // front (fastest)
		{TTFTP90: 200, OutputTokPS: 80}, // front (most throughput)
		{TTFTP90: 90, OutputTokPS: 60},  // equal to 1: neither dominates
		{TTFTP90: 10, OutputTokPS: 99, Errors: 1},
	}
	require.Equal(t, []int{1, 2, 3, 4}, paretoFront(rs))
}

func TestSweepEndToEnd(t *testing.T) {
	// A launcher that reads the generated config and runs its policy with
	// the direct proxy, as the EPP launcher would read its config file.
	var seen []map[string]any
	launch := func(ctx context.Context, policy string, fleet []endpoint.Endpoint, epps int) (rig.Target, error) {
		b, err := os.ReadFile(policy)
		if err != nil {
			return nil, err
		}
		var doc map[string]any
		if err := yaml.Unmarshal(b, &doc); err != nil {
			return nil, err
		}
		seen = append(seen, doc)
		return rig.DirectLauncher(1)(ctx, doc["policy"].(string), fleet, epps)
	}
	o := smallOptions(t)
	o.Workload.SharedPrefix.QPS = []float64{20}
	o.Workload.SharedPrefix.StageDuration = time.Second
	g := Grid{Base: "round-robin"}
	require.NoError(t, g.ParseSet("scoring.weights.prefix=1,2"))
	rep, err := Sweep(context.Background(), o, g, t.TempDir(), launch)
	require.NoError(t, err)
	require.Len(t, rep.Results, 2)
	require.Len(t, seen, 2)
	require.Equal(t, 2, seen[1]["scoring"].(map[string]any)["weights"].(map[string]any)["prefix"])
	require.Equal(t, "scoring.weights.prefix=1", rep.Results[0].Policy)
	require.NotNil(t, rep.Sweep)
	require.NotEmpty(t, rep.Sweep.Front)
	require.Len(t, rep.Sweep.Files, 2)
}

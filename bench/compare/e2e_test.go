package compare

import (
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/omnious/provider-node/bench/internal/leak"
	"github.com/omnious/provider-node/bench/rig"
	"github.com/omnious/provider-node/endpoint"
	"github.com/omnious/provider-node/engines/sim/simtest"
)

func smallOptions(t *testing.T) Options {
	return Options{Options: rig.Options{Scenario: "e2e", Seed: 3, Log: zaptest.NewLogger(t),
		Fleet: rig.FleetOptions{Replicas: 2, TimeScale: 4, NumGPUBlocks: 400},
		Workload: rig.WorkloadOptions{Kind: rig.WorkloadSharedPrefix, SharedPrefix: rig.SharedPrefixOptions{
			NumGroups: 4, PromptsPerGroup: 2, SystemPromptLen: 300, QuestionLen: 40, OutputLen: 8,
			QPS: []float64{10, 20}, StageDuration: 2 * time.Second}}}}
}

// recordingLauncher wraps a launcher and remembers the fleets it saw.
func recordingLauncher(inner rig.Launcher, seen *[][]endpoint.Endpoint) rig.Launcher {
	return func(ctx context.Context, policy string, fleet []endpoint.Endpoint, epps int) (rig.Target, error) {
		*seen = append(*seen, fleet)
		return inner(ctx, policy, fleet, epps)
	}
}

func TestRunEndToEnd(t *testing.T) {
	base, _ := leak.Goroutines()
	o := smallOptions(t)
	o.Policies = []string{"round-robin", "random", "precise"}
	var fleets [][]endpoint.Endpoint
	rep, err := Run(context.Background(), o, recordingLauncher(rig.DirectLauncher(1), &fleets))
	require.NoError(t, err)
	require.Len(t, rep.Results, 3)
	require.Len(t, fleets, 3)
	require.NotEqual(t, fleets[0][0].Addr, fleets[1][0].Addr, "each policy gets a fresh fleet")
	require.True(t, rep.Simulated)
	require.Greater(t, rep.Bound, 0.5)
	// 2 x 400 blocks of 16 tokens hold the 4 x 300-token prefixes and 8 questions.
	require.InDelta(t, rep.Bound, rep.FleetBound, 1e-12)
	for _, pr := range rep.Results[:2] {
		require.Equal(t, rep.Requests, pr.Requests, pr.Policy)
		require.Zero(t, pr.Errors, pr.FirstError)
		require.Greater(t, pr.TTFTP50, 0.0)
		require.GreaterOrEqual(t, pr.TTFTP99, pr.TTFTP90)
		require.GreaterOrEqual(t, pr.TTFTP90, pr.TTFTP50)
		require.Greater(t, pr.ITLP50, 0.0)
		require.Greater(t, pr.OutputTokPS, 0.0)
		require.Greater(t, pr.HitRate, 0.0)
		require.LessOrEqual(t, pr.HitRate, rep.Bound)
		require.Len(t, pr.LoadRequests, 2)
		require.Equal(t, float64(rep.Requests), pr.LoadRequests[0]+pr.LoadRequests[1], "replica counters see every request")
		require.Len(t, pr.Stages, 2)
		require.NotEmpty(t, pr.DecisionP99us)
	}
	// Round-robin alternates over two replicas.
	require.LessOrEqual(t, rep.Results[0].MaxMeanLoad, 1.0+2.0/float64(rep.Requests))
	// A policy the launcher refuses is reported as all errors, not a crash.
	require.Equal(t, rep.Requests, rep.Results[2].Errors)
	require.Contains(t, rep.Results[2].FirstError, "launch")

	dir := t.TempDir()
	require.NoError(t, rep.WriteJSON(filepath.Join(dir, "out.json")))
	b, err := os.ReadFile(filepath.Join(dir, "out.json"))
	require.NoError(t, err)
	require.True(t, json.Valid(b))
	require.NoError(t, rep.WriteHTMLFile(filepath.Join(dir, "out.html")))
	for _, fl := range fleets {
		for _, ep := range fl {
			leak.RequireFree(t, ep.Addr)
		}
	}
	leak.Settle(t, base)
}

func TestRunChatWithTools(t *testing.T) {
	o := smallOptions(t)
	o.Policies = []string{"round-robin"}
	o.Workload = rig.WorkloadOptions{Kind: rig.WorkloadChat, Chat: rig.ChatOptions{Sessions: 3, Turns: 3, SystemPromptLen: 200,
		UserLen: 20, OutputLen: 48, SessionRate: 20, ThinkTime: 100 * time.Millisecond, Tools: true}}
	rep, err := Run(context.Background(), o, rig.DirectLauncher(1))
	require.NoError(t, err)
	pr := rep.Results[0]
	require.Zero(t, pr.Errors, pr.FirstError)
	require.Equal(t, 9, pr.Requests)
	require.Equal(t, 9, rep.Requests)
	require.Zero(t, pr.Errors, pr.FirstError)
	// Later turns extend the conversation, so they hit the cache.
	require.Greater(t, pr.HitRate, 0.3)
	require.Greater(t, rep.Bound, 0.3)
	require.Less(t, rep.Bound, 1.0)
}

func TestRunTraceReplay(t *testing.T) {
	dir := t.TempDir()
	trace := filepath.Join(dir, "t.jsonl")
	lines := []string{
		`{"timestamp": 0, "input_length": 700, "output_length": 4, "hash_ids": [1, 2]}`,
		`{"timestamp": 50, "input_length": 1024, "output_length": 4, "hash_ids": [1, 2]}`,
		`{"timestamp": 100, "input_length": 600, "output_length": 4, "hash_ids": [1, 3]}`,
		`{"timestamp": 150, "input_length": 512, "output_length": 4, "hash_ids": [4]}`,
	}
	require.NoError(t, os.WriteFile(trace, []byte(strings.Join(lines, "\n")), 0o644))
	o := smallOptions(t)
	o.Policies = []string{"round-robin"}
	o.Fleet.Replicas = 1
	o.Workload = rig.WorkloadOptions{Kind: rig.WorkloadTrace, Trace: rig.TraceOptions{Path: trace, Limit: 3}}
	rep, err := Run(context.Background(), o, rig.DirectLauncher(1))
	require.NoError(t, err)
	require.Equal(t, 3, rep.Requests)
	// Bound of the first three: hits 188 (id 2 partial) + 512 + 512 of 2324.
	require.InDelta(t, float64(188+512+512)/float64(700+1024+600), rep.Bound, 1e-12)
	pr := rep.Results[0]
	require.Zero(t, pr.Errors, pr.FirstError)
	// One replica with room for everything reaches the bound up to block
	// granularity (16-token blocks, the last token never hits).
	require.InDelta(t, rep.Bound, pr.HitRate, 0.03)
}

func TestProcessFleet(t *testing.T) {
	bin := simtest.Binary(t)

	o := smallOptions(t)
	o.Policies = []string{"round-robin"}
	o.Fleet.Mode, o.Fleet.EnginesimBin = rig.FleetProcess, bin
	var fleets [][]endpoint.Endpoint
	rep, err := Run(context.Background(), o, recordingLauncher(rig.DirectLauncher(1), &fleets))
	require.NoError(t, err)
	pr := rep.Results[0]
	require.Zero(t, pr.Errors, pr.FirstError)
	require.Greater(t, pr.HitRate, 0.0)
	require.Equal(t, float64(rep.Requests), pr.LoadRequests[0]+pr.LoadRequests[1])
	require.Len(t, fleets, 1)
	for _, ep := range fleets[0] {
		require.NotEmpty(t, ep.KVEvents)
		// The processes are gone: their ports are free again.
		leak.RequireFree(t, ep.Addr)
		leak.RequireFree(t, strings.TrimPrefix(ep.KVEvents, "tcp://"))
		leak.RequireFree(t, strings.TrimPrefix(ep.KVReplay, "tcp://"))
	}

	o.Fleet.EnginesimBin = filepath.Join(t.TempDir(), "missing")
	_, err = Run(context.Background(), o, rig.DirectLauncher(1))
	require.ErrorContains(t, err, "cannot find enginesim")
}

func TestURLFleet(t *testing.T) {
	// Two replicas the bench did not start stand in for real endpoints.
	o := smallOptions(t).WithDefaults()
	f, err := rig.StartFleet(context.Background(), o.Fleet, 1, 1000, o.Log)
	require.NoError(t, err)
	defer func() { require.NoError(t, f.Stop()) }()
	var urls []string
	for _, ep := range f.Endpoints() {
		urls = append(urls, "http://"+ep.Addr+"/")
	}
	u := smallOptions(t)
	u.Policies = []string{"round-robin"}
	u.Fleet = rig.FleetOptions{Mode: rig.FleetURLs, URLs: urls}
	u.Workload.SharedPrefix.QPS = []float64{10}
	u.Workload.SharedPrefix.StageDuration = 2 * time.Second
	var fleets [][]endpoint.Endpoint
	rep, err := Run(context.Background(), u, recordingLauncher(rig.DirectLauncher(1), &fleets))
	require.NoError(t, err)
	require.False(t, rep.Simulated)
	require.Equal(t, 2, rep.Replicas)
	require.Equal(t, "vllm", fleets[0][0].Engine)
	require.Equal(t, "Qwen/Qwen3-32B", fleets[0][0].Model)
	pr := rep.Results[0]
	require.Zero(t, pr.Errors, pr.FirstError)
	require.Greater(t, pr.HitRate, 0.0)
	// The simulator has no cache-reset endpoint, and the report says so.
	require.Contains(t, pr.Warning, "could not reset the prefix cache")

	u.Fleet.URLs = []string{"http://10.1.2.3:8000"}
	_, err = Run(context.Background(), u, rig.DirectLauncher(1))
	require.ErrorContains(t, err, "not on loopback")
}

// TestRunAgents: agent sessions through real EPPs with the agent policy,
// with and without session ids: every call answered, tool calls and the
// final answer in order, histories hit the cache, the session figures
// filled.
func TestRunAgents(t *testing.T) {
	for _, noIDs := range []bool{false, true} {
		t.Run(map[bool]string{false: "ids", true: "no ids"}[noIDs], func(t *testing.T) {
			o := smallOptions(t)
			o.Policies = []string{"agent"}
			o.Workload = rig.WorkloadOptions{Kind: rig.WorkloadAgents, Agents: rig.AgentOptions{Sessions: 4, SessionRate: 8,
				Calls: 3, CallsMax: 4, SystemLen: 200, SchemaLen: 100, TaskLen: 30, ResultLen: 60, ResultMax: 100,
				OutputLen: 16, Gap: 200 * time.Millisecond, GapMax: 400 * time.Millisecond, NoSessionIDs: noIDs}}
			rep, err := Run(context.Background(), o, rig.EPPLauncher(zaptest.NewLogger(t), rig.ExternalOptions{TimeScale: 4}))
			require.NoError(t, err)
			pr := rep.Results[0]
			require.Zero(t, pr.Errors, pr.FirstError)
			require.Equal(t, rep.Requests, pr.Requests)
			require.NotNil(t, pr.Sessions)
			require.Equal(t, 4, pr.Sessions.Sessions)
			require.Equal(t, 4, pr.Sessions.Completed)
			require.Zero(t, pr.Sessions.Refused)
			require.False(t, math.IsNaN(pr.Sessions.Moves), "the EPPs' moves are read")
			// Admission tracks keyed sessions only: each admitted once.
			require.Equal(t, map[bool]float64{false: 4, true: 0}[noIDs], pr.Sessions.AdmittedRoom+pr.Sessions.AdmittedSpare)
			require.Greater(t, pr.HitRate, 0.5, "each call extends the last")
		})
	}
}

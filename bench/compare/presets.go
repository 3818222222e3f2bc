package compare

import (
	"fmt"
	"time"

	"github.com/omnious/provider-node/bench/rig"
	"github.com/omnious/provider-node/engines/sim/engine"
)

// Preset names.
const (
	PresetDemo   = "demo"
	PresetLLMD73 = "llmd-73"
	PresetAgents = "agents"
)

// Preset returns the options of a named scenario.
func Preset(name string) (Options, error) {
	switch name {
	case PresetDemo:
		return DemoOptions(), nil
	case PresetLLMD73:
		return LLMD73Options(0.1), nil
	case PresetAgents:
		return AgentsOptions(), nil
	}
	return Options{}, fmt.Errorf("unknown scenario %q: want %s, %s or %s", name, PresetDemo, PresetLLMD73, PresetAgents)
}

// DemoOptions is the bundled `make demo` scenario: 4 simulated replicas
// whose caches are under eviction pressure at a load the fleet can serve,
// the condition prefix routing earns its keep in: 40 groups of 1,000-token system prompts with Zipf
// popularity (exponent 1), 5 questions of 200 tokens each, 50-token
// answers, and 16,000 KV tokens per replica, so the 80,000 distinct prompt
// tokens are five replicas' caches (the popular groups fit the fleet, the
// tail does not). A 3-step QPS ladder (8, 16, 24), 20 s of model time
// each, at time scale 4; about 15 s per policy on 2 cores. Steps of 10 s
// were mostly the caches filling, and their TTFT p90 moved between runs
// by as much as precise's lead over approximate.
//
// Two EPPs serve the pool side by side, as the Helm chart deploys them.
// Each EPP's own routing history (the approximate matcher's, the precise
// routing memory) holds only the requests that EPP routed, so two
// approximate EPPs place one group on two replicas, and the copies evict
// each other under this pressure; the KV index, fed by every engine's
// events, is the same in both, so precise EPPs find where the other put
// a group. With one EPP the two policies tie on this workload.
func DemoOptions() Options {
	sp := rig.SharedPrefixOptions{NumGroups: 40, PromptsPerGroup: 5, SystemPromptLen: 1000, QuestionLen: 200, OutputLen: 50,
		GroupSkew: 1, QPS: []float64{8, 16, 24}, StageDuration: 20 * time.Second}
	const blockSize = 16
	return Options{EPPs: 2, Options: rig.Options{Scenario: PresetDemo,
		Fleet:    rig.FleetOptions{Replicas: 4, TimeScale: 4, BlockSize: blockSize, NumGPUBlocks: 16000 / blockSize},
		Workload: rig.WorkloadOptions{Kind: rig.WorkloadSharedPrefix, SharedPrefix: sp}}}
}

// The published "73% capacity" run (llm-d's precise-prefix-cache-aware
// guide, benchmark report of 8 x Qwen3-32B, TP2 on 16 H100): inference-perf
// shared_prefix data (150 groups x 5 users, 6,000-token system prompts,
// 1,200-token questions, 1,000 output tokens, ignore_eos), Poisson arrivals
// on this ladder after a warm-up of 15 QPS for 50 s, and 307,328 KV tokens
// per pod (the report's sizing: 150 x 12,000 resident tokens = 73.2% of
// the fleet's 2,458,624).
var (
	llmd73QPS       = []float64{15, 3, 10, 15, 20, 22, 25, 30, 35, 40, 43, 46, 49, 52, 55, 57, 60}
	llmd73Durations = []int{50, 20, 20, 20, 38, 34, 30, 25, 21, 38, 36, 33, 30, 29, 27, 26, 25} // seconds
)

// llmd73KVTokens is each published pod's KV capacity in tokens.
const llmd73KVTokens = 307328

// The published client: inference-perf keeps at most num_workers x
// worker_max_concurrency requests in flight (later arrivals wait in the
// client, and their latencies count from the send) and gives each one
// aiohttp's default total timeout of 5 minutes. The report does not print
// the concurrency; 400 is what both of its plateaus imply by Little's law
// (precise: 10.5k tok/s of 1,000-token answers, 10.5 requests/s at about
// 38 s each; random: 4.8 requests/s at about 83 s, a TTFT mean of about
// 55 s plus 1,000 tokens at 25 ms). BenchmarkPublishedLLMD73 replays the
// run on the engines alone.
const (
	llmd73Concurrency   = 400
	llmd73ClientTimeout = 5 * time.Minute
)

// LLMD73Options reproduces llm-d's published "73% capacity" run, scaled by
// k (0 < k <= 1) to run on a small machine:
//
//   - token counts (prefix, question, output), each replica's KV capacity
//     and its step token budget are multiplied by k, so the workload fills
//     the same 73% of the fleet's KV cache and a request needs the same
//     share of a step's budget;
//   - the per-token step costs (prefill per token, decode base and per
//     sequence, KV term) are divided by k, so each scaled request costs the
//     model time of an original one and the model-time QPS ladder loads
//     the fleet as it did: TTFT and e2e are comparable with the published
//     figures, ITL is per scaled token (1/k original tokens) and output
//     tok/s counts scaled tokens (multiply by 1/k to compare);
//   - the engines run vLLM's defaults on an H100 (max_num_seqs 1024,
//     max_num_batched_tokens 8192, before scaling), the client the
//     published one's concurrency and timeout, the prompts its shuffled
//     cycle;
//   - time scale 4 quarters the wall time; latencies are in model time.
//
// The first stage is the published warm-up: it seats the caches and is
// left out of the summary across stages, which is inference-perf's (the
// mean over the ladder's stages of each stage's TTFT p90 and output tok/s)
// and so comparable with the published table.
func LLMD73Options(k float64) Options {
	scale := func(n int) int { return max(1, int(float64(n)*k+0.5)) }
	durs := make([]time.Duration, len(llmd73Durations))
	for i, d := range llmd73Durations {
		durs[i] = time.Duration(d) * time.Second
	}
	sp := rig.SharedPrefixOptions{NumGroups: 150, PromptsPerGroup: 5, SystemPromptLen: scale(6000), QuestionLen: scale(1200),
		OutputLen: scale(1000), QPS: llmd73QPS, StageDurations: durs, StageDuration: durs[0], WarmupStages: 1, Cycle: true}
	inv := func(d time.Duration) time.Duration { return time.Duration(float64(d) / k) }
	t := engine.DefaultTiming()
	const blockSize = 16
	const timeScale = 4
	return Options{Options: rig.Options{Scenario: PresetLLMD73,
		MaxInFlight:    llmd73Concurrency,
		RequestTimeout: time.Duration(float64(llmd73ClientTimeout) / timeScale),
		Fleet: rig.FleetOptions{Replicas: 8, TimeScale: timeScale, BlockSize: blockSize,
			NumGPUBlocks:        scale(llmd73KVTokens) / blockSize,
			MaxNumBatchedTokens: scale(8192),
			MaxNumSeqs:          1024,
			Timing: engine.Timing{PrefillBase: t.PrefillBase, PrefillPerToken: new(inv(*t.PrefillPerToken)),
				DecodeBase: new(inv(*t.DecodeBase)), DecodePerSeq: new(inv(*t.DecodePerSeq)),
				KVTerm: new(inv(*t.KVTerm)), CPULoadPerToken: new(inv(*t.CPULoadPerToken))}},
		Workload: rig.WorkloadOptions{Kind: rig.WorkloadSharedPrefix, SharedPrefix: sp}},
		Published: LLMD73Published(k)}
}

// AgentsOptions is the agents scenario: tool-using agent sessions
// (rig.AgentOptions' defaults, bench/README.md cites them), agentsSessions
// of them run by agentsConcurrency closed-loop agents on 4 simulated
// replicas of agentsKVTokens each, at time scale 4, raced through
// precise, approximate and agent (with session admission, its default).
// At the busiest the active sessions' histories are 5.76x the fleet's
// 208,000 tokens (TestAgentsPreset, calls taken as 1 s): the regime where
// calls wait for KV and admission pays. -agent-concurrency 32
// -agent-sessions 64 is the 1.57x point, with -num-gpu-blocks 10400
// 0.49x; -agent-concurrency 0 the open-loop arrival.
func AgentsOptions() Options {
	const blockSize = 16
	return Options{EPPs: 1, Policies: []string{"precise", "approximate", "agent"}, Options: rig.Options{Scenario: PresetAgents,
		Fleet: rig.FleetOptions{Replicas: 4, TimeScale: 4, BlockSize: blockSize, NumGPUBlocks: agentsKVTokens / blockSize},
		Workload: rig.WorkloadOptions{Kind: rig.WorkloadAgents,
			Agents: rig.AgentOptions{Sessions: agentsSessions, Concurrency: new(agentsConcurrency)}}}}
}

// agentsConcurrency is the agents scenario's closed-loop agents: a fixed
// pool, as many as ThunderAgent's reproduction runs mini-swe-agent with
// (`mini-extra swebench --workers 128`,
// ThunderAgent-org/ThunderAgent examples/inference/mini-swe-agent), and
// agentsSessions twice as many sessions, so that each agent runs two and
// the loop reaches its steady state.
const (
	agentsConcurrency = 128
	agentsSessions    = 2 * agentsConcurrency
)

// agentsKVTokens is each replica's KV capacity in the agents scenario.
const agentsKVTokens = 52000

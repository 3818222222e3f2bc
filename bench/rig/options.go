package rig

import (
	"cmp"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/omnious/provider-node/engines/sim"
	"github.com/omnious/provider-node/engines/sim/engine"
	"github.com/omnious/provider-node/internal/opt"
)

// Fleet modes.
const (
	FleetInProcess = "inproc"
	FleetProcess   = "process"
	FleetURLs      = "urls"
)

// Workload kinds.
const (
	WorkloadTrace        = "trace"
	WorkloadSharedPrefix = "shared-prefix"
	WorkloadChat         = "chat"
	WorkloadAgents       = "agents"
)

// Options are the fleet, the traffic and the client of one bench run.
// Every default is applied in WithDefaults.
type Options struct {
	// Scenario names the run in the report. Default: the workload kind.
	Scenario string
	// Seed seeds the workload and the replicas. Default 1.
	Seed int64
	// Fleet is the replicas.
	Fleet FleetOptions
	// Workload is the traffic.
	Workload WorkloadOptions
	// RequestTimeout bounds one request in wall time. Default 10m.
	RequestTimeout time.Duration
	// MaxInFlight bounds concurrent requests of the open-loop client, so a
	// broken target cannot exhaust the machine; arrivals beyond it wait.
	// Default 4096.
	MaxInFlight int
	// Log is the logger. Default zap.NewNop().
	Log *zap.Logger
}

// FleetOptions are the replicas.
type FleetOptions struct {
	// Mode is "inproc" (simulated replicas in this process, default),
	// "process" (enginesim processes) or "urls" (real endpoints).
	Mode string
	// Replicas is the number of simulated replicas. Default 2.
	Replicas int
	// URLs are the real OpenAI endpoints (base URLs, e.g.
	// http://127.0.0.1:8000) in mode "urls"; only loopback is accepted.
	// They name no KV-event endpoint: the EPPs learn of the engines'
	// caches from their own routing only (EndpointsFile names them).
	URLs []string
	// EndpointsFile, in mode "urls" instead of URLs, is the EPP's own
	// static endpoint file (discovery's format,
	// deploy/config/endpoints.example.yaml) naming the running engines
	// with their models, engines, KV-event and replay ports and metrics
	// ports; every address must be on loopback.
	EndpointsFile string
	// Engines is what the bench's EPPs are told of running engines in
	// mode "urls" (block size, tokenizer, scrape timeout).
	Engines EngineOptions
	// Model is the served model name. Default "Qwen/Qwen3-32B" for
	// simulated fleets; for URLs, the first model /v1/models lists.
	Model string
	// Engine is the simulated flavour, "vllm" (default) or "sglang".
	Engine string
	// NumGPUBlocks is each simulated replica's KV capacity in blocks.
	// Default: the simulator's (281,600 tokens).
	NumGPUBlocks int
	// BlockSize is the simulated KV block size. Default 16. (Running
	// engines' is Engines.BlockSize.)
	BlockSize int
	// MaxNumBatchedTokens is the simulated step token budget. Default 8192.
	MaxNumBatchedTokens int
	// MaxNumSeqs caps each simulated replica's running requests. Default:
	// the simulator's (256).
	MaxNumSeqs int
	// MaxModelLen is the simulated context limit. Default: 40960, raised to
	// fit the workload's longest request.
	MaxModelLen int
	// TimeScale runs simulated replicas this many times faster than real
	// time; latencies are reported in model time (wall * TimeScale).
	// Default 1.
	TimeScale float64
	// Timing are the simulated step-time coefficients; zero fields take the
	// simulator's defaults.
	Timing engine.Timing
	// EnginesimBin is the enginesim binary for mode "process".
	// Default "bin/enginesim".
	EnginesimBin string
}

// WorkloadOptions select and shape the traffic.
type WorkloadOptions struct {
	// Kind is "trace", "shared-prefix" (default), "chat" or "agents".
	Kind string
	// Trace is a Mooncake trace (kind "trace").
	Trace TraceOptions
	// SharedPrefix is the shared-prefix workload (kind "shared-prefix").
	SharedPrefix SharedPrefixOptions
	// Chat is the multi-turn chat workload (kind "chat").
	Chat ChatOptions
	// Agents is the tool-using agent workload (kind "agents").
	Agents AgentOptions
}

// AgentOptions are tool-using agent sessions through
// /v1/chat/completions (bench/README.md cites where each default comes
// from). Sessions start as a Poisson process; each makes Calls calls.
// Every call sends the shared system prompt, the tools (their schema is
// the prompt's second shared part), the session's task and its history;
// every call but the last must call a tool (tool_choice "required"), the
// last answers (tool_choice "none", OutputLen tokens). After a tool call
// the session waits its tool time, then appends the tool's result. Counts
// and gaps are drawn from log-normal distributions of the given median
// and Sigma, capped at their max.
type AgentOptions struct {
	// Sessions is the number of sessions. Default 64.
	Sessions int
	// SessionRate is new sessions per model second. Default 0.5.
	SessionRate float64
	// Calls is the median calls per session (at least 2); CallsMax caps
	// them. Defaults 12 and 40.
	Calls, CallsMax int
	// SystemLen is the shared system prompt in tokens (words). Default 1000.
	SystemLen int
	// SchemaLen is the tools' descriptions in tokens (words), over Tools
	// tools. Defaults 1200 and 4.
	SchemaLen, Tools int
	// TaskLen is each session's task (first user message) in tokens.
	// Default 300.
	TaskLen int
	// ResultLen is the median tokens of a tool's result; ResultMax caps
	// them. Defaults 700 and 4000.
	ResultLen, ResultMax int
	// OutputLen is the final answer's max_tokens (a tool call is as long
	// as the engine makes it, within ToolCallMax). Defaults 300 and 256.
	OutputLen, ToolCallMax int
	// Gap is the median model-time tool time between a call's answer and
	// the next call; GapMax caps it. Defaults 5s and 60s.
	Gap, GapMax time.Duration
	// Sigma is the log-normal shape of calls, results and gaps. Default 0.8.
	Sigma float64
	// NoSessionIDs sends no session header: the router must infer
	// sessions from prefixes. Default false (x-session-id is sent).
	NoSessionIDs bool
	// MaxContext is the context window every call must fit, prompt plus
	// max_tokens, in tokens: a session whose next call would not fit ends
	// with the call before, which gives its final answer (as SWE-agent
	// submits on exit_context and mini-swe-agent stops on
	// ContextWindowExceededError); it is a completed session with fewer
	// calls. A call's prompt is counted as its words plus 128 tokens a
	// tool and 64 a call so far (the template and JSON around them), its
	// budget the larger of OutputLen and ToolCallMax. Default: the fleet's MaxModelLen, the
	// simulator's 40,960 when that is unset.
	MaxContext int
	// Concurrency, when positive, makes the arrival closed-loop: that many
	// agents, started SessionRate a model second, each starting the next
	// of the Sessions when its current one ends, completed or given up.
	// 0 is open-loop: sessions start as a Poisson process at SessionRate
	// whatever becomes of the earlier ones. nil takes the default, 0.
	Concurrency *int
	// Retries is how many times a closed-loop agent sends a refused call
	// (429) again before it gives the session up; nil takes the default,
	// 20, and 0 never retries. Open-loop sessions never retry.
	Retries *int
	// RetryBackoff is the model-time wait before the first retry when the
	// refusal carries no Retry-After; it doubles on each retry of the
	// same call, up to 8 times itself. Default 5s.
	RetryBackoff time.Duration
}

// ClosedLoop is a closed-loop agent arrival (AgentOptions.Concurrency).
type ClosedLoop struct {
	// Agents run at once; Ramp is the wall time between two agents'
	// first sessions.
	Agents int
	Ramp   time.Duration
	// Retries bounds the retries of one refused call; Backoff is the
	// wall-time wait before the first when the refusal names none.
	Retries int
	Backoff time.Duration
}

// TraceOptions replay a Mooncake-format JSONL trace.
type TraceOptions struct {
	// Path is the JSONL file.
	Path string
	// Speedup divides the trace's timestamps. Default: Fleet.TimeScale, so
	// the trace keeps its shape in model time.
	Speedup float64
	// Limit keeps the first Limit requests (0: all).
	Limit int
	// Text sends prompts as text (one stand-in token per word) instead of
	// token-id lists, for policies and endpoints that need text. Default false.
	Text bool
}

// SharedPrefixOptions are groups of prompts sharing a system prompt, as in
// the Inference Extension's and llm-d's published benchmarks. Each request
// picks a group and one of its prompts uniformly at random.
type SharedPrefixOptions struct {
	// NumGroups is the number of distinct system prompts. Default 16.
	NumGroups int
	// PromptsPerGroup is the distinct questions per group. Default 5.
	PromptsPerGroup int
	// SystemPromptLen is the shared prefix in tokens. Default 2000.
	SystemPromptLen int
	// QuestionLen is the per-prompt suffix in tokens. Default 200.
	QuestionLen int
	// OutputLen is the output of every request in tokens. Default 50.
	OutputLen int
	// QPS is the ladder of arrival rates in model time (requests per model
	// second), one stage each. Default [5, 15].
	QPS []float64
	// StageDuration is each stage's length in model time. Default 10s.
	StageDuration time.Duration
	// StageDurations, when set, gives each stage its own length (one per
	// QPS entry) instead of StageDuration.
	StageDurations []time.Duration
	// WarmupStages leading stages seat the caches and are left out of the
	// summary across stages (inference-perf's warm-up convention).
	WarmupStages int
	// GroupSkew draws groups from a Zipf distribution with this exponent
	// (group g with weight 1/(g+1)^GroupSkew); 0 (default) draws them
	// uniformly. Ignored with Cycle.
	GroupSkew float64
	// ContentSeed, when set, seeds the prompts' words apart from the
	// arrivals and choices (Options.Seed), so differently seeded streams
	// send the same prompts. Default 0: Options.Seed seeds both.
	ContentSeed int64
	// Cycle sends the groups' prompts in one shuffled order, over and over,
	// as inference-perf's shared_prefix data does; false (default) draws
	// each request's group and prompt at random.
	Cycle bool
	// Counted sends each stage's QPS × duration requests exactly, at
	// random times (CountedLadder), instead of a Poisson count of them.
	Counted bool
}

// ChatOptions are multi-turn chat sessions through /v1/chat/completions:
// each turn sends the whole conversation so far, including the previous
// answers. Sessions start as a Poisson process.
type ChatOptions struct {
	// Sessions is the number of conversations. Default 20.
	Sessions int
	// Turns per session. Default 4.
	Turns int
	// SystemPromptLen is the system prompt shared by every session, in
	// words. Default 500.
	SystemPromptLen int
	// UserLen is each user message in words. Default 100.
	UserLen int
	// OutputLen is each answer's max_tokens. Default 64.
	OutputLen int
	// SessionRate is new sessions per model second. Default 2.
	SessionRate float64
	// ThinkTime is the model-time pause between an answer and the next turn.
	// Default 2s.
	ThinkTime time.Duration
	// Tools offers a tool (a weather lookup) with tool_choice "auto"; a
	// tool call is answered with a tool message. Default false.
	Tools bool
}

// ExternalOptions are how EPPLauncher runs exec: and addr: policies.
type ExternalOptions struct {
	// Dir receives one directory per exec: policy, named after its label:
	// the fleet's endpoint files, rendered templates, the command as run
	// and the EPP's output (epp.log). Default "out/bench-epp".
	Dir string
	// TimeScale is the simulated fleet's: the built-in policies' session
	// objective and timeouts, which the EPP counts in wall time, are
	// divided by it and their default prefill rate multiplied. Default 1.
	TimeScale float64
	// Engines, for a fleet of running engines (mode urls), is what the
	// bench's own EPPs are told of them (FleetOptions.Engines); nil for a
	// fleet the bench starts.
	Engines *EngineOptions
	// Settle is how long the bench waits after an external EPP answers
	// gRPC health SERVING before it sends traffic. nil:
	// DefaultExternalSettle (2s); 0 sends at once.
	Settle *time.Duration
}

// WithDefaults fills every unset field.
func (o ExternalOptions) WithDefaults() ExternalOptions {
	def(&o.Dir, "out/bench-epp")
	o.Settle = opt.Or(o.Settle, DefaultExternalSettle)
	return o
}

// WithDefaults fills every unset field.
func (o Options) WithDefaults() Options {
	def(&o.Seed, 1)
	def(&o.RequestTimeout, 10*time.Minute)
	def(&o.MaxInFlight, 4096)
	if o.Log == nil {
		o.Log = zap.NewNop()
	}
	f := &o.Fleet
	def(&f.Mode, FleetInProcess)
	def(&f.Replicas, 2)
	def(&f.Engine, engine.FlavourVLLM)
	def(&f.TimeScale, 1)
	if f.Mode == FleetURLs {
		f.TimeScale = 1 // real engines run in real time
		f.Replicas = len(f.URLs)
		if f.EndpointsFile != "" {
			// The report's count; a file that cannot be read fails in
			// StartFleet.
			if eps, err := readEndpointsFile(f.EndpointsFile); err == nil {
				f.Replicas = len(eps)
			}
		}
		f.Engines = f.Engines.WithDefaults()
	}
	def(&f.EnginesimBin, "bin/enginesim")
	w := &o.Workload
	def(&w.Kind, WorkloadSharedPrefix)
	def(&w.Trace.Speedup, f.TimeScale)
	sp := &w.SharedPrefix
	def(&sp.NumGroups, 16)
	def(&sp.PromptsPerGroup, 5)
	def(&sp.SystemPromptLen, 2000)
	def(&sp.QuestionLen, 200)
	def(&sp.OutputLen, 50)
	if len(sp.QPS) == 0 {
		sp.QPS = []float64{5, 15}
	}
	def(&sp.StageDuration, 10*time.Second)
	c := &w.Chat
	def(&c.Sessions, 20)
	def(&c.Turns, 4)
	def(&c.SystemPromptLen, 500)
	def(&c.UserLen, 100)
	def(&c.OutputLen, 64)
	def(&c.SessionRate, 2)
	def(&c.ThinkTime, 2*time.Second)
	a := &w.Agents
	def(&a.Sessions, 64)
	def(&a.SessionRate, 0.5)
	def(&a.Calls, 12)
	def(&a.CallsMax, 40)
	def(&a.SystemLen, 1000)
	def(&a.SchemaLen, 1200)
	def(&a.Tools, 4)
	def(&a.TaskLen, 300)
	def(&a.ResultLen, 700)
	def(&a.ResultMax, 4000)
	def(&a.OutputLen, 300)
	def(&a.ToolCallMax, 256)
	def(&a.Gap, 5*time.Second)
	def(&a.GapMax, 60*time.Second)
	def(&a.Sigma, 0.8)
	def(&a.MaxContext, cmp.Or(o.Fleet.MaxModelLen, sim.Config{}.WithDefaults().MaxModelLen))
	a.Concurrency = opt.Or(a.Concurrency, 0)
	a.Retries = opt.Or(a.Retries, 20)
	def(&a.RetryBackoff, 5*time.Second)
	def(&o.Scenario, w.Kind)
	return o
}

// def sets *p to v when it is the zero value.
func def[T comparable](p *T, v T) {
	var zero T
	if *p == zero {
		*p = v
	}
}

// Validate reports every problem with defaulted options.
func (o Options) Validate() error {
	var errs []error
	f := o.Fleet
	switch f.Mode {
	case FleetInProcess, FleetProcess:
		if f.Replicas < 1 || f.Replicas > 64 {
			errs = append(errs, fmt.Errorf("replicas %d: want 1..64", f.Replicas))
		}
	case FleetURLs:
		switch {
		case len(f.URLs) == 0 && f.EndpointsFile == "":
			errs = append(errs, errors.New("fleet mode urls needs at least one URL, or an endpoint file"))
		case len(f.URLs) > 0 && f.EndpointsFile != "":
			errs = append(errs, errors.New("fleet mode urls takes URLs or an endpoint file, not both"))
		}
		if err := f.Engines.Validate(); err != nil {
			errs = append(errs, err)
		}
	default:
		errs = append(errs, fmt.Errorf("fleet mode %q: want inproc, process or urls", f.Mode))
	}
	if !(f.TimeScale > 0) || f.TimeScale > 1000 {
		errs = append(errs, fmt.Errorf("time scale %v: want > 0 and <= 1000", f.TimeScale))
	}
	if f.NumGPUBlocks < 0 || f.BlockSize < 0 || f.MaxNumBatchedTokens < 0 || f.MaxNumSeqs < 0 || f.MaxModelLen < 0 {
		errs = append(errs, errors.New("fleet sizes must not be negative"))
	}
	w := o.Workload
	switch w.Kind {
	case WorkloadTrace:
		if w.Trace.Path == "" {
			errs = append(errs, errors.New("workload trace needs a trace path"))
		}
		if !(w.Trace.Speedup > 0) {
			errs = append(errs, fmt.Errorf("speedup %v: want > 0", w.Trace.Speedup))
		}
		if w.Trace.Limit < 0 {
			errs = append(errs, fmt.Errorf("limit %d: want >= 0", w.Trace.Limit))
		}
	case WorkloadSharedPrefix:
		sp := w.SharedPrefix
		if sp.NumGroups < 1 || sp.PromptsPerGroup < 1 || sp.SystemPromptLen < 0 || sp.QuestionLen < 1 || sp.OutputLen < 1 {
			errs = append(errs, errors.New("shared-prefix: groups, prompts per group, question and output lengths must be positive"))
		}
		for _, q := range sp.QPS {
			if !(q > 0) {
				errs = append(errs, fmt.Errorf("shared-prefix: QPS %v: want > 0", q))
			}
		}
		if sp.StageDuration <= 0 {
			errs = append(errs, errors.New("shared-prefix: stage duration must be positive"))
		}
		if len(sp.StageDurations) != 0 && len(sp.StageDurations) != len(sp.QPS) {
			errs = append(errs, fmt.Errorf("shared-prefix: %d stage durations for %d QPS stages", len(sp.StageDurations), len(sp.QPS)))
		}
		for _, d := range sp.StageDurations {
			if d <= 0 {
				errs = append(errs, fmt.Errorf("shared-prefix: stage duration %v: want > 0", d))
			}
		}
		if sp.GroupSkew < 0 {
			errs = append(errs, fmt.Errorf("shared-prefix: group skew %v: want >= 0", sp.GroupSkew))
		}
		if sp.WarmupStages < 0 || sp.WarmupStages >= len(sp.QPS) {
			errs = append(errs, fmt.Errorf("shared-prefix: %d warm-up stages of %d: want 0..%d", sp.WarmupStages, len(sp.QPS), len(sp.QPS)-1))
		}
	case WorkloadChat:
		c := w.Chat
		if c.Sessions < 1 || c.Turns < 1 || c.UserLen < 1 || c.OutputLen < 1 || c.SystemPromptLen < 0 || !(c.SessionRate > 0) || c.ThinkTime < 0 {
			errs = append(errs, errors.New("chat: sessions, turns, lengths and session rate must be positive"))
		}
	case WorkloadAgents:
		a := w.Agents
		if a.Sessions < 1 || !(a.SessionRate > 0) || a.Calls < 2 || a.CallsMax < a.Calls || a.SystemLen < 0 || a.SchemaLen < 0 ||
			a.Tools < 1 || a.TaskLen < 1 || a.ResultLen < 1 || a.ResultMax < a.ResultLen || a.OutputLen < 1 || a.ToolCallMax < 1 ||
			a.Gap < 0 || a.GapMax < a.Gap || a.Sigma < 0 {
			errs = append(errs, errors.New("agents: sessions, rate, lengths and tools must be positive, calls at least 2, each max at least its median, gaps and sigma not negative"))
		}
		if a.Concurrency != nil {
			if err := opt.NonNegative("agent-concurrency", *a.Concurrency); err != nil {
				errs = append(errs, fmt.Errorf("agents: %w", err))
			}
		}
		if a.Retries != nil {
			if err := opt.NonNegative("agent-retries", *a.Retries); err != nil {
				errs = append(errs, fmt.Errorf("agents: %w", err))
			}
		}
		if err := opt.DefaultNonNegative("agent-retry-backoff", a.RetryBackoff, 5*time.Second); err != nil {
			errs = append(errs, fmt.Errorf("agents: %w", err))
		}
		if first := agentCallTokens(a.SystemLen+a.SchemaLen+a.TaskLen, 1, a.Tools) + max(a.OutputLen, a.ToolCallMax); a.MaxContext < first {
			errs = append(errs, fmt.Errorf("agents: agent-max-context %d: the first call alone needs %d tokens", a.MaxContext, first))
		}
	default:
		errs = append(errs, fmt.Errorf("workload %q: want trace, shared-prefix, chat or agents", w.Kind))
	}
	return errors.Join(errs...)
}

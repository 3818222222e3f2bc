package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/omnious/provider-node/bench/compare"
	"github.com/omnious/provider-node/bench/rig"
	"github.com/omnious/provider-node/internal/cli"
	"github.com/omnious/provider-node/internal/testutil/envoytest"
)

// compareFlags are the flags of the comparison and of bench sweep.
type compareFlags struct {
	scenario         string
	policies         listFlag
	eppDir           string
	eppSettle        time.Duration
	epps             int
	direct           bool
	gateway, envoy   string
	seed             int64
	jsonOut, htmlOut string
	logLevel         string
	fleet            fleetFlags
	workload         workloadFlags
	sweep            sweepFlags
	check            checkFlags
	// set holds the flags given on the command line: only those override
	// a preset.
	set map[string]bool
}

type fleetFlags struct {
	mode, urls, model, engine, enginesim    string
	endpointsFile                           *string
	engines                                 rig.EngineOptions
	replicas, gpuBlocks, blockSize, batched int
	timeScale                               float64
	prefillBase, prefillPerToken            time.Duration
	decodeBase, decodePerSeq, kvTerm        time.Duration
}

type workloadFlags struct {
	kind, trace                            string
	speedup                                float64
	limit                                  int
	text, tools                            bool
	groups, perGroup, sysLen, qLen, outLen int
	qps                                    string
	groupSkew                              float64
	stageDur                               time.Duration
	sessions, turns                        int
	sessionRate                            float64
	agents                                 agentFlags
}

// agentFlags are the agents workload's parameters (rig.AgentOptions).
type agentFlags struct {
	sessions, calls, callsMax, system, schema, tools int
	task, result, resultMax, output, toolCallMax     int
	maxContext                                       int
	rate, sigma                                      float64
	gap, gapMax                                      time.Duration
	noIDs                                            bool
	concurrency, retries                             int
	retryBackoff                                     time.Duration
}

func (f *agentFlags) register(fs *flag.FlagSet) {
	fs.IntVar(&f.sessions, "agent-sessions", 0, "agents: sessions (0: 64)")
	fs.Float64Var(&f.rate, "agent-rate", 0, "agents: new sessions per model second (0: 0.5)")
	fs.IntVar(&f.calls, "agent-calls", 0, "agents: median calls per session, at least 2 (0: 12)")
	fs.IntVar(&f.callsMax, "agent-calls-max", 0, "agents: most calls per session (0: 40)")
	fs.IntVar(&f.system, "agent-system-len", 0, "agents: shared system prompt tokens (0: 1000)")
	fs.IntVar(&f.schema, "agent-schema-len", 0, "agents: tool descriptions' tokens, shared (0: 1200)")
	fs.IntVar(&f.tools, "agent-tools", 0, "agents: tools offered (0: 4)")
	fs.IntVar(&f.task, "agent-task-len", 0, "agents: each session's task tokens (0: 300)")
	fs.IntVar(&f.result, "agent-result-len", 0, "agents: median tool result tokens (0: 700)")
	fs.IntVar(&f.resultMax, "agent-result-max", 0, "agents: largest tool result tokens (0: 4000)")
	fs.IntVar(&f.output, "agent-output-len", 0, "agents: final answer tokens (0: 300)")
	fs.IntVar(&f.toolCallMax, "agent-tool-call-max", 0, "agents: max_tokens of a tool call (0: 256)")
	fs.IntVar(&f.maxContext, "agent-max-context", 0, "agents: context window a call's prompt plus max_tokens must fit; a session whose next call would not ends with its answer (0: -max-model-len, else 40960)")
	fs.DurationVar(&f.gap, "agent-gap", 0, "agents: median tool time between calls, model time (0: 5s)")
	fs.DurationVar(&f.gapMax, "agent-gap-max", 0, "agents: longest tool time (0: 60s)")
	fs.Float64Var(&f.sigma, "agent-sigma", 0, "agents: log-normal shape of calls, results and gaps (0: 0.8)")
	fs.BoolVar(&f.noIDs, "agent-no-session-ids", false, "agents: send no session header (the router infers sessions from prefixes)")
	fs.IntVar(&f.concurrency, "agent-concurrency", 0, "agents: closed-loop agents, each starting its next session when one ends, one more each 1/-agent-rate s; 0: open-loop arrival at -agent-rate (not given: the scenario's, else 0)")
	fs.IntVar(&f.retries, "agent-retries", 0, "agents, closed-loop: times a refused (429) call is sent again before its session is given up; 0: never (not given: 20)")
	fs.DurationVar(&f.retryBackoff, "agent-retry-backoff", 0, "agents, closed-loop: wait before retrying a refused call without Retry-After, model time, doubling per retry up to 8x (0: 5s)")
}

func (f *agentFlags) apply(a *rig.AgentOptions, set map[string]bool) {
	ifSet(set, "agent-sessions", &a.Sessions, f.sessions)
	ifSet(set, "agent-rate", &a.SessionRate, f.rate)
	ifSet(set, "agent-calls", &a.Calls, f.calls)
	ifSet(set, "agent-calls-max", &a.CallsMax, f.callsMax)
	ifSet(set, "agent-system-len", &a.SystemLen, f.system)
	ifSet(set, "agent-schema-len", &a.SchemaLen, f.schema)
	ifSet(set, "agent-tools", &a.Tools, f.tools)
	ifSet(set, "agent-task-len", &a.TaskLen, f.task)
	ifSet(set, "agent-result-len", &a.ResultLen, f.result)
	ifSet(set, "agent-result-max", &a.ResultMax, f.resultMax)
	ifSet(set, "agent-output-len", &a.OutputLen, f.output)
	ifSet(set, "agent-tool-call-max", &a.ToolCallMax, f.toolCallMax)
	ifSet(set, "agent-max-context", &a.MaxContext, f.maxContext)
	ifSet(set, "agent-gap", &a.Gap, f.gap)
	ifSet(set, "agent-gap-max", &a.GapMax, f.gapMax)
	ifSet(set, "agent-sigma", &a.Sigma, f.sigma)
	ifSet(set, "agent-no-session-ids", &a.NoSessionIDs, f.noIDs)
	ifSet(set, "agent-concurrency", &a.Concurrency, &f.concurrency)
	ifSet(set, "agent-retries", &a.Retries, &f.retries)
	ifSet(set, "agent-retry-backoff", &a.RetryBackoff, f.retryBackoff)
}

// ifSet copies v to dst when the flag name was given on the command line,
// so a preset's value stays unless the user overrides it.
func ifSet[T any](set map[string]bool, name string, dst *T, v T) {
	if set[name] {
		*dst = v
	}
}

type sweepFlags struct {
	gridFile, base, dir string
	sets                listFlag
}

type checkFlags struct {
	policy         string
	bound, load    float64
	withThroughput bool
}

func (f *compareFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.scenario, "scenario", "", "preset scenario: demo, llmd-73 or agents (other flags override it)")
	fs.Var(&f.policies, "policies", "comma-separated policies or EPP config files (default all five); repeatable; "+
		"exec:[LABEL=]COMMAND (the rest of the value, commas included) starts another EPP, addr:[LABEL=]HOST:PORT[+METRICS_HOST:PORT] races one already running")
	fs.StringVar(&f.eppDir, "epp-dir", "out/bench-epp", "exec: policies: one directory per label for the fleet files, the command and the EPP's output")
	fs.DurationVar(&f.eppSettle, "epp-settle", rig.DefaultExternalSettle, "exec:/addr: policies: wait after the EPP answers gRPC health SERVING, before traffic")
	fs.IntVar(&f.epps, "epps", 1, "EPPs serving the pool side by side behind the gateway, each with the policy (an exec: EPP runs as that many processes; an addr: EPP is the one it names)")
	fs.BoolVar(&f.direct, "direct", false, "use a plain reverse proxy (round-robin, random) instead of the EPP")
	fs.StringVar(&f.gateway, "gateway", rig.GatewayBuiltin, "in front of the EPPs: builtin (the test gateway) or envoy (the real Envoy on deploy/envoy's shipped config; one or two EPPs)")
	fs.StringVar(&f.envoy, "envoy", "", "-gateway envoy: the envoy binary (default: $ENVOY, then envoy on PATH, then .cache/py/envoy from scripts/pyenv.sh envoy)")
	fs.Int64Var(&f.seed, "seed", 1, "workload and replica seed (negative: a seed too)")
	fs.StringVar(&f.jsonOut, "json", "", "write the JSON contract to this file")
	fs.StringVar(&f.htmlOut, "html", "out/bench-report.html", "write the HTML report to this file (empty: none)")
	fs.StringVar(&f.logLevel, "log-level", "error", "debug, info, warn or error")
	f.fleet.register(fs)
	f.workload.register(fs)
	f.sweep.register(fs)
	f.check.register(fs)
}

func (f *fleetFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.mode, "fleet", "inproc", "inproc (simulated in this process), process (enginesim processes) or urls")
	fs.StringVar(&f.urls, "urls", "", "comma-separated loopback OpenAI base URLs (implies -fleet urls)")
	f.endpointsFile = engineFlags(fs, &f.engines)
	fs.IntVar(&f.replicas, "replicas", 2, "simulated replicas")
	fs.StringVar(&f.model, "model", "", "served model name")
	fs.StringVar(&f.engine, "engine", "vllm", "simulated engine: vllm or sglang")
	fs.IntVar(&f.gpuBlocks, "num-gpu-blocks", 0, "KV blocks per simulated replica (0: simulator default)")
	fs.IntVar(&f.blockSize, "block-size", 16, "simulated KV block size")
	fs.IntVar(&f.batched, "max-num-batched-tokens", 0, "simulated step token budget (0: default 8192)")
	fs.Float64Var(&f.timeScale, "time-scale", 1, "simulated replicas run this many times faster than real time")
	fs.StringVar(&f.enginesim, "enginesim", "bin/enginesim", "enginesim binary for -fleet process")
	fs.DurationVar(&f.prefillBase, "prefill-base", 0, "simulated step time: fixed cost of a prefill step (0: 5ms)")
	fs.DurationVar(&f.prefillPerToken, "prefill-per-token", 0, "simulated step time: per new prompt token (0: 63us)")
	fs.DurationVar(&f.decodeBase, "decode-base", 0, "simulated step time: fixed cost of a decode step (0: 10.5ms)")
	fs.DurationVar(&f.decodePerSeq, "decode-per-seq", 0, "simulated step time: per decoding request (0: 190us)")
	fs.DurationVar(&f.kvTerm, "kv-term", 0, "simulated step time: attention over a full KV cache (0: 12ms)")
}

func (f *workloadFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.kind, "workload", "", "shared-prefix, chat, agents or trace (default shared-prefix, or trace with -trace)")
	fs.StringVar(&f.trace, "trace", "", "Mooncake JSONL trace")
	fs.Float64Var(&f.speedup, "speedup", 0, "divide trace timestamps by this (default: the time scale)")
	fs.IntVar(&f.limit, "limit", 0, "replay only the first N trace requests")
	fs.BoolVar(&f.text, "text", false, "send trace prompts as text instead of token ids")
	fs.IntVar(&f.groups, "groups", 0, "shared-prefix: groups")
	fs.IntVar(&f.perGroup, "prompts-per-group", 0, "shared-prefix: prompts per group")
	fs.IntVar(&f.sysLen, "system-len", 0, "shared-prefix: system prompt tokens; chat: system prompt words")
	fs.IntVar(&f.qLen, "question-len", 0, "shared-prefix: question tokens")
	fs.IntVar(&f.outLen, "output-len", 0, "output tokens per request (shared-prefix, chat)")
	fs.StringVar(&f.qps, "qps", "", "shared-prefix: QPS ladder in model time, e.g. 3,10,20")
	fs.Float64Var(&f.groupSkew, "group-skew", 0, "shared-prefix: Zipf exponent of group popularity (0: uniform)")
	fs.DurationVar(&f.stageDur, "stage-duration", 0, "shared-prefix: model time per QPS stage")
	fs.IntVar(&f.sessions, "sessions", 0, "chat: sessions")
	fs.IntVar(&f.turns, "turns", 0, "chat: turns per session")
	fs.Float64Var(&f.sessionRate, "session-rate", 0, "chat: new sessions per model second")
	fs.BoolVar(&f.tools, "tools", false, "chat: offer a tool (tool_choice auto)")
	f.agents.register(fs)
}

func (f *sweepFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.gridFile, "grid", "", "sweep: grid YAML file (base + params)")
	fs.StringVar(&f.base, "base", "", "sweep: base policy or EPP config file")
	fs.Var(&f.sets, "set", "sweep: key=v1,v2,... (repeatable; dotted EPP config keys)")
	fs.StringVar(&f.dir, "sweep-dir", "out/bench-sweep", "sweep: where generated EPP config files go")
}

func (f *checkFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.policy, "check", "", "check this policy's acceptance criteria against the others (hit rate vs bound, load, TTFT p90 lowest); exit 1 on failure")
	fs.Float64Var(&f.bound, "check-bound", 0.95, "-check: minimum share of the bound hit rate")
	fs.Float64Var(&f.load, "check-load", 1.15, "-check: maximum max/mean load")
	fs.BoolVar(&f.withThroughput, "check-throughput", false, "-check: also require the highest output tok/s")
}

// runCompare is the comparison (bench) and, with sweep, bench sweep.
func runCompare(args []string, sweep bool) error {
	f := &compareFlags{}
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	f.register(fs)
	if !sweep {
		fs.Usage = func() { usage(fs.Output()); fs.PrintDefaults() }
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := cli.NonNegative(fs); err != nil {
		return fmt.Errorf("%s: %w", fs.Name(), err)
	}
	f.set = map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { f.set[fl.Name] = true })
	opts, err := f.options(sweep)
	if err != nil {
		return err
	}
	ctx, log, done, err := session(f.logLevel)
	if err != nil {
		return err
	}
	defer done()
	opts.Log = log
	if st, err := os.Stderr.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
		opts.Progress = os.Stderr
	}
	gw, err := f.gatewayOptions()
	if err != nil {
		return err
	}
	ext := rig.ExternalOptions{Dir: f.eppDir, Settle: &f.eppSettle, TimeScale: opts.Fleet.TimeScale}
	if opts.Fleet.Mode == rig.FleetURLs {
		ext.TimeScale = 1 // real engines run in real time
		ext.Engines = &opts.Fleet.Engines
	} else if err := simulatedFleetFlags(f.set); err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	rep, err := f.report(ctx, opts, sweep, launcher(f.direct, f.seed, log, ext, gw))
	if rep == nil {
		return err
	}
	if werr := f.write(rep); werr != nil {
		return werr
	}
	if err == nil && f.check.policy != "" {
		return f.check.run(rep)
	}
	return err
}

// launcher is the one place the bench gets its Launcher.
func launcher(direct bool, seed int64, log *zap.Logger, ext rig.ExternalOptions, gw rig.GatewayOptions) rig.Launcher {
	if direct {
		return rig.DirectLauncher(seed)
	}
	return rig.EPPLauncherVia(log, ext, gw)
}

// gatewayOptions checks -gateway and -envoy, finds the Envoy binary, and
// says on stdout which gateway the run goes through.
func (f *compareFlags) gatewayOptions() (rig.GatewayOptions, error) {
	switch f.gateway {
	case rig.GatewayBuiltin:
		if f.envoy != "" {
			return rig.GatewayOptions{}, errors.New("-envoy needs -gateway envoy")
		}
		if !f.direct {
			fmt.Println("gateway: builtin (the test gateway, extproc/testgw)")
		}
		return rig.GatewayOptions{Kind: rig.GatewayBuiltin}, nil
	case rig.GatewayEnvoy:
		if f.direct {
			return rig.GatewayOptions{}, errors.New("-direct and -gateway envoy: the direct proxy has no EPP for Envoy to ask")
		}
		bin, err := envoytest.Find(f.envoy)
		if err != nil {
			return rig.GatewayOptions{}, fmt.Errorf("-gateway envoy: %w", err)
		}
		version := "unknown version"
		if out, err := exec.Command(bin, "--version").Output(); err == nil {
			if m := regexp.MustCompile(`/(\d+\.\d+\.\d+)/`).FindSubmatch(out); m != nil {
				version = string(m[1])
			}
		}
		fmt.Printf("gateway: envoy %s (%s) on deploy/envoy's shipped config\n", version, bin)
		return rig.GatewayOptions{Kind: rig.GatewayEnvoy, EnvoyBin: bin}, nil
	default:
		return rig.GatewayOptions{}, fmt.Errorf("-gateway %q: want builtin or envoy", f.gateway)
	}
}

// options are a preset's (or the defaults') options with the flags given
// on top.
func (f *compareFlags) options(sweep bool) (compare.Options, error) {
	opts := compare.Options{}
	if f.scenario != "" {
		var err error
		if opts, err = compare.Preset(f.scenario); err != nil {
			return opts, err
		}
	}
	if f.set["policies"] {
		opts.Policies = nil
		for _, v := range f.policies {
			opts.Policies = append(opts.Policies, splitPolicies(v)...)
		}
	} else if f.direct && !sweep {
		opts.Policies = []string{"random", "round-robin"}
	}
	opts.Seed = f.seed
	if f.set["epps"] || opts.EPPs == 0 {
		opts.EPPs = f.epps
	}
	f.fleet.apply(&opts.Fleet, f.set)
	return opts, f.workload.apply(&opts.Workload, f.set)
}

func (f *fleetFlags) apply(o *rig.FleetOptions, set map[string]bool) {
	if set["fleet"] {
		o.Mode = f.mode
	}
	if f.urls != "" {
		o.Mode, o.URLs = rig.FleetURLs, splitList(f.urls)
	}
	if *f.endpointsFile != "" {
		o.Mode, o.EndpointsFile = rig.FleetURLs, *f.endpointsFile
	}
	o.Engines = f.engines
	if set["replicas"] || o.Replicas == 0 {
		o.Replicas = f.replicas
	}
	if set["model"] {
		o.Model = f.model
	}
	if set["engine"] {
		o.Engine = f.engine
	}
	if set["num-gpu-blocks"] {
		o.NumGPUBlocks = f.gpuBlocks
	}
	if set["block-size"] || o.BlockSize == 0 {
		o.BlockSize = f.blockSize
	}
	if set["max-num-batched-tokens"] {
		o.MaxNumBatchedTokens = f.batched
	}
	if set["time-scale"] || o.TimeScale == 0 {
		o.TimeScale = f.timeScale
	}
	o.EnginesimBin = f.enginesim
	for _, d := range []struct {
		name string
		src  *time.Duration
		dst  **time.Duration
	}{{"prefill-base", &f.prefillBase, &o.Timing.PrefillBase}, {"prefill-per-token", &f.prefillPerToken, &o.Timing.PrefillPerToken},
		{"decode-base", &f.decodeBase, &o.Timing.DecodeBase}, {"decode-per-seq", &f.decodePerSeq, &o.Timing.DecodePerSeq},
		{"kv-term", &f.kvTerm, &o.Timing.KVTerm}} {
		if set[d.name] {
			*d.dst = new(*d.src)
		}
	}
}

func (f *workloadFlags) apply(w *rig.WorkloadOptions, set map[string]bool) error {
	switch {
	case set["workload"]:
		w.Kind = f.kind
	case f.trace != "":
		w.Kind = rig.WorkloadTrace
	}
	w.Trace = rig.TraceOptions{Path: f.trace, Speedup: f.speedup, Limit: f.limit, Text: f.text}
	sp, ch := &w.SharedPrefix, &w.Chat
	setInt := func(name string, v int, dst ...*int) {
		if set[name] {
			for _, d := range dst {
				*d = v
			}
		}
	}
	setInt("groups", f.groups, &sp.NumGroups)
	setInt("prompts-per-group", f.perGroup, &sp.PromptsPerGroup)
	setInt("system-len", f.sysLen, &sp.SystemPromptLen, &ch.SystemPromptLen)
	setInt("question-len", f.qLen, &sp.QuestionLen)
	setInt("output-len", f.outLen, &sp.OutputLen, &ch.OutputLen)
	setInt("sessions", f.sessions, &ch.Sessions)
	setInt("turns", f.turns, &ch.Turns)
	if set["qps"] || set["stage-duration"] {
		// A ladder of its own replaces the preset's stage lengths and warm-up.
		sp.StageDurations, sp.WarmupStages = nil, 0
	}
	if set["group-skew"] {
		sp.GroupSkew = f.groupSkew
	}
	if set["qps"] {
		sp.QPS = nil
		for _, s := range splitList(f.qps) {
			v, err := strconv.ParseFloat(s, 64)
			if err != nil {
				return fmt.Errorf("bad -qps %q: %w", f.qps, err)
			}
			sp.QPS = append(sp.QPS, v)
		}
	}
	if set["stage-duration"] {
		sp.StageDuration = f.stageDur
	}
	if set["session-rate"] {
		ch.SessionRate = f.sessionRate
	}
	ch.Tools = ch.Tools || f.tools
	f.agents.apply(&w.Agents, set)
	return nil
}

// report runs the comparison, or the sweep.
func (f *compareFlags) report(ctx context.Context, opts compare.Options, sweep bool, launch rig.Launcher) (*compare.Report, error) {
	if !sweep {
		return compare.Run(ctx, opts, launch)
	}
	g, err := f.sweep.grid()
	if err != nil {
		return nil, err
	}
	return compare.Sweep(ctx, opts, g, f.sweep.dir, launch)
}

// grid is the -grid file's grid with -base and every -set on top.
func (f *sweepFlags) grid() (compare.Grid, error) {
	var g compare.Grid
	if f.gridFile != "" {
		var err error
		if g, err = compare.LoadGrid(f.gridFile); err != nil {
			return g, err
		}
	}
	if f.base != "" {
		g.Base = f.base
	}
	for _, s := range f.sets {
		if err := g.ParseSet(s); err != nil {
			return g, err
		}
	}
	return g, nil
}

// write prints the table, writes the JSON contract and the HTML report
// where asked, and the wall time.
func (f *compareFlags) write(rep *compare.Report) error {
	if err := rep.WriteTable(os.Stdout); err != nil {
		return err
	}
	for _, p := range []string{f.jsonOut, f.htmlOut} {
		if p != "" {
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				return fmt.Errorf("cannot create report directory: %w", err)
			}
		}
	}
	if f.jsonOut != "" {
		if err := rep.WriteJSON(f.jsonOut); err != nil {
			return err
		}
		fmt.Printf("JSON: %s\n", f.jsonOut)
	}
	if f.htmlOut != "" {
		if err := rep.WriteHTMLFile(f.htmlOut); err != nil {
			return err
		}
		abs, _ := filepath.Abs(f.htmlOut)
		fmt.Printf("report: %s\n", abs)
	}
	fmt.Printf("wall time %s\n", rep.Wall.Round(time.Second))
	return nil
}

// run prints each acceptance check and fails if any did.
func (c *checkFlags) run(rep *compare.Report) error {
	results, err := rep.Check(c.policy, c.bound, c.load, c.withThroughput)
	if err != nil {
		return err
	}
	return compare.WriteChecks(os.Stdout, c.policy, results)
}

// splitPolicies splits one -policies value at its commas, except that an
// exec: policy takes the rest of the value: its command may hold commas.
func splitPolicies(v string) []string {
	var out []string
	for v != "" {
		item, rest, _ := strings.Cut(v, ",")
		if t := strings.TrimSpace(v); strings.HasPrefix(t, rig.PolicyExec) {
			item, rest = t, ""
		}
		if item = strings.TrimSpace(item); item != "" {
			out = append(out, item)
		}
		v = rest
	}
	return out
}

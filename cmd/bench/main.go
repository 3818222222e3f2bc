// Command bench replays a workload through routing policies, each on a fresh
// fleet of (simulated or real) engine replicas, and compares them: a table on
// stdout, the JSON contract (-json) and an HTML report with charts (-html).
//
//	bench -scenario demo                                  the make demo scenario
//	bench -scenario llmd-73 -check precise -check-throughput
//	bench -trace ../shared/traces/mooncake_synthetic_trace.jsonl -replicas 8 \
//	      -time-scale 8 -fleet process -json out.json -check precise
//	bench -workload chat -sessions 40 -turns 5 -tools
//	bench -urls http://127.0.0.1:8000,http://127.0.0.1:8001 -policies precise,random
//	bench sweep -grid grid.yaml [flags]                   sweep EPP config keys, report the Pareto front
//	bench sweep -base precise -set scoring.weights.prefix=1,3,5 -set prefix.balance_rel=1.25,2
//	bench chaos [-scenarios engine-kill,...]             scripted faults, expected vs observed (make chaos)
//	bench load [-prompt-bytes 32k] [-rates 500,1000,2000] [-soak 10m]   EPP decisions/s and added latency; memory soak
//	bench load -floor                                    the same ladder against a no-op ext_proc server (bench floor)
//
// Latencies of simulated fleets are in model time (wall time x time scale).
// -direct replaces the EPP by a plain round-robin/random reverse proxy.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/omnious/provider-node/bench"
	"github.com/omnious/provider-node/internal/cli"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// launcher is the one place the bench gets its Launcher.
func launcher(direct bool, seed int64, log *zap.Logger) bench.Launcher {
	if direct {
		return bench.DirectLauncher(seed)
	}
	return bench.EPPLauncher(log)
}

type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, " ") }
func (l *listFlag) Set(s string) error { *l = append(*l, s); return nil }

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

func run(args []string) error {
	if len(args) > 0 && args[0] == "chaos" {
		return runChaos(args[1:])
	}
	if len(args) > 0 && args[0] == "load" {
		return runLoad(args[1:])
	}
	if len(args) > 0 && args[0] == "floor" {
		return runFloor(args[1:])
	}
	sweep := len(args) > 0 && args[0] == "sweep"
	if sweep {
		args = args[1:]
	}
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	scenario := fs.String("scenario", "", "preset scenario: demo or llmd-73 (other flags override it)")
	policies := fs.String("policies", "", "comma-separated policies or EPP config files (default all five)")
	direct := fs.Bool("direct", false, "use a plain reverse proxy (round-robin, random) instead of the EPP")
	seed := fs.Int64("seed", 1, "workload and replica seed")
	jsonOut := fs.String("json", "", "write the JSON contract to this file")
	htmlOut := fs.String("html", "out/bench-report.html", "write the HTML report to this file (empty: none)")
	logLevel := fs.String("log-level", "error", "debug, info, warn or error")
	// Fleet.
	fleetMode := fs.String("fleet", "inproc", "inproc (simulated in this process), process (enginesim processes) or urls")
	urls := fs.String("urls", "", "comma-separated loopback OpenAI base URLs (implies -fleet urls)")
	replicas := fs.Int("replicas", 2, "simulated replicas")
	model := fs.String("model", "", "served model name")
	engineFlavour := fs.String("engine", "vllm", "simulated engine: vllm or sglang")
	gpuBlocks := fs.Int("num-gpu-blocks", 0, "KV blocks per simulated replica (0: simulator default)")
	blockSize := fs.Int("block-size", 16, "simulated KV block size")
	batched := fs.Int("max-num-batched-tokens", 0, "simulated step token budget (0: default 8192)")
	timeScale := fs.Float64("time-scale", 1, "simulated replicas run this many times faster than real time")
	enginesim := fs.String("enginesim", "bin/enginesim", "enginesim binary for -fleet process")
	prefillBase := fs.Duration("prefill-base", 0, "simulated step time: fixed cost of a prefill step (0: 5ms)")
	prefillPerToken := fs.Duration("prefill-per-token", 0, "simulated step time: per new prompt token (0: 63us)")
	decodeBase := fs.Duration("decode-base", 0, "simulated step time: fixed cost of a decode step (0: 10.5ms)")
	decodePerSeq := fs.Duration("decode-per-seq", 0, "simulated step time: per decoding request (0: 190us)")
	kvTerm := fs.Duration("kv-term", 0, "simulated step time: attention over a full KV cache (0: 12ms)")
	// Workloads.
	workload := fs.String("workload", "", "shared-prefix, chat or trace (default shared-prefix, or trace with -trace)")
	trace := fs.String("trace", "", "Mooncake JSONL trace")
	speedup := fs.Float64("speedup", 0, "divide trace timestamps by this (default: the time scale)")
	limit := fs.Int("limit", 0, "replay only the first N trace requests")
	text := fs.Bool("text", false, "send trace prompts as text instead of token ids")
	groups := fs.Int("groups", 0, "shared-prefix: groups")
	perGroup := fs.Int("prompts-per-group", 0, "shared-prefix: prompts per group")
	sysLen := fs.Int("system-len", 0, "shared-prefix: system prompt tokens; chat: system prompt words")
	qLen := fs.Int("question-len", 0, "shared-prefix: question tokens")
	outLen := fs.Int("output-len", 0, "output tokens per request (shared-prefix, chat)")
	qps := fs.String("qps", "", "shared-prefix: QPS ladder in model time, e.g. 3,10,20")
	stageDur := fs.Duration("stage-duration", 0, "shared-prefix: model time per QPS stage")
	sessions := fs.Int("sessions", 0, "chat: sessions")
	turns := fs.Int("turns", 0, "chat: turns per session")
	sessionRate := fs.Float64("session-rate", 0, "chat: new sessions per model second")
	tools := fs.Bool("tools", false, "chat: offer a tool (tool_choice auto)")
	// Sweep.
	gridFile := fs.String("grid", "", "sweep: grid YAML file (base + params)")
	base := fs.String("base", "", "sweep: base policy or EPP config file")
	var sets listFlag
	fs.Var(&sets, "set", "sweep: key=v1,v2,... (repeatable; dotted EPP config keys)")
	sweepDir := fs.String("sweep-dir", "out/bench-sweep", "sweep: where generated EPP config files go")
	check := fs.String("check", "", "check issue 6's acceptance for this policy (hit rate vs bound, load, TTFT p90 lowest); exit 1 on failure")
	checkBound := fs.Float64("check-bound", 0.95, "-check: minimum share of the bound hit rate")
	checkLoad := fs.Float64("check-load", 1.15, "-check: maximum max/mean load")
	checkTput := fs.Bool("check-throughput", false, "-check: also require the highest output tok/s")
	if err := fs.Parse(args); err != nil {
		return err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })

	opts := bench.Options{}
	if *scenario != "" {
		var err error
		if opts, err = bench.Preset(*scenario); err != nil {
			return err
		}
	}
	if set["policies"] {
		opts.Policies = splitList(*policies)
	} else if *direct && !sweep {
		opts.Policies = []string{"random", "round-robin"}
	}
	opts.Seed = *seed
	f := &opts.Fleet
	if set["fleet"] {
		f.Mode = *fleetMode
	}
	if *urls != "" {
		f.Mode, f.URLs = bench.FleetURLs, splitList(*urls)
	}
	if set["replicas"] || f.Replicas == 0 {
		f.Replicas = *replicas
	}
	if set["model"] {
		f.Model = *model
	}
	if set["engine"] {
		f.Engine = *engineFlavour
	}
	if set["num-gpu-blocks"] {
		f.NumGPUBlocks = *gpuBlocks
	}
	if set["block-size"] || f.BlockSize == 0 {
		f.BlockSize = *blockSize
	}
	if set["max-num-batched-tokens"] {
		f.MaxNumBatchedTokens = *batched
	}
	if set["time-scale"] || f.TimeScale == 0 {
		f.TimeScale = *timeScale
	}
	f.EnginesimBin = *enginesim
	for _, d := range []struct {
		name string
		src  *time.Duration
		dst  **time.Duration
	}{{"prefill-base", prefillBase, &f.Timing.PrefillBase}, {"prefill-per-token", prefillPerToken, &f.Timing.PrefillPerToken},
		{"decode-base", decodeBase, &f.Timing.DecodeBase}, {"decode-per-seq", decodePerSeq, &f.Timing.DecodePerSeq},
		{"kv-term", kvTerm, &f.Timing.KVTerm}} {
		if set[d.name] {
			*d.dst = new(*d.src)
		}
	}
	w := &opts.Workload
	switch {
	case set["workload"]:
		w.Kind = *workload
	case *trace != "":
		w.Kind = bench.WorkloadTrace
	}
	w.Trace = bench.TraceOptions{Path: *trace, Speedup: *speedup, Limit: *limit, Text: *text}
	sp := &w.SharedPrefix
	ch := &w.Chat
	setInt := func(name string, v int, dst ...*int) {
		if set[name] {
			for _, d := range dst {
				*d = v
			}
		}
	}
	setInt("groups", *groups, &sp.NumGroups)
	setInt("prompts-per-group", *perGroup, &sp.PromptsPerGroup)
	setInt("system-len", *sysLen, &sp.SystemPromptLen, &ch.SystemPromptLen)
	setInt("question-len", *qLen, &sp.QuestionLen)
	setInt("output-len", *outLen, &sp.OutputLen, &ch.OutputLen)
	setInt("sessions", *sessions, &ch.Sessions)
	setInt("turns", *turns, &ch.Turns)
	if set["qps"] {
		sp.QPS = nil
		for _, s := range splitList(*qps) {
			v, err := strconv.ParseFloat(s, 64)
			if err != nil {
				return fmt.Errorf("bad -qps %q: %w", *qps, err)
			}
			sp.QPS = append(sp.QPS, v)
		}
	}
	if set["stage-duration"] {
		sp.StageDuration = *stageDur
	}
	if set["session-rate"] {
		ch.SessionRate = *sessionRate
	}
	ch.Tools = ch.Tools || *tools

	log, err := cli.NewLogger(*logLevel)
	if err != nil {
		return err
	}
	defer func() { _ = log.Sync() }()
	opts.Log = log
	if st, err := os.Stderr.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
		opts.Progress = os.Stderr
	}
	launch := launcher(*direct, *seed, log)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	var rep *bench.Report
	if sweep {
		var g bench.Grid
		if *gridFile != "" {
			if g, err = bench.LoadGrid(*gridFile); err != nil {
				return err
			}
		}
		if *base != "" {
			g.Base = *base
		}
		for _, s := range sets {
			if err := g.ParseSet(s); err != nil {
				return err
			}
		}
		rep, err = bench.Sweep(ctx, opts, g, *sweepDir, launch)
	} else {
		rep, err = bench.Run(ctx, opts, launch)
	}
	if rep == nil {
		return err
	}
	if terr := rep.WriteTable(os.Stdout); terr != nil {
		return terr
	}
	for _, p := range []string{*jsonOut, *htmlOut} {
		if p != "" {
			if merr := os.MkdirAll(filepath.Dir(p), 0o755); merr != nil {
				return fmt.Errorf("cannot create report directory: %w", merr)
			}
		}
	}
	if *jsonOut != "" {
		if jerr := rep.WriteJSON(*jsonOut); jerr != nil {
			return jerr
		}
		fmt.Printf("JSON: %s\n", *jsonOut)
	}
	if *htmlOut != "" {
		if herr := rep.WriteHTMLFile(*htmlOut); herr != nil {
			return herr
		}
		abs, _ := filepath.Abs(*htmlOut)
		fmt.Printf("report: %s\n", abs)
	}
	fmt.Printf("wall time %s\n", rep.Wall.Round(time.Second))
	if err == nil && *check != "" {
		results, cerr := rep.Check(*check, *checkBound, *checkLoad, *checkTput)
		if cerr != nil {
			return cerr
		}
		failed := 0
		for _, c := range results {
			verdict := "PASS"
			if !c.OK {
				verdict, failed = "FAIL", failed+1
			}
			fmt.Printf("%s  %s: %s\n", verdict, c.Name, c.Got)
		}
		if failed > 0 {
			return fmt.Errorf("%d acceptance checks failed for %s", failed, *check)
		}
	}
	return err
}

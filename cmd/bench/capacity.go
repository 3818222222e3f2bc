package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/omnious/provider-node/bench/compare"
	"github.com/omnious/provider-node/bench/proof"
	"github.com/omnious/provider-node/bench/rig"
	"github.com/omnious/provider-node/internal/cli"
)

// runCapacity is `bench capacity`: does a quote promise what the fleet
// serves within its objectives?
func runCapacity(args []string) error {
	fs := flag.NewFlagSet("bench capacity", flag.ContinueOnError)
	var o proof.Options
	def := proof.Options{}.WithDefaults()
	scenario := fs.String("scenario", compare.PresetDemo, "fleet and traffic: a preset ("+compare.PresetDemo+")")
	replicas := fs.Int("replicas", 0, "replicas (0: the scenario's)")
	trace := fs.String("trace", "", "drive a Mooncake-format trace's mix (its records in order, Poisson arrivals at each step's rate) instead of the scenario's shared-prefix traffic")
	// The proof's latencies are the client's, and the machine's own
	// overheads (gateway, EPP, scheduling) count time-scale times over in
	// model time: at 4, this 2-core machine's p95 ITL at 32 QPS read 41-57
	// ms against 28 ms at 1, so a faster proof measures the machine.
	timeScale := fs.Float64("time-scale", 1, "simulated replicas run this many times faster than real time (0: the scenario's)")
	blocks := fs.Int("num-gpu-blocks", 0, "KV blocks per simulated replica (0: the scenario's)")
	fleetMode := fs.String("fleet", "", "inproc, process or urls (empty: the scenario's)")
	urls := fs.String("urls", "", "comma-separated loopback OpenAI base URLs of running engines (implies -fleet urls): real time, no replica is stopped")
	model := fs.String("model", "", "served model name (empty: the scenario's, or for -urls the first model /v1/models lists)")
	var eng rig.EngineOptions
	endpointsFile := engineFlags(fs, &eng)
	var mix struct{ groups, perGroup, sysLen, qLen, outLen int }
	fs.IntVar(&mix.groups, "groups", 0, "shared-prefix: groups (0: the scenario's)")
	fs.IntVar(&mix.perGroup, "prompts-per-group", 0, "shared-prefix: prompts per group (0: the scenario's)")
	fs.IntVar(&mix.sysLen, "system-len", 0, "shared-prefix: system prompt tokens (0: the scenario's)")
	fs.IntVar(&mix.qLen, "question-len", 0, "shared-prefix: question tokens (0: the scenario's)")
	fs.IntVar(&mix.outLen, "output-len", 0, "shared-prefix: output tokens per request (0: the scenario's)")
	fs.BoolVar(&o.QuoteChecksOnly, "quote-checks-only", false, "after calibration, measure only the idle quote's checks at 0.50x, 1.00x and 1.25x: no true-capacity ladder, half-loaded check or streams ladder (each printed as skipped)")
	fs.DurationVar(&o.Objectives.TTFT, "slo-ttft-p95", def.Objectives.TTFT, "objective for p95 time to first token (model time)")
	fs.DurationVar(&o.Objectives.ITL, "slo-itl-p95", def.Objectives.ITL, "objective for p95 inter-token latency (model time)")
	fs.DurationVar(&o.StageDuration, "stage", def.StageDuration, "length of each measured step, model time")
	fs.Float64Var(&o.StartQPS, "start-qps", def.StartQPS, "first rate of the ladder (model time); it doubles until an objective breaks")
	fs.IntVar(&o.Refine, "refine", def.Refine, "bisection steps at the edge")
	o.Confirm = fs.Int("confirm", *def.Confirm, "rounds that measure the highest rate (and number of streams) held again once the bisection is done; a rung's verdict is then the majority of its steps, a step that breaks measured again too, and each check at 1.00x and 1.25x of the quote is measured until two of its steps agree (0: every rung and check once)")
	fs.BoolVar(&o.SkipCalibration, "skip-calibration", false, "do not run quoter calibrate first")
	fs.BoolVar(&o.RecordWindows, "record-windows", false, "write every scrape window the EPP's capacity curves learn from to DIR/windows.jsonl (needs -dir)")
	fs.StringVar(&o.Dir, "dir", "", "keep the calibration document, the quoter's state and the EPP's capacity snapshot at each quote (snapshot-N.json) in this directory (default: a temporary one, removed)")
	jsonOut := fs.String("json", "", "write the report as JSON to this file")
	htmlOut := fs.String("html", "", "write the report with its charts as HTML to this file")
	logLevel := fs.String("log-level", "warn", "debug, info, warn or error")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := cli.NonNegative(fs); err != nil {
		return fmt.Errorf("%s: %w", fs.Name(), err)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("bench capacity: unexpected arguments %v", fs.Args())
	}
	if o.RecordWindows && o.Dir == "" {
		return errors.New("bench capacity: -record-windows needs -dir")
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if *urls != "" || *endpointsFile != "" || *fleetMode == rig.FleetURLs {
		if err := externalFleetFlags(set, *fleetMode, *urls, *endpointsFile); err != nil {
			return err
		}
	} else if err := simulatedFleetFlags(set); err != nil {
		return fmt.Errorf("bench capacity: %w", err)
	}
	if *trace != "" {
		for _, n := range []string{"groups", "prompts-per-group", "system-len", "question-len", "output-len"} {
			if set[n] {
				return fmt.Errorf("bench capacity: -%s shapes the shared-prefix workload, not -trace", n)
			}
		}
	}
	base, err := compare.Preset(*scenario)
	if err != nil {
		return err
	}
	if *replicas > 0 {
		base.Fleet.Replicas = *replicas
	}
	if *timeScale > 0 {
		base.Fleet.TimeScale = *timeScale
	}
	if *blocks > 0 {
		base.Fleet.NumGPUBlocks = *blocks
	}
	if *fleetMode != "" {
		base.Fleet.Mode = *fleetMode
	}
	if *urls != "" {
		base.Fleet.Mode, base.Fleet.URLs = rig.FleetURLs, splitList(*urls)
	}
	if *endpointsFile != "" {
		base.Fleet.Mode, base.Fleet.EndpointsFile = rig.FleetURLs, *endpointsFile
	}
	base.Fleet.Engines = eng
	if *model != "" {
		base.Fleet.Model = *model
	}
	sp := &base.Workload.SharedPrefix
	for _, m := range []struct{ dst, v *int }{{&sp.NumGroups, &mix.groups}, {&sp.PromptsPerGroup, &mix.perGroup},
		{&sp.SystemPromptLen, &mix.sysLen}, {&sp.QuestionLen, &mix.qLen}, {&sp.OutputLen, &mix.outLen}} {
		if *m.v > 0 {
			*m.dst = *m.v
		}
	}
	if *trace != "" {
		base.Workload = rig.WorkloadOptions{Kind: rig.WorkloadTrace, Trace: rig.TraceOptions{Path: *trace}}
		base.Scenario = "trace mix " + filepath.Base(*trace)
	}
	o.Base = base.Options
	ctx, log, done, err := session(*logLevel)
	if err != nil {
		return err
	}
	defer done()
	o.Base.Log = log
	rep, err := proof.Run(ctx, o)
	if err != nil {
		return err
	}
	if *jsonOut != "" {
		if err := rep.WriteJSONFile(*jsonOut); err != nil {
			return err
		}
	}
	if *htmlOut != "" {
		if err := rep.WriteHTMLFile(*htmlOut); err != nil {
			return err
		}
	}
	return rep.WriteTable(os.Stdout)
}

// externalFleetFlags refuses, for a fleet of running engines (-urls or
// -fleet urls), what only applies to replicas the bench starts: they run
// in real time, their number is the URLs', their KV cache is their own
// (TestCapacityExternalFleetFlags).
func externalFleetFlags(set map[string]bool, mode, urls, endpointsFile string) error {
	if mode != "" && mode != rig.FleetURLs {
		return fmt.Errorf("bench capacity: -urls needs -fleet urls (or no -fleet), not %q", mode)
	}
	if urls == "" && endpointsFile == "" {
		return errors.New("bench capacity: -fleet urls needs -urls URL,URL or -endpoints-file FILE")
	}
	if urls != "" && endpointsFile != "" {
		return errors.New("bench capacity: -urls or -endpoints-file, not both")
	}
	for _, n := range []string{"replicas", "time-scale", "num-gpu-blocks"} {
		if set[n] {
			return fmt.Errorf("bench capacity: -%s applies to simulated replicas, not to -urls (running engines, in real time)", n)
		}
	}
	return nil
}

// engineFlags registers what the bench's EPPs are told of running engines
// (-urls, -endpoints-file) into eng and returns the endpoint file flag;
// bench capacity and bench compare share them.
func engineFlags(fs *flag.FlagSet, eng *rig.EngineOptions) *string {
	file := fs.String("endpoints-file", "", "running engines as the EPP's static endpoint file names them (discovery's format, deploy/config/endpoints.example.yaml: model, engine, kv_events_port, replay_port, metrics_port), loopback only; instead of -urls, and with their KV events (implies -fleet urls)")
	fs.StringVar(&eng.Tokenizer, "tokenizer", "", "running engines: the EPPs' prompt tokens: none (approximate routing, the default), standin (enginesim's) or a directory with the served model's tokenizer.json and tokenizer_config.json")
	fs.IntVar(&eng.BlockSize, "engine-block-size", 0, "running engines: their KV block size (0: read from their vllm:cache_config_info or sglang:cache_config_info metric)")
	fs.DurationVar(&eng.ScrapeTimeout, "scrape-timeout", 0, "running engines: the EPPs' bound on one metrics scrape (0: "+rig.ExternalScrapeTimeout.String()+")")
	return file
}

// simulatedFleetFlags refuses, for a fleet the bench starts, what only
// running engines are told.
func simulatedFleetFlags(set map[string]bool) error {
	for _, n := range []string{"tokenizer", "engine-block-size", "scrape-timeout"} {
		if set[n] {
			return fmt.Errorf("-%s applies to running engines (-urls, -endpoints-file), not to simulated replicas", n)
		}
	}
	return nil
}

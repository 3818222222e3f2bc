package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strconv"

	"github.com/omnious/provider-node/bench/load"
	"github.com/omnious/provider-node/internal/cli"
)

// loadFlags are the flags of bench load that do not map one to one onto
// load.Options, and those of the command itself.
type loadFlags struct {
	promptBytes, rates string
	noKV               bool
	maxGrowthMiB       float64
	checkRate          float64
	jsonOut, logLevel  string
	cpuProfile         string
}

func (f *loadFlags) register(fs *flag.FlagSet, o *load.Options) {
	fs.StringVar(&o.EPPBin, "epp", "bin/epp", "EPP binary, run as its own process")
	fs.BoolVar(&o.Floor, "floor", false, "run the ladder against a no-op ext_proc server (bench floor) in the EPP's place: the floor under the EPP's figures")
	fs.StringVar(&o.FloorBin, "floor-bin", "bin/bench", "with -floor: the bench binary that serves `bench floor`")
	fs.StringVar(&o.Policy, "policy", "precise", "scheduler policy")
	fs.StringVar(&o.Model, "model", "Qwen/Qwen3-32B", "served model name")
	fs.StringVar(&o.Tokenizer, "tokenizer", "standin", "EPP prompt tokens: standin, none (approximate routing) or a directory with the model's tokenizer.json")
	fs.BoolVar(&o.AllRates, "all-rates", false, "run every rate instead of stopping at the first over budget")
	fs.IntVar(&o.Replicas, "replicas", 4, "stub backends")
	fs.StringVar(&f.promptBytes, "prompt-bytes", "32k", "request body size (k = 1024): 32k is an 8k-token chat, 200k a long prompt")
	fs.IntVar(&o.Groups, "groups", 16, "system prompts the requests share")
	fs.Float64Var(&o.SharedFraction, "shared-fraction", 0.75, "share of the prompt that is the group's system prompt (with -shared-document, its document)")
	fs.BoolVar(&o.SharedDocument, "shared-document", false, "one user message per request: the group's shared document, then the unique question (instead of a system prompt and a user turn)")
	fs.BoolVar(&f.noKV, "no-kv-events", false, "do not publish the system prompts as KV blocks before the run")
	fs.IntVar(&o.PromptTokens, "prompt-tokens", 0, "size each prompt in the EPP's tokens instead of -prompt-bytes (default 0: use -prompt-bytes)")
	fs.BoolVar(&o.Unique, "unique", false, "no repeated prefixes: every prompt unique from its first token")
	fs.Float64Var(&o.EventRate, "event-rate", 0, "KV-event batches/s each stub publishes while requests flow, 16 blocks stored and freed each (default 0: none)")
	fs.DurationVar(&o.Idle, "idle", 0, "measure the EPP's CPU this long with the fleet connected and no traffic, before the ladder (default 0: not measured)")
	fs.StringVar(&f.rates, "rates", "", "offered requests/s ladder, comma-separated (default 250,500,1000,1500,2000,2500,3000,4000,5000)")
	fs.DurationVar(&o.Step, "step", 0, "measured time per rate (default 10s)")
	fs.DurationVar(&o.StepWarmup, "step-warmup", 0, "unmeasured time at each rate before measuring (default 2s)")
	fs.BoolVar(&o.HTTP, "http", false, "send requests over loopback HTTP to the test gateway and from it to the stubs (default: both in process; the ext_proc stream to the EPP is real gRPC either way)")
	fs.IntVar(&o.MaxInFlight, "max-in-flight", 512, "requests in flight at most; more are dropped and fail the step")
	fs.DurationVar(&o.BudgetP99, "budget-p99", 0, "largest p99 added latency within budget (default 2ms)")
	fs.Float64Var(&o.BudgetErrors, "budget-errors", 0, "largest error share within budget (default 0.001)")
	fs.Float64Var(&f.checkRate, "check-rate", 0, "exit 1 unless at least this many decisions/s are sustained within budget")
	fs.DurationVar(&o.Soak, "soak", 0, "instead of the ladder, hold -soak-rate this long and watch the EPP's memory")
	fs.Float64Var(&o.SoakRate, "soak-rate", 250, "soak: offered requests/s")
	fs.DurationVar(&o.SoakSample, "soak-sample", 0, "soak: memory sampling interval (default 5s)")
	fs.DurationVar(&o.SoakWarmup, "soak-warmup", 0, "soak: samples before this are not fitted (default 1m)")
	fs.Float64Var(&f.maxGrowthMiB, "soak-max-growth-mib", 32, "soak: largest fitted heap or RSS growth after the warm-up, MiB")
	fs.StringVar(&f.jsonOut, "json", "", "write the report as JSON to this file")
	fs.StringVar(&f.logLevel, "log-level", "error", "debug, info, warn or error")
	fs.StringVar(&f.cpuProfile, "cpuprofile", "", "write this process's CPU profile (load generator, test gateway, stubs) to this file")
}

// apply sets the options the flags give in another form.
func (f *loadFlags) apply(o *load.Options) error {
	n, err := parseBytes(f.promptBytes)
	if err != nil {
		return fmt.Errorf("bad -prompt-bytes: %w", err)
	}
	o.PromptBytes = n
	o.NoKVEvents = f.noKV
	o.SoakMaxGrowth = int64(f.maxGrowthMiB * (1 << 20))
	for _, s := range splitList(f.rates) {
		v, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return fmt.Errorf("bad -rates %q: %w", f.rates, err)
		}
		o.Rates = append(o.Rates, v)
	}
	return nil
}

// runLoad is `bench load` (bench/load): the EPP's decision throughput and
// added latency on a rate ladder, or a memory soak at one rate (-soak).
func runLoad(args []string) error {
	fs := flag.NewFlagSet("bench load", flag.ContinueOnError)
	var o load.Options
	var f loadFlags
	f.register(fs, &o)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := cli.NonNegative(fs); err != nil {
		return fmt.Errorf("%s: %w", fs.Name(), err)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("bench load: unexpected arguments %v", fs.Args())
	}
	if err := f.apply(&o); err != nil {
		return err
	}
	ctx, log, done, err := session(f.logLevel)
	if err != nil {
		return err
	}
	defer done()
	o.Log = log
	o.Progress = os.Stderr
	if f.cpuProfile != "" {
		stop, err := startCPUProfile(f.cpuProfile)
		if err != nil {
			return err
		}
		defer stop()
	}
	rep, err := load.Run(ctx, o)
	if rep != nil {
		if werr := f.write(rep); werr != nil {
			return errors.Join(err, werr)
		}
	}
	if err != nil {
		return err
	}
	return f.verdict(rep)
}

func startCPUProfile(path string) (stop func(), err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("cannot create the CPU profile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("cannot start the CPU profile: %w", err)
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}

// write prints the report and writes its JSON where asked.
func (f *loadFlags) write(rep *load.Report) error {
	if err := rep.WriteTable(os.Stdout); err != nil {
		return err
	}
	if f.jsonOut == "" {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(f.jsonOut), 0o755); err != nil {
		return fmt.Errorf("cannot create report directory: %w", err)
	}
	return rep.WriteJSON(f.jsonOut)
}

// verdict fails a failed soak, or a ladder below -check-rate.
func (f *loadFlags) verdict(rep *load.Report) error {
	if rep.Soak != nil && !rep.Soak.Pass {
		return fmt.Errorf("soak failed: %s", rep.Soak.Why)
	}
	if f.checkRate > 0 && (rep.Sustained == nil || rep.Sustained.Decisions < f.checkRate) {
		return fmt.Errorf("sustained rate below -check-rate %.0f/s", f.checkRate)
	}
	return nil
}

// parseBytes reads a byte count with an optional k or m suffix (binary).
func parseBytes(s string) (int, error) {
	mult := 1
	switch {
	case len(s) > 1 && (s[len(s)-1] == 'k' || s[len(s)-1] == 'K'):
		mult, s = 1<<10, s[:len(s)-1]
	case len(s) > 1 && (s[len(s)-1] == 'm' || s[len(s)-1] == 'M'):
		mult, s = 1<<20, s[:len(s)-1]
	}
	n, err := strconv.Atoi(s)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("%q is not a positive byte count", s)
	}
	return n * mult, nil
}

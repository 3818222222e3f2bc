// Package load owns the EPP-alone load bench (bench load): bin/epp as its
// own process behind the test gateway, in front of stub backends that cost
// microseconds, driven open-loop on a rate ladder (decisions/s, the EPP's
// CPU per decision, added latency) or held at one rate for a memory soak;
// with Floor, the no-op ext_proc server (ServeFloor, run as `bench floor`)
// stands in for the EPP to measure the floor under its figures.
//
// It starts the EPP through bench/internal/launch and reads it over its
// metrics and admin ports. It imports the EPP's prompt path (extproc,
// engines/tokenizer) to size the workload's tokens as the EPP sees them,
// extproc's gRPC server options for the floor server, and the test
// gateway's configuration (extproc/testgw).
package load

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/omnious/provider-node/bench/internal/launch"
	"github.com/omnious/provider-node/bench/internal/loopback"
	"github.com/omnious/provider-node/endpoint"
	"github.com/omnious/provider-node/extproc/testgw"
	"github.com/omnious/provider-node/internal/opt"
)

// Options configure `bench load`: the EPP (bin/epp as its own process,
// precise policy, stand-in tokenizer, a static endpoint file) behind the
// test gateway, in front of cheap stub backends, driven open-loop at
// increasing request rates until a budget breaks, or held at one rate for a
// soak. Zero values take the defaults (WithDefaults).
type Options struct {
	// EPPBin is the EPP binary. Default "bin/epp".
	EPPBin string
	// Floor runs `FloorBin floor`, a no-op ext_proc server that answers
	// message for message as the EPP does (testgw.Floor), in the EPP's
	// place: the same ladder then measures what gRPC, the harness and the
	// machine cost alone, the floor under the EPP's figures. FloorBin
	// defaults to "bin/bench". No soak, no KV events.
	Floor    bool
	FloorBin string
	// Policy is the scheduler policy. Default "precise".
	Policy string
	// Model is the served model name. Default "Qwen/Qwen3-32B".
	Model string
	// Tokenizer is how the EPP gets prompt tokens: "standin" (the engine
	// simulator's tokenizer, the default), a directory holding the model's
	// tokenizer.json and tokenizer_config.json (a real BPE tokenizer and
	// chat template, as in production), or "none" (no tokenizer: every
	// request is routed in approximate mode).
	Tokenizer string
	// AllRates runs every rate of the ladder instead of stopping at the
	// first one over budget, to map the whole curve.
	AllRates bool
	// Replicas is how many stub backends. Default 4.
	Replicas int
	// PromptBytes is the size of each request body. Default 32 KiB (an
	// 8k-token chat with the stand-in tokenizer, about 4 bytes a token).
	PromptBytes int
	// Groups is how many system prompts the requests share; each request
	// is its group's system prompt (SharedFraction of the body) plus a
	// unique user turn. Default 16.
	Groups int
	// SharedFraction is the share of the prompt that is the group's system
	// prompt (with SharedDocument, its document). Default 0.75.
	SharedFraction float64
	// SharedDocument puts the shared text and the unique question in one
	// user message, the group's document first (RAG, code review, long
	// instructions), instead of a system prompt and a user turn: the EPP's
	// prefix cache can then reuse it only by cutting inside the message.
	SharedDocument bool
	// NoKVEvents skips the index warm-up: by default each stub publishes
	// its groups' system prompts as stored KV blocks before the run, so
	// that the index holds what a warm fleet's would.
	NoKVEvents bool
	// Unique makes every prompt unique from its first token: no system
	// prompt or document is shared (Groups and SharedFraction then only
	// vary the text), the case of a pool with no repeated prefixes.
	Unique bool
	// PromptTokens, when set, sizes the prompt in the tokens the EPP sees
	// (the tokenizer's; 4 bytes a token with "none") instead of
	// PromptBytes.
	PromptTokens int
	// EventRate is the KV-event batches a second each stub publishes
	// while requests flow (16 blocks stored and as many freed a batch, as
	// a busy engine's steps; 20 is an engine stepping every 50 ms).
	// Default 0: none beyond the warm-up.
	EventRate float64
	// Idle, when set, measures the EPP's CPU this long with the fleet
	// connected (scraped, subscribed) and no traffic, before the ladder.
	// Default 0: not measured.
	Idle time.Duration
	// Rates is the ladder of offered requests per second.
	Rates []float64
	// Step is how long each rate is measured, after StepWarmup at that
	// rate. Defaults 10s and 2s.
	Step, StepWarmup time.Duration
	// MaxInFlight bounds the requests in flight; a request that would pass
	// it is not sent and counted as dropped (the step then fails). Default
	// 512.
	MaxInFlight int
	// Timeout bounds one request. Default 10s.
	Timeout time.Duration
	// HTTP sends every request over loopback HTTP to the test gateway, and
	// from it to the stubs. By default the load generator calls the
	// gateway in process and the stubs answer it in process, so the
	// machine's CPU goes to the ext_proc exchange being measured (a real
	// gRPC stream to the EPP process either way), as it would with Envoy
	// and clients on other cores.
	HTTP bool
	// BudgetP99 is the largest p99 added latency a step may have, and
	// BudgetErrors the largest error share. Defaults 2ms and 0.001. A step
	// also fails when it delivers under 95% of its offered rate.
	BudgetP99    time.Duration
	BudgetErrors float64

	// Soak, when set, replaces the ladder: SoakRate is held for Soak while
	// the EPP's heap and RSS are sampled every SoakSample; after
	// SoakWarmup, the linear-fit growth over the rest of the run must stay
	// under SoakMaxGrowth bytes for both (fitted on the series' floor,
	// see MemTrend). Defaults 250/s, 5s, 1m, 32 MiB.
	Soak          time.Duration
	SoakRate      float64
	SoakSample    time.Duration
	SoakWarmup    time.Duration
	SoakMaxGrowth int64

	// Dir holds the EPP's config, endpoint file and log. Default: a new
	// temporary directory, removed afterwards.
	Dir      string
	Log      *zap.Logger
	Progress io.Writer
}

// DefaultRates is the default ladder.
func DefaultRates() []float64 {
	return []float64{250, 500, 1000, 1500, 2000, 2500, 3000, 4000, 5000}
}

// WithDefaults fills every unset field.
func (o Options) WithDefaults() Options {
	def := func(s *string, v string) {
		if *s == "" {
			*s = v
		}
	}
	def(&o.EPPBin, "bin/epp")
	def(&o.FloorBin, "bin/bench")
	def(&o.Policy, "precise")
	def(&o.Model, "Qwen/Qwen3-32B")
	def(&o.Tokenizer, "standin")
	defInt := func(p *int, v int) {
		if *p == 0 {
			*p = v
		}
	}
	defInt(&o.Replicas, 4)
	defInt(&o.PromptBytes, 32<<10)
	defInt(&o.Groups, 16)
	defInt(&o.MaxInFlight, 512)
	defDur := func(p *time.Duration, v time.Duration) {
		if *p == 0 {
			*p = v
		}
	}
	defDur(&o.Step, 10*time.Second)
	defDur(&o.StepWarmup, 2*time.Second)
	defDur(&o.Timeout, 10*time.Second)
	defDur(&o.BudgetP99, 2*time.Millisecond)
	defDur(&o.SoakSample, 5*time.Second)
	defDur(&o.SoakWarmup, time.Minute)
	if o.SharedFraction == 0 {
		o.SharedFraction = 0.75
	}
	if len(o.Rates) == 0 {
		o.Rates = DefaultRates()
	}
	if o.BudgetErrors == 0 {
		o.BudgetErrors = 0.001
	}
	if o.SoakRate == 0 {
		o.SoakRate = 250
	}
	if o.SoakMaxGrowth == 0 {
		o.SoakMaxGrowth = 32 << 20
	}
	if o.Log == nil {
		o.Log = zap.NewNop()
	}
	return o
}

// Validate reports options that cannot work.
func (o Options) Validate() error {
	var errs []error
	// Named by the flags of `bench load` that set them.
	errs = append(errs, opt.DefaultNonNegative("-replicas", o.Replicas, 4),
		opt.DefaultNonNegative("-groups", o.Groups, 16),
		opt.DefaultNonNegative("-max-in-flight", o.MaxInFlight, 512),
		opt.DefaultNonNegative("-step", o.Step, 10*time.Second),
		opt.DefaultNonNegative("-step-warmup", o.StepWarmup, 2*time.Second),
		opt.DefaultNonNegative("Timeout", o.Timeout, 10*time.Second),
		opt.DefaultNonNegative("-budget-p99", o.BudgetP99, 2*time.Millisecond),
		opt.DefaultNonNegative("-budget-errors", o.BudgetErrors, 0.001),
		opt.NonNegative("-soak", o.Soak), opt.NonNegative("-prompt-tokens", o.PromptTokens),
		opt.NonNegative("-event-rate", o.EventRate), opt.NonNegative("-idle", o.Idle))
	if o.PromptBytes < 1024 && o.PromptTokens == 0 {
		errs = append(errs, fmt.Errorf("prompt bytes %d: want at least 1024", o.PromptBytes))
	}
	if o.SharedFraction < 0 || o.SharedFraction >= 1 {
		errs = append(errs, fmt.Errorf("shared fraction %v: want [0, 1)", o.SharedFraction))
	}
	for _, r := range o.Rates {
		if !(r > 0) {
			errs = append(errs, fmt.Errorf("rate %v: want > 0", r))
		}
	}
	if o.Floor && o.Soak > 0 {
		errs = append(errs, errors.New("floor: no soak (the no-op server has no memory to watch)"))
	}
	if o.Soak > 0 && (!(o.SoakRate > 0) || o.SoakSample <= 0 || o.SoakWarmup < 0 || o.SoakWarmup >= o.Soak) {
		errs = append(errs, errors.New("soak: want a positive rate and sample interval, and a warm-up shorter than the soak"))
	}
	return errors.Join(errs...)
}

// Run starts the stubs, the EPP process and the gateway, runs the ladder
// (or the soak) and stops everything.
func Run(ctx context.Context, o Options) (rep *Report, err error) {
	o = o.WithDefaults()
	if err := o.Validate(); err != nil {
		return nil, fmt.Errorf("bad load options: %w", err)
	}
	dir := o.Dir
	if dir == "" {
		if dir, err = os.MkdirTemp("", "bench-load-"); err != nil {
			return nil, fmt.Errorf("cannot create a work directory: %w", err)
		}
		defer os.RemoveAll(dir)
	}
	w, err := newWorkload(o)
	if err != nil {
		return nil, err
	}
	var stubs []*stub
	defer func() {
		for _, s := range stubs {
			err = errors.Join(err, s.Close())
		}
	}()
	for range o.Replicas {
		s, serr := startStub(o.Model, w.tokens, !o.NoKVEvents || o.EventRate > 0, o.Log)
		if serr != nil {
			return nil, serr
		}
		stubs = append(stubs, s)
	}
	epp, err := startEPP(ctx, o, dir, stubs)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, epp.Stop()) }()

	l := &loader{o: o, w: w, epp: epp}
	gwCfg := testgw.Config{EPP: epp.GRPCAddr(), OnExchange: l.onExchange}
	if !o.HTTP {
		gwCfg.Upstream = newStubUpstream(stubs)
	}
	gw, err := launch.StartGateway(gwCfg, o.Log)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, gw.Close()) }()
	l.url = gw.URL() + "/v1/chat/completions"
	if o.HTTP {
		l.http = loopback.Client(o.Timeout)
		defer l.http.CloseIdleConnections()
	} else {
		l.gw = gw
	}

	rep = &Report{Floor: o.Floor, Policy: o.Policy, Tokenizer: o.Tokenizer, Replicas: o.Replicas, PromptBytes: w.bytes, PromptTokens: w.tokens,
		Unique: o.Unique, EventRate: o.EventRate, CPUs: runtime.NumCPU(), BudgetP99: ms(o.BudgetP99)}
	if !o.Floor && !o.NoKVEvents && len(w.system) > 0 {
		if rep.IndexBlocks, err = l.warmIndex(ctx, stubs); err != nil {
			return rep, err
		}
	}
	if o.Idle > 0 && !o.Floor {
		if rep.IdleCores, err = l.idle(ctx, o.Idle); err != nil {
			return rep, err
		}
		l.progress("idle, %d replicas connected: EPP %.3f cores\n", o.Replicas, rep.IdleCores)
	}
	if o.EventRate > 0 && !o.Floor {
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for i, s := range stubs {
			wg.Add(1)
			phase := time.Duration(float64(time.Second) / o.EventRate * float64(i) / float64(len(stubs)))
			go func() { defer wg.Done(); s.churn(o.EventRate, phase, uint64(i+1), stop) }()
		}
		defer func() { close(stop); wg.Wait() }()
	}
	// A first pass over every group, so speculative state and connection
	// pools are warm before anything is measured.
	if _, err := l.step(ctx, math.Min(o.Rates[0], 100), time.Duration(0), time.Second); err != nil {
		return rep, err
	}
	if o.Soak > 0 {
		rep.Soak, err = l.soak(ctx)
	} else {
		for _, rate := range o.Rates {
			st, serr := l.step(ctx, rate, o.StepWarmup, o.Step)
			if serr != nil {
				return rep, serr
			}
			rep.Steps = append(rep.Steps, st)
			l.progress("rate %6.0f/s: %7.1f decisions/s, EPP %.2f cores (%.4f per req/s), %6.0f decisions/EPP-CPU-s, added p50 %.3f ms p99 %.3f ms (EPP's own %.3f / %.3f), KV apply lag p99 %.1f ms, errors %d, dropped %d %s\n",
				rate, st.Decisions, st.EPPCores, st.CoresPerReq, st.PerEPPCore, st.AddedP50, st.AddedP99, st.RouteP50, st.RouteP99, st.ApplyLagP99, st.Errors, st.Dropped, st.Why)
			if !st.Pass {
				if o.AllRates {
					continue
				}
				break
			}
			if rep.Sustained == nil || st.Decisions > rep.Sustained.Decisions {
				s := st
				rep.Sustained = &s
			}
		}
	}
	rep.ClientOK = int(l.okTotal.Load())
	if o.Floor {
		return rep, nil
	}
	if rep.PeakRSS, err = epp.PeakRSS(); err != nil {
		return rep, err
	}
	if rep.EPPDecisions, err = counter(ctx, epp, "inference_objective_request_total"); err != nil {
		return rep, err
	}
	return rep, nil
}

// startEPP runs bin/epp in front of the stubs and waits until it has
// scraped each, or the floor server in its place.
func startEPP(ctx context.Context, o Options, dir string, stubs []*stub) (*launch.EPP, error) {
	if o.Floor {
		dests := make([]string, len(stubs))
		for i, s := range stubs {
			dests[i] = s.Addr()
		}
		return launch.StartFloor(ctx, o.FloorBin, dir, dests)
	}
	eps := make([]endpoint.Endpoint, len(stubs))
	for i, s := range stubs {
		eps[i] = s.endpoint()
		eps[i].Model, eps[i].Engine = o.Model, "vllm"
	}
	sc, err := launch.Tuning{Policy: o.Policy}.Config()
	if err != nil {
		return nil, fmt.Errorf("invalid scheduler config: %w", err)
	}
	// With a tokenizer requests carry exact prompt tokens and the policy
	// works on the index.
	e, err := launch.StartProcess(launch.ProcessConfig{Spec: launch.Spec{Scheduler: sc, Endpoints: eps, Tokenizer: o.Tokenizer,
		DrainTimeout: 2 * time.Second}, Bin: o.EPPBin, Dir: dir})
	if err != nil {
		return nil, err
	}
	if _, err := e.WaitReady(ctx, len(stubs)); err != nil {
		_ = e.Stop()
		return nil, err
	}
	return e, nil
}

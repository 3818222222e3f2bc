// Package proof is the capacity proof (bench capacity): on the rig
// (bench/rig) it finds a fleet's true capacity within its objectives by a
// ladder of rates and of streams held open, reads the quoter's quotes
// (idle, half loaded, after a replica is lost) and offers their load back
// to the fleet, and reports whether each quote promised what the fleet
// served (Report.Verdicts), as a table, JSON and HTML with charts. With
// RecordWindows it records every scrape window the EPP's capacity curves
// learnt from; ReadWindows reads such a recording back (bench windows):
// what the engines did at each load, and the curves replayed up to a
// quote.
package proof

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/big"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/ethereum/go-ethereum/crypto"
	"go.uber.org/zap"
	"go.yaml.in/yaml/v3"

	"github.com/omnious/provider-node/bench/internal/launch"
	"github.com/omnious/provider-node/bench/internal/stat"
	"github.com/omnious/provider-node/bench/rig"
	"github.com/omnious/provider-node/capacity"
	"github.com/omnious/provider-node/internal/isotonic"
	"github.com/omnious/provider-node/internal/opt"
	"github.com/omnious/provider-node/quoter"
	"github.com/omnious/provider-node/quoter/calibration"
)

// Options is one capacity proof: does a quote promise what the
// fleet serves within its objectives? Base gives the fleet and the traffic
// (a shared-prefix workload, whose QPS ladder the proof replaces by its
// own); the EPP runs the precise policy.
type Options struct {
	Base rig.Options
	// Objectives are the quoter's SLOs. Zero fields default to
	// capacity.DefaultObjectives'; a negative one is refused (Validate).
	Objectives capacity.Objectives
	// StageDuration is each measured step, in model time. Default 40s,
	// with which the demo fleet's proof at time scale 1 met every target
	// (at time scale 4, steps shorter than 80 s had left one rate's p95
	// ITL 20% apart between runs).
	StageDuration time.Duration
	// StartQPS is the ladder's first rate (model time); it doubles until a
	// step breaks an objective, then Refine bisection steps narrow the
	// edge. Defaults 2 and 4.
	StartQPS float64
	Refine   int
	// Confirm is how many times, once the bisection is done, the highest
	// rate (or number of streams) held is measured again (with a third
	// step if the two disagree; where its majority breaks, the next one
	// held below it is, after one more bisection step). With Confirm above
	// 0, a step that breaks is also measured again, and a third time if
	// the two disagree. A rung's verdict is then its majority's: a 40 s
	// step near the edge forms its queue or does not by chance. So is the
	// verdict of each check at 1.00x and 1.25x of the idle quote, measured
	// until two of its steps agree. Default 2; 0 measures every rung and
	// check once.
	Confirm *int
	// SkipCalibration leaves out `quoter calibrate` (run by default before
	// anything else, with the workload's mix; the quoter is given its
	// document).
	SkipCalibration bool
	// Dir receives the calibration document, the quoter's state and the
	// EPP's capacity snapshot at each quote (snapshot-N.json, the curves
	// the quote was read from). Default: a temporary directory, removed.
	Dir string
	// RecordWindows writes every scrape window the EPP's capacity curves
	// learn from to Dir/windows.jsonl, with a mark at each snapshot, so
	// that what a quote was read from can be replayed.
	RecordWindows bool
	// QuoteChecksOnly measures only the idle quote's checks (0.50x, 1.00x
	// and 1.25x of its rate as arrivals, 1.00x and 1.25x of its
	// concurrency as streams) after calibration: no ladder for the true
	// capacity, no half-loaded check (it offers half the true capacity)
	// and no streams ladder, each named in Report.Skipped. For a fleet of
	// real engines, where each of the ladders' tens of steps takes a stage
	// and a drain in real time (TestCapacityURLFleet).
	QuoteChecksOnly bool
}

// Step is one measured load: client-side latencies in model time.
type Step struct {
	Label string  `json:"label"`
	QPS   float64 `json:"qps"`
	// Streams is a closed loop's requests kept in flight (closedStep); 0
	// for a step of arrivals at QPS.
	Streams     int     `json:"streams,omitempty"`
	Requests    int     `json:"requests"`
	Errors      int     `json:"errors"`
	TTFTP95ms   float64 `json:"ttft_p95_ms"`
	ITLP95ms    float64 `json:"itl_p95_ms"`
	OutputTokPS float64 `json:"output_tok_per_s"`
	// Concurrency is the mean number of requests in flight (Little's law:
	// the requests' summed latency over the step).
	Concurrency float64 `json:"concurrency"`
	// Running and Waiting are the engines' running and waiting requests,
	// summed over the fleet and averaged over the EPP's scrapes in the
	// measured part: what the quote's concurrency counts, without the
	// requests still on their way in or out.
	Running float64 `json:"running"`
	Waiting float64 `json:"waiting"`
	// PrefixHitRate is the engines' prefix-cache hits over the prompt
	// tokens they were asked for, over the same scrapes, weighted by
	// prompt tokens: on a mix of long shared prompts, how much of each
	// prompt the fleet found cached and so how much prefill the step cost.
	PrefixHitRate float64 `json:"prefix_hit_rate"`
	Within        bool    `json:"within"`
}

// Quote is a quote the proof read, in model time.
type Quote struct {
	Label       string  `json:"label"`
	TokensPerS  float64 `json:"tokens_per_s"`
	Concurrency float64 `json:"concurrency"`
	// Replicas is how many replicas the quote counted capacity for.
	Replicas int `json:"replicas"`
	// CapacityTokensPerS, CapacityConcurrency (arrivals' in flight at that
	// rate) and CapacityStreams (requests held open) are the pool's
	// capacity the headroom was taken from, BusyTokensPerS and Busy its
	// load then.
	CapacityTokensPerS  float64 `json:"capacity_tokens_per_s"`
	CapacityConcurrency float64 `json:"capacity_concurrency"`
	CapacityStreams     float64 `json:"capacity_streams"`
	BusyTokensPerS      float64 `json:"busy_tokens_per_s"`
	Busy                float64 `json:"busy"`
	// PerReplica is each replica's curve read at the objectives (wall
	// time), where it came from and what bounds it.
	PerReplica []quoter.ReplicaAssessment `json:"per_replica"`
}

// Report is the proof's result.
type Report struct {
	Scenario   string                  `json:"scenario"`
	Objectives capacity.ObjectivesJSON `json:"objectives"`
	Replicas   int                     `json:"replicas"`
	// Calibration is the calibrated capacity of one replica, if run.
	Calibration *capacity.AtObjectives `json:"calibration,omitempty"`
	// Ladder is the search for the true capacity; True its highest step
	// within the objectives.
	Ladder []Step `json:"ladder"`
	True   Step   `json:"true"`
	// StreamsLadder is the search for the most streams a closed loop keeps
	// open within the objectives (streamsLadder); TrueStreams that number,
	// read where the fit of its steps crosses the objectives.
	StreamsLadder []Step  `json:"streams_ladder"`
	TrueStreams   float64 `json:"true_streams"`
	// Quotes and Checks are the quotes read and the loads offered at them.
	Quotes []Quote `json:"quotes"`
	Checks []Step  `json:"checks"`
	// Skipped names each part of the proof not run, with why.
	Skipped []string `json:"skipped,omitempty"`
	// HalfLoad is the background of the half-loaded check's first trial,
	// the one its quote was read under.
	HalfLoad Step `json:"half_load"`
	// HalfLoadAtQuote is the background's output tokens per second over
	// the capacity.RateSpan before the half-loaded quote, by the client's
	// count: the load that quote subtracts, which a bursty mix moves away
	// from the step's mean (and, before a trace step walked the trace
	// from ten places at once, a trace's drifting mix did: 1.39 times the
	// mean on the Mooncake trace).
	HalfLoadAtQuote float64 `json:"half_load_at_quote_tok_per_s"`
}

// WithDefaults fills unset fields.
func (o Options) WithDefaults() Options {
	o.Base = o.Base.WithDefaults()
	o.Objectives = o.Objectives.WithDefaults()
	opt.Zero(&o.StageDuration, defaults.StageDuration)
	opt.Zero(&o.StartQPS, defaults.StartQPS)
	opt.Zero(&o.Refine, defaults.Refine)
	o.Confirm = opt.Or(o.Confirm, *defaults.Confirm)
	return o
}

// defaults are Options' own defaults, written once: WithDefaults fills them
// and Validate's messages quote them.
var defaults = Options{StageDuration: 40 * time.Second, StartQPS: 2, Refine: 4, Confirm: new(2)}

// Validate refuses defaulted options with a negative setting, named by its
// bench capacity flag, or objectives at a quantile outside (0, 1).
func (o Options) Validate() error {
	var errs []error
	if err := o.Objectives.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("objectives: %w", err))
	}
	if o.Base.Fleet.Mode == rig.FleetURLs {
		errs = append(errs, o.Base.Fleet.Engines.Validate())
	}
	return errors.Join(append(errs,
		opt.DefaultNonNegative("-stage", o.StageDuration, defaults.StageDuration),
		opt.DefaultNonNegative("-start-qps", o.StartQPS, defaults.StartQPS),
		opt.DefaultNonNegative("-refine", o.Refine, defaults.Refine),
		opt.NonNegative("-confirm", *o.Confirm))...)
}

// capacityRun is the fleet, EPP and quoter of one proof.
type capacityRun struct {
	o    Options
	f    *rig.Fleet
	t    *rig.EPPTarget
	c    *rig.Client
	q    *quoter.Service
	log  *zap.Logger
	dir  string
	seed atomic.Int64
	rep  *Report
	// outLen is the mean output length; trace, for a trace workload, its
	// records, in time order.
	outLen float64
	trace  []rig.TraceRecord
	// traceRounds is how many rounds of the trace's walks the steps have
	// taken (traceStep).
	traceRounds atomic.Int64
	// windows, when set, records the curves' windows (RecordWindows).
	windows *windowRecorder
	// probe and streamProbe, when set, measure a ladder step in place of
	// the fleet.
	probe       func(label string, qps float64) Step
	streamProbe func(n int) Step
}

// Run runs the proof: the true capacity by a ladder of rates, the
// quote on the idle fleet and its rate as arrivals (1x and 1.25x), the
// same with the fleet half loaded, the idle quote's concurrency as
// streams held open (1x and 1.25x) and the most streams the fleet holds
// by a ladder of them, and the quote after one replica is lost.
func Run(ctx context.Context, o Options) (*Report, error) {
	o = o.WithDefaults()
	if err := o.Validate(); err != nil {
		return nil, fmt.Errorf("invalid capacity proof options: %w", err)
	}
	var trace []rig.TraceRecord
	switch o.Base.Workload.Kind {
	case rig.WorkloadSharedPrefix:
	case rig.WorkloadTrace:
		recs, err := rig.ReadTrace(o.Base.Workload.Trace.Path)
		if err != nil {
			return nil, err
		}
		if len(recs) == 0 {
			return nil, fmt.Errorf("trace %s has no records", o.Base.Workload.Trace.Path)
		}
		sort.SliceStable(recs, func(i, j int) bool { return recs[i].Timestamp < recs[j].Timestamp })
		trace = recs
	default:
		return nil, fmt.Errorf("the capacity proof drives a shared-prefix or trace workload, not %q", o.Base.Workload.Kind)
	}
	log := o.Base.Log
	dir := o.Dir
	if dir == "" {
		d, err := os.MkdirTemp("", "bench-capacity-")
		if err != nil {
			return nil, fmt.Errorf("cannot make a work directory: %w", err)
		}
		defer os.RemoveAll(d)
		dir = d
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("cannot make the work directory: %w", err)
	}
	sp := o.Base.Workload.SharedPrefix
	maxLen := sp.SystemPromptLen + sp.QuestionLen + sp.OutputLen
	outLen := float64(sp.OutputLen)
	if trace != nil {
		maxLen, outLen = 0, 0
		for _, t := range trace {
			maxLen = max(maxLen, t.InputLength+t.OutputLength)
			outLen += float64(t.OutputLength)
		}
		outLen /= float64(len(trace))
	}
	r := &capacityRun{o: o, log: log, dir: dir, outLen: outLen, trace: trace,
		rep: &Report{Scenario: o.Base.Scenario, Replicas: o.Base.Fleet.Replicas,
			Objectives: capacity.ObjectivesJSON{TTFTSeconds: o.Objectives.TTFT.Seconds(), ITLSeconds: o.Objectives.ITL.Seconds(),
				Quantile: o.Objectives.Quantile}}}
	f, err := rig.StartFleet(ctx, o.Base.Fleet, o.Base.Seed, maxLen, log)
	if err != nil {
		return nil, fmt.Errorf("cannot start fleet: %w", err)
	}
	defer func() { _ = f.Stop() }()
	r.seed.Store(o.Base.Seed)
	r.f = f
	var onWindow func(string, capacity.Window)
	if o.RecordWindows {
		rec, err := newWindowRecorder(filepath.Join(dir, "windows.jsonl"))
		if err != nil {
			return nil, err
		}
		defer func() {
			if cerr := rec.Close(); cerr != nil {
				log.Warn("windows not recorded whole", zap.Error(cerr))
			}
		}()
		r.windows, onWindow = rec, rec.window
	}
	var target *rig.EPPTarget
	if o.Base.Fleet.Mode == rig.FleetURLs {
		r.rep.Replicas = len(f.Endpoints()) // an endpoint file's count
		eng, err := o.Base.Fleet.Engines.Resolve(ctx, f.Endpoints())
		if err != nil {
			return nil, err
		}
		policy, err := externalPolicy(dir, eng)
		if err != nil {
			return nil, err
		}
		target, err = rig.StartEPPsOn(ctx, log, policy, f.Endpoints(), eng, 1, onWindow)
		if err != nil {
			return nil, err
		}
	} else if target, err = rig.StartEPPs(ctx, log, "precise", f.Endpoints(), 1, onWindow); err != nil {
		return nil, err
	}
	defer func() { _ = target.Close() }()
	r.t = target
	r.c = rig.NewClient(r.t.URL(), f.Endpoints()[0].Model)
	defer r.c.Close()

	calFile := ""
	if !o.SkipCalibration {
		cal, err := r.calibrate(ctx, f.Endpoints()[0].Model)
		if err != nil {
			return nil, fmt.Errorf("calibration: %w", err)
		}
		if at, err := cal.Curve.At(o.Objectives); err == nil {
			r.rep.Calibration = &at
		}
		calFile = filepath.Join(dir, "calibration.json")
		w, err := os.Create(calFile)
		if err != nil {
			return nil, err
		}
		err = errors.Join(cal.Write(w), w.Close())
		if err != nil {
			return nil, err
		}
	}
	if r.q, err = r.startQuoter(dir, calFile, f.Endpoints()[0].Model); err != nil {
		return nil, err
	}
	if !o.SkipCalibration {
		r.quiet(ctx)
		if _, err := r.quote(ctx, "idle, after calibration"); err != nil {
			return nil, err
		}
	}

	if o.QuoteChecksOnly {
		r.skip("true capacity (ladder of rates), half-loaded check and streams ladder: -quote-checks-only")
	} else if err := r.ladder(ctx); err != nil {
		return nil, err
	}
	// Idle: the quote, then exactly its load and 1.25 times it.
	r.quiet(ctx)
	idle, err := r.quote(ctx, "idle")
	if err != nil {
		return nil, err
	}
	r.rep.Checks = append(r.rep.Checks, r.step(ctx, "0.50x idle quote", r.qpsOf(idle.TokensPerS/2), 0))
	for _, k := range []float64{1, 1.25} {
		r.check(ctx, func() Step {
			r.idle(ctx)
			return r.step(ctx, fmt.Sprintf("%.2fx idle quote", k), r.qpsOf(idle.TokensPerS*k), 0)
		})
	}
	if !o.QuoteChecksOnly {
		if err := r.halfLoaded(ctx); err != nil {
			return nil, err
		}
	}

	// The idle quote's concurrency, held by a client keeping that many
	// streams open, and the most streams the fleet holds. Closed loops run
	// after every quote whose rate is checked with arrivals: they never
	// bunch, and curves learnt from them read more tokens/s than arrivals
	// from many clients are served (a Mooncake proof quoted 3,752 tok/s
	// after its streams ladder, 1.20 times the edge of its arrivals).
	for _, k := range []float64{1, 1.25} {
		if n := int(math.Round(idle.Concurrency * k)); n > 0 {
			r.check(ctx, func() Step {
				r.idle(ctx)
				return r.closedStep(ctx, fmt.Sprintf("%.2fx quoted concurrency", k), n)
			})
		}
	}
	if !o.QuoteChecksOnly {
		if err := r.streamsLadder(ctx); err != nil {
			return nil, err
		}
	}

	// One replica lost: the next quote must drop by its share.
	if len(r.f.Kills()) == 0 {
		r.skip("lost-replica check: the replicas are external URLs, which the bench does not stop")
		return r.rep, nil
	}
	r.quiet(ctx)
	if _, err := r.quote(ctx, "idle, before the loss"); err != nil {
		return nil, err
	}
	r.f.Kills()[len(r.f.Kills())-1]()
	r.awaitHealthy(ctx, len(r.f.Kills())-1)
	if _, err := r.quote(ctx, "one replica lost"); err != nil {
		return nil, err
	}
	return r.rep, nil
}

// halfLoaded reads the quote under a background at half the true
// capacity, then offers the background plus the quoted headroom and
// measures every request sent while both run, as the fleet serves them.
// With Confirm set, that trial is run again under a fresh background, at
// the same quote, until two agree, as every other check is: near the edge
// one trial holds or breaks by chance (a demo proof's broke once, TTFT
// 3,152 ms, at 0.95 of the edge where the run before held at the same
// share).
func (r *capacityRun) halfLoaded(ctx context.Context) error {
	const label = "half load + 1.00x quote"
	bgQPS := r.rep.True.QPS / 2
	var half Quote
	type background struct {
		st  Step
		res []*rig.Result
	}
	trial := func(first bool) (Step, error) {
		r.idle(ctx)
		bgDone := make(chan background, 1)
		go func() {
			st, res := r.stepResults(ctx, "half load", bgQPS, 3*r.o.StageDuration, 1)
			bgDone <- background{st, res}
		}()
		r.sleepModel(ctx, r.o.StageDuration)
		quotedAt := time.Now()
		if first {
			q, err := r.quote(ctx, "half loaded")
			if err != nil {
				<-bgDone
				return Step{}, err
			}
			half = q
		}
		qps := r.qpsOf(half.TokensPerS)
		var res []*rig.Result
		var loads []engineLoad
		var wall time.Duration
		if qps > 0 {
			res, loads, wall = r.offer(ctx, qps, r.o.StageDuration, 2)
		}
		bg := <-bgDone
		if first {
			r.rep.HalfLoad = bg.st
			r.rep.HalfLoadAtQuote = outputRate(bg.res, quotedAt.Add(-capacity.RateSpan), quotedAt) / r.timeScale()
		}
		if qps <= 0 {
			return Step{Label: label}, nil
		}
		start := startOf(res)
		st := r.measure(label, alongside(res, bg.res, start.Add(wall)), start, wall, loads)
		st.QPS = bgQPS + qps
		r.logStep(st)
		return st, nil
	}
	st, err := trial(true)
	if err != nil {
		return err
	}
	r.rep.Checks = append(r.rep.Checks, st)
	if *r.o.Confirm == 0 || st.Requests == 0 {
		return nil
	}
	held, broke := tally(r.rep.Checks, func(c Step) bool { return c.Label == label })
	untilTwoAgree(ctx, held, broke, func() bool {
		st, _ := trial(false) // only the first trial reads a quote, and only that fails
		r.rep.Checks = append(r.rep.Checks, st)
		return st.Within
	})
	return ctx.Err()
}

// alongside is a step's requests res and those of a background, bg, that
// started before the step ended, at end: every request the fleet served
// while both ran (measure counts the inter-token gaps of all of them in
// its window, the times to first token of those begun in it).
func alongside(res, bg []*rig.Result, end time.Time) []*rig.Result {
	out := append([]*rig.Result(nil), res...)
	for _, x := range bg {
		if !x.Start.IsZero() && x.Start.Before(end) {
			out = append(out, x)
		}
	}
	return out
}

// externalPolicy writes the precise policy's scheduler config for running
// engines as eng resolves them into dir and returns its path: the bench's
// scrape interval, the engines' block size and eng's scrape timeout
// (TestCapacityURLFleet runs it).
func externalPolicy(dir string, eng rig.EngineOptions) (string, error) {
	c, err := launch.Tuning{Policy: "precise", ScrapeInterval: rig.ScrapeInterval, ScrapeTimeout: eng.ScrapeTimeout}.Config()
	if err != nil {
		return "", fmt.Errorf("scheduler config for running engines: %w", err)
	}
	if eng.BlockSize != 0 {
		c.BlockSize = eng.BlockSize
	}
	data, err := yaml.Marshal(c)
	if err != nil {
		return "", fmt.Errorf("cannot encode the scheduler config: %w", err)
	}
	path := filepath.Join(dir, "scheduler.yaml")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		return "", fmt.Errorf("cannot write the scheduler config: %w", err)
	}
	return path, nil
}

// skip records a part of the proof not run, with why: the report prints
// it (TestCapacityURLFleet).
func (r *capacityRun) skip(reason string) {
	r.rep.Skipped = append(r.rep.Skipped, reason)
	r.log.Warn("capacity proof: skipped", zap.String("what", reason))
}

// awaitHealthy waits until the EPP counts n healthy replicas: the lost
// one's scrapes have failed enough to open its breaker.
func (r *capacityRun) awaitHealthy(ctx context.Context, n int) {
	r.awaitSnapshot(ctx, func(m capacity.Model) int { return m.Healthy }, func(healthy int) bool { return healthy <= n })
}

// awaitSnapshot polls the EPP's capacity snapshot for up to five minutes
// until ok holds for v summed over its models: with the Mooncake trace's
// long prompts, the queue a step past the edge left outlasted a one-minute
// wait, and the half-load background started on it failed 280 requests.
func (r *capacityRun) awaitSnapshot(ctx context.Context, v func(capacity.Model) int, ok func(int) bool) {
	deadline := time.Now().Add(5 * time.Minute)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		snap, err := r.t.EPPs()[0].Capacity(ctx)
		sum := 0
		for _, m := range snap.Models {
			sum += v(m)
		}
		if err == nil && ok(sum) {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// timeScale is how much faster than wall time the fleet runs.
func (r *capacityRun) timeScale() float64 { return max(r.o.Base.Fleet.TimeScale, 1) }

// calibrate runs the quoter's calibration through the gateway with the
// workload's mix. Its client measures wall time, so the objectives and
// durations it is given are the model-time ones over the time scale.
func (r *capacityRun) calibrate(ctx context.Context, model string) (*capacity.Calibration, error) {
	sp := r.o.Base.Workload.SharedPrefix
	mix := capacity.Mix{PromptTokens: sp.SystemPromptLen + sp.QuestionLen, SharedPrefixTokens: sp.SystemPromptLen,
		Groups: sp.NumGroups, OutputTokens: sp.OutputLen}
	if r.trace != nil {
		in := 0
		for _, t := range r.trace {
			in += t.InputLength
		}
		mix = capacity.Mix{PromptTokens: in / len(r.trace), OutputTokens: int(r.outLen), Groups: 1}
	}
	ts := r.timeScale()
	wall := func(d time.Duration) time.Duration { return time.Duration(float64(d) / ts) }
	warm := wall(5 * time.Second)
	return calibration.Run(ctx, calibration.Config{URL: r.t.URL(), Model: model, CapacityURL: r.t.EPPs()[0].AdminURL(),
		Objectives:       capacity.Objectives{TTFT: wall(r.o.Objectives.TTFT), ITL: wall(r.o.Objectives.ITL), Quantile: r.o.Objectives.Quantile},
		Mix:              mix,
		StartConcurrency: r.o.Base.Fleet.Replicas, LevelDuration: wall(r.o.StageDuration / 2), Warmup: &warm,
		Log: r.log.Named("calibrate")})
}

func (r *capacityRun) startQuoter(dir, calFile, model string) (*quoter.Service, error) {
	key, err := crypto.GenerateKey()
	if err != nil {
		return nil, err
	}
	cfg := quoter.Config{ProviderID: "bench", Model: model, ModelClass: "bench", ServingURL: r.t.URL(),
		CapacityURL: r.t.EPPs()[0].AdminURL(), StateFile: filepath.Join(dir, "quoter-state.json"),
		FloorIn: big.NewInt(1), FloorOut: big.NewInt(1), SkipConformance: true,
		Objectives: capacity.Objectives{TTFT: r.o.Objectives.TTFT, ITL: r.o.Objectives.ITL}, CalibrationFile: calFile}
	return quoter.New(cfg, key, r.log.Named("quoter"), quoter.Options{})
}

// quote signs one quote and reads its headroom in model time.
func (r *capacityRun) quote(ctx context.Context, label string) (Quote, error) {
	sq, err := r.q.SignOnce(ctx)
	if err != nil {
		return Quote{}, fmt.Errorf("quote %s: %w", label, err)
	}
	tps, _ := strconv.ParseFloat(sq.Message.HeadroomTokensPerSec, 64)
	conc, _ := strconv.ParseFloat(sq.Message.HeadroomConcurrency, 64)
	ts := r.timeScale()
	a := r.q.LastAssessment()
	q := Quote{Label: label, TokensPerS: tps / ts, Concurrency: conc, CapacityTokensPerS: a.OutputTokensPerSec / ts,
		CapacityConcurrency: a.Concurrency, CapacityStreams: a.Streams, BusyTokensPerS: a.BusyTokensPerSec / ts, Busy: a.Busy, PerReplica: a.Replicas}
	if err := r.saveSnapshot(ctx, len(r.rep.Quotes)); err != nil {
		return Quote{}, fmt.Errorf("quote %s: %w", label, err)
	}
	for _, ra := range a.Replicas {
		if ra.Capacity.Concurrency > 0 {
			q.Replicas++
		}
	}
	r.rep.Quotes = append(r.rep.Quotes, q)
	r.log.Info("quote", zap.String("label", label), zap.Float64("tokens_per_s", q.TokensPerS), zap.Float64("concurrency", conc),
		zap.Float64("capacity_tokens_per_s", q.CapacityTokensPerS), zap.Float64("capacity_concurrency", q.CapacityConcurrency),
		zap.Float64("busy_tokens_per_s", q.BusyTokensPerS), zap.Float64("busy", q.Busy))
	return q, nil
}

// saveSnapshot writes the EPP's capacity snapshot to the work directory
// as snapshot-n.json.
func (r *capacityRun) saveSnapshot(ctx context.Context, n int) error {
	snap, err := r.t.EPPs()[0].Capacity(ctx)
	if err != nil {
		return fmt.Errorf("cannot read the EPP's capacity snapshot: %w", err)
	}
	b, err := json.MarshalIndent(snap, "", " ")
	if err != nil {
		return err
	}
	if r.windows != nil {
		r.windows.snapshot(n)
	}
	return os.WriteFile(filepath.Join(r.dir, fmt.Sprintf("snapshot-%d.json", n)), b, 0o644)
}

// qpsOf is the request rate that asks for tps output tokens per second.
func (r *capacityRun) qpsOf(tps float64) float64 { return tps / max(r.outLen, 1) }

// rungs is one of the proof's two ladders: the rate of arrivals, or the
// streams a client holds open. Both are searched, confirmed and fitted
// the same way; they differ in what sets a step and how one is measured.
type rungs struct {
	steps *[]Step
	// at is what set a step: its rate, or its streams.
	at func(Step) float64
	// measure measures one step at x.
	measure func(ctx context.Context, label string, x float64) Step
	// label is a step's label; unit formats a rung for an error.
	label, unit string
}

// brokenAt is the error of a ladder whose lowest rung, x, breaks.
func (l rungs) brokenAt(x float64) error {
	return fmt.Errorf("the fleet breaks the objectives at "+l.unit+" already", x)
}

// rates is the ladder of arrival rates.
func (r *capacityRun) rates() rungs {
	return rungs{steps: &r.rep.Ladder, label: "ladder", unit: "%.2f QPS",
		at: func(s Step) float64 { return s.QPS },
		measure: func(ctx context.Context, label string, qps float64) Step {
			if r.probe != nil {
				return r.probe(label, qps)
			}
			r.idle(ctx)
			return r.step(ctx, label, qps, 0)
		}}
}

// streams is the ladder of streams held open.
func (r *capacityRun) streams() rungs {
	return rungs{steps: &r.rep.StreamsLadder, label: "streams", unit: "%.0f streams",
		at: func(s Step) float64 { return float64(s.Streams) },
		measure: func(ctx context.Context, label string, x float64) Step {
			n := int(math.Round(x))
			if r.streamProbe != nil {
				return r.streamProbe(n)
			}
			r.idle(ctx)
			return r.closedStep(ctx, label, n)
		}}
}

// ladder finds the highest rate whose steps hold the objectives. Every
// step starts from a drained fleet: a step after one that broke would
// otherwise begin with its queue and break for it.
func (r *capacityRun) ladder(ctx context.Context) error {
	l := r.rates()
	var lo, hi float64
	qps := r.o.StartQPS
	for hi == 0 {
		if r.holds(ctx, l, qps) {
			lo = qps
			qps *= 2
		} else {
			hi = qps
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if qps > 1e4 {
			return errors.New("the ladder never broke an objective")
		}
	}
	if lo == 0 {
		return l.brokenAt(hi)
	}
	bisect := func() {
		if mid := (lo + hi) / 2; r.holds(ctx, l, mid) {
			lo = mid
		} else {
			hi = mid
		}
	}
	for range r.o.Refine {
		bisect()
	}
	if err := r.confirm(ctx, l, &lo, &hi, bisect); err != nil {
		return err
	}
	r.rep.True = r.edge()
	return ctx.Err()
}

// confirm measures the highest rung held, lo, again: near the edge a step
// holds or breaks by chance (its queue forms or does not), and the edge
// is read from the rung's majority. Where it breaks, the bracket moves
// below it and bisect halves it once more.
func (r *capacityRun) confirm(ctx context.Context, l rungs, lo, hi *float64, bisect func()) error {
	for range *r.o.Confirm {
		if ctx.Err() != nil || r.majority(ctx, l, *lo) {
			return nil
		}
		below, ok := r.heldBelow(l, *lo)
		if !ok {
			return l.brokenAt(*lo)
		}
		*hi, *lo = *lo, l.at(below)
		bisect()
	}
	return nil
}

// holds is whether the fleet holds the objectives at rung x. With Confirm
// set, a step that breaks is measured again, and a third time if the two
// disagree: on the Mooncake mix one 16 QPS step broke (p95 ITL 359 ms)
// where 17.8 QPS held later in the same run, and 172 streams broke (57.4
// ms) where 221 had held.
func (r *capacityRun) holds(ctx context.Context, l rungs, x float64) bool {
	if r.trial(ctx, l, l.label, x) {
		return true
	}
	return *r.o.Confirm > 0 && r.majority(ctx, l, x)
}

// majority measures rung x again until two of its steps agree, and says
// whether they held.
func (r *capacityRun) majority(ctx context.Context, l rungs, x float64) bool {
	held, broke := tally(*l.steps, func(st Step) bool { return l.at(st) == x })
	return untilTwoAgree(ctx, held, broke, func() bool { return r.trial(ctx, l, "again", x) })
}

// tally counts the steps picked that held and that broke.
func tally(steps []Step, pick func(Step) bool) (held, broke int) {
	for _, st := range steps {
		switch {
		case !pick(st):
		case st.Within:
			held++
		default:
			broke++
		}
	}
	return held, broke
}

// untilTwoAgree runs trial until two outcomes, counting held and broke
// already seen, agree, and says whether they held.
func untilTwoAgree(ctx context.Context, held, broke int, trial func() bool) bool {
	for held < 2 && broke < 2 && ctx.Err() == nil {
		if trial() {
			held++
		} else {
			broke++
		}
	}
	return held >= 2
}

// check measures one of the quote's checks into the report. With Confirm
// set it is measured until two of its steps agree, as a rung of the
// ladders is: the edge is read from majorities, and a quote within a few
// percent of it is a step that holds or breaks by chance (on a demo
// proof 52 QPS held twice on the ladder, and the quote's 51.16 QPS broke
// once). Every step is kept under the check's label, and the verdict is
// their majority (Verdicts).
func (r *capacityRun) check(ctx context.Context, measure func() Step) {
	trial := func() bool {
		st := measure()
		r.rep.Checks = append(r.rep.Checks, st)
		return st.Within
	}
	if *r.o.Confirm == 0 {
		trial()
		return
	}
	untilTwoAgree(ctx, 0, 0, trial)
}

// trial measures one step of ladder l at rung x.
func (r *capacityRun) trial(ctx context.Context, l rungs, label string, x float64) bool {
	st := l.measure(ctx, label, x)
	*l.steps = append(*l.steps, st)
	return st.Within
}

// heldBelow is the highest rung of l below x whose steps' fit holds, and
// whether there is one.
func (r *capacityRun) heldBelow(l rungs, x float64) (Step, bool) {
	steps, load := r.fit(l)
	for i := len(steps) - 1; i >= 0; i-- {
		if l.at(steps[i]) < x && load[i] <= 1 {
			return steps[i], true
		}
	}
	return Step{}, false
}

// streamsLadder finds the most streams a client keeping them open (each
// sending its next request when its last ends) holds within the
// objectives: from the in flight at the rate's edge, up or down by a
// factor of 1.5 until one number holds and the next does not, then
// halved until they are within streamsResolution of each other, then
// confirmed as the rate ladder is. Streams are what a client sets; the in
// flight of arrivals is not, and near their edge it runs away with the
// rate (82.7 to 112.2 requests at the Mooncake edge between runs).
func (r *capacityRun) streamsLadder(ctx context.Context) error {
	l := r.streams()
	const grow, most = 1.5, 1 << 16
	var lo, hi float64
	for n := max(1, math.Round(r.rep.True.Concurrency)); lo == 0 || hi == 0; {
		held := r.holds(ctx, l, n)
		if err := ctx.Err(); err != nil {
			return err
		}
		switch {
		case held:
			lo = n
			n = math.Ceil(n * grow)
			if n > most {
				return fmt.Errorf("%.0f streams never broke an objective", lo)
			}
		case n == 1:
			return errors.New("the fleet breaks the objectives with one stream")
		default:
			hi = n
			n = max(1, math.Floor(n/grow))
		}
	}
	wide := func() bool { return hi-lo > 1 && hi > lo*(1+streamsResolution) }
	bisect := func() {
		if !wide() {
			return
		}
		if mid := math.Floor((lo + hi) / 2); r.holds(ctx, l, mid) {
			lo = mid
		} else {
			hi = mid
		}
	}
	for wide() && ctx.Err() == nil {
		bisect()
	}
	if err := r.confirm(ctx, l, &lo, &hi, bisect); err != nil {
		return err
	}
	a, b, x, _ := r.fitCrossing(l)
	r.rep.TrueStreams = float64(a.Streams) + x*float64(b.Streams-a.Streams)
	return ctx.Err()
}

// streamsResolution is how close the streams ladder brackets its edge:
// finer than the 10% band a quote is judged in.
const streamsResolution = 0.06

// loadOf is how far a step is from its objectives: its p95 over its
// objective, the worse of the two, 1 at the edge; an errored step is past
// any objective (pastAny).
func (r *capacityRun) loadOf(s Step) float64 {
	l := max(s.TTFTP95ms/msOf(r.o.Objectives.TTFT), s.ITLP95ms/msOf(r.o.Objectives.ITL))
	if s.Errors > 0 || math.IsNaN(l) {
		return pastAny
	}
	return l
}

// pastAny is the load of a step with nothing to read (errors, no requests).
const pastAny = 1e9

// crossing is how far from a step of load l to one of load h (l <= 1 < h)
// the load reaches 1, read linearly; 0 when h is pastAny, which says
// nothing of where between them the objectives broke.
func crossing(l, h float64) float64 {
	if h >= pastAny || h <= l {
		return 0
	}
	return (1 - l) / (h - l)
}

// fit is ladder l's rungs in order, each the median of its steps (by
// load: p95 over objective, the worse of the two; the middle two averaged
// for an even count), the loads fitted non-decreasing in the rung by pool
// adjacent violators: a step's p95s are noisy, and a rung measured again
// is one point of the fit, read as its majority read it.
func (r *capacityRun) fit(l rungs) ([]Step, []float64) {
	steps := append([]Step(nil), *l.steps...)
	sort.SliceStable(steps, func(i, j int) bool {
		if x, y := l.at(steps[i]), l.at(steps[j]); x != y {
			return x < y
		}
		return r.loadOf(steps[i]) < r.loadOf(steps[j])
	})
	var out []Step
	var load, w []float64
	for i := 0; i < len(steps); {
		j := i
		for j < len(steps) && l.at(steps[j]) == l.at(steps[i]) {
			j++
		}
		m := (i + j - 1) / 2
		st, ld := steps[m], r.loadOf(steps[m])
		if (j-i)%2 == 0 {
			st, ld = mergeSteps(st, steps[m+1]), (ld+r.loadOf(steps[m+1]))/2
		}
		out, load = append(out, st), append(load, ld)
		w = append(w, float64(max(st.Requests, 1)))
		i = j
	}
	isotonic.NonDecreasing(load, w)
	return out, load
}

// fitCrossing is where ladder l's fit crosses its objectives: the steps
// either side of it and how far from the first to the second (crossing).
// Without a crossing it is the highest step within them, and ok is
// false.
func (r *capacityRun) fitCrossing(l rungs) (a, b Step, x float64, ok bool) {
	steps, load := r.fit(l)
	for i := 1; i < len(steps); i++ {
		if load[i-1] <= 1 && load[i] > 1 {
			return steps[i-1], steps[i], crossing(load[i-1], load[i]), true
		}
	}
	if n := len(steps); n > 0 && load[n-1] <= 1 {
		a = steps[n-1]
	}
	return a, Step{}, 0, false
}

// mergeSteps is two measurements of one rung, averaged.
func mergeSteps(a, b Step) Step {
	mean := func(x, y float64) float64 { return (x + y) / 2 }
	return Step{Label: a.Label, QPS: a.QPS, Streams: a.Streams, Requests: (a.Requests + b.Requests) / 2, Errors: (a.Errors + b.Errors) / 2,
		TTFTP95ms: mean(a.TTFTP95ms, b.TTFTP95ms), ITLP95ms: mean(a.ITLP95ms, b.ITLP95ms),
		OutputTokPS: mean(a.OutputTokPS, b.OutputTokPS), Concurrency: mean(a.Concurrency, b.Concurrency),
		Running: mean(a.Running, b.Running), Waiting: mean(a.Waiting, b.Waiting), PrefixHitRate: mean(a.PrefixHitRate, b.PrefixHitRate),
		Within: a.Within && b.Within}
}

// edge estimates where the objectives stop holding from every ladder step,
// not only the two either side of it: the rate where the ladder's fit
// crosses 1, interpolated between its neighbours. Tokens/s and concurrency
// are the step below's scaled by the rate (throughput follows arrivals
// while the fleet keeps up, and Little's law gives concurrency; past the
// edge both run away and say nothing about it). Without a crossing it is
// the highest rate within the objectives.
func (r *capacityRun) edge() Step {
	a, b, x, ok := r.fitCrossing(r.rates())
	if !ok {
		a.Label = "true capacity"
		return a
	}
	at := func(u, v float64) float64 { return u + x*(v-u) }
	qps := at(a.QPS, b.QPS)
	return Step{Label: "true capacity (fit)", QPS: qps, OutputTokPS: a.OutputTokPS * qps / a.QPS,
		Concurrency: a.Concurrency * qps / a.QPS, Running: a.Running * qps / a.QPS, Waiting: a.Waiting * qps / a.QPS,
		TTFTP95ms: at(a.TTFTP95ms, b.TTFTP95ms), ITLP95ms: at(a.ITLP95ms, b.ITLP95ms),
		PrefixHitRate: a.PrefixHitRate, Requests: a.Requests, Within: true}
}

func msOf(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func (r *capacityRun) step(ctx context.Context, label string, qps float64, stream int) Step {
	return r.stepFor(ctx, label, qps, r.o.StageDuration, stream)
}

// stepFor offers qps (model time) for d (model time) and measures it
// after the first fifth, when queues have formed (measure).
func (r *capacityRun) stepFor(ctx context.Context, label string, qps float64, d time.Duration, stream int) Step {
	st, _ := r.stepResults(ctx, label, qps, d, stream)
	return st
}

// stepResults is stepFor with every request's result.
func (r *capacityRun) stepResults(ctx context.Context, label string, qps float64, d time.Duration, stream int) (Step, []*rig.Result) {
	res, loads, wall := r.offer(ctx, qps, d, stream)
	st := r.measure(label, res, startOf(res), wall, loads)
	st.QPS = qps
	r.logStep(st)
	return st, res
}

// offer sends a step's requests at qps (model time) for d (model time):
// every request's result, the engines' load polled meanwhile, and d in
// wall time.
func (r *capacityRun) offer(ctx context.Context, qps float64, d time.Duration, stream int) ([]*rig.Result, []engineLoad, time.Duration) {
	w := r.stepWorkload(qps, d, stream)
	polled := r.pollDuring(ctx)
	res := rig.Replay(ctx, r.c, w, r.o.Base.MaxInFlight, r.o.Base.RequestTimeout, nil)
	return res, polled(), time.Duration(float64(d) / r.timeScale())
}

// stepWorkload is a step's requests: qps (model time) for d (model time).
func (r *capacityRun) stepWorkload(qps float64, d time.Duration, stream int) *rig.Workload {
	o := r.o.Base
	// Every step sends the same prompts (one content seed), so the fleet's
	// caches are in the steady state the ladder measured, whatever stream
	// or step a request belongs to; arrivals and choices differ.
	o.Workload.SharedPrefix.ContentSeed = r.o.Base.Seed + 1
	o.Seed = r.seed.Add(1)*7919 + int64(stream)
	if r.trace != nil {
		return r.traceStep(o, qps, d)
	}
	o.Workload.SharedPrefix.QPS = []float64{qps}
	o.Workload.SharedPrefix.StageDuration = d
	o.Workload.SharedPrefix.StageDurations = nil
	o.Workload.SharedPrefix.WarmupStages = 0
	o.Workload.SharedPrefix.Counted = true
	return rig.SharedPrefixWorkload(o)
}

// closedStep keeps n requests in flight for StageDuration (model time),
// each stream sending its next request as its last one ends: the load a
// client holding n streams offers, which tests a quote's concurrency as
// an open stream of arrivals at its rate does not (at the rate, fewer are
// in flight). The requests are a step's mix at twice the rate Little's
// law gives n at the true capacity's latency: more than the streams send
// (on a trace, the records they leave unsent go back to the walks,
// unsentRounds), and started over should they send them all, as a request
// sent again finds its prompt cached.
func (r *capacityRun) closedStep(ctx context.Context, label string, n int) Step {
	d := r.o.StageDuration
	qps := 2 * float64(n)
	if t := r.rep.True; t.Concurrency > 0 && t.QPS > 0 {
		qps *= t.QPS / t.Concurrency
	}
	from := r.traceRounds.Load()
	w := r.stepWorkload(qps, d, 3)
	to := r.traceRounds.Load()
	polled := r.pollDuring(ctx)
	wall := time.Duration(float64(d) / r.timeScale())
	start := time.Now()
	end := start.Add(wall)
	var (
		next atomic.Int64
		mu   sync.Mutex
		res  []*rig.Result
		wg   sync.WaitGroup
	)
	for range n {
		wg.Go(func() {
			for ctx.Err() == nil && time.Now().Before(end) {
				req := &w.Requests[int(next.Add(1)-1)%len(w.Requests)]
				rctx, cancel := context.WithTimeout(ctx, r.o.Base.RequestTimeout)
				x := r.c.Completion(rctx, req)
				cancel()
				mu.Lock()
				res = append(res, x)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	r.unsentRounds(from, to, next.Load())
	st := r.measure(label, res, start, wall, polled())
	st.Streams = n
	st.QPS = float64(st.Requests) / (measuredSpan(wall).Seconds() * r.timeScale())
	r.logStep(st)
	return st
}

// measure is the step of the requests res sent over the wall time from
// start to start+d, against the objectives, and the engines' load over the
// same time from loads. It counts what happened after the first fifth,
// when queues have formed: the requests that began then, with their times
// to first token, and every inter-token gap that ended then and before the
// step did, whichever request's.
//
// Gaps after the step's end are left out. The step stops sending at its
// end and its last requests finish in a fleet that drains, with nothing
// new to prefill and so no stall in their decoding: counted with the
// step, those tokens would dilute the tail of a load the fleet no longer
// carried.
func (r *capacityRun) measure(label string, res []*rig.Result, start time.Time, d time.Duration, loads []engineLoad) Step {
	scale := r.timeScale()
	skip := d - measuredSpan(d)
	st := Step{Label: label}
	var ttft, itl []time.Duration
	var out int
	var inflight time.Duration
	from, to := start.Add(skip), start.Add(d)
	for _, x := range res {
		if x.Start.IsZero() {
			continue
		}
		if x.Err == nil {
			chunks(x, func(i int, at time.Time, gap time.Duration) {
				if i > 0 && !at.Before(from) && at.Before(to) {
					itl = append(itl, gap)
				}
			})
		}
		if x.Start.Before(from) {
			continue
		}
		st.Requests++
		if x.Err != nil {
			st.Errors++
			continue
		}
		ttft = append(ttft, x.TTFT)
		out += x.Output
		inflight += x.E2E
	}
	// Rates are over the measured arrivals' window: a step the fleet keeps
	// up with serves what arrives, and one it does not shows in its
	// latencies.
	if window := measuredSpan(d).Seconds(); window > 0 {
		st.OutputTokPS = float64(out) / (window * scale)
		st.Concurrency = inflight.Seconds() / window
	}
	st.Running, st.Waiting, st.PrefixHitRate = engineMeans(loads, start.Add(skip), start.Add(d))
	st.TTFTP95ms = stat.Percentile(stat.SortedMillis(ttft, scale), 95)
	st.ITLP95ms = stat.Percentile(stat.SortedMillis(itl, scale), 95)
	st.Within = st.Requests > 0 && st.Errors == 0 &&
		st.TTFTP95ms <= float64(r.o.Objectives.TTFT)/float64(time.Millisecond) &&
		st.ITLP95ms <= float64(r.o.Objectives.ITL)/float64(time.Millisecond)
	return st
}

// measuredSpan is the part of a step of length d that measure counts:
// all but its first fifth.
func measuredSpan(d time.Duration) time.Duration { return d - d/5 }

func (r *capacityRun) logStep(st Step) {
	r.log.Info("capacity step", zap.String("label", st.Label), zap.Float64("qps", st.QPS), zap.Int("streams", st.Streams),
		zap.Int("requests", st.Requests), zap.Float64("ttft_p95_ms", st.TTFTP95ms), zap.Float64("itl_p95_ms", st.ITLP95ms),
		zap.Float64("tok_per_s", st.OutputTokPS), zap.Float64("concurrency", st.Concurrency), zap.Bool("within", st.Within))
}

// outputRate is the output tokens per second of wall time that res
// streamed within [from, to): a request's tokens are spread over its
// content chunks, the first at its first token and one after each gap.
func outputRate(res []*rig.Result, from, to time.Time) float64 {
	if !to.After(from) {
		return 0
	}
	var tokens float64
	for _, x := range res {
		if x.Err != nil || x.Start.IsZero() {
			continue
		}
		per := float64(x.Output) / float64(len(x.ITL)+1)
		chunks(x, func(_ int, at time.Time, _ time.Duration) {
			if !at.Before(from) && at.Before(to) {
				tokens += per
			}
		})
	}
	return tokens / to.Sub(from).Seconds()
}

// chunks calls f with each of a request's content chunks in order: its
// index, when it arrived and the gap before it (none for the first).
func chunks(x *rig.Result, f func(i int, at time.Time, gap time.Duration)) {
	if x.TTFT == 0 {
		return
	}
	at := x.Start.Add(x.TTFT)
	f(0, at, 0)
	for i, gap := range x.ITL {
		at = at.Add(gap)
		f(i+1, at, gap)
	}
}

// traceStep is the trace's mix at a chosen rate: Poisson arrivals at qps
// carrying the trace's records, walked in its order from traceStreams
// evenly spaced records at once (the i-th request the next record of walk
// i mod traceStreams), each step going on where the steps before it
// stopped.
//
// One walk would give each step another stretch of the trace, and the
// trace's stretches differ (one step's answers averaged a third of
// another's): the ladder would compare mixes, not loads. Ten walks side by
// side put the whole trace's mix into every part of a step: sent in one
// pass, the Mooncake trace's answers shortened from about 200 tokens to 41
// along a step, and a quote read a third of the way into one met a load
// 1.39 times the step's mean.
//
// Walking on keeps the trace's own reuse, between steps as within them:
// nearby records share their prefixes, and no record comes again until
// the walks have been through the trace. Records drawn at random came
// again more often the more a step drew, so a closed loop, which draws
// for more requests than it sends, replayed whole prompts a step at its
// rate did not (65% of its requests against 20%), and held nearly twice
// the streams. Walks started afresh at a random record each step found
// the records of the steps just before them to a varying degree: one
// step's prefix hits read 0.99 where the steps either side read 0.67 and
// 0.68.
func (r *capacityRun) traceStep(o rig.Options, qps float64, d time.Duration) *rig.Workload {
	arrivals, stages := rig.CountedLadder(o.Seed, []float64{qps}, []time.Duration{d}, o.Fleet.TimeScale)
	rounds := int64(len(arrivals[0])+traceStreams-1) / traceStreams
	first := r.traceRounds.Add(rounds) - rounds
	n := int64(len(r.trace))
	w := &rig.Workload{Stages: stages}
	for i, at := range arrivals[0] {
		walk, round := int64(i%traceStreams), first+int64(i/traceStreams)
		rec := r.trace[(walk*n/traceStreams+round)%n]
		w.Requests = append(w.Requests, rig.Request{At: at, MaxTokens: rec.OutputLength, Tokens: rig.TraceTokens(r.o.Base.Seed, rec)})
	}
	return w
}

// traceStreams is how many walks through a trace a step sends side by side.
const traceStreams = 10

// unsentRounds gives the walks back the rounds a step drew, from and to,
// beyond the first sent of its requests, so that the next step goes on
// where the step's sending stopped. A closed loop draws about twice what
// it sends. Skipped, the unsent rounds of a step holding 147 streams of
// the Mooncake trace took the walks 76 rounds past a whole pass (399):
// 151 of the next step's 284 rounds sent records the step had just sent,
// their prompts still cached, and its prefix hits rose from 0.85 to 0.89
// (0.77 to 0.91 between two steps of 116 streams, 158 of 272 rounds sent
// again). The streams the ladder found held were the trace's replayed,
// not its own. Nothing is given back should another step have drawn
// since.
func (r *capacityRun) unsentRounds(from, to, sent int64) {
	if r.trace == nil {
		return
	}
	used := from + (sent+traceStreams-1)/traceStreams
	if used < to {
		r.traceRounds.CompareAndSwap(to, used)
	}
}

// engineLoad is the fleet's running and waiting requests at one poll of
// the EPP's snapshot, and its prompt tokens per second and the prefix-cache
// hits among them over the scrape window.
type engineLoad struct {
	at               time.Time
	running, waiting float64
	prompt, hits     float64
}

// pollDuring polls the EPP's snapshot (pollLoad) until the function it
// returns is called, which returns the polls.
func (r *capacityRun) pollDuring(ctx context.Context) func() []engineLoad {
	pctx, stop := context.WithCancel(ctx)
	polled := make(chan []engineLoad, 1)
	go func() { polled <- r.pollLoad(pctx) }()
	return func() []engineLoad {
		stop()
		return <-polled
	}
}

// pollLoad reads the EPP's snapshot once a scrape until ctx ends.
func (r *capacityRun) pollLoad(ctx context.Context) []engineLoad {
	var out []engineLoad
	t := time.NewTicker(rig.ScrapeInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return out
		case <-t.C:
		}
		snap, err := r.t.EPPs()[0].Capacity(ctx)
		if err != nil {
			continue
		}
		l := engineLoad{at: time.Now()}
		for _, m := range snap.Models {
			l.running += float64(m.Running)
			l.waiting += float64(m.Waiting)
			if p := m.PromptTokensPerSec; p > 0 && m.PrefixHitRate >= 0 && m.PrefixHitRate <= 1 {
				l.prompt += p
				l.hits += p * m.PrefixHitRate
			}
		}
		out = append(out, l)
	}
}

// engineMeans is the fleet's mean running and waiting requests over the
// polls in [from, to), and its prefix-cache hit rate over them weighted by
// prompt tokens.
func engineMeans(loads []engineLoad, from, to time.Time) (running, waiting, hitRate float64) {
	n, prompt, hits := 0, 0.0, 0.0
	for _, l := range loads {
		if !l.at.Before(from) && l.at.Before(to) {
			running += l.running
			waiting += l.waiting
			hits += l.hits
			prompt += l.prompt
			n++
		}
	}
	if n > 0 {
		running /= float64(n)
		waiting /= float64(n)
	}
	if prompt > 0 {
		hitRate = hits / prompt
	}
	return running, waiting, hitRate
}

func startOf(res []*rig.Result) time.Time {
	var t time.Time
	for _, x := range res {
		if !x.Start.IsZero() && (t.IsZero() || x.Start.Before(t)) {
			t = x.Start
		}
	}
	return t
}

// idle waits until the fleet has drained and been scraped since.
func (r *capacityRun) idle(ctx context.Context) {
	r.awaitSnapshot(ctx, func(m capacity.Model) int { return m.Running + m.Waiting + m.InFlight }, func(busy int) bool { return busy == 0 })
	time.Sleep(3 * rig.ScrapeInterval)
}

// quiet is idle, and then until no replica's load of the last
// capacity.RateSpan is left: an idle quote subtracts a load that ended
// within it.
func (r *capacityRun) quiet(ctx context.Context) {
	r.idle(ctx)
	r.awaitSnapshot(ctx, func(m capacity.Model) int {
		n := 0
		for _, rc := range m.ReplicaCapacity {
			if rc.Load > 0 || rc.OutputTokensPerSec > 0 {
				n++
			}
		}
		return n
	}, func(loaded int) bool { return loaded == 0 })
}

// sleepModel waits d of model time.
func (r *capacityRun) sleepModel(ctx context.Context, d time.Duration) {
	t := time.NewTimer(time.Duration(float64(d) / r.timeScale()))
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// ratio is a/b, NaN when b is 0.
func ratio(a, b float64) float64 {
	if b == 0 {
		return math.NaN()
	}
	return a / b
}

// Verdicts are the proof's acceptance figures.
type Verdicts struct {
	// IdleTokens and IdleConcurrency are the idle quote over the true
	// capacity (tokens/s; the most streams held open, TrueStreams).
	IdleTokens, IdleConcurrency float64
	// AtQuote and Over are whether the objectives held at 1.00x the idle
	// quote and broke at 1.25x: its rate offered as arrivals, and its
	// concurrency as streams kept open (AtQuote needs both to hold;
	// ConcurrencyOver is the streams' 1.25x breaking), each the majority
	// of its steps.
	AtQuote, Over, ConcurrencyOver bool
	// HalfTokens is the half-loaded quote over the true capacity minus the
	// background's rate over the span the quote read it over;
	// HalfAtQuote whether background plus quote, every request sent while
	// both ran, held the objectives, the majority of its trials.
	HalfTokens  float64
	HalfAtQuote bool
	// LostTokens is the quote after one replica was lost over the idle
	// quote just before it times (n-1)/n.
	LostTokens float64
}

// Verdicts computes the acceptance figures (NaN where a step is missing).
func (r *Report) Verdicts() Verdicts {
	v := Verdicts{IdleTokens: math.NaN(), IdleConcurrency: math.NaN(), HalfTokens: math.NaN(), LostTokens: math.NaN()}
	quote := func(label string) *Quote {
		for i := range r.Quotes {
			if r.Quotes[i].Label == label {
				return &r.Quotes[i]
			}
		}
		return nil
	}
	// check is the majority of a check's steps, held steps less broken
	// ones (0: none, or as many of each, which counts against the quote
	// either way), and whether it has any.
	check := func(label string) (majority int, ok bool) {
		held, broke := tally(r.Checks, func(c Step) bool { return c.Label == label })
		return held - broke, held+broke > 0
	}
	if q := quote("idle"); q != nil {
		v.IdleTokens = ratio(q.TokensPerS, r.True.OutputTokPS)
		v.IdleConcurrency = ratio(q.Concurrency, r.TrueStreams)
	}
	if b, l := quote("idle, before the loss"), quote("one replica lost"); b != nil && l != nil && r.Replicas > 1 {
		v.LostTokens = ratio(l.TokensPerS, b.TokensPerS*float64(r.Replicas-1)/float64(r.Replicas))
	}
	rate, _ := check("1.00x idle quote")
	streams, ok := check("1.00x quoted concurrency")
	v.AtQuote = rate > 0 && (streams > 0 || !ok)
	over, _ := check("1.25x idle quote")
	v.Over = over < 0
	over, _ = check("1.25x quoted concurrency")
	v.ConcurrencyOver = over < 0
	if q := quote("half loaded"); q != nil {
		v.HalfTokens = ratio(q.TokensPerS, r.True.OutputTokPS-r.HalfLoadAtQuote)
	}
	half, _ := check("half load + 1.00x quote")
	v.HalfAtQuote = half > 0
	return v
}

// WriteJSONFile writes the report as indented JSON to path.
func (r *Report) WriteJSONFile(path string) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("cannot write %s: %w", path, err)
	}
	return nil
}

// WriteTable prints the ladder, the quotes, the checks and the verdicts.
func (r *Report) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "capacity proof: %s, %d replicas, objectives p%.0f TTFT %.0f ms, ITL %.0f ms (model time)\n",
		r.Scenario, r.Replicas, r.Objectives.Quantile*100, r.Objectives.TTFTSeconds*1000, r.Objectives.ITLSeconds*1000)
	if c := r.Calibration; c != nil {
		fmt.Fprintf(tw, "calibration: %.1f concurrency, %.0f tok/s per replica (wall), limit %s\n", c.Concurrency, c.OutputTokensPerSec, c.Limit)
	}
	fmt.Fprintln(tw, "step\tQPS\tstreams\trequests\terrors\tTTFT p95 ms\tITL p95 ms\tout tok/s\tconcurrency\trunning\twaiting\tprefix hits\twithin\t")
	row := func(s Step) {
		streams := ""
		if s.Streams > 0 {
			streams = strconv.Itoa(s.Streams)
		}
		fmt.Fprintf(tw, "%s\t%.2f\t%s\t%d\t%d\t%.0f\t%.1f\t%.0f\t%.1f\t%.1f\t%.1f\t%.3f\t%v\t\n", s.Label, s.QPS, streams, s.Requests, s.Errors,
			s.TTFTP95ms, s.ITLP95ms, s.OutputTokPS, s.Concurrency, s.Running, s.Waiting, s.PrefixHitRate, s.Within)
	}
	for _, s := range r.Ladder {
		row(s)
	}
	if len(r.Ladder) > 0 {
		row(r.True)
	}
	for _, s := range r.StreamsLadder {
		row(s)
	}
	if len(r.StreamsLadder) > 0 {
		fmt.Fprintf(tw, "true capacity, streams (fit)\t\t%.1f\t\t\t\t\t\t\t\t\t\t\t\n", r.TrueStreams)
	}
	if r.HalfLoad.Requests > 0 {
		row(r.HalfLoad)
		fmt.Fprintf(tw, "half load, output over the %v before the quote\t\t\t\t\t\t\t%.0f\t\t\t\t\t\t\n", capacity.RateSpan, r.HalfLoadAtQuote)
	}
	for _, s := range r.Checks {
		row(s)
	}
	fmt.Fprintln(tw, "quote\ttok/s\tconcurrency\treplicas\tcapacity tok/s\tcapacity concurrency\tcapacity streams\tbusy tok/s\tbusy\t")
	for _, q := range r.Quotes {
		fmt.Fprintf(tw, "%s\t%.0f\t%.0f\t%d\t%.0f\t%.1f\t%.1f\t%.0f\t%.1f\t\n", q.Label, q.TokensPerS, q.Concurrency, q.Replicas,
			q.CapacityTokensPerS, q.CapacityConcurrency, q.CapacityStreams, q.BusyTokensPerS, q.Busy)
	}
	v := r.Verdicts()
	fmt.Fprintln(tw, "verdict\tvalue\ttarget\t")
	fmt.Fprintf(tw, "idle quote / true capacity, tok/s\t%.3f\t0.90-1.00\t\n", v.IdleTokens)
	fmt.Fprintf(tw, "idle quote / true capacity, concurrency (streams)\t%.3f\t0.90-1.00\t\n", v.IdleConcurrency)
	fmt.Fprintf(tw, "objectives hold at 1.00x quote\t%v\ttrue\t\n", v.AtQuote)
	fmt.Fprintf(tw, "an objective breaks at 1.25x quote\t%v\ttrue\t\n", v.Over)
	fmt.Fprintf(tw, "an objective breaks at 1.25x quoted concurrency (streams)\t%v\ttrue\t\n", v.ConcurrencyOver)
	fmt.Fprintf(tw, "half-loaded quote / (true - background), tok/s\t%.3f\t0.90-1.10\t\n", v.HalfTokens)
	fmt.Fprintf(tw, "objectives hold at background + quote\t%v\ttrue\t\n", v.HalfAtQuote)
	fmt.Fprintf(tw, "quote after a replica is lost / (quote before) x (n-1)/n\t%.3f\t0.90-1.10\t\n", v.LostTokens)
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, s := range r.Skipped {
		if _, err := fmt.Fprintf(w, "skipped: %s\n", s); err != nil {
			return err
		}
	}
	return nil
}

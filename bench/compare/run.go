package compare

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"go.uber.org/zap"

	"github.com/omnious/provider-node/bench/rig"
	"github.com/omnious/provider-node/engines/tokenizer"
)

// Report is a whole bench run.
type Report struct {
	Scenario string
	Workload string
	Replicas int
	// Simulated is true when latencies are in model time.
	Simulated bool
	TimeScale float64
	// Bound is the workload's infinite-cache hit rate (NaN if unknown).
	Bound     float64
	BoundNote string
	// FleetBound is the hit rate of one LRU cache as large as the whole
	// fleet's KV cache (Workload.LRUBound): the best a router can do with
	// the fleet's capacity. NaN when unknown (real endpoints, chat).
	FleetBound float64
	Requests   int
	Results    []PolicyResult
	// Sweep is set by Sweep: the parameter points, in Results order.
	Sweep *SweepInfo
	// Started and Wall are when the run began and how long it took (wall).
	Started time.Time
	Wall    time.Duration
	// Published is the published run the scenario reproduces (nil: none).
	Published *Published
	// Agents is an agents workload's closed-loop agents (0: open loop).
	Agents int
}

// Run replays the workload of opts through every policy, each on a freshly
// started fleet, and returns the figures. launch puts a policy in front of
// the fleet. A policy that cannot be launched is reported with every request
// counted as an error; cancelling ctx stops the run (the fleet is always
// stopped).
func Run(ctx context.Context, opts Options, launch rig.Launcher) (*Report, error) {
	opts = opts.WithDefaults()
	if err := opts.Validate(); err != nil {
		return nil, fmt.Errorf("invalid bench options: %w", err)
	}
	w, err := rig.BuildWorkload(opts.Options)
	if err != nil {
		return nil, err
	}
	if len(w.Requests) == 0 {
		return nil, errors.New("the workload has no requests (raise the QPS, stage duration or limit)")
	}
	rep := &Report{Scenario: opts.Scenario, Workload: w.Name, Replicas: opts.Fleet.Replicas,
		Simulated: opts.Fleet.Mode != rig.FleetURLs, TimeScale: opts.Fleet.TimeScale,
		Bound: w.Bound, BoundNote: w.BoundNote, Requests: countRequests(opts, w), Started: time.Now(),
		Published: opts.Published}
	rep.FleetBound = math.NaN()
	if w.Closed != nil {
		rep.Agents = w.Closed.Agents
	}
	if rep.Simulated {
		e := rig.SimConfig(opts.Fleet, opts.Seed, w.MaxLen).Engine
		rep.FleetBound = w.LRUBound(int64(opts.Fleet.Replicas) * int64(e.NumGPUBlocks) * int64(e.BlockSize))
	}
	prog := newProgress(opts.Progress, len(opts.Policies)*rep.Requests)
	defer prog.finish()
	for i, policy := range opts.Policies {
		label := rig.PolicyLabel(policy)
		if len(opts.Labels) > 0 {
			label = opts.Labels[i]
		}
		prog.setLabel(label)
		pr, res, err := runPolicy(ctx, opts, w, policy, label, launch, prog.tick)
		if err != nil {
			return nil, err
		}
		if math.IsNaN(rep.Bound) && (opts.Workload.Kind == rig.WorkloadChat || opts.Workload.Kind == rig.WorkloadAgents) {
			rep.Bound = chatBound(res, chatSystemTokens(w))
		}
		rep.Results = append(rep.Results, pr)
		if ctx.Err() != nil {
			rep.Wall = time.Since(rep.Started)
			return rep, ctx.Err()
		}
	}
	rep.Wall = time.Since(rep.Started)
	return rep, nil
}

// countRequests is the number of HTTP requests the workload makes.
func countRequests(o Options, w *rig.Workload) int {
	switch o.Workload.Kind {
	case rig.WorkloadChat:
		return len(w.Requests) * o.Workload.Chat.Turns
	case rig.WorkloadAgents:
		n := 0
		for _, r := range w.Requests {
			n += r.Agent.Calls()
		}
		return n
	}
	return len(w.Requests)
}

func chatSystemTokens(w *rig.Workload) int {
	for _, r := range w.Requests {
		if r.Agent != nil {
			return len(tokenizer.NewStandIn().Encode(nil, "<|im_start|>system\n"+r.Agent.System+"<|im_end|>\n"))
		}
		if r.Session != nil {
			// The stand-in ChatML rendering of the system message.
			return len(tokenizer.NewStandIn().Encode(nil, "<|im_start|>system\n"+r.Session.System+"<|im_end|>\n"))
		}
	}
	return 0
}

// runPolicy runs one policy on a fresh fleet and always stops it.
func runPolicy(ctx context.Context, opts Options, w *rig.Workload, policy, label string, launch rig.Launcher, tick func()) (pr PolicyResult, res []*rig.Result, err error) {
	log := opts.Log.With(zap.String("policy", label))
	f, err := rig.StartFleet(ctx, opts.Fleet, opts.Seed, w.MaxLen, log)
	if err != nil {
		return pr, nil, fmt.Errorf("cannot start fleet for %s: %w", label, err)
	}
	defer func() {
		if serr := f.Stop(); serr != nil {
			log.Warn("stopping fleet", zap.Error(serr))
		}
	}()
	resetWarning := ""
	if opts.Fleet.Mode == rig.FleetURLs {
		resetWarning = f.ResetCaches(ctx)
	}
	before := f.Counters(ctx)
	target, lerr := launch(ctx, policy, f.Endpoints(), opts.EPPs)
	if lerr != nil {
		log.Error("cannot launch policy", zap.Error(lerr))
		pr = PolicyResult{Policy: label, Kind: rig.PolicyKind(policy), Requests: countRequests(opts, w), Errors: countRequests(opts, w),
			FirstError: "launch: " + lerr.Error(), HitRate: math.NaN(), MaxMeanLoad: math.NaN(), MaxMeanPromptLoad: math.NaN(),
			TTFTP50: math.NaN(), TTFTP90: math.NaN(), TTFTP99: math.NaN(), ITLP50: math.NaN(), ITLP99: math.NaN(),
			E2EP50: math.NaN(), E2EP90: math.NaN(), E2EP99: math.NaN(), DecisionP50us: math.NaN(), DecisionP99us: math.NaN()}
		return pr, nil, nil
	}
	defer func() {
		if cerr := target.Close(); cerr != nil {
			log.Warn("closing target", zap.Error(cerr))
		}
	}()
	model := ""
	if eps := f.Endpoints(); len(eps) > 0 {
		model = eps[0].Model
	}
	c := rig.NewClient(target.URL(), model)
	defer c.Close()
	res = rig.Replay(ctx, c, w, opts.MaxInFlight, opts.RequestTimeout, tick)
	after := f.Counters(context.Background())
	delta := make([]rig.Counters, len(after))
	for i := range after {
		delta[i] = after[i].Sub(before[i])
	}
	scale := 1.0
	if f.Simulated() {
		scale = opts.Fleet.TimeScale
	}
	pr = summarise(label, w, res, delta, target.DecisionLatencies(), scale)
	pr.Kind = rig.PolicyKind(policy)
	if opts.Workload.Kind == rig.WorkloadAgents {
		calls := map[int]int{}
		for i, r := range w.Requests {
			calls[i] = r.Agent.Calls()
		}
		pr.Sessions = sessionFigures(res, calls, pr.Duration, scale)
		if m, ok := target.(sessionCounter); ok {
			sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			if v, err := m.SessionCounts(sctx); err == nil {
				pr.Sessions.Moves, pr.Sessions.AdmittedRoom, pr.Sessions.AdmittedSpare = v.Moves, v.Room, v.Spare
			}
			cancel()
		}
	}
	if n, ok := target.(eppCounter); ok {
		pr.EPPs = n.EPPCount()
	}
	if x, ok := target.(externalInfo); ok {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		pr.EPP = x.Info(sctx)
		cancel()
		pr.DecisionP50us, pr.DecisionP99us = pr.EPP.DecisionPercentiles()
	}
	if f.Simulated() {
		pr.Warning = lagWarning(pr, opts.Fleet)
	} else {
		pr.Warning = resetWarning
	}
	log.Info("policy done", zap.Int("requests", pr.Requests), zap.Int("errors", pr.Errors),
		zap.Float64("ttft_p90_ms", pr.TTFTP90), zap.Float64("hit_rate", pr.HitRate))
	return pr, res, nil
}

// eppCounter is a target that knows how many EPPs serve it; externalInfo
// one that reads an external EPP's own metrics.
type (
	eppCounter     interface{ EPPCount() int }
	sessionCounter interface {
		SessionCounts(context.Context) (rig.SessionCounts, error)
	}
	externalInfo interface {
		Info(context.Context) *rig.EPPInfo
	}
)

// lagWarning detects a run the machine could not keep up with: the
// simulator coalesces the tokens a slow reader has not taken yet, so when the
// engines run behind real time or the readers starve, tokens arrive in
// bursts, the median gap between them drops far below one decode step, and
// every model-time latency (wall * time scale) is inflated.
func lagWarning(pr PolicyResult, f rig.FleetOptions) string {
	step := *rig.SimConfig(f, 0, 0).Engine.Timing.DecodeBase
	stepMS := float64(step) / float64(time.Millisecond)
	if math.IsNaN(pr.ITLP50) || pr.ITLP50 >= stepMS/2 {
		return ""
	}
	return fmt.Sprintf("tokens arrived in bursts (ITL p50 %.2f ms is under half a %.1f ms decode step): the machine did not keep up with the simulation at time scale %g, so latencies are inflated; lower the time scale",
		pr.ITLP50, stepMS, f.TimeScale)
}

package rig

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/omnious/provider-node/bench/internal/launch"
	"github.com/omnious/provider-node/bench/internal/promtext"
	"github.com/omnious/provider-node/capacity"
	"github.com/omnious/provider-node/endpoint"
	"github.com/omnious/provider-node/extproc/testgw"
	"github.com/omnious/provider-node/scheduler"
)

// ScrapeInterval is how often the EPP scrapes a simulated fleet when the
// policy does not say: simulated fleets run faster than real time, so the
// production default (2s) would see them through a keyhole.
const ScrapeInterval = 250 * time.Millisecond

// EPPLauncher runs each policy as a real EPP (epp, in process)
// with the test gateway in front of it: client -> gateway -> ext_proc ->
// replica, the path production takes through Envoy. policy is a scheduler
// policy name or the path of a scheduler config file (the `scheduler:`
// section of an EPP config, as bench sweep writes them); an exec: or addr:
// policy is another EndpointPicker behind the same gateway, run as ext
// says. epps EPPs side by side serve a policy, each subscribed to every
// replica's KV events and scraping every replica, as the Helm chart's
// replicas do; the gateway spreads streams over them.
func EPPLauncher(log *zap.Logger, ext ExternalOptions) Launcher {
	return EPPLauncherVia(log, ext, GatewayOptions{})
}

// EPPLauncherVia is EPPLauncher with gw in front of the EPPs; exec: and
// addr: policies run behind the test gateway only.
func EPPLauncherVia(log *zap.Logger, ext ExternalOptions, gw GatewayOptions) Launcher {
	ext = ext.WithDefaults()
	return func(ctx context.Context, policy string, fleet []endpoint.Endpoint, epps int) (Target, error) {
		if x, ok, err := parseExternal(policy); ok {
			if err != nil {
				return nil, err
			}
			if gw.Kind == GatewayEnvoy {
				return nil, fmt.Errorf("policy %s: -gateway envoy runs the bench's own EPPs only", policy)
			}
			return launchExternal(ctx, x, fleet, ext.Dir, *ext.Settle, epps, log)
		}
		return startEPPs(ctx, log, gw, policy, fleet, ext.Engines, epps, nil, ext.TimeScale)
	}
}

// Gateways: what stands in front of the EPPs.
const (
	// GatewayBuiltin is the test gateway, extproc/testgw (the default).
	GatewayBuiltin = "builtin"
	// GatewayEnvoy is the real Envoy on the shipped deploy/envoy config.
	GatewayEnvoy = "envoy"
)

// GatewayOptions choose the gateway in front of the bench's EPPs.
type GatewayOptions struct {
	// Kind is GatewayBuiltin (default, also "") or GatewayEnvoy.
	Kind string
	// EnvoyBin is the envoy binary for GatewayEnvoy.
	EnvoyBin string
	// Dir receives each Envoy's config and log (envoy.yaml, envoy.log);
	// default: a temporary directory per policy.
	Dir string
}

// StartEPPs runs policy (a scheduler policy name or config file, as
// EPPLauncher takes it) as epps real EPPs in process behind the test
// gateway, and waits until each has seen every replica. The first EPP,
// when onWindow is set, gives it every scrape window its capacity curves
// learn from.
func StartEPPs(ctx context.Context, log *zap.Logger, policy string, fleet []endpoint.Endpoint, epps int,
	onWindow func(addr string, w capacity.Window)) (*EPPTarget, error) {
	return startEPPs(ctx, log, GatewayOptions{}, policy, fleet, nil, epps, onWindow, 1)
}

// StartEPPsOn is StartEPPs in front of running engines (mode urls), which
// the EPPs see as eng says (EngineOptions.Resolve fills what it leaves
// out).
func StartEPPsOn(ctx context.Context, log *zap.Logger, policy string, fleet []endpoint.Endpoint, eng EngineOptions, epps int,
	onWindow func(addr string, w capacity.Window)) (*EPPTarget, error) {
	return startEPPs(ctx, log, GatewayOptions{}, policy, fleet, &eng, epps, onWindow, 1)
}

// startEPPs starts the EPPs behind gw. Behind Envoy each EPP names one
// endpoint per decision (extproc.max_endpoints 1, the EPP's default):
// the shipped config's ORIGINAL_DST cluster takes a single ip:port. The
// test gateway gets every endpoint of a decision and walks them.
// timeScale is the simulated fleet's (1 for real engines): the built-in
// policies' session timings run that much faster. eng is nil for a fleet
// the bench started, else what the EPPs are told of the running engines.
func startEPPs(ctx context.Context, log *zap.Logger, gw GatewayOptions, policy string, fleet []endpoint.Endpoint, eng *EngineOptions,
	epps int, onWindow func(addr string, w capacity.Window), timeScale float64) (*EPPTarget, error) {
	if gw.Kind != "" && gw.Kind != GatewayBuiltin && gw.Kind != GatewayEnvoy {
		return nil, fmt.Errorf("gateway %q: want builtin or envoy", gw.Kind)
	}
	sc, err := schedulerConfig(policy, timeScale)
	if err != nil {
		return nil, err
	}
	// The stand-in tokenizer is exact for enginesim only; running engines
	// get the tokenizer they are given, or none (approximate mode).
	tok := "none"
	if eng == nil && !slices.ContainsFunc(fleet, func(ep endpoint.Endpoint) bool { return ep.KVEvents == "" }) {
		tok = launch.TokenizerStandIn
	}
	if eng != nil {
		if sc, tok, err = engineConfig(ctx, log, sc, IsPolicyName(policy), *eng, fleet); err != nil {
			return nil, fmt.Errorf("policy %s: %w", policy, err)
		}
	} else if IsPolicyName(policy) {
		// Simulated replicas report their block size (-block-size) as
		// vLLM does; a built-in policy keys prompts with it. One that
		// cannot be read leaves the scheduler's.
		if e, err := (EngineOptions{}).Resolve(ctx, fleet); err == nil && e.BlockSize != 0 {
			sc.BlockSize = e.BlockSize
		}
	}
	t := &EPPTarget{}
	// Every endpoint of a decision (max_endpoints 0): the test gateway
	// walks the fallback list, as the comparison has always measured.
	maxEndpoints := new(0)
	if gw.Kind == GatewayEnvoy {
		maxEndpoints = nil
	}
	var addrs []string
	for i := range max(epps, 1) {
		l := log
		if epps > 1 {
			l = log.With(zap.Int("epp", i))
		}
		c := launch.InProcessConfig{Spec: launch.Spec{Scheduler: sc, Endpoints: fleet, Tokenizer: tok,
			MaxEndpoints: maxEndpoints, DrainTimeout: 5 * time.Second}, OnPick: t.observe, Log: l}
		if i == 0 {
			c.OnWindow = onWindow
		}
		e, err := launch.StartInProcess(c)
		if err != nil {
			return nil, errors.Join(fmt.Errorf("policy %s: %w", policy, err), t.Close())
		}
		t.epps = append(t.epps, e)
		addrs = append(addrs, e.GRPCAddr())
	}
	if gw.Kind == GatewayEnvoy {
		dir := gw.Dir
		if dir != "" {
			dir = filepath.Join(dir, filepath.Base(policy))
		}
		e, err := launch.StartEnvoy(ctx, gw.EnvoyBin, dir, addrs)
		if err != nil {
			return nil, errors.Join(fmt.Errorf("policy %s: %w", policy, err), t.Close())
		}
		t.gw = e
	} else {
		g, err := launch.StartGateway(testgw.Config{EPPs: addrs}, log)
		if err != nil {
			return nil, errors.Join(err, t.Close())
		}
		t.gw = g
	}
	for _, e := range t.epps {
		if _, err := e.WaitReady(ctx, len(fleet)); err != nil {
			return nil, errors.Join(err, t.Close())
		}
	}
	return t, nil
}

// schedulerConfig is a built-in policy's config, its session settings
// (wall-time objectives and timeouts) scaled to a fleet timeScale times
// faster than real time, or a config file's as written.
func schedulerConfig(policy string, timeScale float64) (scheduler.Config, error) {
	if IsPolicyName(policy) {
		c, err := launch.Tuning{Policy: policy, ScrapeInterval: ScrapeInterval, ScrapeTimeout: ScrapeInterval}.Config()
		if err != nil || !(timeScale > 0) || timeScale == 1 {
			return c, err
		}
		se := &c.Sessions
		wall := func(d time.Duration) time.Duration { return time.Duration(float64(d) / timeScale) }
		se.TTFTObjective, se.IdleTimeout, se.QueueTTL = wall(se.TTFTObjective), wall(se.IdleTimeout), wall(se.QueueTTL)
		se.PrefillRate *= timeScale
		return c, c.Validate()
	}
	data, err := os.ReadFile(policy)
	if err != nil {
		return scheduler.Config{}, fmt.Errorf("policy %q is neither a policy name nor a readable config file: %w", policy, err)
	}
	return scheduler.ParseConfig(data)
}

// engineConfig is sc for running engines as eng resolves them: their
// block size always (an EPP keying prompts with another finds no prefix),
// a built-in policy's scrape timeout (a config file keeps its own), and
// the tokenizer.
func engineConfig(ctx context.Context, log *zap.Logger, sc scheduler.Config, named bool, eng EngineOptions,
	fleet []endpoint.Endpoint) (scheduler.Config, string, error) {
	eng, err := eng.Resolve(ctx, fleet)
	if err != nil {
		return sc, "", err
	}
	if eng.BlockSize != 0 {
		sc.BlockSize = eng.BlockSize
	}
	if named {
		sc.Signals.ScrapeTimeout = eng.ScrapeTimeout
	}
	log.Info("EPPs in front of running engines", zap.Int("block_size", sc.BlockSize),
		zap.Duration("scrape_timeout", sc.Signals.ScrapeTimeout), zap.String("tokenizer", eng.Tokenizer))
	return sc, eng.Tokenizer, sc.Validate()
}

// IsPolicyName is whether s names a built-in policy (DefaultPolicies, or
// agent, which only the agents scenario runs by default).
func IsPolicyName(s string) bool {
	return slices.Contains(DefaultPolicies(), s) || s == scheduler.PolicyAgent
}

// EPPTarget is a policy run by the bench's own EPPs (StartEPPs).
type EPPTarget struct {
	epps []*launch.EPP
	gw   interface {
		URL() string
		Close() error
	} // nil until started

	mu        sync.Mutex
	latencies []time.Duration
}

func (t *EPPTarget) observe(d time.Duration) {
	t.mu.Lock()
	t.latencies = append(t.latencies, d)
	t.mu.Unlock()
}

// URL is the gateway's base URL.
func (t *EPPTarget) URL() string { return t.gw.URL() }

// DecisionLatencies are the EPPs' scheduling decisions' durations so far.
func (t *EPPTarget) DecisionLatencies() []time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]time.Duration(nil), t.latencies...)
}

// EPPCount is how many EPPs serve the policy.
func (t *EPPTarget) EPPCount() int { return len(t.epps) }

// EPPs are the EPPs serving the policy, the one given onWindow first.
func (t *EPPTarget) EPPs() []*launch.EPP { return t.epps }

// SessionCounts are the EPPs' session counters summed: Moves is
// omnious_epp_session_moves_total (calls the agent policy moved off their
// history's replica), Room and Spare omnious_epp_sessions_admitted_total
// by reason (room: within the KV budget; spare_compute: past it, onto a
// replica with compute to spare).
type SessionCounts struct{ Moves, Room, Spare float64 }

// SessionCounts reads the EPPs' session counters.
func (t *EPPTarget) SessionCounts(ctx context.Context) (SessionCounts, error) {
	var total SessionCounts
	for _, e := range t.epps {
		page, err := e.Metrics(ctx)
		if err != nil {
			return SessionCounts{}, err
		}
		var c [3]float64
		for i, q := range []struct {
			name string
			want map[string]string
		}{
			{"omnious_epp_session_moves_total", nil},
			{"omnious_epp_sessions_admitted_total", map[string]string{"reason": "room"}},
			{"omnious_epp_sessions_admitted_total", map[string]string{"reason": "spare_compute"}},
		} {
			if _, err := page.Seek(0, io.SeekStart); err != nil {
				return SessionCounts{}, fmt.Errorf("cannot reread the EPP's metrics: %w", err)
			}
			v, _, err := promtext.SumWhere(page, q.name, q.want)
			if err != nil {
				return SessionCounts{}, fmt.Errorf("cannot read %s: %w", q.name, err)
			}
			c[i] = v
		}
		total.Moves, total.Room, total.Spare = total.Moves+c[0], total.Room+c[1], total.Spare+c[2]
	}
	return total, nil
}

// Close stops the gateway, then every EPP started.
func (t *EPPTarget) Close() error {
	var errs []error
	if t.gw != nil {
		errs = append(errs, t.gw.Close())
	}
	for _, e := range t.epps {
		errs = append(errs, e.Stop())
	}
	return errors.Join(errs...)
}

package rig

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/omnious/provider-node/bench/internal/launch"
	"github.com/omnious/provider-node/bench/internal/loopback"
	"github.com/omnious/provider-node/bench/internal/promtext"
	"github.com/omnious/provider-node/endpoint"
	"github.com/omnious/provider-node/engines/sim"
)

// Fleet is a started set of replicas. Stop it exactly once.
type Fleet struct {
	endpoints []endpoint.Endpoint
	simulated bool
	stop      func() error
	http      *http.Client
	// kills stop one simulated replica each (Kills); nil for real URLs.
	kills []func()
}

// Endpoints are the replicas, in a stable order.
func (f *Fleet) Endpoints() []endpoint.Endpoint { return f.endpoints }

// Simulated is whether the bench started the replicas (in process or as
// processes): their latencies are in model time.
func (f *Fleet) Simulated() bool { return f.simulated }

// Kills stop one simulated replica each, the last one last; nil for real
// URLs, which the bench does not stop.
func (f *Fleet) Kills() []func() { return f.kills }

// Stop stops every replica the bench started and waits for them.
func (f *Fleet) Stop() error {
	f.http.CloseIdleConnections()
	if f.stop == nil {
		return nil
	}
	return f.stop()
}

// SimConfig is one simulated replica's configuration in a fleet of o;
// maxLen is the workload's longest request.
func SimConfig(o FleetOptions, seed int64, maxLen int) sim.Config {
	c := sim.Config{Listen: "127.0.0.1:0", Seed: seed, Model: o.Model, MaxModelLen: o.MaxModelLen}
	if c.MaxModelLen == 0 {
		c.MaxModelLen = max(40960, maxLen+16)
	}
	c.KVEvents.Endpoint = "tcp://127.0.0.1:0"
	c.KVEvents.ReplayEndpoint = "tcp://127.0.0.1:0"
	c.Engine.Flavour = o.Engine
	c.Engine.TimeScale = o.TimeScale
	c.Engine.NumGPUBlocks = o.NumGPUBlocks
	c.Engine.BlockSize = o.BlockSize
	c.Engine.MaxNumBatchedTokens = o.MaxNumBatchedTokens
	c.Engine.MaxNumSeqs = o.MaxNumSeqs
	c.Engine.Timing = o.Timing
	return c.WithDefaults()
}

// StartFleet starts (or, for URLs, attaches to) the fleet. Every replica
// gets the same seed, so outputs do not depend on routing. maxLen is the
// workload's longest request, to size simulated context limits.
func StartFleet(ctx context.Context, o FleetOptions, seed int64, maxLen int, log *zap.Logger) (*Fleet, error) {
	f := &Fleet{http: loopback.Client(10 * time.Second)}
	var err error
	switch o.Mode {
	case FleetInProcess:
		err = f.startInProcess(o, seed, maxLen, log)
	case FleetProcess:
		err = f.startProcesses(ctx, o, seed, maxLen)
	case FleetURLs:
		err = f.attach(ctx, o)
	default:
		err = fmt.Errorf("unknown fleet mode %q", o.Mode)
	}
	if err != nil {
		_ = f.Stop()
		return nil, err
	}
	return f, nil
}

func (f *Fleet) startInProcess(o FleetOptions, seed int64, maxLen int, log *zap.Logger) error {
	f.simulated = true
	cfg := SimConfig(o, seed, maxLen)
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("invalid replica config: %w", err)
	}
	runCtx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var errMu sync.Mutex
	var runErrs []error
	f.stop = func() error {
		cancel()
		wg.Wait()
		errMu.Lock()
		defer errMu.Unlock()
		return errors.Join(runErrs...)
	}
	for i := 0; i < o.Replicas; i++ {
		r, err := sim.NewReplica(cfg, 0, log.With(zap.Int("replica", i)))
		if err != nil {
			return fmt.Errorf("cannot start replica %d: %w", i, err)
		}
		rctx, kill := context.WithCancel(runCtx)
		f.kills = append(f.kills, kill)
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := r.Run(rctx); err != nil && rctx.Err() == nil {
				errMu.Lock()
				runErrs = append(runErrs, err)
				errMu.Unlock()
			}
		}()
		ep, err := f.describe(context.Background(), "http://"+r.Addr(), cfg.Model, cfg.Engine.Flavour)
		if err != nil {
			return err
		}
		f.endpoints = append(f.endpoints, ep)
	}
	return nil
}

// describe reads a simulated replica's bound KV-event endpoints.
func (f *Fleet) describe(ctx context.Context, base, model, flavour string) (endpoint.Endpoint, error) {
	u, _ := url.Parse(base)
	ep := endpoint.Endpoint{Addr: u.Host, Model: model, Engine: flavour, MetricsURL: base + "/metrics"}
	var stats struct {
		KVEvents struct {
			Endpoint       string `json:"endpoint"`
			ReplayEndpoint string `json:"replay_endpoint"`
		} `json:"kv_events"`
	}
	if err := loopback.GetJSON(ctx, f.http, base+"/admin/stats", &stats); err != nil {
		return ep, fmt.Errorf("cannot read replica %s stats: %w", base, err)
	}
	ep.KVEvents, ep.KVReplay = stats.KVEvents.Endpoint, stats.KVEvents.ReplayEndpoint
	return ep, nil
}

// startProcesses runs each replica as an enginesim process.
func (f *Fleet) startProcesses(ctx context.Context, o FleetOptions, seed int64, maxLen int) error {
	f.simulated = true
	bin, err := launch.FindEnginesim(o.EnginesimBin)
	if err != nil {
		return err
	}
	cfg := SimConfig(o, seed, maxLen)
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("invalid replica config: %w", err)
	}
	dir, err := os.MkdirTemp("", "bench-fleet-")
	if err != nil {
		return fmt.Errorf("cannot create fleet dir: %w", err)
	}
	sims, err := launch.StartSims(ctx, launch.SimsConfig{Bin: bin, Dir: dir, Replicas: o.Replicas, Config: cfg, LogLevel: "warn"})
	f.stop = func() error { return errors.Join(launch.StopSims(sims), os.RemoveAll(dir)) }
	if err != nil {
		return err
	}
	for _, s := range sims {
		f.endpoints = append(f.endpoints, s.Endpoint())
		f.kills = append(f.kills, func() { _ = s.Kill() })
	}
	return nil
}

// attach describes real endpoints, from an endpoint file as the EPP reads
// it or from URLs; only loopback addresses are accepted.
func (f *Fleet) attach(ctx context.Context, o FleetOptions) error {
	if o.EndpointsFile != "" {
		eps, err := readEndpointsFile(o.EndpointsFile)
		if err != nil {
			return err
		}
		for i := range eps {
			if o.Model != "" && eps[i].Model != o.Model {
				return fmt.Errorf("endpoint file %s: %s serves %q, not the model asked for, %q", o.EndpointsFile, eps[i].Addr, eps[i].Model, o.Model)
			}
		}
		f.endpoints = eps
		return nil
	}
	for _, raw := range o.URLs {
		u, err := url.Parse(strings.TrimRight(raw, "/"))
		if err != nil || u.Host == "" {
			return fmt.Errorf("bad endpoint URL %q", raw)
		}
		if !isLoopbackHost(u.Hostname()) {
			return fmt.Errorf("endpoint %q is not on loopback", raw)
		}
		base := u.Scheme + "://" + u.Host
		model := o.Model
		if model == "" {
			var models struct {
				Data []struct {
					ID string `json:"id"`
				} `json:"data"`
			}
			if err := loopback.GetJSON(ctx, f.http, base+"/v1/models", &models); err != nil || len(models.Data) == 0 {
				return fmt.Errorf("cannot list models of %s (pass the model): %v", base, err)
			}
			model = models.Data[0].ID
		}
		f.endpoints = append(f.endpoints, endpoint.Endpoint{Addr: u.Host, Model: model, Engine: f.flavourOf(ctx, base), MetricsURL: base + "/metrics"})
	}
	return nil
}

// flavourOf guesses a real endpoint's engine from its metric names.
func (f *Fleet) flavourOf(ctx context.Context, base string) string {
	body, err := loopback.Get(ctx, f.http, base+"/metrics")
	if err != nil {
		return ""
	}
	switch {
	case bytes.Contains(body, []byte("\nsglang:")):
		return "sglang"
	case bytes.Contains(body, []byte("\nvllm:")):
		return "vllm"
	}
	return ""
}

// ResetCaches empties the prefix caches of real endpoints before a policy,
// so that it does not profit from the previous policy's cache: vLLM's
// POST /reset_prefix_cache (served in its dev mode) or SGLang's POST
// /flush_cache. It returns a warning naming the endpoints it could not reset.
func (f *Fleet) ResetCaches(ctx context.Context) string {
	var failed []string
	for _, ep := range f.endpoints {
		ok := false
		for _, path := range []string{"/reset_prefix_cache", "/flush_cache"} {
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+ep.Addr+path, nil)
			if err != nil {
				continue
			}
			resp, err := f.http.Do(req)
			if err != nil {
				continue
			}
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				ok = true
				break
			}
		}
		if !ok {
			failed = append(failed, ep.Addr)
		}
	}
	if len(failed) == 0 {
		return ""
	}
	return "could not reset the prefix cache of " + strings.Join(failed, ", ") + ": this policy may profit from the previous one's cache"
}

// Counters are a replica's cumulative engine counters.
type Counters struct {
	OK                     bool // the replica exposed prefix-cache counters
	Queries, Hits          float64
	Requests, PromptTokens float64
}

// Sub is c less b, counter by counter: what a run added.
func (c Counters) Sub(b Counters) Counters {
	return Counters{OK: c.OK && b.OK, Queries: c.Queries - b.Queries, Hits: c.Hits - b.Hits,
		Requests: c.Requests - b.Requests, PromptTokens: c.PromptTokens - b.PromptTokens}
}

// Counters scrapes every replica's counters (a replica that cannot be read
// gives zero counters with OK false).
func (f *Fleet) Counters(ctx context.Context) []Counters {
	out := make([]Counters, len(f.endpoints))
	for i, ep := range f.endpoints {
		if body, err := loopback.Get(ctx, f.http, ep.MetricsURL); err == nil {
			out[i] = parseCounters(body)
		}
	}
	return out
}

// counterNames are the engine counters parseCounters reads.
var counterNames = []string{"vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "vllm:request_success_total",
	"vllm:prompt_tokens_total", "sglang:cached_tokens_total", "sglang:prompt_tokens_total", "sglang:num_requests_total"}

// parseCounters sums the counters the bench needs over their label sets,
// for vLLM and SGLang names, from the Prometheus text format. Lines it
// cannot read are skipped.
func parseCounters(body []byte) Counters {
	vals, seen, _ := promtext.Sum(bytes.NewReader(body), counterNames...)
	sums := make(map[string]float64, len(counterNames))
	for i, n := range counterNames {
		if seen[i] {
			sums[n] = vals[i]
		}
	}
	if _, ok := sums["vllm:prefix_cache_queries_total"]; ok {
		return Counters{OK: true, Queries: sums["vllm:prefix_cache_queries_total"], Hits: sums["vllm:prefix_cache_hits_total"],
			Requests: sums["vllm:request_success_total"], PromptTokens: sums["vllm:prompt_tokens_total"]}
	}
	if _, ok := sums["sglang:cached_tokens_total"]; ok {
		return Counters{OK: true, Queries: sums["sglang:prompt_tokens_total"], Hits: sums["sglang:cached_tokens_total"],
			Requests: sums["sglang:num_requests_total"], PromptTokens: sums["sglang:prompt_tokens_total"]}
	}
	return Counters{Requests: sums["vllm:request_success_total"] + sums["sglang:num_requests_total"],
		PromptTokens: sums["vllm:prompt_tokens_total"] + sums["sglang:prompt_tokens_total"]}
}

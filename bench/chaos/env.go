package chaos

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/omnious/provider-node/bench/internal/launch"
	"github.com/omnious/provider-node/bench/internal/loopback"
	"github.com/omnious/provider-node/endpoint"
	"github.com/omnious/provider-node/engines/sim"
	"github.com/omnious/provider-node/extproc/testgw"
	"github.com/omnious/provider-node/scheduler"
)

// The chaos fleet's timings. Scrapes are fast so that a scenario sees
// several of them per second; the breaker and ingestion keep their
// production thresholds (failure_threshold 3, max_backoff 5s), so the
// measured recovery times are those a deployment with this scrape
// interval would see.
const (
	scrapeInterval = 200 * time.Millisecond
	scrapeTimeout  = 200 * time.Millisecond
	staleAfter     = time.Second
	cooldown       = 2 * time.Second
	timeScale      = 10
	model          = "Qwen/Qwen3-32B"
)

// world is one scenario's environment: enginesim processes on loopback, the real
// EPP in process, the test gateway in front of it.
type world struct {
	log  *zap.Logger
	dir  string
	http *http.Client
	sims []*launch.Sim
	epp  *launch.EPP
	gw   *launch.Gateway

	servedMu sync.Mutex
	served   map[string]int // requests each endpoint answered, from the gateways
}

// setup tunes one scenario's environment.
type setup struct {
	replicas int
	// noReplay lists replicas whose replay endpoint the EPP is not told:
	// a gap on them cannot be filled.
	noReplay []int
	// cooldown, when set, replaces the breaker's cooldown.
	cooldown time.Duration
}

func newWorld(ctx context.Context, bin string, s setup, log *zap.Logger) (env *world, err error) {
	dir, err := os.MkdirTemp("", "bench-chaos-")
	if err != nil {
		return nil, fmt.Errorf("cannot create chaos dir: %w", err)
	}
	env = &world{log: log, dir: dir, http: loopback.Client(30 * time.Second), served: map[string]int{}}
	defer func() {
		if err != nil {
			_ = env.Close()
			env = nil
		}
	}()
	sc := sim.Config{Seed: 1, Model: model}
	sc.Engine.TimeScale = timeScale
	// A small cache: evictions happen, so the index has removals to follow.
	sc.Engine.NumGPUBlocks = 2000
	if env.sims, err = launch.StartSims(ctx, launch.SimsConfig{Bin: bin, Dir: dir, Replicas: s.replicas, Config: sc, LogLevel: "error"}); err != nil {
		return env, err
	}

	t := launch.Tuning{Policy: scheduler.PolicyPrecise, Seed: 1, ScrapeInterval: scrapeInterval, ScrapeTimeout: scrapeTimeout,
		StaleAfter: staleAfter, BreakerCooldown: cooldown,
		// Speculative credit would hide what the index itself knows.
		SpeculativeTTL: 300 * time.Millisecond}
	if s.cooldown != 0 {
		t.BreakerCooldown = s.cooldown
	}
	cfg, err := t.Config()
	if err != nil {
		return env, fmt.Errorf("invalid chaos scheduler config: %w", err)
	}
	noReplay := map[int]bool{}
	for _, i := range s.noReplay {
		noReplay[i] = true
	}
	var eps []endpoint.Endpoint
	for i, p := range env.sims {
		ep := p.Endpoint()
		if noReplay[i] {
			ep.KVReplay = ""
		}
		eps = append(eps, ep)
	}
	// One endpoint per decision, as behind Envoy's ORIGINAL_DST cluster: a
	// request routed to a dead replica fails instead of being rescued by
	// the gateway's fallback walk, so the client sees what the EPP did.
	if env.epp, err = launch.StartInProcess(launch.InProcessConfig{Scheduler: cfg, Endpoints: eps, StandInTokenizer: true,
		MaxEndpoints: new(1), DrainTimeout: 2 * time.Second, Log: log}); err != nil {
		return env, err
	}
	if env.gw, err = env.startGateway(testgw.Config{EPP: env.epp.GRPCAddr()}); err != nil {
		return env, err
	}
	if err := env.epp.WaitReady(ctx, len(env.sims)); err != nil {
		return env, err
	}
	for i, p := range env.sims {
		if err := env.sync(ctx, i, p); err != nil {
			return env, err
		}
	}
	return env, nil
}

// startGateway starts a test gateway whose answers count in served.
func (env *world) startGateway(cfg testgw.Config) (*launch.Gateway, error) {
	cfg.OnExchange = func(t testgw.Timing) {
		if t.Served == "" {
			return
		}
		env.servedMu.Lock()
		env.served[t.Served]++
		env.servedMu.Unlock()
	}
	return launch.StartGateway(cfg, env.log)
}

// takeServed returns the per-endpoint counts since the last call.
func (env *world) takeServed() map[string]int {
	env.servedMu.Lock()
	defer env.servedMu.Unlock()
	out := env.served
	env.served = map[string]int{}
	return out
}

// Close stops everything the environment started: gateway, EPP, every
// enginesim process; then removes its files. It may run again (a test's
// cleanup).
func (env *world) Close() error {
	var errs []error
	if env.gw != nil {
		errs = append(errs, env.gw.Close())
	}
	if env.epp != nil {
		errs = append(errs, env.epp.Stop())
	}
	errs = append(errs, launch.StopSims(env.sims))
	env.http.CloseIdleConnections()
	errs = append(errs, os.RemoveAll(env.dir))
	return errors.Join(errs...)
}

// sync makes the index start from a state it saw whole: ZMQ drops what is
// published before the subscription connects, so a probe request is sent
// until its blocks show in the index, then the replica is restarted
// (AllBlocksCleared) and its index entries are seen to be gone.
func (env *world) sync(ctx context.Context, i int, p *launch.Sim) error {
	for try := 0; ; try++ {
		if _, err := env.complete(ctx, promptOf(fmt.Sprintf("sync %d %d", i, try), 80), 1, p.Addr()); err != nil {
			return fmt.Errorf("sync of replica %d: %w", i, err)
		}
		n, err := env.indexBlocks(ctx, p.Addr())
		if err != nil {
			return err
		}
		if n > 0 {
			break
		}
		if try >= 100 {
			return fmt.Errorf("replica %d: its KV events never reached the index", i)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := env.post(ctx, p.URL()+"/admin/restart", `{}`); err != nil {
		return err
	}
	_, err := waitFor(ctx, 10*time.Second, func() (bool, error) {
		n, err := env.indexBlocks(ctx, p.Addr())
		return n == 0, err
	})
	if err != nil {
		return fmt.Errorf("replica %d: index not cleared after restart: %w", i, err)
	}
	return nil
}

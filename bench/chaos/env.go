package chaos

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
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
	// eppHealthInterval is how often the gateway health-checks each EPP
	// host when there are several (testgw's HealthUnhealthy, 2 failed
	// checks, marks one down; a stream it cannot open skips it at once).
	eppHealthInterval = 200 * time.Millisecond
	// eppDrainDelay is how long a stopping EPP of several still takes new
	// streams after its health turned NOT_SERVING: past the gateway's two
	// failed checks, as the production drain_delay covers Envoy's, so a
	// rollout's streams move away on health, not on refused streams.
	eppDrainDelay = 3 * eppHealthInterval
	// drainTimeout bounds an EPP's drain on a graceful stop.
	drainTimeout = 2 * time.Second
)

// world is one scenario's environment: enginesim processes on loopback,
// the real EPP (in process, or several bin/epp processes side by side) and
// the test gateway in front of it.
type world struct {
	log  *zap.Logger
	dir  string
	http *http.Client
	sims []*launch.Sim
	// epps are the EPPs serving the pool; epp is the first, the one the
	// single-EPP scenarios read.
	epps []*launch.EPP
	epp  *launch.EPP
	gw   *launch.Gateway

	// bins and spec start more EPPs like the world's own.
	bins bins
	spec launch.Spec

	servedMu sync.Mutex
	served   served // what the gateways' endpoints answered since takeServed
	// exchanges are the gateways' ended exchanges by EPP host; failedX
	// the failed ones.
	exchanges map[string]hostExchanges
	failedX   []exchangeEnd
}

// hostExchanges counts the exchanges that ended on one EPP host.
type hostExchanges struct {
	n    int
	last time.Time // when the last one ended
}

// exchangeEnd is how one exchange ended, as its gateway saw it.
type exchangeEnd struct {
	at     time.Time
	epp    string
	status int
	err    error
}

// setup tunes one scenario's environment.
type setup struct {
	replicas int
	// noReplay lists replicas whose replay endpoint the EPP is not told:
	// a gap on them cannot be filled.
	noReplay []int
	// cooldown, when set, replaces the breaker's cooldown.
	cooldown time.Duration
	// eppProcesses, when set, runs that many bin/epp processes side by side
	// (active-active, each subscribing to and scraping every replica)
	// behind one gateway, in place of the EPP in this process.
	eppProcesses int
	// gpuBlocks, when set, replaces the replicas' small chaos cache.
	gpuBlocks int
}

// bins are the binaries a world runs.
type bins struct {
	enginesim, epp string
	// adminToken: the EPPs' admin ports ask for a bearer token
	// (Options.AdminToken).
	adminToken bool
}

func newWorld(ctx context.Context, b bins, s setup, log *zap.Logger) (env *world, err error) {
	dir, err := os.MkdirTemp("", "bench-chaos-")
	if err != nil {
		return nil, fmt.Errorf("cannot create chaos dir: %w", err)
	}
	env = &world{log: log, dir: dir, http: loopback.Client(30 * time.Second), served: newServed(), exchanges: map[string]hostExchanges{}}
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
	if s.gpuBlocks > 0 {
		sc.Engine.NumGPUBlocks = s.gpuBlocks
	}
	if env.sims, err = launch.StartSims(ctx, launch.SimsConfig{Bin: b.enginesim, Dir: dir, Replicas: s.replicas, Config: sc, LogLevel: "error"}); err != nil {
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
	spec := launch.Spec{Scheduler: cfg, Endpoints: eps, Tokenizer: launch.TokenizerStandIn, MaxEndpoints: new(1), DrainTimeout: drainTimeout}
	if b.adminToken {
		tok := make([]byte, 32)
		_, _ = rand.Read(tok)
		spec.AdminTokenFile = filepath.Join(dir, "admin-token")
		if err := os.WriteFile(spec.AdminTokenFile, []byte(hex.EncodeToString(tok)), 0o600); err != nil {
			return env, fmt.Errorf("cannot write the admin token: %w", err)
		}
	}
	gwc := testgw.Config{}
	if s.eppProcesses == 0 {
		e, err := launch.StartInProcess(launch.InProcessConfig{Spec: spec, Log: log})
		if err != nil {
			return env, err
		}
		env.epps = append(env.epps, e)
		gwc.EPP = e.GRPCAddr()
	}
	if s.eppProcesses > 0 {
		spec.DrainDelay = eppDrainDelay
	}
	env.bins, env.spec = b, spec
	for i := range s.eppProcesses {
		e, err := launch.StartProcess(launch.ProcessConfig{Spec: spec, Bin: b.epp, Dir: filepath.Join(dir, fmt.Sprintf("epp-%d", i)),
			Name: fmt.Sprintf("EPP %d", i)})
		if err != nil {
			return env, err
		}
		env.epps = append(env.epps, e)
		gwc.EPPs = append(gwc.EPPs, e.GRPCAddr())
		gwc.HealthInterval = eppHealthInterval
	}
	env.epp = env.epps[0]
	if env.gw, err = env.startGateway(gwc); err != nil {
		return env, err
	}
	for _, e := range env.epps {
		if _, err := e.WaitReady(ctx, len(env.sims)); err != nil {
			return env, err
		}
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
		env.servedMu.Lock()
		defer env.servedMu.Unlock()
		now := time.Now()
		env.exchanges[t.EPP] = hostExchanges{n: env.exchanges[t.EPP].n + 1, last: now}
		if t.Err != nil || t.Status >= 500 {
			env.failedX = append(env.failedX, exchangeEnd{at: now, epp: t.EPP, status: t.Status, err: t.Err})
		}
		if t.Served != "" {
			env.served.add(t.Tag, t.Served)
		}
	}
	return launch.StartGateway(cfg, env.log)
}

// served counts the requests the endpoints answered, by endpoint, and by
// the request's tag (testgw.HeaderTag, the scenario's own) and endpoint.
type served struct {
	addr map[string]int
	tag  map[string]map[string]int
}

func newServed() served { return served{addr: map[string]int{}, tag: map[string]map[string]int{}} }

func (s served) add(tag, addr string) {
	s.addr[addr]++
	if tag == "" {
		return
	}
	if s.tag[tag] == nil {
		s.tag[tag] = map[string]int{}
	}
	s.tag[tag][addr]++
}

// takeServed returns the counts since the last call.
func (env *world) takeServed() served {
	env.servedMu.Lock()
	defer env.servedMu.Unlock()
	out := env.served
	env.served = newServed()
	return out
}

// exchangesOf is how many exchanges the gateways ran on the EPP at addr,
// and when the last one ended.
func (env *world) exchangesOf(addr string) (int, time.Time) {
	env.servedMu.Lock()
	defer env.servedMu.Unlock()
	x := env.exchanges[addr]
	return x.n, x.last
}

// failedExchanges are the exchanges that failed so far, as the gateways saw
// them, in the order they ended.
func (env *world) failedExchanges() []exchangeEnd {
	env.servedMu.Lock()
	defer env.servedMu.Unlock()
	return append([]exchangeEnd(nil), env.failedX...)
}

// Close stops everything the environment started: gateway, EPPs, every
// enginesim process, each by its own PID; then removes its files. It may
// run again (a test's cleanup).
func (env *world) Close() error {
	var errs []error
	if env.gw != nil {
		errs = append(errs, env.gw.Close())
	}
	for _, e := range env.epps {
		errs = append(errs, e.Stop())
	}
	errs = append(errs, launch.StopSims(env.sims))
	env.http.CloseIdleConnections()
	errs = append(errs, os.RemoveAll(env.dir))
	return errors.Join(errs...)
}

// sync makes every EPP's index start from a state it saw whole: ZMQ drops
// what is published before the subscription connects, so a probe request
// is sent until its blocks show in each index, then the replica is
// restarted (AllBlocksCleared) and its index entries are seen to be gone.
func (env *world) sync(ctx context.Context, i int, p *launch.Sim) error {
	for try := 0; ; try++ {
		if _, err := env.complete(ctx, promptOf(fmt.Sprintf("sync %d %d", i, try), 80), 1, p.Addr()); err != nil {
			return fmt.Errorf("sync of replica %d: %w", i, err)
		}
		n, _, err := env.indexSpread(ctx, p.Addr())
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
		_, n, err := env.indexSpread(ctx, p.Addr())
		return n == 0, err
	})
	if err != nil {
		return fmt.Errorf("replica %d: index not cleared after restart: %w", i, err)
	}
	return nil
}

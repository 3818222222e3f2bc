package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/omnious/provider-node/discovery"
	"github.com/omnious/provider-node/endpoint"
	"github.com/omnious/provider-node/extproc/testgw"
	"github.com/omnious/provider-node/internal/epp"
	"github.com/omnious/provider-node/scheduler"
)

// benchScrapeInterval is how often the in-process EPP scrapes a simulated
// fleet when the policy does not say: simulated fleets run faster than real
// time, so the production default (2s) would see them through a keyhole.
const benchScrapeInterval = 250 * time.Millisecond

// EPPLauncher runs each policy as a real EPP (extproc/epp, in process) with
// the test gateway in front of it: client -> gateway -> ext_proc -> replica,
// the path production takes through Envoy. policy is a scheduler policy
// name or the path of a scheduler config file (the `scheduler:` section of
// an EPP config, as bench sweep writes them).
func EPPLauncher(log *zap.Logger) Launcher {
	return func(ctx context.Context, policy string, fleet []FleetEndpoint) (Target, error) {
		sc, err := schedulerConfig(policy)
		if err != nil {
			return nil, err
		}
		cfg := epp.Config{GRPCAddr: "127.0.0.1:0", HealthAddr: "127.0.0.1:0", MetricsAddr: "127.0.0.1:0", AdminAddr: "127.0.0.1:0",
			Scheduler: sc, DrainTimeout: new(5 * time.Second)}
		eps := make(discovery.Fixed, len(fleet))
		simulated := true
		for i, f := range fleet {
			eps[i] = endpoint.Endpoint{Addr: f.Addr, Model: f.Model, Engine: f.Engine, MetricsURL: f.MetricsURL,
				KVEvents: f.KVEvents, KVReplay: f.KVReplay}
			simulated = simulated && f.KVEvents != ""
		}
		// The stand-in tokenizer is exact for enginesim only; real engines
		// are routed in approximate mode (no tokenizer configured here).
		cfg.StandInTokenizer = simulated
		// Every endpoint of a decision: the test gateway walks the list.
		cfg.ExtProc.MaxEndpoints = new(0)
		cfg = cfg.WithDefaults()

		t := &eppTarget{}
		e, err := epp.New(cfg, eps, log.Named("epp"), epp.WithPickObserver(t.observe))
		if err != nil {
			return nil, fmt.Errorf("cannot start EPP for %s: %w", policy, err)
		}
		runCtx, cancel := context.WithCancel(context.Background())
		t.cancel = cancel
		t.eppDone = make(chan error, 1)
		go func() { t.eppDone <- e.Run(runCtx) }()
		gw, err := testgw.New(testgw.Config{EPP: e.GRPCAddr()}, log.Named("gateway"))
		if err != nil {
			cancel()
			<-t.eppDone
			return nil, fmt.Errorf("cannot start the test gateway: %w", err)
		}
		t.url = "http://" + gw.Addr()
		t.gwDone = make(chan error, 1)
		go func() { t.gwDone <- gw.Run(runCtx) }()
		if err := waitReady(ctx, e, len(fleet)); err != nil {
			_ = t.Close()
			return nil, err
		}
		return t, nil
	}
}

func schedulerConfig(policy string) (scheduler.Config, error) {
	for _, p := range DefaultPolicies() {
		if policy == p {
			c := scheduler.DefaultConfig()
			c.Policy = policy
			c.Signals.ScrapeInterval = benchScrapeInterval
			c.Signals.ScrapeTimeout = benchScrapeInterval
			return c, c.Validate()
		}
	}
	data, err := os.ReadFile(policy)
	if err != nil {
		return scheduler.Config{}, fmt.Errorf("policy %q is neither a policy name nor a readable config file: %w", policy, err)
	}
	return scheduler.ParseConfig(data)
}

// waitReady returns once every replica has been scraped, plus a moment for
// the KV-event subscriptions to connect (ZMQ drops what is published
// before a subscriber is connected).
func waitReady(ctx context.Context, e *epp.EPP, replicas int) error {
	deadline := time.NewTimer(15 * time.Second)
	defer deadline.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		healthy := 0
		for _, m := range e.Scheduler().Capacity().Models {
			healthy += m.Healthy
		}
		if healthy >= replicas {
			time.Sleep(300 * time.Millisecond)
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline.C:
			return fmt.Errorf("EPP saw %d of %d replicas healthy after 15s", healthy, replicas)
		case <-tick.C:
		}
	}
}

type eppTarget struct {
	url             string
	cancel          context.CancelFunc
	eppDone, gwDone chan error

	mu        sync.Mutex
	latencies []time.Duration
}

func (t *eppTarget) observe(d time.Duration) {
	t.mu.Lock()
	t.latencies = append(t.latencies, d)
	t.mu.Unlock()
}

func (t *eppTarget) URL() string { return t.url }

func (t *eppTarget) DecisionLatencies() []time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]time.Duration(nil), t.latencies...)
}

func (t *eppTarget) Close() error {
	t.cancel()
	var errs []error
	if t.gwDone != nil {
		errs = append(errs, <-t.gwDone)
	}
	errs = append(errs, <-t.eppDone)
	return errors.Join(errs...)
}

package compare

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/omnious/provider-node/bench/internal/launch"
	"github.com/omnious/provider-node/endpoint"
	"github.com/omnious/provider-node/extproc/testgw"
	"github.com/omnious/provider-node/scheduler"
)

// scrapeInterval is how often the EPP scrapes a simulated fleet when the
// policy does not say: simulated fleets run faster than real time, so the
// production default (2s) would see them through a keyhole.
const scrapeInterval = 250 * time.Millisecond

// EPPLauncher runs each policy as a real EPP (internal/epp, in process)
// with the test gateway in front of it: client -> gateway -> ext_proc ->
// replica, the path production takes through Envoy. policy is a scheduler
// policy name or the path of a scheduler config file (the `scheduler:`
// section of an EPP config, as bench sweep writes them); an exec: or addr:
// policy is another EndpointPicker behind the same gateway, run as ext
// says.
func EPPLauncher(log *zap.Logger, ext ExternalOptions) Launcher {
	ext = ext.WithDefaults()
	return func(ctx context.Context, policy string, fleet []endpoint.Endpoint) (Target, error) {
		if x, ok, err := parseExternal(policy); ok {
			if err != nil {
				return nil, err
			}
			return launchExternal(ctx, x, fleet, ext.Dir, *ext.Settle, log)
		}
		sc, err := schedulerConfig(policy)
		if err != nil {
			return nil, err
		}
		// The stand-in tokenizer is exact for enginesim only; real engines
		// are routed in approximate mode (no tokenizer configured here).
		simulated := !slices.ContainsFunc(fleet, func(ep endpoint.Endpoint) bool { return ep.KVEvents == "" })
		t := &eppTarget{}
		// Every endpoint of a decision (max_endpoints 0): the test gateway
		// walks the fallback list, as the comparison has always measured.
		tok := "none"
		if simulated {
			tok = launch.TokenizerStandIn
		}
		e, err := launch.StartInProcess(launch.InProcessConfig{Spec: launch.Spec{Scheduler: sc, Endpoints: fleet, Tokenizer: tok,
			MaxEndpoints: new(0), DrainTimeout: 5 * time.Second}, OnPick: t.observe, Log: log})
		if err != nil {
			return nil, fmt.Errorf("policy %s: %w", policy, err)
		}
		t.epp = e
		if t.gw, err = launch.StartGateway(testgw.Config{EPP: e.GRPCAddr()}, log); err != nil {
			_ = e.Stop()
			return nil, err
		}
		if _, err := e.WaitReady(ctx, len(fleet)); err != nil {
			_ = t.Close()
			return nil, err
		}
		return t, nil
	}
}

func schedulerConfig(policy string) (scheduler.Config, error) {
	if isPolicyName(policy) {
		return launch.Tuning{Policy: policy, ScrapeInterval: scrapeInterval, ScrapeTimeout: scrapeInterval}.Config()
	}
	data, err := os.ReadFile(policy)
	if err != nil {
		return scheduler.Config{}, fmt.Errorf("policy %q is neither a policy name nor a readable config file: %w", policy, err)
	}
	return scheduler.ParseConfig(data)
}

func isPolicyName(s string) bool { return slices.Contains(DefaultPolicies(), s) }

type eppTarget struct {
	epp *launch.EPP
	gw  *launch.Gateway

	mu        sync.Mutex
	latencies []time.Duration
}

func (t *eppTarget) observe(d time.Duration) {
	t.mu.Lock()
	t.latencies = append(t.latencies, d)
	t.mu.Unlock()
}

func (t *eppTarget) URL() string { return t.gw.URL() }

func (t *eppTarget) DecisionLatencies() []time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]time.Duration(nil), t.latencies...)
}

func (t *eppTarget) Close() error {
	return errors.Join(t.gw.Close(), t.epp.Stop())
}

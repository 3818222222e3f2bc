// Package compare owns the routing-policy comparison (bench, bench sweep):
// it starts a fleet of engine replicas (simulated in this process,
// enginesim processes, or real OpenAI endpoints on loopback), replays a
// workload (Mooncake traces, shared-prefix groups on a QPS ladder,
// multi-turn chat sessions) through one routing policy at a time on a
// freshly started fleet, and reports latency, throughput, cache-hit and
// load-balance figures side by side as a table, the JSON contract
// (ContractJSON) and a self-contained HTML report; Sweep runs a grid of EPP
// configs and reports its Pareto front, Check the acceptance criteria of
// one policy against the others.
//
// A Launcher puts each policy in front of the fleet: EPPLauncher runs the
// real EPP in this process behind the test gateway (through
// bench/internal/launch, which assembles epp), or another
// EndpointPicker (exec:, addr:) behind the same gateway; DirectLauncher a
// plain reverse proxy with no EPP at all.
package compare

import (
	"context"
	"time"

	"github.com/omnious/provider-node/endpoint"
)

// Target is one routing policy in front of a fleet: every request goes
// client -> URL (a test gateway) -> EPP ext_proc -> replica.
type Target interface {
	// URL is the base URL of the OpenAI API through the gateway
	// (http://127.0.0.1:port).
	URL() string
	// DecisionLatencies are the EPP scheduling decision durations observed
	// so far (for decision_p99_us).
	DecisionLatencies() []time.Duration
	Close() error
}

// Launcher starts a Target for a named policy ("random", "round-robin",
// "least-queue", "approximate", "precise", a path to a user EPP config
// file, or an exec:/addr: external EPP) over the fleet's replicas, served
// by epps EPPs side by side where the policy runs in the bench's own EPP
// (Options.EPPs). A replica's KVEvents and KVReplay are empty for real
// endpoints the bench did not start.
type Launcher func(ctx context.Context, policy string, fleet []endpoint.Endpoint, epps int) (Target, error)

// DefaultPolicies is the default comparison, baselines first.
func DefaultPolicies() []string {
	return []string{"random", "round-robin", "least-queue", "approximate", "precise"}
}

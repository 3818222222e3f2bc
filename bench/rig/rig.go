// Package rig is the bench's test rig: it starts a fleet of engine
// replicas (simulated in this process, enginesim processes, or real OpenAI
// endpoints on loopback, StartFleet), puts a routing policy in front of it
// behind the test gateway (a Launcher: the real EPP in process,
// EPPLauncher or StartEPPs; another EndpointPicker, exec: or addr:; a
// plain reverse proxy, DirectLauncher), builds workloads (Mooncake traces,
// shared-prefix groups on a QPS ladder, multi-turn chat sessions,
// BuildWorkload) and sends them through the gateway (Client, Replay),
// recording what each request saw (Result). The policy comparison
// (bench/compare) and the capacity proof (bench/proof) are built on it.
package rig

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
// by epps EPPs side by side where the policy runs in the bench's own EPP.
// A replica's KVEvents and KVReplay are empty for real endpoints the bench
// did not start.
type Launcher func(ctx context.Context, policy string, fleet []endpoint.Endpoint, epps int) (Target, error)

// DefaultPolicies are the built-in policies, baselines first.
func DefaultPolicies() []string {
	return []string{"random", "round-robin", "least-queue", "approximate", "precise"}
}

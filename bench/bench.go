// Package bench owns the routing benchmark: it starts a fleet of engine
// replicas (simulated in-process, enginesim processes, or real OpenAI
// endpoints), replays a workload (Mooncake traces, shared-prefix groups on a
// QPS ladder, multi-turn chat sessions) through one routing policy at a time
// on a freshly started fleet, and reports latency, throughput, cache-hit and
// load-balance figures side by side as a table, a JSON document and a
// self-contained HTML report. It knows nothing of the EPP: a Launcher puts
// each policy in front of the fleet.
package bench

import (
	"context"
	"time"
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
// "least-queue", "approximate", "precise", or a path to a user EPP config
// file) over the given fleet endpoints.
type Launcher func(ctx context.Context, policy string, fleet []FleetEndpoint) (Target, error)

// FleetEndpoint is one replica (one engine rank) of the fleet.
type FleetEndpoint struct {
	// Addr is the replica's HTTP address, ip:port.
	Addr string
	// Model is the served model name.
	Model string
	// Engine is "vllm" or "sglang".
	Engine string
	// MetricsURL is the replica's Prometheus endpoint.
	MetricsURL string
	// KVEvents and KVReplay are the ZMQ PUB and ROUTER endpoints
	// (tcp://ip:port); empty for real endpoints the bench did not start.
	KVEvents, KVReplay string
}

// DefaultPolicies is the default comparison, baselines first.
func DefaultPolicies() []string {
	return []string{"random", "round-robin", "least-queue", "approximate", "precise"}
}

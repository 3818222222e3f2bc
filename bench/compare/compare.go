// Package compare owns the routing-policy comparison (bench, bench sweep):
// on the rig (bench/rig) it replays a workload through one routing policy
// at a time, each on a freshly started fleet, and reports latency,
// throughput, cache-hit and load-balance figures side by side as a table,
// the JSON contract (ContractJSON) and a self-contained HTML report; Sweep
// runs a grid of EPP configs and reports its Pareto front, Check the
// acceptance criteria of one policy against the others. Preset names the
// bundled scenarios (demo, llmd-73).
package compare

import "github.com/omnious/provider-node/bench/rig"

// DefaultPolicies is the default comparison, baselines first.
func DefaultPolicies() []string { return rig.DefaultPolicies() }

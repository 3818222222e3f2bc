// Package capacity owns the read-only capacity snapshot the EPP serves on its
// admin port (GET /v1/capacity) and the quoter reads: per model, how much
// headroom the pool has right now, computed from the same KV index and engine
// metrics the scheduler uses, and per replica the curve of its latency
// against its load and its prefill (Curve, learnt from the engines' own
// histograms and counters) from which the quoter reads the load it can
// sell within its objectives.
// It is deliberately narrow so the quoter never depends on scheduler
// internals.
package capacity

import "time"

// Path is where the EPP's admin server serves the snapshot.
const Path = "/v1/capacity"

// Snapshot is the whole pool at one instant.
type Snapshot struct {
	// Taken is when the snapshot was computed.
	Taken time.Time `json:"taken"`
	// Models has one entry per served base model.
	Models []Model `json:"models"`
}

// Model is the capacity of the replicas serving one model.
type Model struct {
	Model string `json:"model"`
	// Replicas is how many endpoints serve the model; Healthy those whose
	// breaker is closed and whose metrics are fresh.
	Replicas int `json:"replicas"`
	Healthy  int `json:"healthy"`
	// Stale counts replicas whose metrics are older than the staleness limit.
	Stale int `json:"stale"`
	// FreeKVBlocks and FreeKVTokens are summed over healthy replicas
	// (total minus used, from the engines' own cache metrics).
	FreeKVBlocks int64 `json:"free_kv_blocks"`
	FreeKVTokens int64 `json:"free_kv_tokens"`
	// TotalKVTokens is the KV capacity of healthy replicas.
	TotalKVTokens int64 `json:"total_kv_tokens"`
	// Waiting and Running are the engines' queue depth and running requests,
	// summed; InFlight is what the EPP routed and has not seen finish.
	Waiting  int `json:"waiting"`
	Running  int `json:"running"`
	InFlight int `json:"in_flight"`
	// MaxConcurrency is the configured running-request target summed over
	// healthy replicas (the scheduler's admission.target_inflight each, 256
	// by default as vLLM's max_num_seqs).
	MaxConcurrency int `json:"max_concurrency"`
	// OutputTokensPerSec and PromptTokensPerSec are measured over the last
	// scrape window from the engines' counters.
	OutputTokensPerSec float64 `json:"output_tokens_per_sec"`
	PromptTokensPerSec float64 `json:"prompt_tokens_per_sec"`
	// PrefixHitRate is prefix-cache hits over queries (tokens) over the
	// window, 0..1.
	PrefixHitRate float64 `json:"prefix_hit_rate"`
	// ReplicaCapacity has one entry per endpoint, with what was learnt of
	// its capacity, for the quoter to read at its objectives.
	ReplicaCapacity []Replica `json:"replica_capacity,omitempty"`
	// Admission is the EPP's flow control, nil when it is off.
	Admission *Admission `json:"admission,omitempty"`
}

// Replica is one endpoint's load now and its learnt capacity curve.
type Replica struct {
	Addr string `json:"addr"`
	// Healthy is breaker closed and metrics fresh; Stale is metrics older
	// than the staleness limit. Only a healthy replica has capacity to sell.
	Healthy bool `json:"healthy"`
	Stale   bool `json:"stale"`
	// Running and Waiting are the engine's counts at its last scrape;
	// InFlight what this EPP routed there and has not seen finish.
	Running  int `json:"running"`
	Waiting  int `json:"waiting"`
	InFlight int `json:"in_flight"`
	// MaxRunning is the scheduler's admission.target_inflight, the batch
	// size it will fill a replica to.
	MaxRunning int `json:"max_running"`
	// OutputTokensPerSec is the engine's output rate over its last 30 s of
	// scrapes: the load's sustained rate, which one window's reading
	// misses by half or more on a mix of long prompts (Learner.OutputRate).
	OutputTokensPerSec float64 `json:"output_tokens_per_sec"`
	// Load is the mean number of requests in the engine, running or
	// waiting, over the same 30 s (Learner.Load): the load that rate went
	// with, where Running and Waiting are one scrape's count.
	Load float64 `json:"load"`
	// FreeKVTokens and TotalKVTokens are its KV cache (healthy only).
	FreeKVTokens  int64 `json:"free_kv_tokens"`
	TotalKVTokens int64 `json:"total_kv_tokens"`
	// Curve is the replica's latency against its load, learnt from its
	// scrapes.
	Curve Curve `json:"curve"`
}

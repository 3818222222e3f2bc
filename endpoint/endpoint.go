// Package endpoint is the one type discovery produces and the scheduler
// consumes: a serving target. It is a leaf so that neither layer depends on
// the other.
package endpoint

// Endpoint is one serving target: one engine rank's HTTP address. Several
// endpoints may share an IP (data-parallel ranks, several target ports).
type Endpoint struct {
	// Addr is "ip:port", the value placed in x-gateway-destination-endpoint.
	Addr string
	// Model is the base model the endpoint serves (as /v1/models reports).
	Model string
	// Engine is "vllm" or "sglang": it selects metric names and KV-event
	// encodings.
	Engine string
	// MetricsURL is scraped for engine metrics ("" = no scraping).
	MetricsURL string
	// KVEvents is the engine's ZMQ PUB endpoint ("" = no KV events), and
	// KVReplay its ROUTER replay endpoint ("" = no replay).
	KVEvents string
	KVReplay string
	// KVConnect says the engine publishes its KV events by connecting to
	// the EPP's bound socket (vLLM with an endpoint without "*", llm-d's
	// centralized mode) rather than binding its own; the events are told
	// apart by the topic kv@<Addr>@<model>. KVEvents and KVReplay are then
	// "".
	KVConnect bool
	// Labels are free-form (pod labels, static-file labels).
	Labels map[string]string
}

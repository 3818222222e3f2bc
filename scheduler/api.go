// Package scheduler decides where each request goes: it scores the replicas
// of a pool on prefix-cache hits (precise from the KV index, approximate
// from text when tokens are unknown), queue depth, in-flight requests, KV
// pressure and session/LoRA affinity, filters out replicas that cannot or
// should not serve, guards against hot-spotting, trips per-replica circuit
// breakers, and admits requests by priority band (flow control).
//
// This file is the contract with the ext_proc server: the types it builds
// and consumes. The picker itself never blocks on I/O; Pick may wait only in
// the flow-control queue, bounded by the band's TTL and the caller's context.
package scheduler

import (
	"errors"
	"net/http"
	"time"

	"github.com/omnious/provider-node/endpoint"
)

// Request is what the scheduler needs to know about one request. The
// ext_proc server fills it from the headers and the single parse of the body.
type Request struct {
	// ID identifies the request in logs (x-request-id or generated).
	ID string
	// Model is the model the engine will be asked for (after any rewrite);
	// it may be a LoRA adapter name served on top of a base model.
	Model string
	// Tokens are the exact prompt token ids the engine will see (chat
	// template rendered and tokenized), or nil when the tokenizer for Model
	// is unavailable: then PromptText drives approximate prefix matching.
	Tokens []uint32
	// PromptText is the prompt as text (rendered chat or completion prompt),
	// for approximate prefix matching. It may alias the request body: the
	// scheduler must not keep it after Pick returns.
	PromptText []byte
	// CacheSalt is the request's cache_salt (isolates prefix caching).
	CacheSalt string
	// SessionKey is the affinity key: the session header, else the OpenAI
	// "user" field; "" for none.
	SessionKey string
	// Band is the flow-control priority band name ("" = the default band).
	Band string
	// Tenant is the fairness/usage key (extproc's tenant_header, default
	// x-gateway-inference-fairness-id); "" = "default-flow".
	Tenant string
	// Subset, when non-nil, restricts candidates to these "ip:port" values
	// (Envoy's subset hint); an empty non-nil slice matches nothing.
	Subset []string
	// Arrived is when the request reached the EPP (queue wait is measured
	// from it).
	Arrived time.Time
}

// Decision is the scheduler's answer.
type Decision struct {
	// Endpoints is the primary followed by up to the configured number of
	// fallbacks, best first. Never empty when Pick returns no error.
	Endpoints []*endpoint.Endpoint
	// Reason says why the primary was chosen, for metrics and logs:
	// "prefix", "load_balance_override", "cold", "session", "fallback",
	// "random", "round_robin", "least_queue".
	Reason string
	// PrefixBlocks is the primary's matched prefix in blocks, and
	// PromptBlocks the prompt's full blocks (0 when unknown).
	PrefixBlocks, PromptBlocks int
	// Mode is "precise" or "approximate".
	Mode string
	// Queued is how long the request waited in flow control.
	Queued time.Duration

	done func(DoneInfo)
}

// DoneInfo reports how a routed request ended. The ext_proc server calls
// Decision.Done exactly once per successful Pick, when the response ended
// (or failed, or the client went away).
type DoneInfo struct {
	// Served is the "ip:port" that actually served the request (the
	// gateway's x-gateway-destination-endpoint-served), "" if unknown; it
	// may be a fallback.
	Served string
	// Status is the upstream HTTP status (0 when no response arrived).
	Status int
	// Err is set when the upstream failed (connect error, reset, timeout).
	Err error
	// PromptTokens, CachedTokens and CompletionTokens come from the
	// response's usage (0 when absent).
	PromptTokens, CachedTokens, CompletionTokens int
	// FirstByte and Total are the time to the first response byte and the
	// whole exchange, measured by the ext_proc server (0 when unknown).
	FirstByte, Total time.Duration
}

// Done must be called exactly once when the routed request has ended. It
// releases in-flight accounting, feeds the breaker and usage counters.
func (d *Decision) Done(info DoneInfo) {
	if d != nil && d.done != nil {
		d.done(info)
		d.done = nil
	}
}

// Error is a scheduling failure with the HTTP status the client gets.
type Error struct {
	Status int
	// Reason is a short machine-readable cause, used as the reason header
	// and metric label: "model_not_served", "no_endpoint", "queue_full",
	// "queue_expired", "shed", "client_gone".
	Reason string
	Msg    string
}

func (e *Error) Error() string { return e.Msg }

// Errors the ext_proc server maps to immediate responses.
var (
	ErrModelNotServed = &Error{http.StatusNotFound, "model_not_served", "model is not served by this pool"}
	ErrNoEndpoint     = &Error{http.StatusServiceUnavailable, "no_endpoint", "no endpoint can serve the request"}
	ErrQueueFull      = &Error{http.StatusTooManyRequests, "queue_full", "the request's priority band queue is full"}
	ErrQueueExpired   = &Error{http.StatusServiceUnavailable, "queue_expired", "the request waited longer than its band's queue TTL"}
	ErrShed           = &Error{http.StatusTooManyRequests, "shed", "the pool is saturated for the request's band"}
	ErrClientGone     = &Error{http.StatusServiceUnavailable, "client_gone", "the client went away while queued"}
)

// StatusOf returns the HTTP status for err: the Error's status, or 500.
func StatusOf(err error) int {
	var e *Error
	if errors.As(err, &e) {
		return e.Status
	}
	return http.StatusInternalServerError
}

// SetDone sets the function Done calls; schedulers (and test fakes) use it.
func (d *Decision) SetDone(f func(DoneInfo)) { d.done = f }

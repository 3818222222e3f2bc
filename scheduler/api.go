// Package scheduler decides where each request goes: it scores the replicas
// of a pool on prefix-cache hits (precise from the KV index, approximate
// from text when tokens are unknown), queue depth, in-flight requests, KV
// pressure and session/LoRA affinity, filters out replicas that cannot or
// should not serve, guards against hot-spotting, trips per-replica circuit
// breakers, and admits requests by priority band (flow control).
//
// This file is the contract with the ext_proc server: the types it builds
// and consumes. Admission and placement are two calls: Admit may wait in the
// flow-control queue, bounded by the band's TTL and the caller's context;
// Pick never waits.
package scheduler

import (
	"net/http"
	"time"

	"github.com/omnious/provider-node/endpoint"
	"github.com/omnious/provider-node/kvindex"
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
	// template rendered and tokenized) after those Prefix holds: the whole
	// prompt without a Prefix. Both nil when the tokenizer for Model is
	// unavailable: then PromptText drives approximate prefix matching.
	// Read the prompt through TokenCount, HasTokens and AppendTokens, never
	// Tokens alone. They must not be kept after Pick returns (the ext_proc
	// server reuses their buffer).
	Tokens []uint32
	// Prefix, when non-nil, holds the prompt's leading ids as the
	// tokenizer's prefix cache stored them (tokenizer.PrefixCache.EncodeTail),
	// by reference: the ids are the cache's, read-only, and neither they
	// nor Prefix are kept after Pick returns. The block keys of that part
	// come from its entries rather than from a comparison and hash of the
	// ids (kvindex.KeyCache.AppendPrefixKeys), and its ids are never copied
	// into one slice. Pick decides as it would on the whole prompt in
	// Tokens (TestPickWithCachedPrefix, FuzzPickWithCachedPrefix).
	Prefix kvindex.CachedPrefix
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
	// x-gateway-inference-fairness-id); "" = "default-flow";
	// CalibrationTenant for `quoter calibrate`'s traffic.
	Tenant string
	// Subset, when non-nil, restricts candidates to these "ip:port" values
	// (Envoy's subset hint); an empty non-nil slice matches nothing.
	Subset []string
	// Arrived is when the request reached the EPP (queue wait is measured
	// from it).
	Arrived time.Time
}

// HasTokens reports whether the request's prompt ids are known (Tokens
// or Prefix set): the precise matching's condition.
func (r *Request) HasTokens() bool { return r.Tokens != nil || r.Prefix != nil }

// TokenCount is the number of prompt ids: Prefix's and Tokens'.
func (r *Request) TokenCount() int {
	if r.Prefix == nil {
		return len(r.Tokens)
	}
	return r.Prefix.Len() + len(r.Tokens)
}

// AppendTokens appends the prompt's ids in order (Prefix's runs, then
// Tokens) to dst and returns it, for a reader that needs the ids
// themselves, kept or not past Pick; most need only TokenCount.
func (r *Request) AppendTokens(dst []uint32) []uint32 {
	if r.Prefix != nil {
		runs, _ := r.Prefix.AppendRuns(nil, nil)
		for _, ids := range runs {
			dst = append(dst, ids...)
		}
	}
	return append(dst, r.Tokens...)
}

// Decision is the scheduler's answer.
type Decision struct {
	// Endpoints is the primary followed by up to the configured number of
	// fallbacks, best first. Never empty when Pick returns no error.
	Endpoints []*endpoint.Endpoint
	// Reason says why the primary was chosen, for metrics and logs:
	// "prefix", "recall" (the index showed the prefix nowhere; it went
	// where it was routed last), "load_balance_override", "cold",
	// "session", "fallback", "random", "round_robin", "least_queue".
	Reason string
	// PrefixBlocks is the primary's matched prefix in blocks, and
	// PromptBlocks the prompt's full blocks (0 when unknown).
	PrefixBlocks, PromptBlocks int
	// Mode is "precise" or "approximate".
	Mode string
	// Queued is how long the request waited in flow control.
	Queued time.Duration
	// Priority, when set, is the request priority the ext_proc server
	// writes into the body, over any the client sent: with
	// sessions.sglang_priority on and every endpoint SGLang, that
	// priority for a call of an admitted session, else 0. Nil leaves the
	// body alone (TestSGLangPriority).
	Priority *int

	done   func(DoneInfo)
	picked *picked // the Scheduler's own decisions, instead of done; nil once done
	// mem is the memory of the Scheduler's own decisions, which Release
	// gives back (nil once released).
	mem *picked
}

// DoneInfo reports how a routed request ended. The ext_proc server calls
// Decision.Done exactly once per successful Pick, when the response ended
// (or failed, or the client went away).
type DoneInfo struct {
	// Served is the "ip:port" that actually served the request (the
	// gateway's x-gateway-destination-endpoint-served), "" if unknown; it
	// may be a fallback.
	Served string
	// Status is the upstream HTTP status as the gateway reported it in the
	// response phase (0 when none arrived). Envoy answers a connect failure
	// or an upstream reset before headers with its own 503 there.
	Status int
	// Err is set when the exchange ended before the response did: the
	// ext_proc stream was cancelled, reset or timed out. The EPP cannot see
	// why (the client went away, response processing is off, Envoy reset
	// the stream), so Err alone is no evidence against the replica.
	Err error
	// PromptTokens, CachedTokens and CompletionTokens come from the
	// response's usage (0 when absent).
	PromptTokens, CachedTokens, CompletionTokens int
	// FirstByte and Total are the time to the first response byte and the
	// whole exchange, measured by the ext_proc server (0 when unknown).
	FirstByte, Total time.Duration
}

// Outcome is what a finished request says about the replica that served it.
type Outcome int

// Outcomes, as labelled on omnious_epp_request_outcomes_total.
const (
	// OutcomeUnknown: nothing either way (no response status, or the
	// stream ended before a non-5xx response did). Breakers ignore it; a
	// dead engine is caught by its failed scrapes instead.
	OutcomeUnknown Outcome = iota
	// OutcomeSuccess: a status below 500 and a complete exchange.
	OutcomeSuccess
	// OutcomeFailure: a 5xx status, the engine's or Envoy's own for a
	// connect failure or reset, whether or not the body completed.
	OutcomeFailure
)

var outcomeNames = [...]string{OutcomeUnknown: "unknown", OutcomeSuccess: "success", OutcomeFailure: "failure"}

func (o Outcome) String() string { return outcomeNames[o] }

// Outcome classifies the end of a request: only a 5xx counts against the
// replica, only a complete non-5xx exchange for it.
func (i DoneInfo) Outcome() Outcome {
	switch {
	case i.Status >= 500:
		return OutcomeFailure
	case i.Status > 0 && i.Err == nil:
		return OutcomeSuccess
	default:
		return OutcomeUnknown
	}
}

// Done must be called exactly once when the routed request has ended. It
// releases in-flight accounting, feeds the breaker and usage counters.
// The decision stays readable until Release.
func (d *Decision) Done(info DoneInfo) {
	switch {
	case d == nil:
	case d.picked != nil:
		pk := d.picked
		d.picked = nil
		pk.done(info)
	case d.done != nil:
		d.done(info)
		d.done = nil
	}
}

// Release gives the memory of a decision that is done back to the
// Scheduler, for a later decision, so that Pick does not allocate. It is
// optional: call it once, after Done, when nothing reads the decision any
// more; a decision released before Done is left alone (Done still has to
// be called, and the memory is then the garbage collector's).
func (d *Decision) Release() {
	if d == nil || d.picked != nil || d.mem == nil {
		return
	}
	pk := d.mem
	d.mem = nil
	pk.s.decisions.Put(pk)
}

// Error is a scheduling failure with the HTTP status the client gets.
type Error struct {
	Status int
	// Reason is a short machine-readable cause, used as the reason header
	// and metric label: "model_not_served", "no_endpoint", "queue_full",
	// "queue_expired", "client_gone".
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
	ErrClientGone     = &Error{http.StatusServiceUnavailable, "client_gone", "the client went away while queued"}
)

// errNoRequest answers a nil request.
var errNoRequest = &Error{http.StatusBadRequest, "bad_request", "no request"}

// SetDone sets the function Done calls. The Scheduler sets it on its own
// decisions; other implementations of the ext_proc server's Picker (a
// different placement policy, a test double) set theirs, as grpc-go's
// balancers fill PickResult.Done.
func (d *Decision) SetDone(f func(DoneInfo)) { d.done = f }

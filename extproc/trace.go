package extproc

import (
	"strconv"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/omnious/provider-node/scheduler"
)

// Tracing. With a TracerProvider set, every request gets a span
// "epp.request" from its headers to the end of its response, a child of
// the client's W3C trace context when the request carries one. The routing
// reply sets traceparent (and tracestate) to that span, so the engine's
// own span (vLLM with --otlp-traces-endpoint) hangs under the EPP's and one
// trace shows gateway, routing decision and generation. Without a provider
// nothing is traced and the client's headers pass through untouched.

const (
	headerTraceparent = "traceparent"
	headerTracestate  = "tracestate"
)

var traceContext propagation.TraceContext

// SetTracerProvider makes the server trace requests; call it before the
// server receives streams. A nil provider turns tracing off.
func (s *Server) SetTracerProvider(tp trace.TracerProvider) {
	s.tracer = nil
	if tp != nil {
		s.tracer = tp.Tracer("github.com/omnious/provider-node/extproc")
	}
}

// traceHeaders carries the W3C trace context between the header list and
// the propagator: the two headers it knows, read while the request's
// headers are scanned.
type traceHeaders struct{ parent, state string }

func (h *traceHeaders) Get(key string) string {
	switch key {
	case headerTraceparent:
		return h.parent
	case headerTracestate:
		return h.state
	}
	return ""
}

func (h *traceHeaders) Set(key, value string) {
	switch key {
	case headerTraceparent:
		h.parent = value
	case headerTracestate:
		h.state = value
	}
}

func (h *traceHeaders) Keys() []string { return []string{headerTraceparent, headerTracestate} }

// startSpan opens the request's span; the stream's context becomes its
// context so the scheduler's work is inside it.
func (st *stream) startSpan() {
	parent := traceContext.Extract(st.ctx, &st.trace)
	st.ctx, st.span = st.s.tracer.Start(parent, "epp.request", trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithTimestamp(st.arrived), trace.WithAttributes(
			attribute.String("http.request.method", st.method),
			attribute.String("url.path", st.path),
			attribute.String("omnious.epp.request_id", st.id)))
}

// traceReply adds to r the headers that carry the span to the upstream.
func (st *stream) traceReply(r *routeReply) {
	var h traceHeaders
	traceContext.Inject(st.ctx, &h) // the span's context, set by startSpan
	if h.parent == "" {
		return
	}
	r.add(headerTraceparent, stringBytes(h.parent))
	if h.state != "" {
		r.add(headerTracestate, stringBytes(h.state))
	}
}

// spanRouted records the decision on the span.
func (st *stream) spanRouted(d *scheduler.Decision, dest, mode string) {
	st.span.AddEvent("routed", trace.WithAttributes(
		attribute.String("omnious.epp.destination", dest),
		attribute.String("omnious.epp.reason", d.Reason),
		attribute.String("omnious.epp.prompt_mode", mode),
		attribute.Int("omnious.epp.prefix_blocks", d.PrefixBlocks),
		attribute.Int("omnious.epp.prompt_blocks", d.PromptBlocks),
		attribute.Int64("omnious.epp.queued_us", d.Queued.Microseconds())))
	st.span.SetAttributes(attribute.String("gen_ai.request.model", st.clientModel),
		attribute.String("omnious.epp.target_model", st.targetModel),
		attribute.String("omnious.epp.destination", dest))
}

// endSpan closes the span with the request's outcome: the status Envoy saw
// upstream, the served endpoint, usage, or the EPP's own rejection.
func (st *stream) endSpan(err error) {
	sp := st.span
	if sp == nil {
		return
	}
	st.span = nil
	attrs := []attribute.KeyValue{attribute.String("omnious.epp.end", st.end)}
	if st.status != 0 {
		attrs = append(attrs, attribute.Int("http.response.status_code", st.status))
	}
	if st.served != "" {
		attrs = append(attrs, attribute.String("omnious.epp.served", st.served))
	}
	if u := st.resp.usage; u.seen {
		attrs = append(attrs, attribute.Int("gen_ai.usage.input_tokens", u.prompt),
			attribute.Int("gen_ai.usage.output_tokens", u.completion),
			attribute.Int("omnious.epp.cached_tokens", u.cached))
	}
	sp.SetAttributes(attrs...)
	switch {
	case st.rejected != 0:
		sp.SetStatus(codes.Error, "rejected "+strconv.Itoa(st.rejected)+": "+st.rejectReason)
	case err != nil:
		sp.SetStatus(codes.Error, err.Error())
	case st.status >= 500:
		sp.SetStatus(codes.Error, "upstream status "+strconv.Itoa(st.status))
	}
	sp.End()
}

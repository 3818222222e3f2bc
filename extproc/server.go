// Package extproc is the Envoy ext_proc v3 server of the EndpointPicker: it
// follows a request through Envoy's external-processing stream, parses its
// OpenAI body once, asks the scheduler where it goes, tells Envoy through
// x-gateway-destination-endpoint and envoy.lb metadata, and watches the
// response (status, usage, served endpoint) to report back to the
// scheduler. The protocol is the Gateway API Inference Extension's
// EndpointPicker contract; errors reach clients as OpenAI-style JSON.
package extproc

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/omnious/provider-node/internal/label"
	"github.com/omnious/provider-node/rules"
	"github.com/omnious/provider-node/scheduler"
)

// Picker admits requests and chooses their endpoints; the scheduler
// implements it. Admit may wait (flow control, bounded by ctx); Pick never
// does, and releases the ticket Admit returned.
type Picker interface {
	Admit(ctx context.Context, r *scheduler.Request) (*scheduler.Ticket, error)
	Pick(r *scheduler.Request, t *scheduler.Ticket) (*scheduler.Decision, error)
}

// Header and metadata names of the EndpointPicker protocol.
const (
	HeaderDestination  = "x-gateway-destination-endpoint"
	HeaderModelRewrite = "x-gateway-model-name-rewrite"
	// HeaderReason carries the machine-readable cause of an EPP rejection
	// (the scheduler.Error reason, or bad_request, body_too_large, ...).
	HeaderReason   = "x-omnious-epp-reason"
	MetadataLB     = "envoy.lb"
	MetadataSubset = "envoy.lb.subset_hint"
	KeySubset      = "x-gateway-destination-endpoint-subset"
	KeyServed      = "x-gateway-destination-endpoint-served"
	// HeaderCalibration marks `quoter calibrate`'s requests ("1"): their
	// tokens count under scheduler.CalibrationTenant, never as a
	// customer's. It changes nothing else about a request (no band, no
	// routing), so a client that sends it gains nothing.
	HeaderCalibration = "x-omnious-calibration"
	headerRequestID   = "x-request-id"
	headerContentLen  = "content-length"
	headerContentType = "content-type"
)

// Server is the ext_proc server. It is safe for concurrent streams.
type Server struct {
	extprocv3.UnimplementedExternalProcessorServer

	cfg         Config
	picker      Picker
	prompter    Prompter
	m           *metrics
	log         *zap.Logger
	injectUsage bool
	idPrefix    string
	ids         atomic.Uint64
	bufs        bodyPool
	// approxModels holds the models already reported as routed without
	// exact tokens, so that is logged once per model, not per request. The
	// model name comes from clients, so at most maxApproxModels are kept.
	approxModels *label.Set   // models already warned about
	models       *label.Set   // target models on metric labels
	aliases      *label.Set   // the client's model names a rewrite replaced
	tracer       trace.Tracer // nil: no tracing
	rules        *rules.Store // nil: no model rules (SetRules)
	prober       Prober       // nil: fallbacks are never taken
	rewriteNames *label.Set   // rewrite names on metric labels

	// series holds each (client, target) label pair's metric children,
	// copied on write under seriesMu; streamEnds and promptModes the
	// children of the other counters' few label values.
	series      atomic.Pointer[map[[2]string]*series]
	seriesMu    sync.Mutex
	streamEnds  map[string]prometheus.Counter
	promptModes map[string]prometheus.Counter
	// streams hands a new stream to an idle receive loop (see receiver).
	streams chan *watch
	watches sync.Pool // of *watch, for streams to come
}

// Bounds of the client-controlled names the server keeps: model names
// reach metric labels and a warning set. Past them, later names share one
// label value and get no warning of their own.
const (
	maxApproxModels = 256
	maxModelLabels  = 256
	maxAliasLabels  = 64
	unknownLabel    = "unknown"
)

// firstApprox reports whether model is seen in approximate mode for the
// first time (false once the bounded set is full).
func (s *Server) firstApprox(model string) bool {
	_, added := s.approxModels.Add(model)
	return added
}

// NewServer builds a server; cfg gets its defaults applied. prompter may be
// nil (every request is routed in approximate mode); reg may be nil (no
// metrics exported). A metric that cannot be registered is logged.
func NewServer(cfg Config, picker Picker, prompter Prompter, reg prometheus.Registerer, log *zap.Logger) *Server {
	cfg = cfg.WithDefaults()
	m, err := newMetrics(reg)
	if err != nil {
		log.Error("cannot register ext_proc metrics", zap.Error(err))
	}
	return &Server{
		cfg: cfg, picker: picker, prompter: prompter, m: m, log: log,
		injectUsage:  *cfg.InjectUsage,
		idPrefix:     "epp-" + strconv.FormatInt(time.Now().UnixNano()&0xffffffffff, 36) + "-",
		approxModels: label.NewSet(maxApproxModels, ""),
		models:       label.NewSet(maxModelLabels, unknownLabel),
		aliases:      label.NewSet(maxAliasLabels, unknownLabel),
		streamEnds:   children(m.streams, streamEndValues),
		promptModes:  children(m.promptMode, promptModeValues),
		streams:      make(chan *watch),
	}
}

// Register adds the ext_proc service to g.
func (s *Server) Register(g *grpc.Server) { extprocv3.RegisterExternalProcessorServer(g, s) }

// Process implements the ext_proc stream: one HTTP request and its response.
// A stream whose peer goes quiet ends after the idle timeout of its phase
// (Config).
func (s *Server) Process(srv grpc.BidiStreamingServer[extprocv3.ProcessingRequest, extprocv3.ProcessingResponse]) error {
	w := s.watch(srv)
	st := &w.st
	if s.cfg.RequestIdleTimeout < 0 && s.cfg.ResponseIdleTimeout < 0 {
		for {
			req, err := srv.Recv()
			if done, err := st.step(req, err); done {
				s.recycle(w)
				return err
			}
		}
	}
	// Messages are received and handled by a receive loop (see receiver),
	// without a hand-off per message; this goroutine waits for the loop's
	// end, or for an idle timer's, which ends a stream that has been quiet
	// too long. Recv cannot be interrupted, but returning ends the RPC, and
	// then Recv fails.
	w.last.Store(time.Now().UnixNano())
	w.mu.Lock()
	if w.timer == nil {
		w.timer = time.AfterFunc(armFor(st.idleTimeout()), w.fire)
	} else {
		w.timer.Reset(armFor(st.idleTimeout()))
	}
	w.mu.Unlock()
	select {
	case s.streams <- w: // an idle receive loop takes it
	default:
		go s.receiver(w)
	}
	err := <-w.done
	if w.timer.Stop() {
		// The receive loop ended the stream and has let go of w, and the
		// timer will not call fire: nothing touches w any more.
		s.recycle(w)
	}
	// Else the timer ended the stream, or its fire is running: either may
	// still read w, which is left to the collector.
	return err
}

func (s *Server) defaultMode() filterv3.ProcessingMode_BodySendMode {
	if s.cfg.DefaultBodyMode == ModeBuffered {
		return filterv3.ProcessingMode_BUFFERED
	}
	return filterv3.ProcessingMode_FULL_DUPLEX_STREAMED
}

func (st *stream) responseHeaders(h *extprocv3.HttpHeaders) error {
	if st.phase == phaseRequest {
		return status.Error(codes.FailedPrecondition, "response headers before the request was routed")
	}
	st.phase = phaseResponse
	ctype := ""
	for _, hv := range h.GetHeaders().GetHeaders() {
		switch hv.Key {
		case ":status":
			st.status, _ = strconv.Atoi(headerValue(hv))
		case headerContentType:
			ctype = strings.ToLower(headerValue(hv))
		}
	}
	r := &st.resp
	r.sse = strings.Contains(ctype, "text/event-stream")
	r.buffer = !r.sse && strings.Contains(ctype, "json")
	if m := st.replyModel(); m != "" {
		r.rewrite = quoteJSON(m)
	}
	r.strip = st.injected && r.sse
	common := &extprocv3.CommonResponse{}
	if r.rewrite != "" || r.strip {
		// The body changes size; Envoy re-frames it.
		common.HeaderMutation = &extprocv3.HeaderMutation{RemoveHeaders: []string{headerContentLen}}
	}
	st.fallbackHeader(common)
	if err := st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{
		ResponseHeaders: &extprocv3.HeadersResponse{Response: common}}}); err != nil {
		return err
	}
	if h.EndOfStream || st.respMode == filterv3.ProcessingMode_NONE {
		// No body follows, or Envoy does not show it to us: the response
		// is as complete as we will see it.
		st.firstByte = time.Since(st.arrived)
		st.finish(nil, "completed")
	}
	return nil
}

func (st *stream) responseBody(b *extprocv3.HttpBody) error {
	if st.phase != phaseResponse {
		return status.Error(codes.FailedPrecondition, "response body before response headers")
	}
	if st.firstByte == 0 && len(b.Body) > 0 {
		st.firstByte = time.Since(st.arrived)
	}
	st.respBytes += len(b.Body)
	r := &st.resp
	var out []byte
	switch {
	case r.sse:
		out = r.sseChunk(b.Body, b.EndOfStream)
	case r.buffer && int64(len(r.pending)+len(b.Body)) > st.s.cfg.MaxBodyBytes:
		// Too large to hold: pass it through untouched from here on.
		out = append(r.pending, b.Body...)
		r.pending, r.buffer = nil, false
	case r.buffer:
		if r.pending == nil && b.EndOfStream {
			out = r.jsonBody(b.Body)
		} else {
			r.pending = append(r.pending, b.Body...)
			if b.EndOfStream {
				out = r.jsonBody(r.pending)
				r.pending = nil
			}
		}
	default:
		out = b.Body
	}
	if err := st.emitResponse(out, b.Body, b.EndOfStream); err != nil {
		return err
	}
	if b.EndOfStream {
		st.finish(nil, "completed")
	}
	return nil
}

// emitResponse sends out in the response body mode Envoy uses: any number
// of streamed chunks in FULL_DUPLEX_STREAMED, else exactly one reply per
// received message, replacing it only when it changed.
func (st *stream) emitResponse(out, in []byte, eos bool) error {
	if st.respMode == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED {
		return st.sendBody(out, eos, false)
	}
	common := &extprocv3.CommonResponse{}
	if len(out) != len(in) || (len(out) > 0 && &out[0] != &in[0]) {
		common.BodyMutation = &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_Body{Body: out}}
	}
	return st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{
		ResponseBody: &extprocv3.BodyResponse{Response: common}}})
}

func (st *stream) responseTrailers() error {
	if st.phase == phaseResponse && st.respMode == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED {
		var out []byte
		switch r := &st.resp; {
		case r.sse && len(r.pending) > 0:
			out = r.sseEvents(r.pending)
		case r.buffer && len(r.pending) > 0:
			out = r.jsonBody(r.pending)
		}
		st.resp.pending = nil
		if len(out) > 0 {
			if err := st.sendBody(out, false, false); err != nil {
				return err
			}
		}
	}
	if err := st.sendTrailers(&extprocv3.ProcessingRequest_ResponseTrailers{}); err != nil {
		return err
	}
	st.finish(nil, "completed")
	return nil
}

// finish reports the end of the routed request to the scheduler, once.
func (st *stream) finish(err error, end string) {
	if st.phase == phaseDone {
		return
	}
	st.phase = phaseDone
	st.end = end
	d := st.decision
	if d == nil {
		return
	}
	total := time.Since(st.arrived)
	u := st.resp.usage
	d.Done(scheduler.DoneInfo{Served: st.served, Status: st.status, Err: err,
		PromptTokens: u.prompt, CachedTokens: u.cached, CompletionTokens: u.completion,
		FirstByte: st.firstByte, Total: total})
	m := st.series
	m.running.Dec()
	m.duration.Observe(total.Seconds())
	m.responseSizes.Observe(float64(st.respBytes))
	if u.seen {
		m.inputTokens.Observe(float64(u.prompt))
		m.outputTokens.Observe(float64(u.completion))
		m.cachedTokens.Observe(float64(u.cached))
	}
	switch {
	case err != nil:
		m.incomplete.Inc()
	case st.status >= 500:
		m.upstream5xx.Inc()
	case st.status >= 400:
		m.upstream4xx.Inc()
	}
}

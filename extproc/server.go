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
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
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

// route parses the body, picks the endpoints and sends the request-side
// replies. headersOnly: the request has no body; eos: the body ended
// without trailers.
func (st *stream) route(headersOnly, eos bool) error {
	s := st.s
	start := time.Now()
	defer func() { s.m.route.Observe(time.Since(start).Seconds()) }()
	api := apiOf(st.path)
	body := st.body
	hasBody := len(body) > 0
	inference := api == APIChat || api == APICompletions || api == APIResponses
	parsed := false
	if hasBody {
		err := parseRequestBody(body, &st.rb)
		switch {
		case err == nil:
			parsed = true
		case inference:
			return st.reject(400, "bad_request", "invalid JSON body: "+err.Error())
		}
	}
	if inference && (!parsed || !st.rb.model.ok()) {
		return st.reject(400, "bad_request", "the request has no model")
	}
	if parsed && st.rb.model.ok() && st.rb.modelName == "" && inference {
		return st.reject(400, "bad_request", "model must be a non-empty string")
	}
	st.clientModel = st.rb.modelName
	st.targetModel = st.clientModel
	if st.rewriteHdr != "" && st.clientModel != "" {
		st.targetModel = st.rewriteHdr
	}
	st.applyRules()
	var edits [2]edit
	ne := 0
	if st.targetModel != st.clientModel {
		edits[ne] = edit{st.rb.model.s, st.rb.model.e, quoteJSON(st.targetModel)}
		ne++
	}
	if s.injectUsage && parsed && st.rb.stream && !st.rb.usageAsked && (api == APIChat || api == APICompletions) {
		if e, ok := usageEdit(body, &st.rb); ok {
			edits[ne] = e
			ne++
			st.injected = true
		}
	}
	if ne == 2 && edits[1].s < edits[0].s {
		edits[0], edits[1] = edits[1], edits[0]
	}

	d, mode, err := st.pick(api, body, parsed, inference)
	if d == nil {
		return err // answered, or the stream fails
	}
	st.decision = d
	st.phase = phaseRouted
	// The target model is served (it was just routed): it earns a label of
	// its own while there is room. A client's name for it does so only in
	// the smaller alias set.
	st.targetLabel = s.models.Label(st.targetModel)
	st.clientLabel = st.targetLabel
	if st.clientModel != st.targetModel {
		st.clientLabel = s.aliases.Label(st.clientModel)
	}
	st.series = s.seriesOf(st.clientLabel, st.targetLabel)
	st.series.requests.Inc()
	st.series.requestSizes.Observe(float64(len(body)))
	st.series.running.Inc()
	inc(s.promptModes, s.m.promptMode, mode)

	out := body
	if ne > 0 {
		out = applyEdits(s.bufs.get(editedLen(body, edits[:ne])), body, edits[:ne])
		defer s.bufs.put(out)
	}
	st.body = nil
	if st.owned != nil {
		// Every message pointing into the body is encoded when route
		// returns.
		defer func() {
			s.bufs.put(st.owned)
			st.owned = nil
		}()
	}
	dest := st.destination(d)
	if ce := s.log.Check(zap.DebugLevel, "routed"); ce != nil {
		st.logRouted(ce, d, dest, mode, len(body))
	}

	r := &st.reply
	r.add(HeaderDestination, stringBytes(dest))
	if st.genID {
		r.add(headerRequestID, stringBytes(st.id))
	}
	if st.span != nil {
		st.spanRouted(d, dest, mode)
		st.traceReply(r)
	}
	if ne > 0 || (!headersOnly && st.reqMode != filterv3.ProcessingMode_BUFFERED) {
		// In the streamed body modes always, as the contract and the
		// reference EPP have it: Envoy removes the client's Content-Length
		// there (the processor may resize the body), so the upstream would
		// otherwise get a chunked request. BUFFERED keeps the client's.
		r.add(headerContentLen, strconv.AppendInt(r.contentLength[:0], int64(len(out)), 10))
	}
	if st.reqMode == filterv3.ProcessingMode_BUFFERED && !headersOnly {
		var m *extprocv3.BodyMutation
		if ne > 0 {
			m = &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_Body{Body: out}}
		}
		return st.send(r.onRequestBody(st.strip, dest, m))
	}
	pr := r.onHeaders(st.strip, dest)
	if err := st.send(pr); err != nil {
		return err
	}
	if headersOnly {
		return nil
	}
	return st.sendBody(out, eos, true)
}

// pick asks the picker where the request goes. A nil decision means the
// request got its answer (a rejection) or the stream fails with err. It is
// a function of its own so that its frame (the request, the prompt input,
// the error paths) is off the stack while route sends the replies.
func (st *stream) pick(api API, body []byte, parsed, inference bool) (*scheduler.Decision, string, error) {
	s := st.s
	req := &st.req
	*req = scheduler.Request{
		ID: st.id, Model: st.targetModel, CacheSalt: st.rb.cacheSalt, SessionKey: st.session,
		Band: st.band, Tenant: st.tenant, Subset: st.subset, Arrived: st.arrived,
	}
	if req.SessionKey == "" {
		req.SessionKey = st.rb.user
	}
	mode := "none" // no prompt: GET /v1/models and the like
	if parsed {
		req.PromptText = approximateText(body, &st.rb)
		if req.PromptText != nil {
			mode = "approximate"
		}
		if s.prompter != nil && inference {
			in := promptInput(api, body, &st.rb)
			if toks, ok := s.prompter.Prompt(st.targetModel, &in); ok {
				req.Tokens, mode = toks, "precise"
			} else if s.firstApprox(st.targetModel) {
				st.logApproximate()
			}
		}
	}
	t, err := s.picker.Admit(st.ctx, req)
	var d *scheduler.Decision
	if err == nil {
		d, err = s.picker.Pick(req, t)
	}
	req.PromptText = nil // it aliases the body; the scheduler must not keep it
	if err != nil {
		var se *scheduler.Error
		if errors.As(err, &se) {
			return nil, "", st.reject(se.Status, se.Reason, se.Msg)
		}
		if st.ctx.Err() != nil {
			return nil, "", st.ctx.Err()
		}
		st.end = "error"
		cl, tl := st.modelLabels()
		s.m.errors.WithLabelValues(cl, tl, "pick_failed").Inc()
		st.logPickFailed(err)
		return nil, "", status.Errorf(codes.Internal, "cannot pick an endpoint: %v", err)
	}
	if d == nil || len(d.Endpoints) == 0 {
		if d != nil {
			d.Done(scheduler.DoneInfo{Err: errors.New("decision without endpoints")})
		}
		return nil, "", st.reject(scheduler.ErrNoEndpoint.Status, scheduler.ErrNoEndpoint.Reason, scheduler.ErrNoEndpoint.Msg)
	}
	return d, mode, nil
}

// The log lines of route are written by functions of their own: their
// fields are arrays on the stack, which in route would enlarge the frame
// under every Send of the request's replies past the goroutine's first
// stack, to be copied into a larger one on every stream.

func (st *stream) logRouted(ce *zapcore.CheckedEntry, d *scheduler.Decision, dest, mode string, bytes int) {
	ce.Write(zap.String("id", st.id), zap.String("model", st.targetModel), zap.String("destination", dest),
		zap.String("reason", d.Reason), zap.String("mode", mode), zap.Int("prefix_blocks", d.PrefixBlocks),
		zap.Int("prompt_blocks", d.PromptBlocks), zap.Duration("queued", d.Queued), zap.Int("bytes", bytes))
}

func (st *stream) logApproximate() {
	st.s.log.Warn("no exact prompt tokens for model (no tokenizer or chat template, or a request the engine completes from its own state): routing such requests in approximate mode (mode=approximate in metrics)",
		zap.String("model", st.targetModel))
}

func (st *stream) logPickFailed(err error) {
	st.s.log.Warn("cannot pick an endpoint", zap.String("id", st.id), zap.String("model", st.targetModel), zap.Error(err))
}

// chunkReply is the message sendBody sends each body chunk in.
type chunkReply struct {
	resp     extprocv3.ProcessingResponse
	onReq    extprocv3.ProcessingResponse_RequestBody
	onResp   extprocv3.ProcessingResponse_ResponseBody
	body     extprocv3.BodyResponse
	common   extprocv3.CommonResponse
	mutation extprocv3.BodyMutation
	streamed extprocv3.BodyMutation_StreamedResponse
	chunk    extprocv3.StreamedBodyResponse
}

// message returns the reply for chunk b of the request's (request) or the
// response's body.
func (c *chunkReply) message(b []byte, eos, request bool) *extprocv3.ProcessingResponse {
	if c.body.Response == nil {
		c.streamed.StreamedResponse = &c.chunk
		c.mutation.Mutation = &c.streamed
		c.common.BodyMutation = &c.mutation
		c.body.Response = &c.common
		c.onReq.RequestBody, c.onResp.ResponseBody = &c.body, &c.body
	}
	c.chunk.Body, c.chunk.EndOfStream = b, eos
	if request {
		c.resp.Response = &c.onReq
	} else {
		c.resp.Response = &c.onResp
	}
	return &c.resp
}

func (st *stream) destination(d *scheduler.Decision) string {
	eps := d.Endpoints
	if n := *st.s.cfg.MaxEndpoints; n > 0 && len(eps) > n {
		eps = eps[:n]
	}
	if len(eps) == 1 {
		return eps[0].Addr
	}
	var b strings.Builder
	for i, e := range eps {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(e.Addr)
	}
	return b.String()
}

func setHeader(k, v string) *corev3.HeaderValueOption {
	return &corev3.HeaderValueOption{
		Header:       &corev3.HeaderValue{Key: k, RawValue: []byte(v)},
		AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
	}
}

// sendBody emits b as streamed_response chunks of at most ChunkSize bytes
// (FULL_DUPLEX_STREAMED). An empty b still sends one message when it
// carries end of stream.
func (st *stream) sendBody(b []byte, eos, request bool) error {
	size := st.s.cfg.ChunkSize
	for first := true; first || len(b) > 0; first = false {
		n := min(len(b), size)
		last := n == len(b)
		if n == 0 && !(eos && last) {
			return nil
		}
		if err := st.send(st.chunk.message(b[:n], eos && last, request)); err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
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

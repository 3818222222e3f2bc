package extproc

import (
	"errors"
	"strconv"
	"strings"
	"time"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/omnious/provider-node/scheduler"
)

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
	if answered, err := st.checkSalt(body); answered {
		return err
	}
	var edits [3]edit
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

	if d.Priority != nil && parsed && (api == APIChat || api == APICompletions) {
		// After the others: it inserts before the body's closing brace.
		if e, ok := priorityEdit(body, *d.Priority); ok {
			edits[ne] = e
			ne++
		}
	}
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
// the error paths) is off the stack while route sends the replies, which
// matters on a goroutine whose stack has not grown yet (the handler's,
// when both idle timeouts are off; BenchmarkReceiveLoop shows the cost).
func (st *stream) pick(api API, body []byte, parsed, inference bool) (*scheduler.Decision, string, error) {
	s := st.s
	req := &st.req
	*req = scheduler.Request{
		ID: st.id, Model: st.targetModel, CacheSalt: st.rb.cacheSalt, SessionKey: st.sessionKey(),
		Band: st.band, Tenant: st.tenant, Subset: st.subset, Arrived: st.arrived,
	}
	mode := "none" // no prompt: GET /v1/models and the like
	if parsed {
		req.PromptText = approximateText(body, &st.rb)
		if req.PromptText != nil {
			mode = "approximate"
		}
		if s.prompter != nil && inference {
			in := promptInput(api, body, &st.rb)
			if toks, prefix, ok := s.prompt(st.targetModel, &in); ok {
				req.Tokens, mode = toks, "precise"
				if prefix.Len() > 0 {
					req.Prefix = prefix
				}
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
	s.putTokens(req.Tokens)
	req.Tokens, req.Prefix = nil, nil
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

// The log lines of route are written by functions of their own: their
// fields are arrays on the stack, which in route would enlarge the frame
// under every Send of the request's replies past the goroutine's first
// stack, to be copied into a larger one on every stream that runs on a
// fresh goroutine (BenchmarkReceiveLoop).

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

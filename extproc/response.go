package extproc

import (
	"bytes"
	"strconv"
	"strings"
	"time"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/omnious/provider-node/scheduler"
)

// responseHeaders reads the response's status and content type, decides
// how its body is handled (SSE, buffered JSON, passed through) and
// answers the headers; a response without body ends the request here.
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

// responseBody forwards a response body message, rewritten as the
// response's handling says, and ends the request at end of stream.
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
	if ce := st.s.log.Check(zap.DebugLevel, "finished"); ce != nil {
		ce.Write(zap.String("id", st.id), zap.String("served", st.served), zap.Int("status", st.status), zap.String("end", end))
	}
	d.Done(scheduler.DoneInfo{Served: st.served, Status: st.status, Err: err,
		PromptTokens: u.prompt, CachedTokens: u.cached, CompletionTokens: u.completion,
		FirstByte: st.firstByte, Total: total})
	d.Release() // nothing reads the decision past here; st.decision is only compared with nil
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

// usage is the token accounting parsed from a response.
type usage struct {
	prompt, cached, completion int
	seen                       bool
}

// respInfo locates what the response phase rewrites or reads in one JSON
// object: an SSE event's data or a whole non-streaming response. For the
// Responses API, model and usage sit inside "response".
type respInfo struct {
	model        span
	usage        span
	emptyChoices bool
}

func scanResponse(b []byte) (respInfo, error) {
	var ri respInfo
	it, err := newObjIter(b, 0, 1)
	if err != nil {
		return ri, err
	}
	for {
		key, vs, ve, ok, err := it.next()
		if err != nil {
			return ri, err
		}
		if !ok {
			break
		}
		switch {
		case keyIs(key, "model"):
			ri.model = span{vs, ve}
		case keyIs(key, "usage"):
			ri.usage = span{vs, ve}
		case keyIs(key, "choices"):
			ri.emptyChoices = b[vs] == '[' && skipWS(b, vs+1) == ve-1
		case keyIs(key, "response") && b[vs] == '{':
			inner, _ := newObjIter(b, vs, 2)
			for {
				key, vs, ve, ok, _ := inner.next()
				if !ok {
					break
				}
				switch {
				case keyIs(key, "model"):
					ri.model = span{vs, ve}
				case keyIs(key, "usage"):
					ri.usage = span{vs, ve}
				}
			}
		}
	}
	return ri, nil
}

// parseUsage reads an OpenAI usage object (chat and completions names, and
// the Responses API's input/output names).
func parseUsage(b []byte) usage {
	u := usage{}
	it, err := newObjIter(b, 0, 1)
	if err != nil {
		return u
	}
	for {
		key, vs, ve, ok, err := it.next()
		if err != nil || !ok {
			return u
		}
		v := b[vs:ve]
		switch {
		case keyIs(key, "prompt_tokens"), keyIs(key, "input_tokens"):
			u.prompt, u.seen = parseInt(v), true
		case keyIs(key, "completion_tokens"), keyIs(key, "output_tokens"):
			u.completion, u.seen = parseInt(v), true
		case keyIs(key, "prompt_tokens_details"), keyIs(key, "input_tokens_details"):
			if v[0] != '{' {
				continue
			}
			d, _ := newObjIter(v, 0, 2)
			for {
				key, vs, ve, ok, _ := d.next()
				if !ok {
					break
				}
				if keyIs(key, "cached_tokens") {
					u.cached = parseInt(v[vs:ve])
				}
			}
		}
	}
}

// nextEventEnd returns the index after the blank line ending the SSE event
// that starts at or after from, or -1 when the event is incomplete.
func nextEventEnd(b []byte, from int) int {
	for i := from; i < len(b); {
		n := bytes.IndexByte(b[i:], '\n')
		if n < 0 {
			return -1
		}
		j := i + n + 1
		switch {
		case j < len(b) && b[j] == '\n':
			return j + 1
		case j+1 < len(b) && b[j] == '\r' && b[j+1] == '\n':
			return j + 2
		}
		i = j
	}
	return -1
}

// respState is the response phase of one request.
type respState struct {
	sse     bool   // text/event-stream: events forwarded as they complete
	buffer  bool   // JSON: held to end of stream, then rewritten
	rewrite string // the client-facing model as a JSON literal, "" = no rewrite
	strip   bool   // drop the usage-only event the EPP asked for
	pending []byte // an incomplete SSE event, or the buffered JSON body
	usage   usage
	edits   []edit
}

// sseChunk returns what can be forwarded now: every complete event of
// pending+data, rewritten; an incomplete tail is held back (at end of
// stream it is flushed as is).
func (r *respState) sseChunk(data []byte, eos bool) []byte {
	if len(r.pending) > 0 {
		data = append(r.pending, data...)
		r.pending = nil
	}
	end := 0
	for {
		e := nextEventEnd(data, end)
		if e < 0 {
			break
		}
		end = e
	}
	if eos {
		end = len(data)
	}
	if end < len(data) {
		rest := data[end:]
		r.pending = rest[:len(rest):len(rest)]
	}
	return r.sseEvents(data[:end])
}

// sseEvents rewrites complete events; it returns b itself when nothing
// changes (TestAllocsResponse).
func (r *respState) sseEvents(b []byte) []byte {
	r.edits = r.edits[:0]
	for pos := 0; pos < len(b); {
		evEnd := nextEventEnd(b, pos)
		if evEnd < 0 {
			evEnd = len(b)
		}
		drop := false
		for ls := pos; ls < evEnd; {
			le := ls + bytes.IndexByte(b[ls:evEnd], '\n')
			if le < ls {
				le = evEnd
			}
			line := b[ls:le]
			off := ls
			ls = le + 1
			if !bytes.HasPrefix(line, []byte("data:")) {
				continue
			}
			p := 5
			if p < len(line) && line[p] == ' ' {
				p++
			}
			payload := bytes.TrimRight(line[p:], "\r")
			if len(payload) == 0 || payload[0] != '{' {
				continue
			}
			if r.rewrite == "" && !bytes.Contains(payload, []byte(`"usage"`)) {
				continue
			}
			ri, err := scanResponse(payload)
			if err != nil {
				continue
			}
			if ri.usage.present(payload) {
				r.usage = parseUsage(ri.usage.of(payload))
				if r.strip && ri.emptyChoices {
					drop = true
				}
			}
			if r.rewrite != "" && ri.model.ok() {
				base := off + p
				r.edits = append(r.edits, edit{base + ri.model.s, base + ri.model.e, r.rewrite})
			}
		}
		if drop {
			// The event's own edits go with it.
			for len(r.edits) > 0 && r.edits[len(r.edits)-1].s >= pos {
				r.edits = r.edits[:len(r.edits)-1]
			}
			r.edits = append(r.edits, edit{pos, evEnd, ""})
		}
		pos = evEnd
	}
	if len(r.edits) == 0 {
		return b
	}
	return applyEdits(nil, b, r.edits)
}

// jsonBody handles the buffered JSON response at end of stream: it reads
// usage and rewrites the model; unparseable bodies pass unchanged.
func (r *respState) jsonBody(b []byte) []byte {
	ri, err := scanResponse(b)
	if err != nil {
		return b
	}
	if ri.usage.present(b) {
		r.usage = parseUsage(ri.usage.of(b))
	}
	if r.rewrite != "" && ri.model.ok() {
		return applyEdits(nil, b, []edit{{ri.model.s, ri.model.e, r.rewrite}})
	}
	return b
}

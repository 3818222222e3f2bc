package extproc

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"github.com/cespare/xxhash/v2"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/omnious/provider-node/internal/jsonstr"
	"github.com/omnious/provider-node/scheduler"
)

// requestHeaders stores the request's headers and reads the ones the EPP
// acts on. A request without body is routed at once; in BUFFERED mode the
// headers are answered so that Envoy sends the body.
func (st *stream) requestHeaders(req *extprocv3.ProcessingRequest, h *extprocv3.HttpHeaders) error {
	if st.phase != phaseRequest || !st.arrived.IsZero() {
		return status.Error(codes.FailedPrecondition, "request headers received twice")
	}
	if st.reqMode != filterv3.ProcessingMode_FULL_DUPLEX_STREAMED && st.reqMode != filterv3.ProcessingMode_BUFFERED {
		return status.Errorf(codes.FailedPrecondition, "request body mode %s is not supported: use FULL_DUPLEX_STREAMED or BUFFERED", st.reqMode)
	}
	st.arrived = time.Now()
	cfg := &st.s.cfg
	contentLength := int64(-1)
	for _, hv := range h.GetHeaders().GetHeaders() {
		switch k := hv.Key; k {
		case ":path":
			st.path = headerValue(hv)
		case ":method":
			st.method = headerValue(hv)
		case headerRequestID:
			st.id = headerValue(hv)
		case HeaderModelRewrite:
			st.rewriteHdr = headerValue(hv)
			st.strip = append(st.strip, k)
		case headerContentLen:
			if n, err := strconv.ParseInt(headerValue(hv), 10, 64); err == nil {
				contentLength = n
			}
		case headerTraceparent:
			st.trace.parent = headerValue(hv)
		case headerTracestate:
			st.trace.state = headerValue(hv)
		case KeyServed, KeySubset:
			// Only the gateway may say these, in metadata; a client's
			// header of that name must not reach the engine as if it had.
			st.strip = append(st.strip, k)
		case HeaderCalibrationToken:
			if st.s.calToken != nil && st.s.calToken.Equal(headerValue(hv)) {
				st.tenant = scheduler.CalibrationTenant
			}
			st.strip = append(st.strip, k)
		default:
			switch k {
			case cfg.BandHeader:
				if !cfg.GatewayHeaders {
					st.band = headerValue(hv)
				}
				st.strip = append(st.strip, k)
			case cfg.TenantHeader:
				if !cfg.GatewayHeaders {
					st.setTenant(headerValue(hv))
				}
				st.strip = append(st.strip, k)
			case HeaderCalibration:
				// Without a secret, the legacy mark; never when only
				// the gateway may speak.
				if headerValue(hv) == "1" && st.s.calToken == nil && !cfg.GatewayHeaders {
					st.tenant = scheduler.CalibrationTenant
				}
				st.strip = append(st.strip, k)
			case cfg.SessionHeader:
				st.session = sessionHeader(hv)
			}
		}
	}
	if cfg.GatewayHeaders {
		st.gatewayHeaders(req.GetMetadataContext())
	}
	if st.id == "" {
		st.id = st.s.idPrefix + strconv.FormatUint(st.s.ids.Add(1), 10)
		st.genID = true
	}
	if st.s.tracer != nil {
		st.startSpan()
	}
	st.subset = subsetHint(req.GetMetadataContext())
	if contentLength > cfg.MaxBodyBytes {
		return st.reject(413, "body_too_large", fmt.Sprintf("request body of %d bytes exceeds the limit of %d bytes", contentLength, cfg.MaxBodyBytes))
	}
	if h.EndOfStream {
		return st.route(true, false)
	}
	if st.reqMode == filterv3.ProcessingMode_BUFFERED {
		// Envoy holds the body until the headers are answered; the
		// destination goes into the body response instead.
		return st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{
			RequestHeaders: &extprocv3.HeadersResponse{Response: &extprocv3.CommonResponse{}}}})
	}
	st.contentLength = contentLength
	return nil
}

// setTenant sets the tenant unless it names the calibration tenant, which
// only the calibration mark gives, or the mark was already seen.
func (st *stream) setTenant(t string) {
	if t != scheduler.CalibrationTenant && st.tenant != scheduler.CalibrationTenant {
		st.tenant = t
	}
}

// gatewayHeaders reads the band, tenant and session the gateway wrote into
// the MetadataGateway namespace (Config.GatewayHeaders).
func (st *stream) gatewayHeaders(md *corev3.Metadata) {
	f := md.GetFilterMetadata()[MetadataGateway]
	if f == nil {
		return
	}
	cfg := &st.s.cfg
	str := func(key string) string { return f.GetFields()[key].GetStringValue() }
	st.band = str(cfg.BandHeader)
	st.setTenant(str(cfg.TenantHeader))
	if v := str(cfg.SessionHeader); v != "" {
		st.session, st.gatewaySession = boundSession(v), true
	}
}

// subsetHint reads the gateway's subset hint: nil when absent, a non-nil
// (possibly empty) list when present.
func subsetHint(md *corev3.Metadata) []string {
	if md == nil {
		return nil
	}
	f := md.FilterMetadata[MetadataSubset]
	if f == nil {
		return nil
	}
	v, ok := f.Fields[KeySubset]
	if !ok {
		return nil
	}
	out := []string{}
	switch x := v.Kind.(type) {
	case *structpb.Value_ListValue:
		for _, e := range x.ListValue.GetValues() {
			if s := strings.TrimSpace(e.GetStringValue()); s != "" {
				out = append(out, s)
			}
		}
	case *structpb.Value_StringValue:
		for _, s := range strings.Split(x.StringValue, ",") {
			if s = strings.TrimSpace(s); s != "" {
				out = append(out, s)
			}
		}
	}
	return out
}

func (st *stream) requestBody(b *extprocv3.HttpBody) error {
	if st.bodyOpen {
		return st.restOfBody(b)
	}
	if st.phase != phaseRequest {
		return nil // Envoy sends nothing after end of stream; tolerate it
	}
	if st.body == nil && (b.EndOfStream || st.contentLength > 0 && int64(len(b.Body)) == st.contentLength) {
		// The whole body in one message, ended or complete by its
		// Content-Length (as Envoy sends a body it read at once): keep
		// it, no copy (TestAllocsRequest, TestRequestBodyKept).
		st.body = b.Body
	} else {
		switch {
		case st.owned == nil:
			// The body's one gathering buffer, pooled and sized from
			// Content-Length when known (TestAllocsRequest), after a
			// body kept by reference if there is one.
			n := max(int(min(st.contentLength, st.s.cfg.MaxBodyBytes)), 2*(len(st.body)+len(b.Body)))
			st.body = append(append(st.s.bufs.get(n), st.body...), b.Body...)
		case len(st.body)+len(b.Body) > cap(st.body):
			grown := append(st.s.bufs.get(2*(len(st.body)+len(b.Body))), st.body...)
			st.s.bufs.put(st.body)
			st.body = append(grown, b.Body...)
		default:
			st.body = append(st.body, b.Body...)
		}
		st.owned = st.body
	}
	if int64(len(st.body)) > st.s.cfg.MaxBodyBytes {
		return st.reject(413, "body_too_large", fmt.Sprintf("request body exceeds the limit of %d bytes", st.s.cfg.MaxBodyBytes))
	}
	if b.EndOfStream {
		return st.route(false, true)
	}
	if st.contentLength > 0 && int64(len(st.body)) == st.contentLength {
		// The whole body by its Content-Length, which Envoy's codecs
		// enforce: Envoy sends its end of stream in a message of its own
		// (an empty body, or trailers), often after a pause. Routing now
		// takes the decision off that pause; the end of stream is passed
		// on when it comes (restOfBody, requestTrailers). Same decision
		// and forwarded bytes as routing at the end:
		// TestRouteAtContentLength, FuzzRouteAtContentLength.
		if err := st.route(false, false); err != nil {
			return err
		}
		st.bodyOpen = st.phase == phaseRouted
	}
	return nil
}

// restOfBody answers a body message that comes after the request was
// routed at its Content-Length: the end of stream is passed on; a byte
// past the declared length fails the stream, as the body routed on would
// no longer be the body the engine gets.
func (st *stream) restOfBody(b *extprocv3.HttpBody) error {
	if len(b.Body) > 0 {
		return status.Errorf(codes.InvalidArgument, "request body longer than its Content-Length of %d bytes", st.contentLength)
	}
	if !b.EndOfStream {
		return nil
	}
	st.bodyOpen = false
	return st.sendBody(nil, true, true)
}

func (st *stream) requestTrailers() error {
	if st.phase == phaseRequest {
		if err := st.route(false, false); err != nil || st.phase == phaseDone {
			return err
		}
	}
	st.bodyOpen = false
	return st.sendTrailers(&extprocv3.ProcessingRequest_RequestTrailers{})
}

// maxSessionKey bounds a session key: the scheduler remembers keys, and a
// client sends them.
const maxSessionKey = 128

// sessionHeader is the one place the session header is read: the key of
// the agent policy, session affinity and session admission, bounded by
// boundSession.
func sessionHeader(h *corev3.HeaderValue) string {
	return boundSession(headerValue(h))
}

// boundSession bounds a session key. A key longer than maxSessionKey is
// cut to its head and a hash of the whole, so distinct long keys stay
// distinct (TestSessionHeaderBound).
func boundSession(v string) string {
	if len(v) <= maxSessionKey {
		return v
	}
	return v[:maxSessionKey-17] + "#" + strconv.FormatUint(xxhash.Sum64String(v)|1<<63, 16)
}

// sessionKey is the request's affinity key: the session header, else the
// body's "user" field, bounded. When only the gateway may set the band and
// tenant (Config.GatewayHeaders) a client still names its own sessions,
// as the seeds' x-session-id does, but its key is scoped to the tenant the
// gateway named, so it cannot join or jump another tenant's sessions; a
// session the gateway itself names is taken as it is
// (TestGatewaySessionScoped).
func (st *stream) sessionKey() string {
	if st.gatewaySession {
		return st.session
	}
	k := st.session
	if k == "" {
		k = boundSession(st.rb.user)
	}
	if k == "" || !st.s.cfg.GatewayHeaders {
		return k
	}
	return boundSession(st.tenant + "\x1f" + k)
}

// headerValue returns h's value. RawValue is the received message's own
// copy (unmarshalling copies bytes fields) and nothing writes it, so the
// string shares its memory (TestAllocsViews).
func headerValue(h *corev3.HeaderValue) string {
	if len(h.RawValue) > 0 {
		return unsafe.String(unsafe.SliceData(h.RawValue), len(h.RawValue))
	}
	return h.Value
}

// stringBytes views s as bytes for a message field that is only encoded,
// never written (TestAllocsViews).
func stringBytes(s string) []byte { return unsafe.Slice(unsafe.StringData(s), len(s)) }

// API is the OpenAI endpoint a request addresses.
type API uint8

const (
	APIOther API = iota
	APIChat
	APICompletions
	APIResponses
	APIModels
)

func (a API) String() string {
	switch a {
	case APIChat:
		return "chat"
	case APICompletions:
		return "completions"
	case APIResponses:
		return "responses"
	case APIModels:
		return "models"
	}
	return "other"
}

// apiOf classifies a request path (query string ignored).
func apiOf(path string) API {
	if i := strings.IndexByte(path, '?'); i >= 0 {
		path = path[:i]
	}
	path = strings.TrimSuffix(path, "/")
	switch path {
	case "/v1/chat/completions":
		return APIChat
	case "/v1/completions":
		return APICompletions
	case "/v1/responses":
		return APIResponses
	case "/v1/models":
		return APIModels
	}
	return APIOther
}

// span is a byte range of the body; e == 0 means absent.
type span struct{ s, e int }

func (p span) ok() bool              { return p.e > p.s }
func (p span) of(b []byte) []byte    { return b[p.s:p.e] }
func (p span) isNull(b []byte) bool  { return p.ok() && isNull(p.of(b)) }
func (p span) present(b []byte) bool { return p.ok() && !isNull(p.of(b)) }

// requestBody is the result of the single parse of a request body: spans
// into the body and the few scalars routing needs.
type requestBody struct {
	obj           int // offset of the top-level '{'
	model         span
	modelName     string
	stream        bool
	streamOptions span
	includeUsage  span // value of stream_options.include_usage
	usageAsked    bool // include_usage is true
	user          string
	cacheSalt     string
	saltSpan      span // cache_salt's value, checked against the engines (checkSalt)
	messages      span
	tools         span
	prompt        span
	input         span
	instructions  span
	previousResp  span // previous_response_id
	kwargs        span
	addGenPrompt  span
}

var errNotObject = errors.New("request body must be a JSON object")

// parseRequestBody scans body once. It fails on malformed JSON; semantic
// checks (model present, types of fields the engine validates) are left to
// the caller and the engine.
func parseRequestBody(body []byte, rb *requestBody) error {
	*rb = requestBody{}
	i := skipWS(body, 0)
	if i >= len(body) || body[i] != '{' {
		return errNotObject
	}
	rb.obj = i
	it, err := newObjIter(body, i, 1)
	if err != nil {
		return err
	}
	for {
		key, vs, ve, ok, err := it.next()
		if err != nil {
			return err
		}
		if !ok {
			break
		}
		v := span{vs, ve}
		switch {
		case keyIs(key, "model"):
			rb.model = v
		case keyIs(key, "stream"):
			rb.stream = string(body[vs:ve]) == "true"
		case keyIs(key, "stream_options"):
			rb.streamOptions = v
		case keyIs(key, "user"):
			rb.user, _ = jsonstr.Decode(body[vs:ve])
		case keyIs(key, "cache_salt"):
			rb.cacheSalt, _ = jsonstr.Decode(body[vs:ve])
			rb.saltSpan = v
		case keyIs(key, "messages"):
			rb.messages = v
		case keyIs(key, "tools"):
			rb.tools = v
		case keyIs(key, "prompt"):
			rb.prompt = v
		case keyIs(key, "input"):
			rb.input = v
		case keyIs(key, "instructions"):
			rb.instructions = v
		case keyIs(key, "previous_response_id"):
			rb.previousResp = v
		case keyIs(key, "chat_template_kwargs"):
			rb.kwargs = v
		case keyIs(key, "add_generation_prompt"):
			rb.addGenPrompt = v
		}
	}
	if j := skipWS(body, it.i); j != len(body) {
		return fmt.Errorf("invalid character %q after the JSON object at offset %d", body[j], j)
	}
	if rb.model.ok() {
		name, err := jsonstr.Decode(rb.model.of(body))
		if err != nil {
			return errors.New("model must be a string")
		}
		rb.modelName = name
	}
	if rb.streamOptions.ok() && body[rb.streamOptions.s] == '{' {
		so, _ := newObjIter(body, rb.streamOptions.s, 2)
		for {
			key, vs, ve, ok, _ := so.next() // already validated by the outer scan
			if !ok {
				break
			}
			if keyIs(key, "include_usage") {
				rb.includeUsage = span{vs, ve}
				rb.usageAsked = string(body[vs:ve]) == "true"
			}
		}
	}
	return nil
}

// edit replaces body[s:e] with repl (s == e inserts).
type edit struct {
	s, e int
	repl string
}

// usageEdit returns the edit that makes stream_options.include_usage true,
// or ok=false when stream_options has a shape the engine will reject anyway.
func usageEdit(body []byte, rb *requestBody) (edit, bool) {
	so := rb.streamOptions
	switch {
	case !so.ok():
		return edit{rb.obj + 1, rb.obj + 1, `"stream_options":{"include_usage":true},`}, true
	case so.isNull(body):
		return edit{so.s, so.e, `{"include_usage":true}`}, true
	case body[so.s] != '{':
		return edit{}, false
	case rb.includeUsage.ok():
		return edit{rb.includeUsage.s, rb.includeUsage.e, "true"}, true
	}
	if j := skipWS(body, so.s+1); body[j] == '}' {
		return edit{so.s + 1, so.s + 1, `"include_usage":true`}, true
	}
	return edit{so.s + 1, so.s + 1, `"include_usage":true,`}, true
}

// priorityEdit returns the edit that appends "priority":p as the body's
// last member, so that it is the priority the engine reads whatever the
// client put earlier (Python's json, as SGLang's server parses, and Go's
// keep the last of duplicate keys; TestSGLangPriority). ok=false when
// the body does not end in an object's closing brace.
func priorityEdit(body []byte, p int) (edit, bool) {
	i := len(body) - 1
	for i >= 0 && (body[i] == ' ' || body[i] == '\t' || body[i] == '\n' || body[i] == '\r') {
		i--
	}
	if i < 1 || body[i] != '}' {
		return edit{}, false
	}
	sep := ","
	if j := i - 1; j >= 0 {
		for j >= 0 && (body[j] == ' ' || body[j] == '\t' || body[j] == '\n' || body[j] == '\r') {
			j--
		}
		if j >= 0 && body[j] == '{' {
			sep = ""
		}
	}
	return edit{i, i, sep + `"priority":` + strconv.Itoa(p)}, true
}

// editedLen is the length of body after edits.
func editedLen(body []byte, edits []edit) int {
	n := len(body)
	for _, e := range edits {
		n += len(e.repl) - (e.e - e.s)
	}
	return n
}

// applyEdits appends the edited body to dst (pass nil for a new buffer of
// the exact size). edits must be sorted by offset and must not overlap.
func applyEdits(dst, body []byte, edits []edit) []byte {
	out := dst
	if out == nil {
		out = make([]byte, 0, editedLen(body, edits))
	}
	at := 0
	for _, e := range edits {
		out = append(out, body[at:e.s]...)
		out = append(out, e.repl...)
		at = e.e
	}
	return append(out, body[at:]...)
}

// quoteJSON returns s as a JSON string literal.
func quoteJSON(s string) string {
	b, _ := json.Marshal(s) // a string always marshals
	return string(b)
}

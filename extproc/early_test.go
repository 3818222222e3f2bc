package extproc

import (
	"context"
	"fmt"
	"hash/fnv"
	"io"
	"strconv"
	"testing"
	"unsafe"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"

	"github.com/omnious/provider-node/endpoint"
	"github.com/omnious/provider-node/scheduler"
)

// promptPicker routes by a hash of everything the scheduler is given
// about the prompt (model, tokens, text, session), so that any difference
// in what the EPP made of the body shows as another destination.
type promptPicker struct{}

func (promptPicker) Admit(context.Context, *scheduler.Request) (*scheduler.Ticket, error) {
	return nil, nil
}

func (promptPicker) Pick(r *scheduler.Request, _ *scheduler.Ticket) (*scheduler.Decision, error) {
	h := fnv.New64a()
	fmt.Fprintf(h, "%s|%s|%s|%v|", r.Model, r.SessionKey, r.CacheSalt, allTokens(r))
	_, _ = h.Write(r.PromptText)
	return &scheduler.Decision{Endpoints: []*endpoint.Endpoint{{Addr: "10.0.0." + strconv.FormatUint(h.Sum64()%250, 10) + ":8000"}}}, nil
}

// exchange is what the EPP answered to one request's messages, read as
// Envoy reads it.
type exchange struct {
	dest, contentLength string
	immediate           int    // status of an immediate response, 0 if none
	body                []byte // the body sent back, all chunks
	eos, trailers       bool   // the body's end was passed on, as end of stream or as trailers
	routedAfter         int    // the message after which the routing reply came (-1: none)
}

// runRequest hands msgs to one stream, without gRPC, and reads the replies.
func runRequest(t testing.TB, s *Server, msgs []*extprocv3.ProcessingRequest) exchange {
	t.Helper()
	ex := exchange{routedAfter: -1}
	w := s.watch(&ctxStream{})
	at := 0
	w.st.send = func(r *extprocv3.ProcessingResponse) error {
		// The replies are built in place: decode a copy of the wire bytes.
		wire, err := proto.Marshal(r)
		require.NoError(t, err)
		var got extprocv3.ProcessingResponse
		require.NoError(t, proto.Unmarshal(wire, &got))
		switch x := got.Response.(type) {
		case *extprocv3.ProcessingResponse_RequestHeaders:
			require.Equal(t, -1, ex.routedAfter, "a second routing reply")
			ex.routedAfter = at
			for _, h := range x.RequestHeaders.GetResponse().GetHeaderMutation().GetSetHeaders() {
				switch h.GetHeader().GetKey() {
				case HeaderDestination:
					ex.dest = string(h.GetHeader().GetRawValue())
				case headerContentLen:
					ex.contentLength = string(h.GetHeader().GetRawValue())
				}
			}
		case *extprocv3.ProcessingResponse_RequestBody:
			require.NotEqual(t, -1, ex.routedAfter, "a body chunk before the routing reply")
			require.False(t, ex.eos || ex.trailers, "a body chunk after the end")
			sr := x.RequestBody.GetResponse().GetBodyMutation().GetStreamedResponse()
			ex.body = append(ex.body, sr.GetBody()...)
			ex.eos = sr.GetEndOfStream()
		case *extprocv3.ProcessingResponse_RequestTrailers:
			ex.trailers = true
		case *extprocv3.ProcessingResponse_ImmediateResponse:
			ex.immediate = int(x.ImmediateResponse.GetStatus().GetCode())
		default:
			t.Fatalf("unexpected reply %T", got.Response)
		}
		return nil
	}
	for i, m := range msgs {
		at = i
		done, err := w.st.step(m, nil)
		require.False(t, done, "message %d ended the stream: %v", i, err)
	}
	w.st.step(nil, io.EOF)
	s.recycle(w)
	return ex
}

// splitBody is the request's messages: headers (with Content-Length when
// cl), body[:k] and body[k:] (the second left out when empty), and the end
// of stream as end says.
func splitBody(hdr []string, body []byte, k int, cl bool, end string) []*extprocv3.ProcessingRequest {
	if cl {
		hdr = append(hdr[:len(hdr):len(hdr)], "content-length", strconv.Itoa(len(body)))
	}
	msgs := []*extprocv3.ProcessingRequest{reqHeaders(false, hdr...)}
	parts := [][]byte{body[:k]}
	if k < len(body) {
		parts = append(parts, body[k:])
	}
	for i, p := range parts {
		msgs = append(msgs, reqBody(string(p), end == "last" && i == len(parts)-1))
	}
	switch end {
	case "empty":
		msgs = append(msgs, reqBody("", true))
	case "trailers":
		msgs = append(msgs, reqTrailers())
	}
	return msgs
}

// splitCases are the request shapes the split tests run: unchanged,
// usage injected, model rewritten, and a body that is not JSON.
var splitCases = []struct {
	name string
	hdr  []string
	body string
}{
	{"unchanged", nil, `{"model":"m1","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"What is a KV cache? \u00e9\n"}],"user":"u1"}`},
	{"usage injected", nil, `{"stream":true,"model":"m1","messages":[{"role":"user","content":"hello there"}],"max_tokens":4}`},
	{"model rewritten", []string{HeaderModelRewrite, "m2"}, `{"model":"m1","prompt":"Once upon a time","cache_salt":"s"}`},
	{"invalid", nil, `{"model":"m1","messages":[{"role":"user","content":"cut`},
}

// TestRouteAtContentLength: a request routed when its body reaches its
// Content-Length, before Envoy's end of stream, gets the decision and the
// forwarded bytes it gets when routed at the end, wherever the body is
// split and however the end comes (with the last chunk, as an empty
// message, as trailers); without Content-Length it is routed at the end.
func TestRouteAtContentLength(t *testing.T) {
	s := NewServer(Config{}, promptPicker{}, NewStandInPrompter(), nil, zap.NewNop())
	hdr := []string{":method", "POST", ":path", "/v1/chat/completions", "content-type", "application/json"}
	for _, tc := range splitCases {
		t.Run(tc.name, func(t *testing.T) {
			h := append(hdr[:len(hdr):len(hdr)], tc.hdr...)
			if tc.name == "model rewritten" {
				h[3] = "/v1/completions"
			}
			body := []byte(tc.body)
			ref := runRequest(t, s, []*extprocv3.ProcessingRequest{reqHeaders(false, h...), reqBody(tc.body, true)})
			if tc.name == "invalid" {
				require.Equal(t, 400, ref.immediate)
			} else {
				require.NotEmpty(t, ref.dest)
				require.True(t, ref.eos)
			}
			for _, end := range []string{"last", "empty", "trailers"} {
				for _, cl := range []bool{false, true} {
					for k := 0; k <= len(body); k++ {
						msgs := splitBody(h, body, k, cl, end)
						got := runRequest(t, s, msgs)
						where := fmt.Sprintf("end %s, content-length %v, split at %d", end, cl, k)
						require.Equal(t, ref.immediate, got.immediate, where)
						require.Equal(t, ref.dest, got.dest, where)
						require.Equal(t, ref.contentLength, got.contentLength, where)
						require.Equal(t, string(ref.body), string(got.body), where)
						if ref.immediate != 0 {
							continue
						}
						require.Equal(t, end != "trailers", got.eos, where)
						require.Equal(t, end == "trailers", got.trailers, where)
						// Routed at the message that completed the body
						// when its length was declared and the end came
						// apart; else at the end.
						want := len(msgs) - 1
						if cl && end != "last" {
							want = len(msgs) - 2
						}
						require.Equal(t, want, got.routedAfter, where)
					}
				}
			}
		})
	}
}

// TestBodyPastContentLength: a byte past the declared length, after the
// request was routed at its Content-Length, fails the stream; an empty
// message without end of stream changes nothing.
func TestBodyPastContentLength(t *testing.T) {
	s := NewServer(Config{}, promptPicker{}, nil, nil, zap.NewNop())
	body := `{"model":"m1","prompt":"hi"}`
	w := s.watch(&ctxStream{})
	var sent []*extprocv3.ProcessingResponse
	w.st.send = func(r *extprocv3.ProcessingResponse) error {
		sent = append(sent, proto.Clone(r).(*extprocv3.ProcessingResponse))
		return nil
	}
	for _, m := range []*extprocv3.ProcessingRequest{
		reqHeaders(false, ":method", "POST", ":path", "/v1/completions", "content-length", strconv.Itoa(len(body))),
		reqBody(body, false), reqBody("", false),
	} {
		done, err := w.st.step(m, nil)
		require.False(t, done, "%v", err)
	}
	require.Len(t, sent, 2, "routing reply and the body")
	done, err := w.st.step(reqBody(" ", true), nil)
	require.True(t, done)
	require.ErrorContains(t, err, "longer than its Content-Length")
	s.recycle(w)
}

// FuzzRouteAtContentLength: for any body and split, routing at the
// Content-Length and routing at the end give the same answer, destination
// and forwarded bytes.
func FuzzRouteAtContentLength(f *testing.F) {
	for _, tc := range splitCases {
		f.Add([]byte(tc.body), uint16(len(tc.body)/2), uint8(0))
	}
	f.Add([]byte(`{"model":"m","stream":true,"stream_options":null,"messages":[]}`), uint16(7), uint8(1))
	s := NewServer(Config{}, promptPicker{}, NewStandInPrompter(), nil, zap.NewNop())
	hdr := []string{":method", "POST", ":path", "/v1/chat/completions"}
	f.Fuzz(func(t *testing.T, body []byte, at uint16, shape uint8) {
		if len(body) == 0 {
			return // no body: routed at the headers, as a GET
		}
		k := int(at) % (len(body) + 1)
		end := []string{"empty", "trailers"}[shape%2]
		ref := runRequest(t, s, []*extprocv3.ProcessingRequest{reqHeaders(false, hdr...), reqBody(string(body), true)})
		got := runRequest(t, s, splitBody(hdr, body, k, true, end))
		require.Equal(t, ref.immediate, got.immediate)
		require.Equal(t, ref.dest, got.dest)
		require.Equal(t, ref.contentLength, got.contentLength)
		require.Equal(t, string(ref.body), string(got.body))
	})
}

// TestRequestBodyKept: a body that comes whole in one message, with its
// end of stream or complete by its Content-Length with the end apart (as
// Envoy sends a body it read at once), is routed and forwarded from the
// message's own bytes; a body in pieces, or one whose end cannot be known
// before the end of stream, is gathered in a buffer of the EPP's. The
// forwarded bytes are the body either way.
func TestRequestBodyKept(t *testing.T) {
	body := chatRequestUsage(64<<10, true)
	cl := []string{"content-length", strconv.Itoa(len(body))}
	for _, tc := range []struct {
		name     string
		length   bool
		chunks   []int // message sizes; the last message ends the stream
		emptyEnd bool  // the end of stream in an empty message after them
		kept     bool
	}{
		{name: "one message with its end", chunks: []int{len(body)}, kept: true},
		{name: "one message at content-length", length: true, chunks: []int{len(body)}, emptyEnd: true, kept: true},
		{name: "one message with its end and content-length", length: true, chunks: []int{len(body)}, kept: true},
		{name: "one message, no content-length", chunks: []int{len(body)}, emptyEnd: true},
		{name: "two messages at content-length", length: true, chunks: []int{100, len(body) - 100}, emptyEnd: true},
		{name: "empty, then whole at content-length", length: true, chunks: []int{0, len(body)}, emptyEnd: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := NewServer(Config{}, promptPicker{}, NewStandInPrompter(), nil, zap.NewNop())
			h := []string{":method", "POST", ":path", "/v1/chat/completions", "content-type", "application/json"}
			if tc.length {
				h = append(h, cl...)
			}
			msgs := []*extprocv3.ProcessingRequest{reqHeaders(false, h...)}
			off := 0
			for i, n := range tc.chunks {
				msgs = append(msgs, reqBody(string(body[off:off+n]), i == len(tc.chunks)-1 && !tc.emptyEnd))
				off += n
			}
			if tc.emptyEnd {
				msgs = append(msgs, reqBody("", true))
			}
			within := func(p *byte) bool { // p points into a body message's bytes
				for _, m := range msgs {
					if b := m.GetRequestBody().GetBody(); len(b) > 0 {
						a := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
						if x := uintptr(unsafe.Pointer(p)); x >= a && x < a+uintptr(len(b)) {
							return true
						}
					}
				}
				return false
			}
			w := s.watch(&ctxStream{})
			var fwd []byte
			chunks, kept := 0, 0
			w.st.send = func(r *extprocv3.ProcessingResponse) error {
				if b := r.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse().GetBody(); len(b) > 0 {
					fwd = append(fwd, b...)
					chunks++
					if within(unsafe.SliceData(b)) {
						kept++
					}
				}
				return nil
			}
			for _, m := range msgs {
				done, err := w.st.step(m, nil)
				require.False(t, done, "%v", err)
			}
			s.recycle(w)
			require.Equal(t, string(body), string(fwd))
			require.Positive(t, chunks)
			if tc.kept {
				require.Equal(t, chunks, kept, "every chunk forwarded from the message")
			} else {
				require.Zero(t, kept, "every chunk forwarded from the EPP's buffer")
			}
		})
	}
}

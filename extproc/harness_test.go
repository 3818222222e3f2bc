package extproc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/omnious/provider-node/endpoint"
	"github.com/omnious/provider-node/scheduler"
)

// fakePicker records requests and completions.
type fakePicker struct {
	mu    sync.Mutex
	addrs []string
	err   error
	reqs  []scheduler.Request
	done  []scheduler.DoneInfo
}

func (*fakePicker) Admit(context.Context, *scheduler.Request) (*scheduler.Ticket, error) {
	return nil, nil
}

// allTokens copies every prompt id the request carries (Prefix's runs,
// then Tokens) into one slice; nil when it carries none.
func allTokens(r *scheduler.Request) []uint32 {
	if !r.HasTokens() {
		return nil
	}
	return r.AppendTokens(make([]uint32, 0, r.TokenCount()))
}

func (f *fakePicker) Pick(r *scheduler.Request, _ *scheduler.Ticket) (*scheduler.Decision, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	cp := *r
	cp.PromptText = append([]byte(nil), r.PromptText...)
	cp.Tokens, cp.Prefix = allTokens(r), nil // the server reuses the buffer
	f.reqs = append(f.reqs, cp)
	if f.err != nil {
		return nil, f.err
	}
	d := &scheduler.Decision{Mode: "approximate", Reason: "random"}
	for _, a := range f.addrs {
		d.Endpoints = append(d.Endpoints, &endpoint.Endpoint{Addr: a, Model: r.Model})
	}
	d.SetDone(func(i scheduler.DoneInfo) {
		f.mu.Lock()
		f.done = append(f.done, i)
		f.mu.Unlock()
	})
	return d, nil
}

func (f *fakePicker) snapshot() ([]scheduler.Request, []scheduler.DoneInfo) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]scheduler.Request(nil), f.reqs...), append([]scheduler.DoneInfo(nil), f.done...)
}

// startServer runs the ext_proc server on an in-memory listener and returns
// a client for it.
func startServer(t testing.TB, cfg Config, p Picker, pr Prompter, reg prometheus.Registerer) extprocv3.ExternalProcessorClient {
	t.Helper()
	return serve(t, cfg, NewServer(cfg, p, pr, reg, zap.NewNop()))
}

// serve runs s as startServer does.
func serve(t testing.TB, cfg Config, s *Server) extprocv3.ExternalProcessorClient {
	t.Helper()
	cfg = cfg.WithDefaults()
	require.NoError(t, cfg.Validate())
	lis := bufconn.Listen(1 << 20)
	g := grpc.NewServer(cfg.ServerOptions()...)
	s.Register(g)
	go func() { _ = g.Serve(lis) }()
	conn, err := grpc.NewClient("passthrough:///bufconn",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20), grpc.MaxCallSendMsgSize(64<<20)))
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = conn.Close()
		g.Stop()
	})
	return extprocv3.NewExternalProcessorClient(conn)
}

// --- request builders, as Envoy sends them ---

func hdrs(kv ...string) *corev3.HeaderMap {
	m := &corev3.HeaderMap{}
	for i := 0; i+1 < len(kv); i += 2 {
		m.Headers = append(m.Headers, &corev3.HeaderValue{Key: kv[i], RawValue: []byte(kv[i+1])})
	}
	return m
}

// reqHeaders builds request headers with an x-request-id, as Envoy's
// connection manager always sets one, unless kv has its own.
func reqHeaders(eos bool, kv ...string) *extprocv3.ProcessingRequest {
	if !slices.Contains(kv, headerRequestID) {
		kv = append(kv, headerRequestID, "req-1")
	}
	return rawReqHeaders(eos, kv...)
}

// rawReqHeaders builds request headers with exactly kv.
func rawReqHeaders(eos bool, kv ...string) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{
		RequestHeaders: &extprocv3.HttpHeaders{Headers: hdrs(kv...), EndOfStream: eos}}}
}

func withProtocol(r *extprocv3.ProcessingRequest, reqMode, respMode filterv3.ProcessingMode_BodySendMode) *extprocv3.ProcessingRequest {
	r.ProtocolConfig = &extprocv3.ProtocolConfiguration{RequestBodyMode: reqMode, ResponseBodyMode: respMode}
	return r
}

func withSubset(r *extprocv3.ProcessingRequest, addrs ...string) *extprocv3.ProcessingRequest {
	vals := make([]any, len(addrs))
	for i, a := range addrs {
		vals[i] = a
	}
	s, _ := structpb.NewStruct(map[string]any{KeySubset: vals})
	r.MetadataContext = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{MetadataSubset: s}}
	return r
}

func withServed(r *extprocv3.ProcessingRequest, addr string) *extprocv3.ProcessingRequest {
	s, _ := structpb.NewStruct(map[string]any{KeyServed: addr})
	r.MetadataContext = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{MetadataLB: s}}
	return r
}

func reqBody(b string, eos bool) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
		RequestBody: &extprocv3.HttpBody{Body: []byte(b), EndOfStream: eos}}}
}

func reqTrailers() *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestTrailers{
		RequestTrailers: &extprocv3.HttpTrailers{Trailers: hdrs("x-checksum", "1")}}}
}

func respHeaders(eos bool, kv ...string) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{
		ResponseHeaders: &extprocv3.HttpHeaders{Headers: hdrs(kv...), EndOfStream: eos}}}
}

func respBody(b string, eos bool) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{
		ResponseBody: &extprocv3.HttpBody{Body: []byte(b), EndOfStream: eos}}}
}

func respTrailers() *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseTrailers{
		ResponseTrailers: &extprocv3.HttpTrailers{Trailers: hdrs("grpc-status", "0")}}}
}

// --- expected responses ---

// expRouted is the routing reply; strip lists the control headers it
// removes, in the order the request had them.
func expRouted(dest string, contentLength string, strip ...string) *extprocv3.ProcessingResponse {
	hm := &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{setHeader(HeaderDestination, dest)}, RemoveHeaders: strip}
	if contentLength != "" {
		hm.SetHeaders = append(hm.SetHeaders, setHeader(headerContentLen, contentLength))
	}
	return &extprocv3.ProcessingResponse{DynamicMetadata: lbMetadata(dest), Response: &extprocv3.ProcessingResponse_RequestHeaders{
		RequestHeaders: &extprocv3.HeadersResponse{Response: &extprocv3.CommonResponse{ClearRouteCache: true, HeaderMutation: hm}}}}
}

func expContinueHeaders() *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{
		RequestHeaders: &extprocv3.HeadersResponse{Response: &extprocv3.CommonResponse{}}}}
}

func streamed(b string, eos bool) *extprocv3.BodyResponse {
	return &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{
		Mutation: &extprocv3.BodyMutation_StreamedResponse{StreamedResponse: &extprocv3.StreamedBodyResponse{Body: []byte(b), EndOfStream: eos}}}}}
}

func expReqBody(b string, eos bool) *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: streamed(b, eos)}}
}

func expRespBody(b string, eos bool) *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: streamed(b, eos)}}
}

func expRespHeaders(removeContentLength bool) *extprocv3.ProcessingResponse {
	c := &extprocv3.CommonResponse{}
	if removeContentLength {
		c.HeaderMutation = &extprocv3.HeaderMutation{RemoveHeaders: []string{headerContentLen}}
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{
		ResponseHeaders: &extprocv3.HeadersResponse{Response: c}}}
}

func expReqTrailers() *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestTrailers{RequestTrailers: &extprocv3.TrailersResponse{}}}
}

func expRespTrailers() *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseTrailers{ResponseTrailers: &extprocv3.TrailersResponse{}}}
}

func expImmediate(code int, reason, msg string) *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{
		ImmediateResponse: immediateResponse(code, reason, msg)}}
}

// step is one message Envoy sends (in) followed by the responses it must
// get before its next message (out).
type step struct {
	in  *extprocv3.ProcessingRequest
	out []*extprocv3.ProcessingResponse
}

// runSteps drives one stream as Envoy does and compares every response;
// after the last step it closes the send side and requires that nothing
// else arrives. It returns the stream's final error (nil on a clean end).
func runSteps(t *testing.T, c extprocv3.ExternalProcessorClient, steps []step) error {
	t.Helper()
	end, err := drive(c, steps)
	require.NoError(t, err)
	return end
}

// drive is runSteps for any goroutine: err says how the exchange differed
// from steps, end is the stream's final error.
func drive(c extprocv3.ExternalProcessorClient, steps []step) (end, err error) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, err := c.Process(ctx)
	if err != nil {
		return nil, err
	}
	for i, s := range steps {
		if err := st.Send(s.in); err != nil {
			return nil, fmt.Errorf("step %d: %w", i, err)
		}
		for j, want := range s.out {
			got, err := st.Recv()
			if err != nil {
				return nil, fmt.Errorf("step %d response %d: %w", i, j, err)
			}
			if !proto.Equal(want, got) {
				return nil, fmt.Errorf("step %d response %d:\nwant %s\ngot  %s", i, j, prototext.Format(want), prototext.Format(got))
			}
		}
	}
	if err := st.CloseSend(); err != nil {
		return nil, err
	}
	got, err := st.Recv()
	if err == nil {
		return nil, fmt.Errorf("unexpected extra response: %s", prototext.Format(got))
	}
	if errors.Is(err, io.EOF) {
		return nil, nil
	}
	return err, nil
}

// lbMetadata is the envoy.lb dynamic metadata naming dest, built as proto
// messages: the reference the reply's hand-encoded bytes are checked
// against.
func lbMetadata(dest string) *structpb.Struct {
	return &structpb.Struct{Fields: map[string]*structpb.Value{
		MetadataLB: structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
			HeaderDestination: structpb.NewStringValue(dest),
		}}),
	}}
}

package testgw

import (
	"errors"
	"io"
	"strconv"
	"sync/atomic"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/omnious/provider-node/extproc"
)

// Floor is an ext_proc server that answers the gateway's exchange as the
// EPP does, message for message, with no work at all: it gathers the
// request body, routes to its destinations in turn, echoes the body in
// chunks of at most the EPP's chunk_size (the ext_proc contract's 62000
// bytes) and answers the response phase unchanged, in chunks alike. What
// the gateway waits on it is the cost of gRPC, protobuf and the machine's
// scheduling alone, the floor under the EPP's added latency (`bench load
// -floor`).
type Floor struct {
	extprocv3.UnimplementedExternalProcessorServer
	// Dests are the endpoints (ip:port) requests are routed to in turn.
	Dests []string
	next  atomic.Uint64
}

// Process implements the ext_proc stream.
func (f *Floor) Process(st extprocv3.ExternalProcessor_ProcessServer) error {
	var body []byte
	for {
		req, err := st.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		var resp *extprocv3.ProcessingResponse
		switch r := req.Request.(type) {
		case *extprocv3.ProcessingRequest_RequestHeaders:
			if !r.RequestHeaders.EndOfStream {
				continue // answered with the routing reply at the body's end
			}
			resp = RouteReply(f.dest(), 0)
		case *extprocv3.ProcessingRequest_RequestBody:
			body = append(body, r.RequestBody.Body...)
			if !r.RequestBody.EndOfStream {
				continue
			}
			if err := st.Send(RouteReply(f.dest(), len(body))); err != nil {
				return err
			}
			if err := SendBody(st, true, body, true); err != nil {
				return err
			}
			continue
		case *extprocv3.ProcessingRequest_ResponseHeaders:
			resp = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{
				ResponseHeaders: &extprocv3.HeadersResponse{}}}
		case *extprocv3.ProcessingRequest_ResponseBody:
			if err := SendBody(st, false, r.ResponseBody.Body, r.ResponseBody.EndOfStream); err != nil {
				return err
			}
			continue
		default:
			continue // trailers: the gateway sends none
		}
		if err := st.Send(resp); err != nil {
			return err
		}
	}
}

// dest is the next of the Floor's destinations.
func (f *Floor) dest() string { return f.Dests[int(f.next.Add(1)%uint64(len(f.Dests)))] }

// RouteReply is the EPP's routing reply to dest for a body of n bytes:
// the destination header, Content-Length and the envoy.lb metadata.
func RouteReply(dest string, n int) *extprocv3.ProcessingResponse {
	set := func(k, v string) *corev3.HeaderValueOption {
		return &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: k, RawValue: []byte(v)},
			AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD}
	}
	md, _ := structpb.NewStruct(map[string]any{extproc.MetadataLB: map[string]any{extproc.HeaderDestination: dest}})
	return &extprocv3.ProcessingResponse{DynamicMetadata: md, Response: &extprocv3.ProcessingResponse_RequestHeaders{
		RequestHeaders: &extprocv3.HeadersResponse{Response: &extprocv3.CommonResponse{ClearRouteCache: true,
			HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{
				set(extproc.HeaderDestination, dest), set("content-length", strconv.Itoa(n))}}}}}}
}

// chunkSize is the largest body chunk the EPP sends back (its default
// chunk_size).
var chunkSize = extproc.Config{}.WithDefaults().ChunkSize

// SendBody sends body back unchanged, as the request's (request) or the
// response's, in the EPP's chunks (extproc.EachChunk at its default
// chunk_size).
func SendBody(st extprocv3.ExternalProcessor_ProcessServer, request bool, body []byte, eos bool) error {
	return extproc.EachChunk(body, eos, chunkSize, func(c []byte, eos bool) error {
		return st.Send(StreamedBody(request, c, eos))
	})
}

// StreamedBody is a streamed body chunk of the request or the response,
// sent back unchanged.
func StreamedBody(request bool, body []byte, eos bool) *extprocv3.ProcessingResponse {
	br := &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{
		Mutation: &extprocv3.BodyMutation_StreamedResponse{StreamedResponse: &extprocv3.StreamedBodyResponse{
			Body: body, EndOfStream: eos}}}}}
	if request {
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: br}}
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: br}}
}

package extproc

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/experimental"
	"google.golang.org/protobuf/proto"

	"github.com/omnious/provider-node/endpoint"
	"github.com/omnious/provider-node/scheduler"
)

// onePicker always picks the same endpoint.
type onePicker struct{ eps []*endpoint.Endpoint }

func (onePicker) Admit(context.Context, *scheduler.Request) (*scheduler.Ticket, error) {
	return nil, nil
}

func (p onePicker) Pick(*scheduler.Request, *scheduler.Ticket) (*scheduler.Decision, error) {
	return &scheduler.Decision{Endpoints: p.eps}, nil
}

// chatRequest builds a chat body of about size bytes: a system prompt and a
// long user turn of English-like text (about 4 bytes per token).
func chatRequest(size int) []byte { return chatRequestUsage(size, true) }

// chatRequestUsage builds the body with or without a request for usage.
func chatRequestUsage(size int, askUsage bool) []byte {
	words := []string{"the", "router", "sends", "each", "request", "to", "a", "replica", "whose", "cache", "already", "holds", "its", "prefix", "\\n"}
	var b strings.Builder
	for i := 0; b.Len() < size-200; i++ {
		b.WriteString(words[(i*7+i/3)%len(words)])
		b.WriteByte(' ')
	}
	req := map[string]any{
		"model":    "Qwen/Qwen3-32B",
		"messages": []map[string]string{{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": b.String()}},
		"stream":   true, "max_tokens": 64,
	}
	if askUsage {
		req["stream_options"] = map[string]bool{"include_usage": true}
	}
	body, _ := json.Marshal(req)
	return body
}

func startTCPServer(b *testing.B, register func(*grpc.Server, Config)) extprocv3.ExternalProcessorClient {
	cfg := Config{}.WithDefaults()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(b, err)
	g := grpc.NewServer(cfg.ServerOptions()...)
	register(g, cfg)
	go func() { _ = g.Serve(lis) }()
	// The client plays Envoy; it gets the same pool so that its own
	// costs do not hide the server's.
	pool := NewBufferPool()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		experimental.WithBufferPool(pool), grpc.WithInitialWindowSize(1<<20), grpc.WithInitialConnWindowSize(16<<20),
		grpc.WithReadBufferSize(128<<10), grpc.WithWriteBufferSize(128<<10), grpc.WithDefaultCallOptions(grpc.ForceCodecV2(NewCodec(pool))))
	require.NoError(b, err)
	b.Cleanup(func() {
		_ = conn.Close()
		g.Stop()
	})
	return extprocv3.NewExternalProcessorClient(conn)
}

// BenchmarkExtProcRoundTrip (1KB shows the fixed cost of a stream) measures one request's full ext_proc exchange
// as Envoy drives it in FULL_DUPLEX_STREAMED mode over loopback TCP: the
// headers, the body in 64 KiB chunks, then the routing header response and
// the re-emitted body. bodies/op is allocated bytes over body size: every
// copy of the body on both sides of the connection, gRPC's included.
func BenchmarkExtProcRoundTrip(b *testing.B) {
	roundTrips(b, func(g *grpc.Server, cfg Config) {
		NewServer(cfg, onePicker{[]*endpoint.Endpoint{{Addr: "127.0.0.1:8000"}}}, nil, nil, zap.NewNop()).Register(g)
	})
}

// BenchmarkExtProcFloor is the same exchange against floorServer.
func BenchmarkExtProcFloor(b *testing.B) {
	roundTrips(b, func(g *grpc.Server, _ Config) { extprocv3.RegisterExternalProcessorServer(g, floorServer{}) })
}

func roundTrips(b *testing.B, register func(*grpc.Server, Config)) {
	for _, size := range []int{1 << 10, 32 << 10, 200 << 10} {
		body := chatRequest(size)
		b.Run(fmt.Sprintf("%dKB", size>>10), func(b *testing.B) {
			exchange := newExchange(b, startTCPServer(b, register), body)
			exchange()
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			cpu0 := cpuTime()
			b.ResetTimer()
			for range b.N {
				exchange()
			}
			b.StopTimer()
			cpu := cpuTime() - cpu0
			runtime.ReadMemStats(&after)
			b.ReportMetric(float64(after.TotalAlloc-before.TotalAlloc)/float64(b.N)/float64(len(body)), "bodies/op")
			// On a shared machine wall time is mostly waiting for a core;
			// process CPU time per exchange (client and server) is the
			// stable figure.
			b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/op")
		})
	}
}

// newExchange returns one request's exchange with c as Envoy drives it in
// FULL_DUPLEX_STREAMED mode: the headers, body in 64 KiB chunks, then the
// replies until the re-emitted body ends, then the stream's end.
func newExchange(b *testing.B, c extprocv3.ExternalProcessorClient, body []byte) func() {
	headers := reqHeaders(false, ":method", "POST", ":path", "/v1/chat/completions",
		"content-type", "application/json", "content-length", strconv.Itoa(len(body)))
	var chunks []*extprocv3.ProcessingRequest
	for off := 0; off < len(body); off += 64 << 10 {
		end := min(off+64<<10, len(body))
		chunks = append(chunks, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
			RequestBody: &extprocv3.HttpBody{Body: body[off:end], EndOfStream: end == len(body)}}})
	}
	return func() {
		st, err := c.Process(context.Background())
		if err != nil {
			b.Fatal(err)
		}
		if err := st.Send(headers); err != nil {
			b.Fatal(err)
		}
		for _, ch := range chunks {
			if err := st.Send(ch); err != nil {
				b.Fatal(err)
			}
		}
		got := 0
		for {
			r, err := st.Recv()
			if err != nil {
				b.Fatal(err)
			}
			if rb := r.GetRequestBody(); rb != nil {
				sr := rb.GetResponse().GetBodyMutation().GetStreamedResponse()
				got += len(sr.GetBody())
				if sr.GetEndOfStream() {
					break
				}
			}
		}
		if got != len(body) {
			b.Fatalf("got %d body bytes back, want %d", got, len(body))
		}
		_ = st.CloseSend()
		if _, err := st.Recv(); err != io.EOF {
			b.Fatalf("stream end: %v", err)
		}
	}
}

// BenchmarkExtProcVsFloor alternates BenchmarkExtProcRoundTrip's exchange
// with the EPP and with floorServer in one loop and reports the ratio of
// their median wall times (and of the first quartiles): on a shared
// machine the two benchmarks run minutes apart under different loads, and
// only a ratio measured side by side is stable.
func BenchmarkExtProcVsFloor(b *testing.B) {
	for _, size := range []int{1 << 10, 32 << 10, 200 << 10} {
		body := chatRequest(size)
		b.Run(fmt.Sprintf("%dKB", size>>10), func(b *testing.B) {
			epp := newExchange(b, startTCPServer(b, func(g *grpc.Server, cfg Config) {
				NewServer(cfg, onePicker{[]*endpoint.Endpoint{{Addr: "127.0.0.1:8000"}}}, nil, nil, zap.NewNop()).Register(g)
			}), body)
			floor := newExchange(b, startTCPServer(b, func(g *grpc.Server, _ Config) {
				extprocv3.RegisterExternalProcessorServer(g, floorServer{})
			}), body)
			epp()
			floor()
			timed := func(f func()) time.Duration {
				start := time.Now()
				f()
				return time.Since(start)
			}
			te, tf := make([]time.Duration, 0, b.N), make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for i := range b.N {
				// Either order in turn, so neither always follows the other.
				if i%2 == 0 {
					te, tf = append(te, timed(epp)), append(tf, timed(floor))
				} else {
					tf, te = append(tf, timed(floor)), append(te, timed(epp))
				}
			}
			slices.Sort(te)
			slices.Sort(tf)
			b.ReportMetric(float64(te[len(te)/2])/float64(tf[len(tf)/2]), "median-ratio")
			b.ReportMetric(float64(te[len(te)/4])/float64(tf[len(tf)/4]), "p25-ratio")
			b.ReportMetric(float64(te[len(te)/2]), "epp-ns")
			b.ReportMetric(float64(tf[len(tf)/2]), "floor-ns")
		})
	}
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkParseRequestBody is the single parse on its own.
func BenchmarkParseRequestBody(b *testing.B) {
	for _, size := range []int{32 << 10, 200 << 10} {
		body := chatRequest(size)
		b.Run(fmt.Sprintf("%dKB", size>>10), func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			var rb requestBody
			for range b.N {
				if err := parseRequestBody(body, &rb); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkHandle is the EPP's own work for one request, without gRPC:
// headers, the body in 64 KiB chunks, the parse, the pick and the replies
// (built, not sent). With rewrite, the model is rewritten and usage
// injected, so the body is copied once more.
func BenchmarkHandle(b *testing.B) {
	for _, size := range []int{32 << 10, 200 << 10} {
		for _, rewrite := range []bool{false, true} {
			body := chatRequestUsage(size, !rewrite)
			name := fmt.Sprintf("%dKB", size>>10)
			if rewrite {
				name += "/rewrite"
			}
			b.Run(name, func(b *testing.B) {
				s := NewServer(Config{}, onePicker{[]*endpoint.Endpoint{{Addr: "127.0.0.1:8000"}}}, nil, nil, zap.NewNop())
				kv := []string{":method", "POST", ":path", "/v1/chat/completions", "content-length", strconv.Itoa(len(body))}
				if rewrite {
					kv = append(kv, HeaderModelRewrite, "other-model")
				}
				headers := reqHeaders(false, kv...)
				var chunks []*extprocv3.ProcessingRequest
				for off := 0; off < len(body); off += 64 << 10 {
					end := min(off+64<<10, len(body))
					// Each chunk is its own allocation, as gRPC delivers it.
					chunks = append(chunks, reqBody(string(body[off:end]), end == len(body)))
				}
				sent := 0
				send := func(r *extprocv3.ProcessingResponse) error {
					sent += len(r.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse().GetBody())
					return nil
				}
				ctx := context.Background()
				b.SetBytes(int64(len(body)))
				b.ReportAllocs()
				b.ResetTimer()
				for range b.N {
					st := &stream{s: s, ctx: ctx, send: send, reqMode: s.defaultMode(), respMode: s.defaultMode()}
					if err := st.handle(headers); err != nil {
						b.Fatal(err)
					}
					for _, c := range chunks {
						if err := st.handle(c); err != nil {
							b.Fatal(err)
						}
					}
					st.close(nil)
				}
				if sent < b.N*(len(body)-len("Qwen/Qwen3-32B")) {
					b.Fatalf("sent %d bytes for %d requests of %d", sent, b.N, len(body))
				}
			})
		}
	}
}

// floorServer answers the same exchange as Server with no work at all: a
// fixed header response and each body chunk echoed. Its round trip is what
// gRPC and protobuf cost on this machine before the EPP does anything, the
// floor under BenchmarkExtProcRoundTrip.
type floorServer struct {
	extprocv3.UnimplementedExternalProcessorServer
}

func (floorServer) Process(st extprocv3.ExternalProcessor_ProcessServer) error {
	for {
		req, err := st.Recv()
		if err != nil {
			return nil
		}
		rb := req.GetRequestBody()
		if rb == nil {
			continue
		}
		if rb.GetEndOfStream() {
			if err := st.Send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{
				RequestHeaders: &extprocv3.HeadersResponse{}}}); err != nil {
				return err
			}
		}
		if err := st.Send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{
			RequestBody: &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{
				Mutation: &extprocv3.BodyMutation_StreamedResponse{StreamedResponse: &extprocv3.StreamedBodyResponse{
					Body: rb.GetBody(), EndOfStream: rb.GetEndOfStream()}}}}}}}); err != nil {
			return err
		}
	}
}

// BenchmarkDecodeReply is the client's (Envoy's) share of the reply to the
// request headers: decoding the EPP's routing reply (destination and
// content-length headers, envoy.lb metadata) against floorServer's empty
// answer.
func BenchmarkDecodeReply(b *testing.B) {
	routed := expRouted("127.0.0.1:8000", "1024")
	floor := &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{
		RequestHeaders: &extprocv3.HeadersResponse{}}}
	for _, c := range []struct {
		name string
		msg  *extprocv3.ProcessingResponse
	}{{"routed", routed}, {"floor", floor}} {
		wire, err := proto.Marshal(c.msg)
		require.NoError(b, err)
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				var m extprocv3.ProcessingResponse
				if err := proto.Unmarshal(wire, &m); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

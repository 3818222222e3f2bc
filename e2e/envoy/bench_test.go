package envoy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/omnious/provider-node/endpoint"
	"github.com/omnious/provider-node/extproc"
	"github.com/omnious/provider-node/extproc/testgw"
	"github.com/omnious/provider-node/internal/testutil/envoytest"
)

// answer is the fixed engine answer of the benchmark's upstream.
const answer = `{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"Qwen/Qwen3-32B","choices":[{"index":0,` +
	`"message":{"role":"assistant","content":"Hello."},"finish_reason":"stop"}],"usage":{"prompt_tokens":10,"completion_tokens":2,"total_tokens":12}}`

// startAnswerer is an upstream that reads the request and answers at
// once, so that the three gateways are compared on their own cost.
func startAnswerer(tb testing.TB) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(tb, err)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, answer)
	}), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	tb.Cleanup(func() { _ = srv.Close() })
	return ln.Addr().String()
}

// startFloor runs the no-op ext_proc server (testgw.Floor) routing to
// dest, with gRPC health SERVING for the ext_proc service on its port.
func startFloor(tb testing.TB, dest string) string {
	tb.Helper()
	return startExtProc(tb, &testgw.Floor{Dests: []string{dest}})
}

// bufferingFloor is an ext_proc server that does what any EPP that must
// read the whole body before it names a destination pays in
// FULL_DUPLEX_STREAMED mode, where the headers' answer must precede the
// body's, and nothing else: it holds every body chunk until the body is
// complete, then answers with the routing reply (testgw.Floor's) and the
// chunks as they came, unchanged (cut at the EPP's chunk_size, as
// testgw.SendBody sends them). atLength: the body is complete when it
// reaches its Content-Length, as the EPP takes it (Envoy's end of stream,
// an empty message that often comes later, is then passed on by itself);
// else at Envoy's end of stream, as testgw.Floor waits for it.
type bufferingFloor struct {
	extprocv3.UnimplementedExternalProcessorServer
	dest     string
	atLength bool
}

// Process implements the ext_proc stream.
func (f *bufferingFloor) Process(st extprocv3.ExternalProcessor_ProcessServer) error {
	var chunks [][]byte
	held, length, open := 0, int64(-1), false
	for {
		req, err := st.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		var out *extprocv3.ProcessingResponse
		switch r := req.Request.(type) {
		case *extprocv3.ProcessingRequest_RequestHeaders:
			for _, h := range r.RequestHeaders.GetHeaders().GetHeaders() {
				if h.Key == "content-length" {
					length, _ = strconv.ParseInt(string(h.RawValue), 10, 64)
				}
			}
			if !r.RequestHeaders.EndOfStream {
				continue
			}
			out = testgw.RouteReply(f.dest, 0)
		case *extprocv3.ProcessingRequest_RequestBody:
			b := r.RequestBody
			if open { // answered at Content-Length: the end of stream
				if err := testgw.SendBody(st, true, b.Body, b.EndOfStream); err != nil {
					return err
				}
				continue
			}
			chunks = append(chunks, b.Body) // the received message's own bytes: no copy
			held += len(b.Body)
			complete := f.atLength && length > 0 && int64(held) == length
			if !b.EndOfStream && !complete {
				continue
			}
			open = !b.EndOfStream
			if err := st.Send(testgw.RouteReply(f.dest, held)); err != nil {
				return err
			}
			for i, c := range chunks {
				if err := testgw.SendBody(st, true, c, b.EndOfStream && i == len(chunks)-1); err != nil {
					return err
				}
			}
			continue
		case *extprocv3.ProcessingRequest_ResponseHeaders:
			out = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{
				ResponseHeaders: &extprocv3.HeadersResponse{}}}
		case *extprocv3.ProcessingRequest_ResponseBody:
			if err := testgw.SendBody(st, false, r.ResponseBody.Body, r.ResponseBody.EndOfStream); err != nil {
				return err
			}
			continue
		default:
			continue // trailers: the benchmark's client sends none
		}
		if err := st.Send(out); err != nil {
			return err
		}
	}
}

// startExtProc runs srv as an ext_proc server, with gRPC health SERVING
// for the ext_proc service on its port.
func startExtProc(tb testing.TB, srv extprocv3.ExternalProcessorServer) string {
	tb.Helper()
	ln, err := net.Listen("tcp", ports(tb, 1)[0])
	require.NoError(tb, err)
	g := grpc.NewServer(extproc.Config{}.WithDefaults().ServerOptions()...)
	extprocv3.RegisterExternalProcessorServer(g, srv)
	hs := health.NewServer()
	hs.SetServingStatus("envoy.service.ext_proc.v3.ExternalProcessor", healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(g, hs)
	go func() { _ = g.Serve(ln) }()
	tb.Cleanup(g.Stop)
	return ln.Addr().String()
}

// withoutExtProc removes the ext_proc filter: the route alone.
func withoutExtProc(doc map[string]any) error {
	lis := doc["static_resources"].(map[string]any)["listeners"].([]any)[0].(map[string]any)
	hcm := lis["filter_chains"].([]any)[0].(map[string]any)["filters"].([]any)[0].(map[string]any)["typed_config"].(map[string]any)
	filters := hcm["http_filters"].([]any)
	var kept []any
	for _, f := range filters {
		if f.(map[string]any)["name"] != "envoy.filters.http.ext_proc" {
			kept = append(kept, f)
		}
	}
	if len(kept) == len(filters) {
		return fmt.Errorf("no ext_proc filter in the config")
	}
	hcm["http_filters"] = kept
	return nil
}

// BenchmarkEPPInEnvoy is the EPP's cost inside the real Envoy: one
// request at a time through five Envoys on the shipped envoy.yaml, to an
// upstream that answers at once: with the EPP (precise, stand-in
// tokenizer); with the no-op ext_proc server in its place (testgw.Floor,
// the same filter config, the body sent back in the EPP's chunks of at
// most 62000 bytes as the ext_proc contract has them: the floor the
// target is set against); with the
// buffering floor, which holds the body until Envoy's end of stream
// ("buffer") or until its Content-Length ("buffer-cl", when the EPP
// routes) and then answers, doing nothing else (bufferingFloor: what any
// EPP that reads the whole body pays); and with the ext_proc filter
// removed (the route alone, the destination header set by the client).
// Each iteration sends one request through each, in turn, so they share
// the machine's noise; the metrics are medians and their ratios, and
// route-us and route-p50-us are the mean and the median of the EPP's own
// decision latency (its histogram omnious_extproc_route_duration_seconds)
// over the same requests.
//
//	go test -run '^$' -bench EPPInEnvoy -count 3 ./e2e/envoy/
func BenchmarkEPPInEnvoy(b *testing.B) {
	up := startAnswerer(b)
	e := startEPPOver(b, []endpoint.Endpoint{{Addr: up, Model: model, Engine: "vllm"}})
	cfg := shipped(b, "envoy.yaml")
	over := func(addr string) map[string]string {
		return map[string]string{"127.0.0.1:9002": addr, "127.0.0.1:9003": addr}
	}
	withEPP := envoytest.MustStart(b, cfg, subst(e), nil)
	withFloor := envoytest.MustStart(b, cfg, over(startFloor(b, up)), nil)
	withBuffer := envoytest.MustStart(b, cfg, over(startExtProc(b, &bufferingFloor{dest: up})), nil)
	withBufferCL := envoytest.MustStart(b, cfg, over(startExtProc(b, &bufferingFloor{dest: up, atLength: true})), nil)
	static := envoytest.MustStart(b, cfg, subst(e), withoutExtProc)
	for _, env := range []*envoytest.Envoy{withEPP, withFloor, withBuffer, withBufferCL} {
		waitEPPHealthy(b, env, 1)
	}
	client := &http.Client{Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 4}, Timeout: 30 * time.Second}
	send := func(url string, body []byte, dest string) time.Duration {
		req, err := http.NewRequest(http.MethodPost, url+"/v1/chat/completions", bytes.NewReader(body))
		require.NoError(b, err)
		req.Header.Set("Content-Type", "application/json")
		if dest != "" {
			req.Header.Set(extproc.HeaderDestination, dest)
		}
		start := time.Now()
		resp, err := client.Do(req)
		require.NoError(b, err)
		got, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		took := time.Since(start)
		require.NoError(b, err)
		require.Equal(b, http.StatusOK, resp.StatusCode, "%s", got)
		return took
	}
	// route is the EPP's decision-latency histogram so far.
	route := func() *dto.Histogram {
		ms := e.metric("omnious_extproc_route_duration_seconds")
		require.Len(b, ms, 1)
		return ms[0].GetHistogram()
	}
	for _, size := range []int{1 << 10, 32 << 10, 200 << 10} {
		body := chat(words(size, size), false, 4)
		b.Run(fmt.Sprintf("%dKB", size>>10), func(b *testing.B) {
			for range 20 { // warm connections and caches
				send(withEPP.URL(), body, "")
				send(withFloor.URL(), body, "")
				send(withBuffer.URL(), body, "")
				send(withBufferCL.URL(), body, "")
				send(static.URL(), body, up)
			}
			var ep, fl, bu, bc, st []time.Duration
			h0 := route()
			b.ResetTimer()
			for b.Loop() {
				ep = append(ep, send(withEPP.URL(), body, ""))
				fl = append(fl, send(withFloor.URL(), body, ""))
				bu = append(bu, send(withBuffer.URL(), body, ""))
				bc = append(bc, send(withBufferCL.URL(), body, ""))
				st = append(st, send(static.URL(), body, up))
			}
			b.StopTimer()
			h1 := route()
			n := h1.GetSampleCount() - h0.GetSampleCount()
			require.Equal(b, uint64(len(ep)), n, "one decision per request")
			me, mf, mb, mc, ms := median(ep), median(fl), median(bu), median(bc), median(st)
			b.ReportMetric(float64(me.Microseconds()), "epp-us")
			b.ReportMetric(float64(mf.Microseconds()), "noop-us")
			b.ReportMetric(float64(mb.Microseconds()), "buffer-us")
			b.ReportMetric(float64(mc.Microseconds()), "buffer-cl-us")
			b.ReportMetric(float64(ms.Microseconds()), "static-us")
			b.ReportMetric((h1.GetSampleSum()-h0.GetSampleSum())/float64(n)*1e6, "route-us")
			b.ReportMetric(histMedian(h0, h1)*1e6, "route-p50-us")
			b.ReportMetric(float64(me)/float64(mf), "epp/noop")
			b.ReportMetric(float64(me)/float64(mb), "epp/buffer")
			b.ReportMetric(float64(mb)/float64(mf), "buffer/noop")
			b.ReportMetric(float64(me)/float64(mc), "epp/buffer-cl")
			b.ReportMetric(float64(mf)/float64(ms), "noop/static")
		})
	}
}

// histMedian is the median of the observations a histogram got between
// snapshots h0 and h1, interpolated inside its bucket as Prometheus'
// histogram_quantile does.
func histMedian(h0, h1 *dto.Histogram) float64 {
	b0, b1 := h0.GetBucket(), h1.GetBucket()
	half := float64(h1.GetSampleCount()-h0.GetSampleCount()) / 2
	lower, below := 0.0, 0.0
	for i := range b1 {
		upper := b1[i].GetUpperBound()
		n := float64(b1[i].GetCumulativeCount() - b0[i].GetCumulativeCount())
		if n >= half {
			return lower + (upper-lower)*(half-below)/(n-below)
		}
		lower, below = upper, n
	}
	return lower
}

func median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}

package envoy

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
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
	ln, err := net.Listen("tcp", ports(tb, 1)[0])
	require.NoError(tb, err)
	g := grpc.NewServer(extproc.Config{}.WithDefaults().ServerOptions()...)
	extprocv3.RegisterExternalProcessorServer(g, &testgw.Floor{Dests: []string{dest}})
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
// request at a time through three Envoys on the shipped envoy.yaml, to
// an upstream that answers at once: with the EPP (precise, stand-in
// tokenizer), with the no-op ext_proc server in its place (the same
// filter config: the floor), and with the ext_proc filter removed (the
// route alone, the destination header set by the client). Each iteration
// sends one request through each, in turn, so the three share the
// machine's noise; the metrics are medians and their ratios.
//
//	go test -run '^$' -bench EPPInEnvoy -count 3 ./e2e/envoy/
func BenchmarkEPPInEnvoy(b *testing.B) {
	up := startAnswerer(b)
	e := startEPPOver(b, []endpoint.Endpoint{{Addr: up, Model: model, Engine: "vllm"}})
	floor := startFloor(b, up)
	cfg := shipped(b, "envoy.yaml")
	withEPP := envoytest.MustStart(b, cfg, subst(e), nil)
	withFloor := envoytest.MustStart(b, cfg, map[string]string{"127.0.0.1:9002": floor, "127.0.0.1:9003": floor}, nil)
	static := envoytest.MustStart(b, cfg, subst(e), withoutExtProc)
	waitEPPHealthy(b, withEPP, 1)
	waitEPPHealthy(b, withFloor, 1)
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
	for _, size := range []int{1 << 10, 32 << 10, 200 << 10} {
		body := chat(words(size, size), false, 4)
		b.Run(fmt.Sprintf("%dKB", size>>10), func(b *testing.B) {
			for range 20 { // warm connections and caches
				send(withEPP.URL(), body, "")
				send(withFloor.URL(), body, "")
				send(static.URL(), body, up)
			}
			var ep, fl, st []time.Duration
			b.ResetTimer()
			for b.Loop() {
				ep = append(ep, send(withEPP.URL(), body, ""))
				fl = append(fl, send(withFloor.URL(), body, ""))
				st = append(st, send(static.URL(), body, up))
			}
			b.StopTimer()
			me, mf, ms := median(ep), median(fl), median(st)
			b.ReportMetric(float64(me.Microseconds()), "epp-us")
			b.ReportMetric(float64(mf.Microseconds()), "noop-us")
			b.ReportMetric(float64(ms.Microseconds()), "static-us")
			b.ReportMetric(float64(me)/float64(mf), "epp/noop")
			b.ReportMetric(float64(mf)/float64(ms), "noop/static")
		})
	}
}

func median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}

package main

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/stretchr/testify/require"
	collectortracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/omnious/provider-node/deploy/metricscheck"
	"github.com/omnious/provider-node/engines/openai"
	"github.com/omnious/provider-node/engines/sim/simtest"
	"github.com/omnious/provider-node/extproc/testgw"
)

// start runs a process until the test ends.
func start(t *testing.T, bin string, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return cmd
}

func getJSON(t *testing.T, url string, v any) {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.NoError(t, json.NewDecoder(resp.Body).Decode(v))
}

// metric sums the values of the series of name in a Prometheus exposition.
func metric(t *testing.T, url, name string) float64 {
	t.Helper()
	return series(t, url, name+"{") + series(t, url, name+" ")
}

// startFleet runs three enginesim processes (two vLLM, one SGLang) on
// 127.0.0.1, each publishing KV events with a replay endpoint, kvEvents
// added to their kv_events section; it returns their addresses once they
// are healthy, and an endpoints file listing them for model.
func startFleet(t *testing.T, simBin, dir, model, kvEvents string) (addrs []string, endpoints string) {
	t.Helper()
	var file strings.Builder
	fmt.Fprintf(&file, "defaults:\n  model: %s\nendpoints:\n", model)
	for i, flavour := range []string{"vllm", "vllm", "sglang"} {
		httpPort, pub, replay := simtest.FreePort(t), simtest.FreePort(t), simtest.FreePort(t)
		cfg := fmt.Sprintf("listen: 127.0.0.1:%d\nseed: %d\nengine: {flavour: %s, time_scale: 50}\n"+
			"kv_events: {endpoint: \"tcp://127.0.0.1:%d\", replay_endpoint: \"tcp://127.0.0.1:%d\"%s}\n",
			httpPort, i, flavour, pub, replay, kvEvents)
		path := filepath.Join(dir, fmt.Sprintf("sim-%d.yaml", i))
		require.NoError(t, os.WriteFile(path, []byte(cfg), 0o600))
		start(t, simBin, "-config", path, "-log-level", "warn")
		addrs = append(addrs, fmt.Sprintf("127.0.0.1:%d", httpPort))
		fmt.Fprintf(&file, "  - {ip: 127.0.0.1, port: %d, engine: %s, kv_events_port: %d, replay_port: %d}\n", httpPort, flavour, pub, replay)
	}
	for _, a := range addrs {
		simtest.WaitOK(t, "http://"+a+"/health")
	}
	endpoints = filepath.Join(dir, "endpoints.yaml")
	require.NoError(t, os.WriteFile(endpoints, []byte(file.String()), 0o600))
	return addrs, endpoints
}

// startGateway runs the test gateway in front of the EPP at eppAddr until
// the test ends and returns its base URL.
func startGateway(t *testing.T, eppAddr string) string {
	t.Helper()
	gw, err := testgw.New(testgw.Config{EPP: eppAddr}, zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- gw.Run(ctx) }()
	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })
	return "http://" + gw.Addr()
}

// buildEPP builds this command into dir.
func buildEPP(t *testing.T, dir string) string {
	t.Helper()
	bin := filepath.Join(dir, "epp")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, string(out))
	return bin
}

// TestEPPRoutesThroughGateway runs cmd/epp with a static endpoint file in
// front of three enginesim processes (two vLLM, one SGLang), with the test
// gateway playing Envoy: real OpenAI requests, streamed and not, are routed,
// the index sees the replicas' KV events, and requests that share a long
// prefix stay on the replica that holds it.
func TestEPPRoutesThroughGateway(t *testing.T) {
	dir := t.TempDir()
	simBin := simtest.Binary(t)
	eppBin := buildEPP(t, dir)
	const model = "Qwen/Qwen3-32B"

	sims, endpoints := startFleet(t, simBin, dir, model, "")

	grpcAddr := fmt.Sprintf("127.0.0.1:%d", simtest.FreePort(t))
	metricsAddr := fmt.Sprintf("127.0.0.1:%d", simtest.FreePort(t))
	adminAddr := fmt.Sprintf("127.0.0.1:%d", simtest.FreePort(t))
	col := startCollector(t)
	// Spans leave in batches; a short delay keeps the test quick.
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
	healthAddr := fmt.Sprintf("127.0.0.1:%d", simtest.FreePort(t))
	epp := start(t, eppBin, "-endpoints-file", endpoints, "-standin-tokenizer", "-log-level", "warn", "-drain-delay", "3s",
		"-grpc-addr", grpcAddr, "-health-addr", healthAddr,
		"-metrics-addr", metricsAddr, "-admin-addr", adminAddr,
		"-otlp-endpoint", col.addr, "-otlp-insecure", "-trace-sample-ratio", "0")
	simtest.WaitOK(t, "http://"+metricsAddr+"/metrics")

	base := startGateway(t, grpcAddr)

	// The EPP lists its endpoints once it has read the file; until its
	// first scrape a replica is scored as idle.
	require.Eventually(t, func() bool {
		var eps []map[string]any
		getJSON(t, "http://"+adminAddr+"/debug/endpoints", &eps)
		return len(eps) == 3
	}, 10*time.Second, 50*time.Millisecond)

	system := strings.Repeat("You are the provider's careful assistant; answer with sources. ", 60)
	chat := func(user string, stream bool) (int, string) {
		body := map[string]any{"model": model, "max_tokens": 8, "stream": stream,
			"messages": []any{map[string]any{"role": "system", "content": system}, map[string]any{"role": "user", "content": user}}}
		raw, err := json.Marshal(body)
		require.NoError(t, err)
		resp, err := http.Post(base+"/v1/chat/completions", "application/json", bytes.NewReader(raw))
		require.NoError(t, err)
		defer resp.Body.Close()
		out, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(out)
	}

	code, body := chat("first question", false)
	require.Equal(t, http.StatusOK, code, body)
	var full struct {
		Model   string       `json:"model"`
		Usage   openai.Usage `json:"usage"`
		Choices []struct {
			Message struct {
				Content string `json:"content"`
			} `json:"message"`
		} `json:"choices"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &full))
	require.Equal(t, model, full.Model)
	require.NotEmpty(t, full.Choices[0].Message.Content)

	code, body = chat("a streamed question", true)
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, `"chat.completion.chunk"`)
	require.True(t, strings.HasSuffix(strings.TrimSpace(body), "data: [DONE]"))
	require.NotContains(t, body, `"usage":{`, "the EPP's injected usage chunk does not reach a client that did not ask")

	// The index sees the replicas' KV events.
	require.Eventually(t, func() bool {
		var eps []struct {
			Resident int `json:"resident_blocks"`
		}
		getJSON(t, "http://"+adminAddr+"/debug/endpoints", &eps)
		total := 0
		for _, e := range eps {
			total += e.Resident
		}
		return total > 0
	}, 10*time.Second, 50*time.Millisecond, "KV events reach the index")

	// Requests sharing the long system prompt follow the replicas that hold
	// it. The first two requests may have landed on two replicas (the second
	// is routed before the first one's events arrive, or before the holder's
	// first scrape); once every replica that served them shows blocks in the
	// index, no follow-up goes to a replica without the prefix.
	before := served(t, sims, 2)
	warm := map[string]bool{}
	for i, s := range sims {
		if before[i] > 0 {
			warm[s] = true
		}
	}
	require.Eventually(t, func() bool {
		var eps []struct {
			Addr     string
			Resident int `json:"resident_blocks"`
		}
		getJSON(t, "http://"+adminAddr+"/debug/endpoints", &eps)
		held := 0
		for _, e := range eps {
			if warm[e.Addr] && e.Resident > 0 {
				held++
			}
		}
		return held == len(warm)
	}, 10*time.Second, 50*time.Millisecond, "every replica that served the prefix reports it")
	for i := 0; i < 6; i++ {
		code, body := chat(fmt.Sprintf("follow-up %d", i), i%2 == 0)
		require.Equal(t, http.StatusOK, code, body)
	}
	for i, s := range sims {
		if !warm[s] {
			require.Zero(t, requests(t, s)-before[i], "prefix affinity: no same-prefix request goes to %s, which never held the prefix", s)
		}
	}
	require.Positive(t, metric(t, "http://"+metricsAddr+"/metrics", "omnious_epp_decisions_total"))

	// Responses API requests are routed on exact tokens too, streamed and
	// not, and the ones sharing long instructions stay together.
	precise := `omnious_extproc_prompt_mode_total{mode="precise"}`
	precise0 := metric(t, "http://"+metricsAddr+"/metrics", precise)
	before = served(t, sims, 8)
	for i := 0; i < 4; i++ {
		raw, err := json.Marshal(map[string]any{"model": model, "instructions": system, "input": fmt.Sprintf("responses question %d", i),
			"max_output_tokens": 6, "stream": i%2 == 1})
		require.NoError(t, err)
		resp, err := http.Post(base+"/v1/responses", "application/json", bytes.NewReader(raw))
		require.NoError(t, err)
		out, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode, string(out))
		// max_output_tokens cuts the answer: the response is incomplete.
		if i%2 == 1 {
			require.Contains(t, string(out), "event: response.incomplete")
		} else {
			require.Contains(t, string(out), `"object":"response"`)
		}
		require.Contains(t, string(out), `"input_tokens":`)
	}
	require.Equal(t, precise0+4, metric(t, "http://"+metricsAddr+"/metrics", precise))
	for i, s := range sims {
		if !warm[s] {
			require.Zero(t, requests(t, s)-before[i], "instructions rendered as the same system prompt: no Responses request goes to %s, which never held it", s)
		}
	}

	// A traced request: its span reaches the collector as a child of the
	// client's, sampled because the client's is (the EPP's own ratio is 0).
	const traceID, parentID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	req, err := http.NewRequest(http.MethodPost, base+"/v1/chat/completions",
		strings.NewReader(`{"model":"`+model+`","max_tokens":4,"messages":[{"role":"user","content":"traced"}]}`))
	require.NoError(t, err)
	req.Header.Set("traceparent", "00-"+traceID+"-"+parentID+"-01")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var span *tracepb.Span
	require.Eventually(t, func() bool { span = col.find(traceID); return span != nil }, 10*time.Second, 50*time.Millisecond)
	require.Equal(t, "epp.request", span.Name)
	require.Equal(t, parentID, hex.EncodeToString(span.ParentSpanId))
	attrs := map[string]*commonpb.AnyValue{}
	for _, kv := range span.Attributes {
		attrs[kv.Key] = kv.Value
	}
	primary, _, _ := strings.Cut(attrs["omnious.epp.destination"].GetStringValue(), ",")
	require.Contains(t, sims, primary)
	require.Equal(t, primary, attrs["omnious.epp.served"].GetStringValue())
	require.Equal(t, int64(200), attrs["http.response.status_code"].GetIntValue())
	require.Equal(t, model, attrs["gen_ai.request.model"].GetStringValue())
	require.Len(t, col.spans(), 1, "untraced requests are not sampled at ratio 0")

	// Bad input is refused by the EPP with an OpenAI error, not passed on.
	resp, err = http.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(`{"model": `))
	require.NoError(t, err)
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusBadRequest, resp.StatusCode, string(raw))
	var e openai.ErrorResponse
	require.NoError(t, json.Unmarshal(raw, &e), string(raw))
	require.NotEmpty(t, e.Error.Message)

	// After traffic and an error, the live exposition carries every name the
	// dashboards, alerts and KEDA use.
	resp, err = http.Get("http://" + metricsAddr + "/metrics")
	require.NoError(t, err)
	exposition, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	metricscheck.Check(t, exposition, "epp")

	// SIGTERM turns health NOT_SERVING at once, still serves new requests
	// for the drain delay (while health checks move traffic away), then
	// drains and exits cleanly.
	require.NoError(t, epp.Process.Signal(syscall.SIGTERM))
	hconn, err := grpc.NewClient(healthAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer hconn.Close()
	require.Eventually(t, func() bool {
		r, err := healthpb.NewHealthClient(hconn).Check(context.Background(), &healthpb.HealthCheckRequest{Service: "readiness"})
		return err == nil && r.GetStatus() == healthpb.HealthCheckResponse_NOT_SERVING
	}, 2*time.Second, 20*time.Millisecond, "health NOT_SERVING right after SIGTERM")
	status, _ := chat("served while draining", false)
	require.Equal(t, http.StatusOK, status, "a new request during the drain delay is still served")
	done := make(chan error, 1)
	go func() { done <- epp.Wait() }()
	select {
	case err := <-done:
		require.NoError(t, err, "epp exits 0 after a drain")
	case <-time.After(40 * time.Second):
		t.Fatal("epp did not stop after SIGTERM")
	}
}

// requests is a replica's finished-request count from its own metrics.
func requests(t *testing.T, addr string) float64 {
	return metric(t, "http://"+addr+"/metrics", "vllm:request_success_total") +
		metric(t, "http://"+addr+"/metrics", "sglang:num_requests_total")
}

// served waits until the replicas at addrs report total requests served
// between them (an engine counts a streamed request once its stream has
// ended, which can be after the client read [DONE]) and returns each one's
// count.
func served(t *testing.T, addrs []string, total float64) []float64 {
	t.Helper()
	counts := make([]float64, len(addrs))
	require.Eventually(t, func() bool {
		sum := 0.0
		for i, a := range addrs {
			counts[i] = requests(t, a)
			sum += counts[i]
		}
		return sum == total
	}, 10*time.Second, 20*time.Millisecond, "the replicas count %v requests served", total)
	return counts
}

// collector is an OTLP/gRPC trace collector on loopback that keeps every
// span it receives.
type collector struct {
	collectortracepb.UnimplementedTraceServiceServer
	addr string
	mu   sync.Mutex
	got  []*tracepb.Span
}

func startCollector(t *testing.T) *collector {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	c := &collector{addr: lis.Addr().String()}
	g := grpc.NewServer()
	collectortracepb.RegisterTraceServiceServer(g, c)
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)
	return c
}

func (c *collector) Export(_ context.Context, req *collectortracepb.ExportTraceServiceRequest) (*collectortracepb.ExportTraceServiceResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, rs := range req.ResourceSpans {
		for _, ss := range rs.ScopeSpans {
			c.got = append(c.got, ss.Spans...)
		}
	}
	return &collectortracepb.ExportTraceServiceResponse{}, nil
}

func (c *collector) spans() []*tracepb.Span {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]*tracepb.Span(nil), c.got...)
}

func (c *collector) find(traceID string) *tracepb.Span {
	for _, sp := range c.spans() {
		if hex.EncodeToString(sp.TraceId) == traceID {
			return sp
		}
	}
	return nil
}

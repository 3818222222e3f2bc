package testgw

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"

	"github.com/omnious/provider-node/endpoint"
	"github.com/omnious/provider-node/engines/sim"
	"github.com/omnious/provider-node/engines/sim/simtest"
	"github.com/omnious/provider-node/extproc"
	"github.com/omnious/provider-node/scheduler"
)

const simModel = "Qwen/Qwen3-32B"

// listPicker routes to a fixed endpoint list and records completions.
type listPicker struct {
	mu    sync.Mutex
	addrs []string
	err   error
	reqs  []scheduler.Request
	done  []scheduler.DoneInfo
}

func (*listPicker) Admit(context.Context, *scheduler.Request) (*scheduler.Ticket, error) {
	return nil, nil
}

func (p *listPicker) Pick(r *scheduler.Request, _ *scheduler.Ticket) (*scheduler.Decision, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	cp := *r
	cp.PromptText = nil
	// The server reuses the buffer and the prefix cache owns Prefix's
	// runs: keep a copy of every id, in one slice.
	cp.Tokens, cp.Prefix = nil, nil
	if r.HasTokens() {
		cp.Tokens = r.AppendTokens(make([]uint32, 0, r.TokenCount()))
	}
	p.reqs = append(p.reqs, cp)
	if p.err != nil {
		return nil, p.err
	}
	d := &scheduler.Decision{}
	for _, a := range p.addrs {
		d.Endpoints = append(d.Endpoints, &endpoint.Endpoint{Addr: a})
	}
	d.SetDone(func(i scheduler.DoneInfo) {
		p.mu.Lock()
		p.done = append(p.done, i)
		p.mu.Unlock()
	})
	return d, nil
}

func (p *listPicker) last(t *testing.T) (scheduler.Request, scheduler.DoneInfo) {
	t.Helper()
	var d scheduler.DoneInfo
	require.Eventually(t, func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		if len(p.done) == 0 {
			return false
		}
		d = p.done[len(p.done)-1]
		return true
	}, 5*time.Second, 5*time.Millisecond)
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.reqs[len(p.reqs)-1], d
}

// runGateway runs a gateway with cfg until the test ends.
func runGateway(t testing.TB, cfg Config) *Gateway {
	t.Helper()
	gw, err := New(cfg, zaptest.NewLogger(t))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- gw.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	return gw
}

// jsonUpstream is an engine stand-in on loopback that reads each request
// and answers it with body as JSON; it returns its ip:port.
func jsonUpstream(t testing.TB, body string) string {
	t.Helper()
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, body)
	}))
	t.Cleanup(upstream.Close)
	return upstream.Listener.Addr().String()
}

// startStack runs the EPP (with picker) and a gateway in front of it.
func startStack(t *testing.T, p extproc.Picker) *Gateway {
	t.Helper()
	return startStackConfig(t, extproc.Config{}, Config{}, p)
}

func post(t *testing.T, gw *Gateway, path, body string, hdr ...string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, "http://"+gw.Addr()+path, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var b strings.Builder
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		b.WriteString(sc.Text())
		b.WriteByte('\n')
	}
	require.NoError(t, sc.Err())
	return resp, []byte(b.String())
}

// sseEvents returns the decoded JSON events of an SSE body and whether it
// ended with [DONE].
func sseEvents(t *testing.T, body []byte) ([]map[string]any, bool) {
	t.Helper()
	var evs []map[string]any
	done := false
	for _, line := range strings.Split(string(body), "\n") {
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			continue
		}
		if data == "[DONE]" {
			done = true
			continue
		}
		var ev map[string]any
		require.NoError(t, json.Unmarshal([]byte(data), &ev), data)
		evs = append(evs, ev)
	}
	return evs, done
}

func TestEndToEndWithSimulator(t *testing.T) {
	r := simtest.Start(t, func(c *sim.Config) { c.Seed = 7 })
	p := &listPicker{addrs: []string{r.Addr()}}
	gw := startStack(t, p)
	chat := func(extra string) string {
		return `{"model":"` + simModel + `","max_tokens":8,` + extra + `"messages":[{"role":"user","content":"hello there, how are you?"}]}`
	}

	t.Run("non-streaming chat", func(t *testing.T) {
		resp, body := post(t, gw, "/v1/chat/completions", chat(""))
		require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
		var out struct {
			Model string `json:"model"`
			Usage struct {
				PromptTokens     int `json:"prompt_tokens"`
				CompletionTokens int `json:"completion_tokens"`
			} `json:"usage"`
		}
		require.NoError(t, json.Unmarshal(body, &out))
		req, d := p.last(t)
		require.Equal(t, simModel, out.Model)
		require.NoError(t, d.Err)
		require.Equal(t, 200, d.Status)
		require.Equal(t, r.Addr(), d.Served)
		require.Equal(t, out.Usage.PromptTokens, d.PromptTokens)
		require.Equal(t, out.Usage.CompletionTokens, d.CompletionTokens)
		require.Positive(t, d.PromptTokens)
		require.Len(t, req.Tokens, d.PromptTokens, "the stand-in prompter predicts the simulator's prompt exactly")
	})

	t.Run("streaming without usage: injected for accounting, hidden from the client", func(t *testing.T) {
		resp, body := post(t, gw, "/v1/chat/completions", chat(`"stream":true,`))
		require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
		require.Contains(t, resp.Header.Get("Content-Type"), "text/event-stream")
		evs, done := sseEvents(t, body)
		require.True(t, done)
		require.NotEmpty(t, evs)
		for _, ev := range evs {
			require.NotContains(t, ev, "usage", "the client did not ask for usage")
		}
		_, d := p.last(t)
		require.NoError(t, d.Err)
		require.Positive(t, d.PromptTokens)
		require.Positive(t, d.CompletionTokens)
		require.Positive(t, d.FirstByte)
	})

	t.Run("streaming with usage asked: forwarded", func(t *testing.T) {
		resp, body := post(t, gw, "/v1/chat/completions", chat(`"stream":true,"stream_options":{"include_usage":true},`))
		require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
		evs, done := sseEvents(t, body)
		require.True(t, done)
		u, ok := evs[len(evs)-1]["usage"].(map[string]any)
		require.True(t, ok, "the last event carries usage")
		_, d := p.last(t)
		require.Equal(t, float64(d.PromptTokens), u["prompt_tokens"])
	})

	t.Run("model rewrite is invisible to the client", func(t *testing.T) {
		body := strings.Replace(chat(`"stream":true,`), simModel, "my-alias", 1)
		resp, out := post(t, gw, "/v1/chat/completions", body, extproc.HeaderModelRewrite, simModel)
		require.Equal(t, http.StatusOK, resp.StatusCode, string(out))
		evs, _ := sseEvents(t, out)
		require.NotEmpty(t, evs)
		for _, ev := range evs {
			require.Equal(t, "my-alias", ev["model"])
		}
		req, _ := p.last(t)
		require.Equal(t, simModel, req.Model)
	})

	t.Run("completions", func(t *testing.T) {
		resp, body := post(t, gw, "/v1/completions", `{"model":"`+simModel+`","prompt":"once upon a time","max_tokens":4}`)
		require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
		req, d := p.last(t)
		require.Len(t, req.Tokens, d.PromptTokens)
	})

	t.Run("GET /v1/models", func(t *testing.T) {
		resp, err := http.Get("http://" + gw.Addr() + "/v1/models")
		require.NoError(t, err)
		defer resp.Body.Close()
		var out struct {
			Data []struct {
				ID string `json:"id"`
			} `json:"data"`
		}
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
		require.Equal(t, simModel, out.Data[0].ID)
	})

	t.Run("bad request answered by the EPP", func(t *testing.T) {
		resp, body := post(t, gw, "/v1/chat/completions", `{"messages":[]}`)
		require.Equal(t, http.StatusBadRequest, resp.StatusCode)
		require.Equal(t, "bad_request", resp.Header.Get(extproc.HeaderReason))
		var e struct {
			Error struct {
				Message string `json:"message"`
				Code    int    `json:"code"`
			} `json:"error"`
		}
		require.NoError(t, json.Unmarshal(body, &e))
		require.Equal(t, 400, e.Error.Code)
		require.Equal(t, "the request has no model", e.Error.Message)
	})
}

func TestFallbacks(t *testing.T) {
	r := simtest.Start(t, func(c *sim.Config) { c.Seed = 7 })
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	deadAddr := dead.Addr().String()
	require.NoError(t, dead.Close()) // connections to it are refused
	failing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, `{"error":{"message":"boom","code":500}}`, http.StatusInternalServerError)
	}))
	defer failing.Close()
	failingAddr := strings.TrimPrefix(failing.URL, "http://")
	body := `{"model":"` + simModel + `","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`

	tests := []struct {
		name       string
		addrs      []string
		wantStatus int
		wantServed string
	}{
		{"connect failure falls back", []string{deadAddr, r.Addr()}, 200, r.Addr()},
		{"5xx falls back", []string{failingAddr, r.Addr()}, 200, r.Addr()},
		{"last endpoint's 5xx reaches the client", []string{deadAddr, failingAddr}, 500, failingAddr},
		{"no endpoint reachable", []string{deadAddr}, 503, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := &listPicker{addrs: tc.addrs}
			gw := startStack(t, p)
			resp, out := post(t, gw, "/v1/chat/completions", body)
			require.Equal(t, tc.wantStatus, resp.StatusCode, string(out))
			_, d := p.last(t)
			require.Equal(t, tc.wantStatus, d.Status)
			require.Equal(t, tc.wantServed, d.Served)
		})
	}
}

func TestSchedulerErrorsReachTheClient(t *testing.T) {
	p := &listPicker{err: scheduler.ErrQueueFull}
	gw := startStack(t, p)
	resp, body := post(t, gw, "/v1/chat/completions", `{"model":"m","messages":[]}`, HeaderSubsetHint, "127.0.0.1:1")
	require.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	require.Equal(t, "queue_full", resp.Header.Get(extproc.HeaderReason))
	require.Contains(t, string(body), scheduler.ErrQueueFull.Msg)
	p.mu.Lock()
	defer p.mu.Unlock()
	require.Equal(t, []string{"127.0.0.1:1"}, p.reqs[0].Subset)
}

func TestNonLoopbackRefused(t *testing.T) {
	_, err := New(Config{Listen: "0.0.0.0:0", EPP: "127.0.0.1:9002"}, zap.NewNop())
	require.ErrorContains(t, err, "not a loopback address")
	_, err = New(Config{EPP: "10.1.2.3:9002"}, zap.NewNop())
	require.ErrorContains(t, err, "not a loopback address")
}

// TestUpstreamBreaksMidResponse: an endpoint that dies after sending part of
// its response leaves the client with a truncated body, not a clean end,
// and the EPP hears the request failed (no retry once bytes were sent).
func TestUpstreamBreaksMidResponse(t *testing.T) {
	dying := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = w.Write([]byte("data: {\"choices\":[]}\n\n"))
		w.(http.Flusher).Flush()
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			_ = conn.Close() // mid-body, as an engine that crashed
		}
	}))
	defer dying.Close()
	p := &listPicker{addrs: []string{strings.TrimPrefix(dying.URL, "http://")}}
	gw := startStack(t, p)
	req, err := http.NewRequest(http.MethodPost, "http://"+gw.Addr()+"/v1/chat/completions",
		strings.NewReader(`{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`))
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	_, err = io.ReadAll(resp.Body)
	require.Error(t, err, "the client must see the break, not a clean end")
	_, d := p.last(t)
	require.Error(t, d.Err)
}

// TestFloor: the no-op ext_proc server routes to its destinations in turn
// and passes both bodies through unchanged, here with the upstream answered
// in process (Config.Upstream), as the load bench runs it.
func TestFloor(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	g := grpc.NewServer(extproc.Config{}.WithDefaults().ServerOptions()...)
	extprocv3.RegisterExternalProcessorServer(g, &Floor{Dests: []string{"127.0.0.1:1", "127.0.0.1:2"}})
	go func() { _ = g.Serve(lis) }()
	defer g.Stop()

	var mu sync.Mutex
	var seen []string
	up := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			return nil, err
		}
		mu.Lock()
		seen = append(seen, r.URL.Host+" "+string(body)+" "+r.Header.Get("Content-Length"))
		mu.Unlock()
		return &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"application/json"}},
			Body: io.NopCloser(strings.NewReader(`{"echo":` + string(body) + `}`))}, nil
	})
	timings := make(chan Timing, 2)
	gw := runGateway(t, Config{EPP: lis.Addr().String(), Upstream: up, OnExchange: func(tm Timing) { timings <- tm }})

	var hosts []string
	for i := range 2 {
		body := `{"n":` + strconv.Itoa(i) + `}`
		req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(body))
		rec := httptest.NewRecorder()
		gw.ServeHTTP(rec, req)
		require.Equal(t, http.StatusOK, rec.Code)
		require.Equal(t, `{"echo":`+body+`}`, rec.Body.String())
		tm := <-timings
		require.Equal(t, http.StatusOK, tm.Status)
		require.Positive(t, tm.Request)
		require.Positive(t, tm.Response)
		mu.Lock()
		host, rest, _ := strings.Cut(seen[i], " ")
		mu.Unlock()
		require.Equal(t, body+" ", rest, "the body and no Content-Length header reach the upstream as sent")
		hosts = append(hosts, host)
	}
	require.ElementsMatch(t, []string{"127.0.0.1:1", "127.0.0.1:2"}, hosts, "destinations in turn")

	rec := httptest.NewRecorder()
	gw.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/v1/models", nil))
	require.Equal(t, http.StatusOK, rec.Code, "a request without a body is routed at its headers")
	require.Equal(t, http.StatusOK, (<-timings).Status)
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// TestTagReportedNotForwarded: HeaderTag comes back in the exchange's
// Timing and never reaches the endpoint.
func TestTagReportedNotForwarded(t *testing.T) {
	seen := make(chan http.Header, 1)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen <- r.Header.Clone()
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{}`))
	}))
	defer up.Close()
	timings := make(chan Timing, 1)
	p := &listPicker{addrs: []string{strings.TrimPrefix(up.URL, "http://")}}
	gw := startStackConfig(t, extproc.Config{}, Config{OnExchange: func(tm Timing) { timings <- tm }}, p)
	resp, body := post(t, gw, "/v1/chat/completions", `{"model":"m","messages":[]}`, HeaderTag, "group-7")
	require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
	require.Equal(t, "group-7", (<-timings).Tag)
	require.Empty(t, (<-seen).Get(HeaderTag))
}

// TestSingleDestination: one destination is tried three times on a 503,
// as the shipped Envoy route retries it (num_retries 2, ORIGINAL_DST
// re-reading the same header), and the body goes chunked, as Envoy
// forwards a FULL_DUPLEX_STREAMED body.
func TestSingleDestination(t *testing.T) {
	tests := []struct {
		name     string
		fail     int
		wantCode int
		attempts int
	}{
		{"served at once", 0, http.StatusOK, 1},
		{"two 503 then served", 2, http.StatusOK, 3},
		{"503 past the retries", 5, http.StatusServiceUnavailable, 3},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			require.NoError(t, err)
			g := grpc.NewServer(extproc.Config{}.WithDefaults().ServerOptions()...)
			extprocv3.RegisterExternalProcessorServer(g, &Floor{Dests: []string{"127.0.0.1:1"}})
			go func() { _ = g.Serve(lis) }()
			defer g.Stop()
			var mu sync.Mutex
			attempts := 0
			up := roundTripFunc(func(r *http.Request) (*http.Response, error) {
				_, _ = io.Copy(io.Discard, r.Body)
				mu.Lock()
				defer mu.Unlock()
				attempts++
				require.Equal(t, "127.0.0.1:1", r.URL.Host)
				require.EqualValues(t, -1, r.ContentLength, "the body goes chunked")
				if attempts <= tc.fail {
					return &http.Response{StatusCode: http.StatusServiceUnavailable, Header: http.Header{}, Body: io.NopCloser(strings.NewReader("busy"))}, nil
				}
				return &http.Response{StatusCode: http.StatusOK, Header: http.Header{"Content-Type": {"application/json"}},
					Body: io.NopCloser(strings.NewReader(`{}`))}, nil
			})
			gw := runGateway(t, Config{EPP: lis.Addr().String(), Upstream: up})
			rec := httptest.NewRecorder()
			gw.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(`{"n":1}`)))
			require.Equal(t, tc.wantCode, rec.Code)
			mu.Lock()
			defer mu.Unlock()
			require.Equal(t, tc.attempts, attempts)
		})
	}
}

package testgw

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"

	"github.com/omnious/provider-node/engines/openai"
	"github.com/omnious/provider-node/extproc"
)

// startStackConfig is startStack with an ext_proc and a gateway config.
func startStackConfig(t *testing.T, cfg extproc.Config, gcfg Config, p extproc.Picker) *Gateway {
	t.Helper()
	if cfg.MaxEndpoints == nil {
		cfg.MaxEndpoints = new(0) // every endpoint: the gateway walks the list
	}
	cfg = cfg.WithDefaults()
	require.NoError(t, cfg.Validate())
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	g := grpc.NewServer(cfg.ServerOptions()...)
	extproc.NewServer(cfg, p, extproc.NewStandInPrompter(), prometheus.NewRegistry(), zaptest.NewLogger(t)).Register(g)
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop) // after the gateway has stopped
	gcfg.EPP = lis.Addr().String()
	return runGateway(t, gcfg)
}

// TestBodyLimitThroughGateway: a body over max_body_bytes reaches the
// client as 413 with an OpenAI error body, whether its size is announced
// (Content-Length) or only found while streaming (chunked); a body under
// the limit goes upstream.
func TestBodyLimitThroughGateway(t *testing.T) {
	const limit = 100 << 10
	p := &listPicker{addrs: []string{jsonUpstream(t, `{"id":"x","object":"chat.completion","model":"m","choices":[]}`)}}
	timings := make(chan Timing, 1)
	gw := startStackConfig(t, extproc.Config{MaxBodyBytes: limit}, Config{OnExchange: func(tm Timing) { timings <- tm }}, p)
	body := func(n int) string {
		return `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("w ", n/2) + `"}]}`
	}
	cases := []struct {
		name       string
		body       string
		chunked    bool
		wantStatus int
		wantMsg    string
	}{
		{"announced size over the limit", body(limit + 10), false, http.StatusRequestEntityTooLarge, "exceeds the limit of 102400 bytes"},
		{"chunked body over the limit", body(3 * limit), true, http.StatusRequestEntityTooLarge, "request body exceeds the limit of 102400 bytes"},
		{"200 KB prompt over the limit", body(200 << 10), false, http.StatusRequestEntityTooLarge, "exceeds the limit of 102400 bytes"},
		{"under the limit goes upstream", body(limit - 1024), false, http.StatusOK, ""},
		{"chunked under the limit goes upstream", body(limit - 1024), true, http.StatusOK, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var rd io.Reader = strings.NewReader(tc.body)
			if tc.chunked {
				rd = io.MultiReader(rd) // hides the length: Transfer-Encoding: chunked
			}
			req, err := http.NewRequest(http.MethodPost, "http://"+gw.Addr()+"/v1/chat/completions", rd)
			require.NoError(t, err)
			req.Header.Set("Content-Type", "application/json")
			resp, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			defer resp.Body.Close()
			got, err := io.ReadAll(resp.Body)
			require.NoError(t, err)
			require.Equal(t, tc.wantStatus, resp.StatusCode, string(got))
			tm := <-timings // the added latency the gateway saw
			require.Equal(t, tc.wantStatus, tm.Status)
			require.Positive(t, tm.Request)
			if tc.wantStatus == http.StatusOK {
				require.Positive(t, tm.Response, "the response went through the EPP")
				return
			}
			require.Zero(t, tm.Response, "an immediate response has no response phase")
			require.Equal(t, "application/json", resp.Header.Get("Content-Type"))
			require.Equal(t, "body_too_large", resp.Header.Get(extproc.HeaderReason))
			var e openai.ErrorResponse
			require.NoError(t, json.Unmarshal(got, &e), string(got))
			require.Equal(t, http.StatusRequestEntityTooLarge, e.Error.Code)
			require.Equal(t, "RequestEntityTooLarge", e.Error.Type)
			require.Contains(t, e.Error.Message, tc.wantMsg)
		})
	}
}

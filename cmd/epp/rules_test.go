package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omnious/provider-node/engines/sim"
	"github.com/omnious/provider-node/engines/sim/simtest"
)

// TestEPPModelRules runs cmd/epp with model rules in its endpoint file in
// front of two engine simulators serving different models, through the
// test gateway: an alias and a rewrite reach the engine under the served
// name and come back under the client's, and once an edit of the file
// takes the model's only endpoint away its requests go to its fallback,
// which the response says.
func TestEPPModelRules(t *testing.T) {
	dir := t.TempDir()
	eppBin := buildEPP(t, dir)
	big := simtest.Start(t, func(c *sim.Config) { c.Model = "llama-3.3-70b" })
	small := simtest.Start(t, func(c *sim.Config) { c.Model = "qwen2.5-32b" })
	endpoint := func(r *sim.Replica, model string) string {
		host, port, _ := strings.Cut(r.Addr(), ":")
		return fmt.Sprintf("  - {ip: %s, port: %s, model: %s}\n", host, port, model)
	}
	rulesSection := `objectives:
  - {name: batch, priority: 100}
rewrites:
  - name: retire-old
    rules:
      - matches: [{model: {value: llama-2-70b}}]
        targets: [{modelRewrite: qwen2.5-32b}]
models:
  - name: llama-3.3-70b
    aliases: [llama]
    fallbacks: [qwen]
  - {name: qwen2.5-32b, aliases: [qwen]}
`
	path := filepath.Join(dir, "endpoints.yaml")
	write := func(content string) {
		tmp := path + ".tmp"
		require.NoError(t, os.WriteFile(tmp, []byte(content), 0o600))
		require.NoError(t, os.Rename(tmp, path))
	}
	write("endpoints:\n" + endpoint(big, "llama-3.3-70b") + endpoint(small, "qwen2.5-32b") + rulesSection)

	grpcAddr := fmt.Sprintf("127.0.0.1:%d", simtest.FreePort(t))
	metricsAddr := fmt.Sprintf("127.0.0.1:%d", simtest.FreePort(t))
	start(t, eppBin, "-endpoints-file", path, "-standin-tokenizer", "-log-level", "warn",
		"-grpc-addr", grpcAddr, "-health-addr", fmt.Sprintf("127.0.0.1:%d", simtest.FreePort(t)),
		"-metrics-addr", metricsAddr, "-admin-addr", fmt.Sprintf("127.0.0.1:%d", simtest.FreePort(t)))
	simtest.WaitOK(t, "http://"+metricsAddr+"/metrics")
	base := startGateway(t, grpcAddr)

	type answer struct {
		status          int
		model, reason   string
		servedBy        string
		body            string
		bigDone, smDone float64
	}
	served := func() (float64, float64) {
		return requests(t, big.Addr()), requests(t, small.Addr())
	}
	chat := func(model string, header ...string) answer {
		b0, s0 := served()
		req, err := http.NewRequest(http.MethodPost, base+"/v1/chat/completions",
			strings.NewReader(`{"model":"`+model+`","max_tokens":4,"messages":[{"role":"user","content":"hello"}]}`))
		require.NoError(t, err)
		req.Header.Set("content-type", "application/json")
		for i := 0; i+1 < len(header); i += 2 {
			req.Header.Set(header[i], header[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		raw, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		a := answer{status: resp.StatusCode, reason: resp.Header.Get("x-omnious-epp-reason"), body: string(raw)}
		var out struct {
			Model string `json:"model"`
		}
		if json.Unmarshal(raw, &out) == nil {
			a.model = out.Model
		}
		// The engines count a request once it has finished.
		for deadline := time.Now().Add(5 * time.Second); a.bigDone+a.smDone != 1 && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			b1, s1 := served()
			a.bigDone, a.smDone = b1-b0, s1-s0
		}
		require.Equal(t, 1.0, a.bigDone+a.smDone, "one engine served it")
		if a.bigDone == 1 {
			a.servedBy = "big"
		} else {
			a.servedBy = "small"
		}
		return a
	}

	a := chat("llama", "x-gateway-inference-objective", "batch")
	require.Equal(t, http.StatusOK, a.status, a.body)
	require.Equal(t, "big", a.servedBy)
	require.Equal(t, "llama", a.model, "an alias is mapped back")
	require.Empty(t, a.reason)

	a = chat("llama-2-70b")
	require.Equal(t, http.StatusOK, a.status, a.body)
	require.Equal(t, "small", a.servedBy, "the rewrite's target serves")
	require.Equal(t, "llama-2-70b", a.model, "a rewrite is mapped back")

	// The model's only endpoint leaves the file: its fallback answers.
	write("endpoints:\n" + endpoint(small, "qwen2.5-32b") + rulesSection)
	var fb answer
	for deadline := time.Now().Add(10 * time.Second); fb.reason == "" && time.Now().Before(deadline); {
		fb = chat("llama") // served by the old set until the reload reaches the EPP
	}
	require.Equal(t, http.StatusOK, fb.status, fb.body)
	require.Equal(t, "small", fb.servedBy)
	require.Equal(t, "fallback_no_endpoint", fb.reason)
	require.Equal(t, "qwen2.5-32b", fb.model, "a fallback's response names the model that answered")
	require.Positive(t, series(t, "http://"+metricsAddr+"/metrics",
		`omnious_extproc_model_fallbacks_total{model_name="llama-3.3-70b",reason="no_endpoint",target_model_name="qwen2.5-32b"}`))
	require.Equal(t, 1.0, series(t, "http://"+metricsAddr+"/metrics",
		`inference_extension_model_rewrite_decisions_total{model_name="llama-2-70b",model_rewrite_name="retire-old",target_model="qwen2.5-32b"}`))
}

package envoy

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/omnious/provider-node/discovery"
	"github.com/omnious/provider-node/engines/sim"
	"github.com/omnious/provider-node/engines/sim/simtest"
	"github.com/omnious/provider-node/epp"
	"github.com/omnious/provider-node/extproc"
	"github.com/omnious/provider-node/extproc/testgw"
	"github.com/omnious/provider-node/internal/testutil/certtest"
	"github.com/omnious/provider-node/internal/testutil/freeport"
	"github.com/omnious/provider-node/internal/testutil/pyenv"
)

const testModel = "Qwen/Qwen3-32B"

// replace replaces old in s exactly once, failing t when it is not there.
func replace(t *testing.T, s, old, new string) string {
	t.Helper()
	require.Equal(t, 1, strings.Count(s, old), "envoy.yaml no longer holds %q", old)
	return strings.Replace(s, old, new, 1)
}

// shipped is envoy.yaml on free loopback ports, its ext_proc cluster at
// the EPP's gRPC and health addresses. routeBand, when set, turns on the
// commented route example with that band (and tenant acme).
func shipped(t *testing.T, grpcAddr, healthAddr, routeBand string) (cfg string, listen string) {
	t.Helper()
	raw, err := os.ReadFile("envoy.yaml")
	require.NoError(t, err)
	s := string(raw)
	ports, err := freeport.Take(2)
	require.NoError(t, err)
	_, grpcPort, _ := net.SplitHostPort(grpcAddr)
	_, healthPort, _ := net.SplitHostPort(healthAddr)
	s = replace(t, s, "address: 0.0.0.0, port_value: 8080 }", fmt.Sprintf("address: 127.0.0.1, port_value: %d }", ports[0]))
	s = replace(t, s, "address: 127.0.0.1, port_value: 9901 }", fmt.Sprintf("address: 127.0.0.1, port_value: %d }", ports[1]))
	s = replace(t, s, "address: 127.0.0.1, port_value: 9002 }", "address: 127.0.0.1, port_value: "+grpcPort+" }")
	s = replace(t, s, "health_check_config:\n              port_value: 9003\n", "health_check_config:\n              port_value: "+healthPort+"\n")
	if routeBand != "" {
		var out []string
		on := false
		for _, l := range strings.Split(s, "\n") {
			if strings.HasPrefix(l, "                # typed_per_filter_config:") {
				on = true
			}
			if on && !strings.HasPrefix(l, "                #") {
				on = false
			}
			if on {
				l = strings.Replace(l, "# ", "", 1)
			}
			out = append(out, l)
		}
		s = strings.Join(out, "\n")
		s = replace(t, s, "key: x-gateway-inference-objective, value: gold }", "key: x-gateway-inference-objective, value: "+routeBand+" }")
	}
	return s, fmt.Sprintf("127.0.0.1:%d", ports[0])
}

// runEnvoy runs the pinned Envoy with cfg until t ends (stopped by its
// PID), and waits until its listener at listen accepts.
func runEnvoy(t *testing.T, cfg, listen string) {
	t.Helper()
	bin := pyenv.MustEnvoy(t)
	dir := t.TempDir()
	path := filepath.Join(dir, "envoy.yaml")
	require.NoError(t, os.WriteFile(path, []byte(cfg), 0o600))
	log, err := os.Create(filepath.Join(dir, "envoy.log"))
	require.NoError(t, err)
	cmd := exec.Command(bin, "-c", path, "--use-dynamic-base-id", "--log-level", "warn", "--concurrency", "1")
	cmd.Stdout, cmd.Stderr = log, log
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		_ = log.Close()
		if t.Failed() {
			b, _ := os.ReadFile(log.Name())
			t.Logf("envoy log:\n%s", b)
		}
	})
	require.Eventually(t, func() bool {
		c, err := net.DialTimeout("tcp", listen, 100*time.Millisecond)
		if err == nil {
			c.Close()
		}
		return err == nil
	}, 20*time.Second, 50*time.Millisecond, "envoy listens")
}

// bands: bronze admits nothing while a request is in flight (its ceiling is
// below that saturation, and it queues nothing), so a request's band shows
// in its status.
const bands = `scheduler:
  admission:
    queue_capacity_per_band: 0
    bands:
    - {name: platinum, priority: 400, saturation_ceiling: 1}
    - {name: gold, priority: 300, saturation_ceiling: 1}
    - {name: silver, priority: 200, saturation_ceiling: 1}
    - {name: bronze, priority: 100, saturation_ceiling: 0.001}
`

// startEPP runs one simulated engine and an EPP (extra: YAML added to its
// config) on loopback until t ends.
func startEPP(t *testing.T, extra string) (*epp.EPP, string) {
	t.Helper()
	r := simtest.Start(t, func(c *sim.Config) { c.Engine.TimeScale = 1000 })
	cfg, err := epp.Parse([]byte("grpc_addr: 127.0.0.1:0\nhealth_addr: 127.0.0.1:0\nmetrics_addr: 127.0.0.1:0\nadmin_addr: 127.0.0.1:0\n" +
		"standin_tokenizer: true\ndrain_delay: 0s\ndrain_timeout: 0s\n" + extra))
	require.NoError(t, err)
	e, err := epp.New(cfg, discovery.Fixed{{Addr: r.Addr(), Model: testModel, Engine: "vllm"}}, zap.NewNop())
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })
	return e, "http://" + r.Addr()
}

// holdOne keeps one request in flight on the EPP for two seconds (through
// the test gateway, tenant "holder"), so the pool's saturation is above 0.
func holdOne(t *testing.T, e *epp.EPP, engine string) {
	t.Helper()
	holder := map[string]string{"x-gateway-inference-fairness-id": "holder"}
	gw, err := testgw.New(testgw.Config{EPP: e.GRPCAddr(), GatewayMetadata: holder}, zap.NewNop())
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- gw.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	simtest.SetFaults(t, engine, `{"stall_after_tokens": 1, "stall_for": "2s"}`)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+gw.Addr()+"/v1/chat/completions",
		strings.NewReader(`{"model":"`+testModel+`","max_tokens":50,"stream":true,"messages":[{"role":"user","content":"hold"}]}`))
	require.NoError(t, err)
	req.Header.Set("x-gateway-inference-fairness-id", "holder")
	go func() {
		if resp, err := http.DefaultClient.Do(req); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}()
	require.Eventually(t, func() bool { return metric(t, e, "inference_objective_running_requests") == 1 }, 5*time.Second, 5*time.Millisecond)
	simtest.SetFaults(t, engine, `{}`)
}

// metric sums the EPP's series whose line starts with prefix.
func metric(t *testing.T, e *epp.EPP, prefix string) float64 {
	resp, err := http.Get("http://" + e.MetricsAddr() + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	sum := 0.0
	for l := range strings.Lines(string(b)) {
		if strings.HasPrefix(l, prefix) {
			v, err := strconv.ParseFloat(strings.TrimSpace(l[strings.LastIndexByte(l, ' '):]), 64)
			require.NoError(t, err)
			sum += v
		}
	}
	return sum
}

// tenants are the tenants the EPP counted prompt tokens under.
func tenants(t *testing.T, e *epp.EPP) []string {
	var out []string
	for _, tenant := range []string{"acme", "victim", "default-flow", "omnious-calibration"} {
		if metric(t, e, fmt.Sprintf(`omnious_epp_tenant_tokens_total{kind="prompt",tenant=%q}`, tenant)) > 0 {
			out = append(out, tenant)
		}
	}
	return out
}

// chat sends one completion to url with headers and returns its status.
func chat(t *testing.T, client *http.Client, url string, headers map[string]string) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url+"/v1/chat/completions",
		strings.NewReader(`{"model":"`+testModel+`","max_tokens":3,"messages":[{"role":"user","content":"hello there"}]}`))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := client.Do(req)
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// TestShippedConfigStripsClientHeaders: through the real Envoy running
// envoy.yaml, a client's band, tenant, session and calibration headers
// change neither the admitted band nor the tenant its tokens count under,
// with the EPP's extproc.gateway_headers on or off; the route's band and
// tenant (the commented example turned on) do, and the calibration Job's
// secret passes.
func TestShippedConfigStripsClientHeaders(t *testing.T) {
	secret := filepath.Join(t.TempDir(), "calibration-token")
	require.NoError(t, os.WriteFile(secret, []byte("calibration-secret\n"), 0o600))
	forged := map[string]string{
		"x-gateway-inference-objective":   "bronze",
		"x-gateway-inference-fairness-id": "victim",
		"x-session-id":                    "someone-elses-session",
		extproc.HeaderCalibration:         "1",
	}
	for _, tt := range []struct {
		name      string
		option    bool
		routeBand string
		headers   map[string]string
		status    int
		tenants   []string
	}{
		{"option off, forged headers", false, "", forged, 200, []string{"default-flow"}},
		{"option on, forged headers", true, "", forged, 200, []string{"default-flow"}},
		{"option off, the route's band and tenant", false, "bronze", nil, 429, nil},
		{"option on, the route's band over a forged one", true, "bronze", map[string]string{"x-gateway-inference-objective": "platinum"}, 429, nil},
		{"option on, the route's tenant over a forged one", true, "silver", forged, 200, []string{"acme"}},
		{"option off, the route's tenant over a forged one", false, "silver", forged, 200, []string{"acme"}},
		{"the calibration Job's secret passes", true, "silver", map[string]string{"x-omnious-calibration-token": "calibration-secret"}, 200, []string{"omnious-calibration"}},
		{"a guessed secret does not", true, "silver", map[string]string{"x-omnious-calibration-token": "guess", extproc.HeaderCalibration: "1"}, 200, []string{"acme"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel() // each case waits for its held request
			extra := bands + "extproc:\n  calibration_token_file: " + secret + "\n"
			if tt.option {
				extra += "  gateway_headers: true\n"
			}
			e, engine := startEPP(t, extra)
			cfg, listen := shipped(t, e.GRPCAddr(), e.HealthAddr(), tt.routeBand)
			runEnvoy(t, cfg, listen)
			holdOne(t, e, engine)
			require.Equal(t, tt.status, chat(t, http.DefaultClient, "http://"+listen, tt.headers))
			if tt.tenants == nil {
				time.Sleep(300 * time.Millisecond) // what a routed request would have counted by now
				require.Empty(t, tenants(t, e))
				return
			}
			require.Eventually(t, func() bool { return len(tenants(t, e)) > 0 }, 5*time.Second, 10*time.Millisecond)
			require.Equal(t, tt.tenants, tenants(t, e))
		})
	}
}

// extprocTLS is the TLS the chart's extprocTLS option gives the ext_proc
// cluster: Envoy verifies the EPP's certificate against the CA, by name,
// and health-checks it on its (TLS) ext_proc port.
func extprocTLS(t *testing.T, cfg, grpcPort, healthPort, caFile, name string) string {
	t.Helper()
	cfg = replace(t, cfg, "health_check_config:\n              port_value: "+healthPort+"\n", "health_check_config:\n              port_value: "+grpcPort+"\n")
	return replace(t, cfg, "  - name: epp\n    type: STATIC\n", fmt.Sprintf(`  - name: epp
    type: STATIC
    transport_socket:
      name: envoy.transport_sockets.tls
      typed_config:
        "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext
        sni: %[2]s
        common_tls_context:
          alpn_protocols: [h2]
          validation_context:
            trusted_ca: { filename: %[1]s }
            match_typed_subject_alt_names:
            - san_type: DNS
              matcher: { exact: %[2]s }
`, caFile, name))
}

// TestExtProcTLS: Envoy reaches the EPP over TLS and routes requests; with
// a CA that did not sign the EPP's certificate, nothing is routed.
func TestExtProcTLS(t *testing.T) {
	ca, other := certtest.NewCA(t, "extproc"), certtest.NewCA(t, "other")
	cert, key := ca.Issue(t, "epp", "epp.local")
	for _, tt := range []struct {
		name   string
		ca     string
		status int
	}{
		{"the EPP's CA", ca.CertFile, 200},
		{"another CA", other.CertFile, 500},
	} {
		t.Run(tt.name, func(t *testing.T) {
			e, _ := startEPP(t, fmt.Sprintf("tls_cert_file: %s\ntls_key_file: %s\n", cert, key))
			cfg, listen := shipped(t, e.GRPCAddr(), e.HealthAddr(), "")
			_, grpcPort, _ := net.SplitHostPort(e.GRPCAddr())
			_, healthPort, _ := net.SplitHostPort(e.HealthAddr())
			runEnvoy(t, extprocTLS(t, cfg, grpcPort, healthPort, tt.ca, "epp.local"), listen)
			if tt.status == 200 {
				// Routed once the health check over TLS passed.
				require.Eventually(t, func() bool { return chat(t, http.DefaultClient, "http://"+listen, nil) == 200 }, 10*time.Second, 50*time.Millisecond)
				require.Equal(t, 1.0, metric(t, e, "inference_objective_request_total"), "the EPP routed it")
				return
			}
			for range 10 {
				require.NotEqual(t, 200, chat(t, http.DefaultClient, "http://"+listen, nil))
				time.Sleep(200 * time.Millisecond)
			}
			require.Zero(t, metric(t, e, "inference_objective_request_total"))
		})
	}
}

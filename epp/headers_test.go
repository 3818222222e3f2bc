package epp

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/omnious/provider-node/discovery"
	"github.com/omnious/provider-node/endpoint"
	"github.com/omnious/provider-node/engines/sim"
	"github.com/omnious/provider-node/engines/sim/simtest"
	"github.com/omnious/provider-node/extproc"
	"github.com/omnious/provider-node/extproc/testgw"
)

// gatewayFleet runs one simulated engine and an EPP with extra config,
// holds one request in flight on it (through a gateway without route
// metadata), so the pool's saturation is above zero, and returns the URL
// of a test gateway writing route into the gateway metadata, and the EPP.
func gatewayFleet(t *testing.T, extra string, route map[string]string) (string, *EPP) {
	t.Helper()
	r := simtest.Start(t, func(c *sim.Config) { c.Engine.TimeScale = 1000 })
	eps := []endpoint.Endpoint{{Addr: r.Addr(), Model: testModel, Engine: "vllm"}}
	e, err := New(testConfig(t, "drain_delay: 0s\ndrain_timeout: 0s\n"+extra), discovery.Fixed(eps), zap.NewNop())
	require.NoError(t, err)
	run(t, e)
	gateway := func(md map[string]string) string {
		gw, err := testgw.New(testgw.Config{EPP: e.GRPCAddr(), GatewayMetadata: md}, zap.NewNop())
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- gw.Run(ctx) }()
		t.Cleanup(func() { cancel(); <-done })
		return "http://" + gw.Addr()
	}
	// Its tokens count under a tenant of its own, in either mode. Under
	// make test's load one held request was not seen in flight within 5 s
	// (refused before the EPP had a healthy replica, or through its 2 s
	// stall before a poll saw it), so it is sent again until one is; a
	// second one held does no harm: any in flight refuses bronze.
	holder := map[string]string{"x-gateway-inference-fairness-id": "holder"}
	holdURL := gateway(holder)
	inFlight := func() bool { return metricSum(t, e.MetricsAddr(), "inference_objective_running_requests") >= 1 }
	for deadline := time.Now().Add(30 * time.Second); ; {
		simtest.Hold(t, http.DefaultClient, "http://"+r.Addr(), holdURL, testModel, holder)
		if waitFor(inFlight, 3*time.Second) {
			break
		}
		require.True(t, time.Now().Before(deadline), "a request in flight")
	}
	return gateway(route), e
}

// waitFor polls cond every 5 ms until it holds or d has passed.
func waitFor(cond func() bool, d time.Duration) bool {
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		if cond() {
			return true
		}
	}
	return false
}

// chat sends one completion through the gateway with headers and returns
// its status.
func chat(t *testing.T, url string, headers map[string]string) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url+"/v1/chat/completions",
		strings.NewReader(`{"model":"`+testModel+`","max_tokens":3,"messages":[{"role":"user","content":"hello there"}]}`))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// tenants is the tenants the EPP counted prompt tokens under.
func tenants(t *testing.T, e *EPP) []string {
	var out []string
	for _, tenant := range []string{"acme", "victim", "default-flow", "omnious-calibration"} {
		if metricSum(t, e.MetricsAddr(), fmt.Sprintf(`omnious_epp_tenant_tokens_total{kind="prompt",tenant=%q}`, tenant)) > 0 {
			out = append(out, tenant)
		}
	}
	return out
}

// bands are the test's flow-control bands: bronze admits nothing while a
// request is in flight (its ceiling is below that saturation, and it
// queues nothing), so a request's band shows in its status.
const bands = `scheduler:
  admission:
    queue_capacity_per_band: 0
    bands:
    - {name: platinum, priority: 400, saturation_ceiling: 1}
    - {name: gold, priority: 300, saturation_ceiling: 1}
    - {name: silver, priority: 200, saturation_ceiling: 1}
    - {name: bronze, priority: 100, saturation_ceiling: 0.001}
`

// TestGatewayHeaders: with extproc.gateway_headers and a calibration
// secret, a client's band, tenant, session and calibration headers change
// neither the band (bronze is refused, whatever the client claims) nor
// the tenant its tokens count under: the gateway's metadata decides, and
// only the secret marks calibration. With the option off the headers are
// read as they arrive (the documented legacy path).
func TestGatewayHeaders(t *testing.T) {
	secret := tokenFile(t, "calibration-secret")
	forged := map[string]string{
		"x-gateway-inference-objective":   "platinum",
		"x-gateway-inference-fairness-id": "victim",
		"x-session-id":                    "someone-elses-session",
		extproc.HeaderCalibration:         "1",
	}
	on := "extproc:\n  gateway_headers: true\n"
	acme := func(band string) map[string]string {
		return map[string]string{"x-gateway-inference-objective": band, "x-gateway-inference-fairness-id": "acme"}
	}
	for _, tt := range []struct {
		name    string
		extra   string
		route   map[string]string
		headers map[string]string
		status  int
		tenants []string
	}{
		{"option on, the route's band", on, acme("bronze"), nil, 429, nil},
		{"option on, forged band over the route's", on, acme("bronze"), forged, 429, nil},
		{"option on, the route's tenant", on, acme("silver"), nil, 200, []string{"acme"}},
		{"option on, forged tenant and calibration", on, acme("silver"), forged, 200, []string{"acme"}},
		{"option on, no route: the defaults", on, nil, forged, 200, []string{"default-flow"}},
		{"calibration secret, forged mark and token", "extproc:\n  calibration_token_file: " + secret + "\n", nil,
			map[string]string{extproc.HeaderCalibration: "1", extproc.HeaderCalibrationToken: "guess"}, 200, []string{"default-flow"}},
		{"calibration secret, the Job's token", "extproc:\n  gateway_headers: true\n  calibration_token_file: " + secret + "\n", acme("silver"),
			map[string]string{extproc.HeaderCalibrationToken: "calibration-secret"}, 200, []string{"omnious-calibration"}},
		{"option off: band header read", "", nil, map[string]string{"x-gateway-inference-objective": "bronze"}, 429, nil},
		{"option off: tenant header read", "", nil, map[string]string{"x-gateway-inference-fairness-id": "victim"}, 200, []string{"victim"}},
		{"option off: calibration mark read", "", nil, forged, 200, []string{"omnious-calibration"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel() // each case waits for its held request
			url, e := gatewayFleet(t, bands+tt.extra, tt.route)
			require.Equal(t, tt.status, chat(t, url, tt.headers))
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

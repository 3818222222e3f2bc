package envoy

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/omnious/provider-node/engines/sim/simtest"
	"github.com/omnious/provider-node/extproc"
	"github.com/omnious/provider-node/extproc/testgw"
	"github.com/omnious/provider-node/internal/testutil/envoytest"
)

// bands: bronze admits nothing while a request is in flight (its ceiling
// is below that saturation, and it queues nothing), so a request's band
// shows in its status. Keys of the EPP's scheduler: section.
const bands = `  admission:
    queue_capacity_per_band: 0
    bands:
    - {name: platinum, priority: 400, saturation_ceiling: 1}
    - {name: gold, priority: 300, saturation_ceiling: 1}
    - {name: silver, priority: 200, saturation_ceiling: 1}
    - {name: bronze, priority: 100, saturation_ceiling: 0.001}
`

// holdOne keeps one streamed request in flight on the stack's EPP for
// two seconds after its first token (through the test gateway, straight
// to the EPP, tenant "holder"), so the pool's saturation is above 0.
func (s *stack) holdOne(t *testing.T) {
	t.Helper()
	e, engine := s.epps[0], "http://"+s.replicas[0].sim.Addr()
	holder := map[string]string{"x-gateway-inference-fairness-id": "holder"}
	gw, err := testgw.New(testgw.Config{EPP: e.grpc, GatewayMetadata: holder}, zap.NewNop())
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- gw.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	simtest.Hold(t, s.client, engine, "http://"+gw.Addr(), model, holder)
	require.Eventually(t, func() bool { return e.sum("inference_objective_running_requests") == 1 }, 5*time.Second, 5*time.Millisecond)
}

// tenants are the tenants the EPP counted prompt tokens under.
func (p *eppProc) tenants() []string {
	var out []string
	for _, tenant := range []string{"acme", "victim", "default-flow", "omnious-calibration"} {
		if p.sum("omnious_epp_tenant_tokens_total", "kind", "prompt", "tenant", tenant) > 0 {
			out = append(out, tenant)
		}
	}
	return out
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
			o := opts{replicas: 1, timeScale: 1000, sched: bands, epp: "extproc:\n  calibration_token_file: " + secret + "\n"}
			if tt.option {
				o.epp += "  gateway_headers: true\n"
			}
			if tt.routeBand != "" {
				// The shipped example (band gold, tenant acme) with this band.
				o.envoy = envoytest.Config{Uncomment: []string{"typed_per_filter_config"},
					Edit: envoytest.RouteHeader("x-gateway-inference-objective", tt.routeBand)}
			}
			s := startStack(t, "envoy.yaml", o)
			e := s.epps[0]
			s.holdOne(t)
			code, _, got, err := s.post(context.Background(), "/v1/chat/completions", chat("hello there", false, 3), tt.headers)
			require.NoError(t, err)
			require.Equal(t, tt.status, code, "%s", got)
			if tt.tenants == nil {
				time.Sleep(300 * time.Millisecond) // what a routed request would have counted by now
				require.Empty(t, e.tenants())
				return
			}
			// Eight stacks start at once: on a loaded machine the usage can take
			// seconds to come back.
			require.Eventually(t, func() bool { return len(e.tenants()) > 0 }, 30*time.Second, 10*time.Millisecond)
			require.Equal(t, tt.tenants, e.tenants())
		})
	}
}

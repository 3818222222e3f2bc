package envoy

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omnious/provider-node/internal/testutil/certtest"
	"github.com/omnious/provider-node/internal/testutil/envoytest"
)

// TestExtProcTLS: Envoy reaches the EPP over TLS (the chart's
// epp.extprocTLS: envoytest.ClusterTLS), health-checks it on its TLS
// ext_proc port and routes requests; with a CA that did not sign the
// EPP's certificate, the handshake fails verification and nothing is
// routed.
func TestExtProcTLS(t *testing.T) {
	ca, other := certtest.NewCA(t, "extproc"), certtest.NewCA(t, "other")
	cert, key := ca.Issue(t, "epp", "epp.local")
	for _, tt := range []struct {
		name   string
		ca     string
		status int
		stat   string // an Envoy counter the handshakes raise
	}{
		{"the EPP's CA", ca.CertFile, http.StatusOK, "cluster.epp.ssl.handshake"},
		{"another CA", other.CertFile, http.StatusInternalServerError, "cluster.epp.ssl.fail_verify_error"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			s := startStack(t, "envoy.yaml", opts{replicas: 1, timeScale: 1000,
				epp:   fmt.Sprintf("tls_cert_file: %s\ntls_key_file: %s\n", cert, key),
				envoy: envoytest.Config{Edit: envoytest.ClusterTLS("epp", tt.ca, "epp.local")},
				// Only the EPP's CA lets the health check over TLS pass.
				unhealthy: tt.status != http.StatusOK})
			e := s.epps[0]
			if tt.status == http.StatusOK {
				code, _, got, err := s.post(ctx, "/v1/chat/completions", chat("hello there", false, 3), nil)
				require.NoError(t, err)
				require.Equal(t, http.StatusOK, code, "%s", got)
				require.Equal(t, 1.0, e.sum("inference_objective_request_total"), "the EPP routed it")
			} else {
				for range 10 {
					code, _, got, err := s.post(ctx, "/v1/chat/completions", chat("hello there", false, 3), nil)
					require.NoError(t, err)
					require.Equal(t, tt.status, code, "%s", got)
					time.Sleep(200 * time.Millisecond)
				}
				require.Zero(t, e.sum("inference_objective_request_total"))
			}
			n, err := s.envoy.Stat(ctx, tt.stat)
			require.NoError(t, err)
			require.Positive(t, n, tt.stat)
		})
	}
}

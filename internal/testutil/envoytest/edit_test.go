package envoytest

import (
	"os"
	"testing"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

// TestEdits: the shipped route example turns on as its comment wrote it,
// RouteHeader and ClusterTLS change what they name and refuse what is
// not there.
func TestEdits(t *testing.T) {
	raw, err := os.ReadFile(shipped(t, "envoy.yaml"))
	require.NoError(t, err)
	subst := map[string]string{"127.0.0.1:9002": "127.0.0.1:20002", "127.0.0.1:9003": "127.0.0.1:20003"}
	route := func(doc map[string]any) map[string]any {
		hcm := dig(dig(doc, "static_resources")["listeners"].([]any)[0])["filter_chains"].([]any)[0]
		tc := dig(dig(hcm)["filters"].([]any)[0], "typed_config", "route_config")
		return dig(dig(tc["virtual_hosts"].([]any)[0])["routes"].([]any)[0])
	}
	epp := func(doc map[string]any) map[string]any {
		return dig(dig(doc, "static_resources")["clusters"].([]any)[1])
	}
	tests := []struct {
		name      string
		uncomment string
		edit      func(map[string]any) error
		wantErr   string
		check     func(t *testing.T, doc map[string]any)
	}{
		{name: "route example on", uncomment: "typed_per_filter_config", check: func(t *testing.T, doc map[string]any) {
			muts := dig(route(doc), "typed_per_filter_config", "omnious.route_headers", "mutations")["request_mutations"].([]any)
			require.Len(t, muts, 2)
			require.Equal(t, map[string]any{"key": "x-gateway-inference-objective", "value": "gold"}, dig(muts[0], "append", "header"))
			require.Equal(t, map[string]any{"key": "x-gateway-inference-fairness-id", "value": "acme"}, dig(muts[1], "append", "header"))
		}},
		{name: "no such commented block", uncomment: "per_filter_nothing", wantErr: `0 blocks commented out under "per_filter_nothing"`},
		{name: "route header set", uncomment: "typed_per_filter_config", edit: RouteHeader("x-gateway-inference-objective", "bronze"),
			check: func(t *testing.T, doc map[string]any) {
				muts := dig(route(doc), "typed_per_filter_config", "omnious.route_headers", "mutations")["request_mutations"].([]any)
				require.Equal(t, "bronze", dig(muts[0], "append", "header")["value"])
				require.Equal(t, "acme", dig(muts[1], "append", "header")["value"])
			}},
		{name: "route header without the example", edit: RouteHeader("x-gateway-inference-objective", "bronze"),
			wantErr: "no route sets header x-gateway-inference-objective"},
		{name: "cluster TLS", edit: ClusterTLS("epp", "/ca.crt", "epp.local"), check: func(t *testing.T, doc map[string]any) {
			c := epp(doc)
			tls := dig(c, "transport_socket", "typed_config")
			require.Equal(t, "epp.local", tls["sni"])
			vc := dig(tls, "common_tls_context", "validation_context")
			require.Equal(t, "/ca.crt", dig(vc, "trusted_ca")["filename"])
			require.Equal(t, "epp.local", dig(vc["match_typed_subject_alt_names"].([]any)[0], "matcher")["exact"])
			ep := endpoints(c)[0]
			require.Equal(t, 20002, dig(ep, "health_check_config")["port_value"], "health-checked on the TLS port")
		}},
		{name: "cluster TLS, no such cluster", edit: ClusterTLS("nope", "/ca.crt", "epp.local"), wantErr: "no cluster nope"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			in := raw
			if tc.uncomment != "" {
				var err error
				in, err = Uncomment(raw, tc.uncomment)
				if err != nil {
					require.ErrorContains(t, err, tc.wantErr)
					require.NotEmpty(t, tc.wantErr, "unexpected error")
					return
				}
			}
			out, _, _, err := Rewrite(in, subst, tc.edit)
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			var doc map[string]any
			require.NoError(t, yaml.Unmarshal(out, &doc))
			tc.check(t, doc)
		})
	}
}

package extproc

import (
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"github.com/stretchr/testify/require"
)

// TestSessionHeaderBound: a session key reaches the scheduler at most
// maxSessionKey bytes long, and two long keys that differ only past the
// cut stay apart.
func TestSessionHeaderBound(t *testing.T) {
	long := strings.Repeat("s", 1<<20)
	for _, tc := range []struct {
		name, v string
		same    bool // the key passes unchanged
	}{
		{"empty", "", true},
		{"short", "agent-42", true},
		{"at the bound", strings.Repeat("a", maxSessionKey), true},
		{"over the bound", strings.Repeat("a", maxSessionKey+1), false},
		{"1 MiB", long, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := sessionHeader(&corev3.HeaderValue{RawValue: []byte(tc.v)})
			require.LessOrEqual(t, len(got), maxSessionKey)
			if tc.same {
				require.Equal(t, tc.v, got)
				return
			}
			require.Len(t, got, maxSessionKey)
			require.Equal(t, tc.v[:maxSessionKey-17], got[:maxSessionKey-17])
		})
	}
	a := sessionHeader(&corev3.HeaderValue{RawValue: []byte(long + "a")})
	b := sessionHeader(&corev3.HeaderValue{RawValue: []byte(long + "b")})
	require.NotEqual(t, a, b)
}

// TestGatewaySessionScoped: with Config.GatewayHeaders a client's session
// key (header or "user" field) is scoped to the gateway's tenant, so two
// tenants' equal keys are two sessions; a session the gateway names is
// taken as it is; every key is bounded.
func TestGatewaySessionScoped(t *testing.T) {
	long := strings.Repeat("u", 4*maxSessionKey)
	for _, tc := range []struct {
		name           string
		gateway        bool
		header, user   string
		tenant, gwSess string
		want           string
	}{
		{name: "off: header", header: "s1", tenant: "acme", want: "s1"},
		{name: "off: user field", user: "u1", tenant: "acme", want: "u1"},
		{name: "off: header before user", header: "s1", user: "u1", want: "s1"},
		{name: "off: none", want: ""},
		{name: "on: header scoped", gateway: true, header: "s1", tenant: "acme", want: "acme\x1fs1"},
		{name: "on: other tenant", gateway: true, header: "s1", tenant: "globex", want: "globex\x1fs1"},
		{name: "on: user field scoped", gateway: true, user: "u1", tenant: "acme", want: "acme\x1fu1"},
		{name: "on: no tenant", gateway: true, header: "s1", want: "\x1fs1"},
		{name: "on: the gateway's session", gateway: true, header: "s1", tenant: "acme", gwSess: "g7", want: "g7"},
		{name: "on: none", gateway: true, tenant: "acme", want: ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := &stream{s: &Server{cfg: Config{GatewayHeaders: tc.gateway}}, tenant: tc.tenant}
			st.rb.user = tc.user
			if tc.header != "" {
				st.session = sessionHeader(&corev3.HeaderValue{RawValue: []byte(tc.header)})
			}
			if tc.gwSess != "" {
				st.session, st.gatewaySession = tc.gwSess, true
			}
			require.Equal(t, tc.want, st.sessionKey())
		})
	}
	for _, gateway := range []bool{false, true} {
		st := &stream{s: &Server{cfg: Config{GatewayHeaders: gateway}}, tenant: long}
		st.rb.user = long
		require.LessOrEqual(t, len(st.sessionKey()), maxSessionKey, "gateway headers %v", gateway)
	}
}

package envoytest

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/omnious/provider-node/internal/testutil/freeport"
	"github.com/omnious/provider-node/internal/testutil/pyenv"
)

func shipped(t *testing.T, name string) string {
	t.Helper()
	root, err := pyenv.Root()
	require.NoError(t, err)
	return filepath.Join(root, "deploy", "envoy", name)
}

func eppSubst(t *testing.T, grpc, health string) map[string]string {
	t.Helper()
	p, err := freeport.Take(2)
	require.NoError(t, err)
	return map[string]string{grpc: "127.0.0.1:" + strconv.Itoa(p[0]), health: "127.0.0.1:" + strconv.Itoa(p[1])}
}

func TestRewrite(t *testing.T) {
	raw, err := os.ReadFile(shipped(t, "envoy.yaml"))
	require.NoError(t, err)
	tests := []struct {
		name    string
		subst   map[string]string
		wantErr string
	}{
		{"every endpoint named", map[string]string{"127.0.0.1:9002": "127.0.0.1:20002", "127.0.0.1:9003": "127.0.0.1:20003"}, ""},
		{"endpoint missing", map[string]string{"127.0.0.1:9003": "127.0.0.1:20003"}, "endpoint 127.0.0.1:9002 has no substitution"},
		{"health port missing", map[string]string{"127.0.0.1:9002": "127.0.0.1:20002"}, "health check port 127.0.0.1:9003 has no substitution"},
		{"bad target", map[string]string{"127.0.0.1:9002": "nowhere", "127.0.0.1:9003": "127.0.0.1:20003"}, "substitution \"nowhere\""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out, listen, admin, err := Rewrite(raw, tc.subst, nil)
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			require.NotEqual(t, listen, admin)
			s := string(out)
			require.Contains(t, s, "port_value: 20002")
			require.Contains(t, s, "port_value: 20003")
			require.NotContains(t, s, "0.0.0.0")
			require.NotContains(t, s, "port_value: 8080")
			require.NotContains(t, s, "port_value: 9901")
		})
	}
}

// TestTwoAtOnce runs both shipped configs side by side (dynamic base ids),
// reads their stats and stops them by PID.
func TestTwoAtOnce(t *testing.T) {
	a := MustStart(t, shipped(t, "envoy.yaml"), eppSubst(t, "127.0.0.1:9002", "127.0.0.1:9003"), nil)
	s := eppSubst(t, "127.0.0.1:9002", "127.0.0.1:9003")
	for k, v := range eppSubst(t, "127.0.0.1:9012", "127.0.0.1:9013") {
		s[k] = v
	}
	b := MustStart(t, shipped(t, "envoy-two-epps.yaml"), s, nil)
	require.NotEqual(t, a.URL(), b.URL())
	for _, e := range []*Envoy{a, b} {
		n, err := e.Stat(context.Background(), "cluster.epp.membership_total")
		require.NoError(t, err)
		require.Positive(t, n)
		// No EPP listens: fail closed with 500.
		resp, err := http.Get(e.URL() + "/v1/models")
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusInternalServerError, resp.StatusCode)
	}
	// An Envoy that died on its own is reported by Stop, with its log.
	require.NoError(t, syscall.Kill(b.PID(), syscall.SIGKILL))
	<-b.Done()
	require.ErrorContains(t, b.Stop(), "envoy had exited")
	require.NoError(t, b.Stop(), "a later stop does nothing")
}

func TestFind(t *testing.T) {
	_, err := Find(filepath.Join(t.TempDir(), "no-envoy"))
	require.ErrorContains(t, err, "no-envoy")
	t.Setenv("ENVOY", "")
	t.Setenv("PATH", t.TempDir())
	p, err := Find("")
	require.NoError(t, err, "the pinned envoy: scripts/pyenv.sh envoy")
	require.FileExists(t, p)
}

package adminauth

import (
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestTokenRefused: only the exact token passes; a prefix, a longer value,
// another scheme or none gets 401, and an empty token file is refused.
func TestTokenRefused(t *testing.T) {
	dir := t.TempDir()
	tok := filepath.Join(dir, "token")
	require.NoError(t, os.WriteFile(tok, []byte("  abc123\n"), 0o600))
	h, err := Config{TokenFile: tok}.Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusTeapot) }))
	require.NoError(t, err)
	for _, tt := range []struct {
		auth string
		want int
	}{
		{"Bearer abc123", http.StatusTeapot},
		{"", http.StatusUnauthorized},
		{"Bearer abc12", http.StatusUnauthorized},
		{"Bearer abc1234", http.StatusUnauthorized},
		{"Bearer ", http.StatusUnauthorized},
		{"Basic abc123", http.StatusUnauthorized},
		{"bearer abc123", http.StatusUnauthorized},
	} {
		r := httptest.NewRequest(http.MethodGet, "/v1/capacity", nil)
		if tt.auth != "" {
			r.Header.Set("Authorization", tt.auth)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		require.Equal(t, tt.want, w.Code, tt.auth)
		require.NotContains(t, w.Body.String(), "abc123")
	}

	empty := filepath.Join(dir, "empty")
	require.NoError(t, os.WriteFile(empty, []byte("\n"), 0o600))
	_, err = Config{TokenFile: empty}.Handler(http.NotFoundHandler())
	require.ErrorContains(t, err, "is empty")
	_, err = Config{TokenFile: filepath.Join(dir, "missing")}.Handler(http.NotFoundHandler())
	require.ErrorContains(t, err, "cannot read token file")
}

// TestLoopback: only a loopback host keeps the admin port private.
func TestLoopback(t *testing.T) {
	for addr, want := range map[string]bool{
		"127.0.0.1:9091": true, "localhost:9091": true, "[::1]:9091": true, "127.0.0.2:0": true,
		":9091": false, "0.0.0.0:9091": false, "[::]:9091": false, "10.0.0.5:9091": false, "epp:9091": false, "bad": false,
	} {
		require.Equal(t, want, Loopback(addr), addr)
	}
}

// TestClientSendsToken: the client's transport adds the token, and the
// scheme follows its TLS settings.
func TestClientSendsToken(t *testing.T) {
	tok := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(tok, []byte("xyz"), 0o600))
	var got string
	srv := httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) { got = r.Header.Get("Authorization") }))
	defer srv.Close()
	c := Client{TokenFile: tok}
	require.Equal(t, "http", c.Scheme())
	require.Equal(t, "https", Client{CAFile: "ca"}.Scheme())
	rt, err := c.Transport(nil)
	require.NoError(t, err)
	resp, err := (&http.Client{Transport: rt}).Get(srv.URL)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, "Bearer xyz", got)
}

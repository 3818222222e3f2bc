// Package simtest starts simulated engine replicas for other packages'
// tests: on loopback, on free ports, fast (time scale 100), stopped when the
// test ends.
package simtest

import (
	"context"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/omnious/provider-node/engines/sim"
	"github.com/omnious/provider-node/internal/testutil/freeport"
)

// Start runs one replica until t ends. mutate, when not nil, adjusts the
// config before defaults apply.
func Start(t testing.TB, mutate func(*sim.Config)) *sim.Replica {
	t.Helper()
	c := sim.Config{Listen: "127.0.0.1:0"}
	c.KVEvents.Endpoint = "tcp://127.0.0.1:0"
	c.Engine.TimeScale = 100
	if mutate != nil {
		mutate(&c)
	}
	c = c.WithDefaults()
	require.NoError(t, c.Validate())
	r, err := sim.NewReplica(c, 0, zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	return r
}

// URL starts a replica of flavour ("" = vllm) and returns its base URL.
func URL(t testing.TB, flavour string) string {
	t.Helper()
	return "http://" + Start(t, func(c *sim.Config) { c.Engine.Flavour = flavour }).Addr()
}

// SetFaults replaces the replica's injected faults with body (JSON, as
// POST /admin/faults takes it; "{}" clears them).
func SetFaults(t testing.TB, base, body string) {
	t.Helper()
	resp, err := http.Post(base+"/admin/faults", "application/json", strings.NewReader(body))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
}

// Hold keeps one streamed chat in flight until t ends: it makes the
// replica at base stall two seconds after each streamed answer's first
// token, then sends the chat for model to gateway (a URL the request
// reaches the replica through) with header, without waiting for it. The
// caller waits until its router counts the request. The stall stays set:
// the replica reads its faults when the request reaches it, which can be
// after a router counts it, and only streamed answers stall.
func Hold(t testing.TB, client *http.Client, base, gateway, model string, header map[string]string) {
	t.Helper()
	SetFaults(t, base, `{"stall_after_tokens": 1, "stall_for": "2s"}`)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, gateway+"/v1/chat/completions",
		strings.NewReader(`{"model":"`+model+`","max_tokens":50,"stream":true,"messages":[{"role":"user","content":"hold"}]}`))
	require.NoError(t, err)
	for k, v := range header {
		req.Header.Set(k, v)
	}
	go func() {
		if resp, err := client.Do(req); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}()
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago,
// from below the ephemeral range (see freeport).
func FreePort(t testing.TB) int {
	t.Helper()
	ports, err := freeport.Take(1)
	require.NoError(t, err)
	return ports[0]
}

// WaitOK waits up to 20 s for GET url to answer 200.
func WaitOK(t testing.TB, url string) {
	t.Helper()
	require.Eventually(t, func() bool {
		resp, err := http.Get(url)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, 20*time.Second, 20*time.Millisecond, url)
}

// Binary builds the enginesim command into a temporary directory and
// returns its path, for tests that run replicas as processes.
func Binary(t testing.TB) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	require.True(t, ok)
	src := filepath.Join(filepath.Dir(file), "..", "..", "..", "cmd", "enginesim")
	bin := filepath.Join(t.TempDir(), "enginesim")
	out, err := exec.Command("go", "build", "-o", bin, src).CombinedOutput()
	require.NoError(t, err, string(out))
	return bin
}

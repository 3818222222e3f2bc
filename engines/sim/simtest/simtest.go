// Package simtest starts simulated engine replicas for other packages'
// tests: on loopback, on free ports, fast (time scale 100), stopped when the
// test ends.
package simtest

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/omnious/provider-node/engines/sim"
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

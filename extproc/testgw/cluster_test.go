package testgw

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/omnious/provider-node/extproc"
	"github.com/omnious/provider-node/scheduler"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// countingEPP is a Floor on its own gRPC server with gRPC health on the
// same port, counting the streams it is given.
type countingEPP struct {
	*Floor
	streams atomic.Int64
	addr    string
	srv     *grpc.Server
	health  *health.Server
}

func (c *countingEPP) Process(st extprocv3.ExternalProcessor_ProcessServer) error {
	c.streams.Add(1)
	return c.Floor.Process(st)
}

func startCountingEPP(t *testing.T, addr, dest string) *countingEPP {
	t.Helper()
	lis, err := net.Listen("tcp", addr)
	require.NoError(t, err)
	c := &countingEPP{Floor: &Floor{Dests: []string{dest}}, addr: lis.Addr().String(), srv: grpc.NewServer(), health: health.NewServer()}
	extprocv3.RegisterExternalProcessorServer(c.srv, c)
	c.health.SetServingStatus(healthService, healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(c.srv, c.health)
	go func() { _ = c.srv.Serve(lis) }()
	t.Cleanup(c.srv.Stop)
	return c
}

// TestSeveralEPPs: the gateway spreads streams over the EPP hosts as an
// Envoy cluster does, stops sending new streams to a host whose health
// turns NOT_SERVING (a draining EPP) or that is gone, loses no request to
// either, and takes a host back once it is healthy again.
func TestSeveralEPPs(t *testing.T) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"ok":true}`)
	}))
	defer upstream.Close()
	dest := strings.TrimPrefix(upstream.URL, "http://")
	a, b := startCountingEPP(t, "127.0.0.1:0", dest), startCountingEPP(t, "127.0.0.1:0", dest)

	gw, err := New(Config{EPPs: []string{a.addr, b.addr}, HealthInterval: 20 * time.Millisecond}, zaptest.NewLogger(t))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- gw.Run(ctx) }()
	defer func() {
		cancel()
		require.NoError(t, <-done)
	}()
	send := func(n int) {
		t.Helper()
		for range n {
			resp, body := post(t, gw, "/v1/chat/completions", `{"model":"m"}`)
			require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
		}
	}
	counts := func() (int64, int64) { return a.streams.Load(), b.streams.Load() }

	send(20)
	na, nb := counts()
	require.Equal(t, int64(10), na, "round robin")
	require.Equal(t, int64(10), nb)

	// b drains: health NOT_SERVING; once the checks see it, b gets nothing.
	b.health.Shutdown()
	require.Eventually(t, func() bool { return gw.epps.hosts[1].down.Load() }, 5*time.Second, 5*time.Millisecond)
	send(20)
	na2, nb2 := counts()
	require.Equal(t, na+20, na2)
	require.Equal(t, nb, nb2, "no stream to a draining EPP")

	// b comes back healthy, then is killed: the next stream for it finds it
	// gone, goes to a instead, and no request fails.
	b.health.Resume()
	require.Eventually(t, func() bool { return !gw.epps.hosts[1].down.Load() }, 5*time.Second, 5*time.Millisecond)
	send(2)
	_, nb3 := counts()
	require.Greater(t, nb3, nb2, "a healthy host is used again")
	b.srv.Stop()
	send(20)
	require.True(t, gw.epps.hosts[1].down.Load())

	// Every host down: the gateway still tries them (Envoy's panic mode)
	// and a comes back into use once it answers.
	a.health.Shutdown()
	require.Eventually(t, func() bool { return gw.epps.hosts[0].down.Load() }, 5*time.Second, 5*time.Millisecond)
	before := a.streams.Load()
	send(3)
	require.Equal(t, before+3, a.streams.Load())
}

// TestSkipResponse: with response processing off the client gets the
// engine's answer untouched, and the EPP hears only that the stream ended:
// no status, which the scheduler takes as no evidence either way.
func TestSkipResponse(t *testing.T) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"model":"m1","ok":true}`)
	}))
	defer upstream.Close()
	addr := strings.TrimPrefix(upstream.URL, "http://")
	p := &listPicker{addrs: []string{addr}}
	var timing atomic.Pointer[Timing]
	gw := startStackConfig(t, extproc.Config{}, Config{SkipResponse: true, OnExchange: func(tm Timing) { timing.Store(&tm) }}, p)
	resp, body := post(t, gw, "/v1/chat/completions", `{"model":"m1","messages":[{"role":"user","content":"hi"}]}`)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.JSONEq(t, `{"model":"m1","ok":true}`, strings.TrimSpace(string(body)))
	_, d := p.last(t)
	require.Zero(t, d.Status, "the EPP saw no response phase")
	require.Error(t, d.Err)
	require.Equal(t, scheduler.OutcomeUnknown, d.Outcome())
	require.Equal(t, addr, timing.Load().Served)
}

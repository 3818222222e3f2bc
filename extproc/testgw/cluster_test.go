package testgw

import (
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/omnious/provider-node/extproc"
	"github.com/omnious/provider-node/scheduler"
)

// countingEPP is a Floor on its own gRPC server with gRPC health on the
// same port, counting the streams it is given.
type countingEPP struct {
	*Floor
	streams atomic.Int64
	// failOn, when set, ends a stream with an error in place of answering
	// the first message it matches, as an EPP that died there.
	failOn func(*extprocv3.ProcessingRequest) bool
	addr   string
	srv    *grpc.Server
	health *health.Server
}

func (c *countingEPP) Process(st extprocv3.ExternalProcessor_ProcessServer) error {
	c.streams.Add(1)
	if c.failOn != nil {
		st = failingStream{st, c.failOn}
	}
	return c.Floor.Process(st)
}

type failingStream struct {
	extprocv3.ExternalProcessor_ProcessServer
	failOn func(*extprocv3.ProcessingRequest) bool
}

func (s failingStream) Recv() (*extprocv3.ProcessingRequest, error) {
	req, err := s.ExternalProcessor_ProcessServer.Recv()
	if err == nil && s.failOn(req) {
		return nil, status.Error(codes.Unavailable, "the EPP is gone")
	}
	return req, err
}

func startCountingEPP(t *testing.T, addr, dest string, failOn func(*extprocv3.ProcessingRequest) bool) *countingEPP {
	t.Helper()
	lis, err := net.Listen("tcp", addr)
	require.NoError(t, err)
	c := &countingEPP{Floor: &Floor{Dests: []string{dest}}, failOn: failOn, addr: lis.Addr().String(), srv: grpc.NewServer(),
		health: health.NewServer()}
	extprocv3.RegisterExternalProcessorServer(c.srv, c)
	c.health.SetServingStatus(HealthService, healthpb.HealthCheckResponse_SERVING)
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
	dest := jsonUpstream(t, `{"ok":true}`)
	a, b := startCountingEPP(t, "127.0.0.1:0", dest, nil), startCountingEPP(t, "127.0.0.1:0", dest, nil)

	gw := runGateway(t, Config{EPPs: []string{a.addr, b.addr}, HealthInterval: 20 * time.Millisecond})
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
	addr := jsonUpstream(t, `{"model":"m1","ok":true}`)
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

// TestEPPFailsMidExchange: an EPP whose stream fails (it died) before the
// routing reply or at the response headers gets the client the gateway's
// 502; one that fails once the response status has reached the client
// leaves it a truncated response, never a clean end. Either way the
// exchange reports the EPP host and the error, and the host's stream
// counts as open from its opening to the exchange's end.
func TestEPPFailsMidExchange(t *testing.T) {
	dest := jsonUpstream(t, `{"ok":true}`)
	cases := []struct {
		name      string
		failOn    func(*extprocv3.ProcessingRequest) bool
		status    int
		truncated bool
	}{
		{"no failure", nil, http.StatusOK, false},
		{"before the routing reply", func(r *extprocv3.ProcessingRequest) bool { return r.GetRequestBody() != nil },
			http.StatusBadGateway, false},
		{"at the response headers", func(r *extprocv3.ProcessingRequest) bool { return r.GetResponseHeaders() != nil },
			http.StatusBadGateway, false},
		{"mid-response", func(r *extprocv3.ProcessingRequest) bool { return r.GetResponseBody() != nil },
			http.StatusOK, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var gw atomic.Pointer[Gateway]
			var openAtFailure atomic.Int64
			var epp *countingEPP
			failOn := tc.failOn
			if failOn != nil {
				failOn = func(r *extprocv3.ProcessingRequest) bool {
					if !tc.failOn(r) {
						return false
					}
					openAtFailure.Store(int64(gw.Load().OpenStreams()[epp.addr]))
					return true
				}
			}
			epp = startCountingEPP(t, "127.0.0.1:0", dest, failOn)
			var timing atomic.Pointer[Timing]
			g := runGateway(t, Config{EPPs: []string{epp.addr}, HealthInterval: -1, OnExchange: func(tm Timing) { timing.Store(&tm) }})
			gw.Store(g)

			resp, err := http.Post("http://"+g.Addr()+"/v1/completions", "application/json", strings.NewReader(`{"model":"m"}`))
			require.NoError(t, err)
			defer resp.Body.Close()
			require.Equal(t, tc.status, resp.StatusCode)
			_, err = io.ReadAll(resp.Body)
			require.Equal(t, tc.truncated, err != nil, "truncated response: %v", err)

			tm := timing.Load()
			require.NotNil(t, tm)
			require.Equal(t, epp.addr, tm.EPP)
			require.Equal(t, tc.failOn != nil, tm.Err != nil, "exchange error: %v", tm.Err)
			if tc.failOn != nil {
				require.Equal(t, int64(1), openAtFailure.Load(), "the stream is open while the EPP holds it")
			}
			require.Equal(t, map[string]int{epp.addr: 0}, g.OpenStreams(), "nothing open once the client has its answer")
		})
	}
}

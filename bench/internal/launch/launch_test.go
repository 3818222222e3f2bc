package launch

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/omnious/provider-node/bench/internal/promtext"
	"github.com/omnious/provider-node/endpoint"
	"github.com/omnious/provider-node/engines/sim"
	"github.com/omnious/provider-node/engines/sim/simtest"
	"github.com/omnious/provider-node/extproc/testgw"
	"github.com/omnious/provider-node/scheduler"
)

func requireFree(t *testing.T, hostport string) {
	t.Helper()
	l, err := net.Listen("tcp", hostport)
	require.NoError(t, err, "port %s still bound", hostport)
	require.NoError(t, l.Close())
}

func requireSimFree(t *testing.T, s *Sim) {
	t.Helper()
	requireFree(t, s.Addr())
	requireFree(t, strings.TrimPrefix(s.Config.KVEvents.Endpoint, "tcp://"))
	requireFree(t, strings.TrimPrefix(s.Config.KVEvents.ReplayEndpoint, "tcp://"))
}

// TestSimsAndEPP starts two enginesim processes and the EPP in process in
// front of them, kills and restarts a replica and the EPP, and requires
// every port free once each is stopped.
func TestSimsAndEPP(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	log := zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))
	cfg := sim.Config{Seed: 1, Model: "m"}
	cfg.Engine.TimeScale = 100
	sims, err := StartSims(ctx, SimsConfig{Bin: simtest.Binary(t), Dir: t.TempDir(), Replicas: 2, Config: cfg, LogLevel: "error"})
	require.NoError(t, err)
	defer func() { _ = StopSims(sims) }()
	require.Len(t, sims, 2)
	var eps []endpoint.Endpoint
	for _, s := range sims {
		ep := s.Endpoint()
		require.Equal(t, endpoint.Endpoint{Addr: s.Addr(), Model: "m", Engine: "vllm", MetricsURL: s.URL() + "/metrics",
			KVEvents: s.Config.KVEvents.Endpoint, KVReplay: s.Config.KVEvents.ReplayEndpoint}, ep)
		require.True(t, strings.HasPrefix(ep.Addr, "127.0.0.1:"), ep.Addr)
		eps = append(eps, ep)
	}

	// A killed replica comes back at the same address.
	addr := sims[0].Addr()
	require.NoError(t, sims[0].Kill())
	requireSimFree(t, sims[0])
	require.NoError(t, sims[0].Start(ctx))
	require.Equal(t, addr, sims[0].Addr())

	sc, err := Tuning{Policy: scheduler.PolicyPrecise, ScrapeInterval: 100 * time.Millisecond, ScrapeTimeout: 100 * time.Millisecond}.Config()
	require.NoError(t, err)
	e, err := StartInProcess(InProcessConfig{Spec: Spec{Scheduler: sc, Endpoints: eps, Tokenizer: TokenizerStandIn, DrainTimeout: time.Second}, Log: log})
	require.NoError(t, err)
	defer func() { _ = e.Stop() }()
	gw, err := StartGateway(testgw.Config{EPP: e.GRPCAddr()}, log)
	require.NoError(t, err)
	defer func() { _ = gw.Close() }()
	_, err = e.WaitReady(ctx, 2)
	require.NoError(t, err)
	blocks, err := e.ResidentBlocks(ctx)
	require.NoError(t, err)
	require.Len(t, blocks, 2)
	page, err := e.Metrics(ctx)
	require.NoError(t, err)
	_, found, err := promtext.SumWhere(page, "omnious_epp_breaker_state", map[string]string{"endpoint": addr})
	require.NoError(t, err)
	require.True(t, found, "the EPP exports a breaker state per endpoint")
	_, err = e.CPU()
	require.Error(t, err, "an EPP in this process has no CPU of its own")

	// Stopped, its ports are free; started again, it is where it was.
	grpcAddr, admin := e.GRPCAddr(), e.AdminURL()
	require.NoError(t, e.Stop())
	requireFree(t, grpcAddr)
	require.NoError(t, e.Stop(), "stopping twice does nothing")
	require.NoError(t, e.Start())
	require.Equal(t, grpcAddr, e.GRPCAddr())
	require.Equal(t, admin, e.AdminURL())
	_, err = e.WaitReady(ctx, 2)
	require.NoError(t, err)

	require.NoError(t, gw.Close())
	require.NoError(t, gw.Close(), "closing twice does nothing")
	require.NoError(t, e.Stop())
	requireFree(t, grpcAddr)
	require.NoError(t, StopSims(sims))
	for _, s := range sims {
		requireSimFree(t, s)
	}
}

func TestStartSimsRejects(t *testing.T) {
	_, err := StartSims(context.Background(), SimsConfig{Bin: "/nonexistent/enginesim", Replicas: 1})
	require.ErrorContains(t, err, "cannot find enginesim")
}

func TestTuning(t *testing.T) {
	def := scheduler.DefaultConfig()
	tests := []struct {
		name  string
		t     Tuning
		check func(t *testing.T, c scheduler.Config)
	}{
		{"zero keeps the defaults", Tuning{}, func(t *testing.T, c scheduler.Config) {
			require.Equal(t, def.Policy, c.Policy)
			require.Equal(t, def.Signals.ScrapeInterval, c.Signals.ScrapeInterval)
			require.Equal(t, def.Breaker.Cooldown, c.Breaker.Cooldown)
		}},
		{"every field", Tuning{Policy: "round-robin", Seed: 7, ScrapeInterval: 200 * time.Millisecond, ScrapeTimeout: 150 * time.Millisecond,
			StaleAfter: time.Second, BreakerCooldown: 2 * time.Second, SpeculativeTTL: 300 * time.Millisecond}, func(t *testing.T, c scheduler.Config) {
			require.Equal(t, "round-robin", c.Policy)
			require.Equal(t, int64(7), c.Seed)
			require.Equal(t, 200*time.Millisecond, c.Signals.ScrapeInterval)
			require.Equal(t, 150*time.Millisecond, c.Signals.ScrapeTimeout)
			require.Equal(t, time.Second, c.Signals.StaleAfter)
			require.Equal(t, 2*time.Second, c.Breaker.Cooldown)
			require.Equal(t, 300*time.Millisecond, *c.Prefix.SpeculativeTTL)
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := tc.t.Config()
			require.NoError(t, err)
			tc.check(t, c)
		})
	}
	_, err := Tuning{Policy: "nope"}.Config()
	require.Error(t, err)
	require.Equal(t, def.Breaker.FailureThreshold, BreakerThreshold())
}

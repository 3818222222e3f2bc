package launch

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"go.yaml.in/yaml/v3"

	"github.com/omnious/provider-node/bench/internal/launch/launchtest"
	"github.com/omnious/provider-node/bench/internal/promtext"
	"github.com/omnious/provider-node/discovery"
	"github.com/omnious/provider-node/endpoint"
	"github.com/omnious/provider-node/engines/sim"
	"github.com/omnious/provider-node/engines/sim/simtest"
	"github.com/omnious/provider-node/epp"
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

// TestProcessFiles: the files a child EPP is started with are the config
// the EPP in this process would run (read back by epp.Load) and an endpoint
// file that discovery reads back as the same endpoints.
func TestProcessFiles(t *testing.T) {
	sc, err := Tuning{Policy: scheduler.PolicyPrecise, ScrapeInterval: 200 * time.Millisecond, BreakerCooldown: 2 * time.Second,
		SpeculativeTTL: 300 * time.Millisecond}.Config()
	require.NoError(t, err)
	sim := func(port int) endpoint.Endpoint {
		return endpoint.Endpoint{Addr: "127.0.0.1:" + itoa(port), Model: "m", Engine: "vllm", MetricsURL: "http://127.0.0.1:" + itoa(port) + "/metrics",
			KVEvents: "tcp://127.0.0.1:" + itoa(port+1), KVReplay: "tcp://127.0.0.1:" + itoa(port+2)}
	}
	tests := []struct {
		name string
		spec Spec
		// tokenizers is what the config maps models to (dir relative to the test's directory).
		tokenizers map[string]string
	}{
		{"stand-in tokenizer, KV events and replay", Spec{Scheduler: sc, Endpoints: []endpoint.Endpoint{sim(30000), sim(30010)},
			Tokenizer: TokenizerStandIn, MaxEndpoints: new(1), DrainTimeout: 2 * time.Second}, nil},
		{"no tokenizer, metrics elsewhere or none, labels", Spec{Scheduler: sc, Endpoints: []endpoint.Endpoint{
			{Addr: "127.0.0.1:30100", Model: "m", Engine: "sglang", MetricsURL: "http://127.0.0.1:30101/stats", Labels: map[string]string{"rack": "a"}},
			{Addr: "127.0.0.1:30200", Model: "m", Engine: "vllm"},
		}, Tokenizer: "none"}, nil},
		{"tokenizer directory for each model", Spec{Scheduler: sc, Endpoints: []endpoint.Endpoint{
			{Addr: "127.0.0.1:30300", Model: "a", Engine: "vllm", MetricsURL: "http://127.0.0.1:30300/metrics"},
			{Addr: "127.0.0.1:30400", Model: "b", Engine: "vllm", MetricsURL: "http://127.0.0.1:30400/metrics"},
		}, Tokenizer: "tok", MaxEndpoints: new(0)}, map[string]string{"a": "tok", "b": "tok"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "epp-0")
			t.Chdir(filepath.Dir(dir))
			addrs := [4]string{"127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3", "127.0.0.1:4"}
			cfgFile, err := ProcessConfig{Spec: tc.spec, Dir: dir, Name: "EPP 0"}.writeFiles(addrs)
			require.NoError(t, err)
			require.Equal(t, filepath.Join(dir, "epp.yaml"), cfgFile)

			got, err := epp.Load(cfgFile)
			require.NoError(t, err)
			want, err := tc.spec.config(addrs[0], addrs[1], addrs[2], addrs[3])
			require.NoError(t, err)
			want.EndpointsFile = filepath.Join(dir, "endpoints.yaml")
			require.Equal(t, yamlOf(t, want), yamlOf(t, got), "the child runs the in-process config")
			require.Equal(t, tc.spec.Tokenizer == TokenizerStandIn, got.StandInTokenizer)
			for m, d := range tc.tokenizers {
				abs, err := filepath.Abs(d)
				require.NoError(t, err)
				require.Equal(t, abs, got.Tokenizers[m])
			}
			require.Len(t, got.Tokenizers, len(tc.tokenizers))

			data, err := os.ReadFile(got.EndpointsFile)
			require.NoError(t, err)
			eps, err := discovery.ParseFile(data)
			require.NoError(t, err)
			require.Equal(t, tc.spec.Endpoints, eps)
		})
	}
}

func itoa(i int) string { return strconv.Itoa(i) }

func yamlOf(t *testing.T, c epp.Config) string {
	t.Helper()
	b, err := yaml.Marshal(c)
	require.NoError(t, err)
	return string(b)
}

// TestProcessEPP runs two bin/epp processes side by side in front of one
// enginesim replica, each with its own directory and log: one is killed
// (SIGKILL to its PID: its ports free at once) and started again on the
// same ports, the other stopped gracefully; every port is free at the end.
func TestProcessEPP(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg := sim.Config{Seed: 1, Model: "m"}
	cfg.Engine.TimeScale = 100
	sims, err := StartSims(ctx, SimsConfig{Bin: simtest.Binary(t), Dir: t.TempDir(), Replicas: 1, Config: cfg, LogLevel: "error"})
	require.NoError(t, err)
	defer func() { _ = StopSims(sims) }()
	sc, err := Tuning{Policy: scheduler.PolicyPrecise, ScrapeInterval: 100 * time.Millisecond, ScrapeTimeout: 100 * time.Millisecond}.Config()
	require.NoError(t, err)
	spec := Spec{Scheduler: sc, Endpoints: []endpoint.Endpoint{sims[0].Endpoint()}, Tokenizer: TokenizerStandIn, DrainTimeout: time.Second}
	bin := launchtest.EPPBinary(t)
	dir := t.TempDir()
	var epps []*EPP
	for _, name := range []string{"a", "b"} {
		e, err := StartProcess(ProcessConfig{Spec: spec, Bin: bin, Dir: filepath.Join(dir, name), Name: "EPP " + name})
		require.NoError(t, err)
		defer func() { _ = e.Stop() }()
		_, err = e.WaitReady(ctx, 1)
		require.NoError(t, err)
		epps = append(epps, e)
	}
	a, b := epps[0], epps[1]
	require.NotEqual(t, a.GRPCAddr(), b.GRPCAddr())
	for _, name := range []string{"a", "b"} {
		require.FileExists(t, filepath.Join(dir, name, "epp.log"))
	}
	cpu, err := a.CPU()
	require.NoError(t, err)
	require.Positive(t, cpu)

	ports := func(e *EPP) []string {
		return []string{e.GRPCAddr(), strings.TrimSuffix(strings.TrimPrefix(e.MetricsURL(), "http://"), "/metrics"),
			strings.TrimPrefix(e.AdminURL(), "http://")}
	}
	before := ports(a)
	require.NoError(t, a.Kill())
	for _, p := range before {
		requireFree(t, p)
	}
	require.NoError(t, a.Kill(), "killing a stopped EPP does nothing")
	require.NoError(t, a.Start())
	require.Equal(t, before, ports(a), "started again on the same ports")
	_, err = a.WaitReady(ctx, 1)
	require.NoError(t, err)

	require.NoError(t, b.Stop())
	require.NoError(t, a.Stop())
	for _, e := range epps {
		for _, p := range ports(e) {
			requireFree(t, p)
		}
	}

	inProc, err := StartInProcess(InProcessConfig{Spec: spec})
	require.NoError(t, err)
	defer func() { _ = inProc.Stop() }()
	require.ErrorContains(t, inProc.Kill(), "runs in this process")
	require.NoError(t, inProc.Stop())
}

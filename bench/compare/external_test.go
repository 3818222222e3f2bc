package compare

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/omnious/provider-node/bench/internal/launch"
	"github.com/omnious/provider-node/bench/internal/launch/launchtest"
	"github.com/omnious/provider-node/bench/internal/leak"
	"github.com/omnious/provider-node/bench/rig"
	"github.com/omnious/provider-node/endpoint"
	"github.com/omnious/provider-node/extproc/testgw"
)

func TestValidateExternalPolicies(t *testing.T) {
	o := smallOptions(t)
	o.Policies = []string{"precise", "exec:bin/epp -a", "exec:/other/epp -b"}
	require.ErrorContains(t, o.WithDefaults().Validate(), `two policies are named "exec:epp"`)
	o.Policies = []string{"precise", "exec:precise=bin/epp"}
	require.ErrorContains(t, o.WithDefaults().Validate(), `two policies are named "precise"`)
	o.Policies = []string{"addr:127.0.0.1:9002"}
	require.ErrorContains(t, o.WithDefaults().Validate(), "race it with -urls")
	o.Policies = []string{"addr:192.0.2.1:9002"}
	require.ErrorContains(t, o.WithDefaults().Validate(), "not on loopback")
	o.Policies = []string{"exec:a=bin/epp -x", "exec:b=bin/epp -x"}
	require.NoError(t, o.WithDefaults().Validate())
	o.Fleet = rig.FleetOptions{Mode: rig.FleetURLs, URLs: []string{"http://127.0.0.1:8000"}}
	o.Policies = []string{"addr:127.0.0.1:9002", "precise"}
	require.NoError(t, o.WithDefaults().Validate())
}

// eppCommand is bin/epp as a user runs it next to a simulated fleet, on
// the bench's ports and endpoint file.
func eppCommand(bin, policy string) string {
	return bin + " -endpoints-file {endpoints_file} -grpc-addr {grpc_addr} -health-addr {health_addr} -metrics-addr {metrics_addr}" +
		" -admin-addr {admin_addr} -drain-delay 0s -policy " + policy + " -standin-tokenizer -log-level warn"
}

// raceOptions is a workload on which prefix-aware routing clearly beats
// round-robin: six 600-token prefixes over three replicas.
func raceOptions(t *testing.T) Options {
	o := smallOptions(t)
	o.Fleet.Replicas = 3
	o.Workload.SharedPrefix = rig.SharedPrefixOptions{NumGroups: 6, PromptsPerGroup: 2, SystemPromptLen: 600, QuestionLen: 40,
		OutputLen: 8, QPS: []float64{6}, StageDuration: 4 * time.Second}
	return o
}

var grpcAddrRE = regexp.MustCompile(`-grpc-addr (127\.0\.0\.1:[0-9]+)`)

// TestRaceExecEPP races bin/epp, started by the bench from a command line
// (exec:), beside the EPP in process: the same gateway, fleet and
// workload, reported side by side; the processes are gone afterwards.
func TestRaceExecEPP(t *testing.T) {
	bin := launchtest.EPPBinary(t)
	dir := t.TempDir()
	o := raceOptions(t)
	// bound takes the fleet's KV events on a socket it binds, relayed by
	// the bench, as engines publish in vLLM's centralized mode.
	o.Policies = []string{"precise", "exec:ours=" + eppCommand(bin, "precise"), "exec:" + eppCommand(bin, "round-robin"),
		"exec:bound=" + eppCommand(bin, "precise") + " -kv-events-bind {kv_events_bind}"}
	settle := 500 * time.Millisecond
	rep, err := Run(context.Background(), o, rig.EPPLauncher(o.Log, rig.ExternalOptions{Dir: dir, Settle: &settle}))
	require.NoError(t, err)
	require.Len(t, rep.Results, 4)
	inproc, ours, rr, bound := rep.Results[0], rep.Results[1], rep.Results[2], rep.Results[3]
	require.Equal(t, []string{"precise", "ours", "exec:epp", "bound"}, rep.policyNames())
	require.Equal(t, rig.KindPolicy, inproc.Kind)
	require.Nil(t, inproc.EPP)
	for _, pr := range []PolicyResult{ours, rr, bound} {
		require.Equal(t, rig.KindExec, pr.Kind)
		require.Zero(t, pr.Errors, pr.FirstError)
		require.Equal(t, rep.Requests, pr.Requests)
		require.Greater(t, pr.TTFTP50, 0.0)
		require.Greater(t, pr.OutputTokPS, 0.0)
		require.NotNil(t, pr.EPP)
		require.Equal(t, "inference_objective_request_total", pr.EPP.RequestsCounter)
		require.Equal(t, float64(rep.Requests), pr.EPP.Requests, "its own counter saw every request")
		require.Equal(t, "omnious_extproc_route_duration_seconds", pr.EPP.DecisionHistogram)
		require.Greater(t, pr.DecisionP99us, 0.0)
		require.GreaterOrEqual(t, pr.DecisionP99us, pr.DecisionP50us)
		require.FileExists(t, pr.EPP.Log)
		require.Empty(t, pr.EPP.MetricsError)
	}
	// Prefix-aware routing, in process or as bin/epp, keeps each group on
	// the replica that holds it; round-robin scatters it.
	require.Greater(t, ours.HitRate, rr.HitRate)
	require.Greater(t, ours.HitRate, 0.8*rep.Bound)
	require.Greater(t, inproc.HitRate, 0.8*rep.Bound)
	require.Greater(t, bound.HitRate, rr.HitRate)
	require.Greater(t, bound.HitRate, 0.8*rep.Bound)
	require.Empty(t, ours.EPP.KVEventsBind)
	require.Regexp(t, `^tcp://127\.0\.0\.1:[0-9]+$`, bound.EPP.KVEventsBind)
	require.Positive(t, bound.EPP.KVBatchesRelayed, "its index was fed through the relay")
	eps, err := os.ReadFile(filepath.Join(dir, "bound", "endpoints.yaml"))
	require.NoError(t, err)
	require.Contains(t, string(eps), "kv_events_connect: true")
	require.NotContains(t, string(eps), "kv_events_port")

	// Every process the bench started is gone: its ext_proc port is free.
	for _, label := range []string{"ours", "exec-epp", "bound"} {
		cmd, err := os.ReadFile(filepath.Join(dir, label, "command"))
		require.NoError(t, err)
		m := grpcAddrRE.FindStringSubmatch(string(cmd))
		require.NotNil(t, m, string(cmd))
		leak.RequireFree(t, m[1])
		require.FileExists(t, filepath.Join(dir, label, "gie-endpoints.yaml"))
	}

	// The contract and the report carry them.
	out := filepath.Join(t.TempDir(), "out.json")
	require.NoError(t, rep.WriteJSON(out))
	b, err := os.ReadFile(out)
	require.NoError(t, err)
	var doc struct {
		Results []struct {
			Policy         string   `json:"policy"`
			Kind           string   `json:"kind"`
			Decision       *float64 `json:"decision_p99_us"`
			DecisionSource *string  `json:"decision_source"`
			EPPRequests    *float64 `json:"epp_requests"`
			HitRate        *float64 `json:"hit_rate"`
		} `json:"results"`
	}
	require.NoError(t, json.Unmarshal(b, &doc))
	require.Equal(t, "policy", doc.Results[0].Kind)
	require.Nil(t, doc.Results[0].DecisionSource, "the EPP in process times its decisions itself")
	require.Equal(t, "ours", doc.Results[1].Policy)
	require.Equal(t, "exec", doc.Results[1].Kind)
	require.Equal(t, "omnious_extproc_route_duration_seconds", *doc.Results[1].DecisionSource)
	require.Equal(t, float64(rep.Requests), *doc.Results[1].EPPRequests)
	require.NotNil(t, doc.Results[1].HitRate)
	var html strings.Builder
	require.NoError(t, rep.WriteHTML(&html))
	require.Contains(t, html.String(), "<th>exec:epp</th>")
	require.Contains(t, html.String(), "ours: external EPP on 127.0.0.1:")
	var table strings.Builder
	require.NoError(t, rep.WriteTable(&table))
	require.Contains(t, table.String(), "requests counted by its inference_objective_request_total")
}

// TestRaceExecEPPSideBySide: with Options.EPPs 2 an exec: EPP runs as two
// processes, each in its own directory with its own ports and KV relay,
// both behind the gateway: each routes a share, the report sums their
// counters, and both processes are gone afterwards.
func TestRaceExecEPPSideBySide(t *testing.T) {
	bin := launchtest.EPPBinary(t)
	dir := t.TempDir()
	o := raceOptions(t)
	o.EPPs = 2
	o.Policies = []string{"exec:pair=" + eppCommand(bin, "precise") + " -kv-events-bind {kv_events_bind}"}
	settle := 500 * time.Millisecond
	inner := rig.EPPLauncher(o.Log, rig.ExternalOptions{Dir: dir, Settle: &settle})
	var routed []float64
	launch := func(ctx context.Context, policy string, fleet []endpoint.Endpoint, epps int) (rig.Target, error) {
		tg, err := inner(ctx, policy, fleet, epps)
		if err != nil {
			return nil, err
		}
		return countingTarget{externalTarget: tg.(externalTarget), routed: &routed}, nil
	}
	rep, err := Run(context.Background(), o, launch)
	require.NoError(t, err)
	pr := rep.Results[0]
	require.Zero(t, pr.Errors, pr.FirstError)
	require.Equal(t, 2, pr.EPPs)
	require.Len(t, routed, 2)
	for _, n := range routed {
		require.Positive(t, n, "each process routes a share: %v", routed)
	}
	require.Equal(t, float64(rep.Requests), pr.EPP.Requests, "the two counters summed saw every request")
	require.Len(t, strings.Split(pr.EPP.Addr, ", "), 2)
	require.Len(t, strings.Split(pr.EPP.KVEventsBind, ", "), 2)
	require.Positive(t, pr.EPP.KVBatchesRelayed)
	require.Equal(t, "omnious_extproc_route_duration_seconds", pr.EPP.DecisionHistogram)
	require.Greater(t, pr.DecisionP99us, 0.0)
	for _, sub := range []string{"1", "2"} {
		cmd, err := os.ReadFile(filepath.Join(dir, "pair", sub, "command"))
		require.NoError(t, err)
		m := grpcAddrRE.FindStringSubmatch(string(cmd))
		require.NotNil(t, m, string(cmd))
		require.Contains(t, pr.EPP.Addr, m[1])
		leak.RequireFree(t, m[1])
		require.FileExists(t, filepath.Join(dir, "pair", sub, "epp.log"))
	}
}

// externalTarget is what the rig's exec: target offers besides a Target.
type externalTarget interface {
	rig.Target
	EPPCount() int
	Info(context.Context) *rig.EPPInfo
	Metrics(context.Context) ([][]byte, error)
}

// countingTarget reads each external member's routed-request counter just
// before the target closes.
type countingTarget struct {
	externalTarget
	routed *[]float64
}

func (t countingTarget) Close() error {
	members, err := t.Metrics(context.Background())
	var pages []func() (io.Reader, error)
	for _, b := range members {
		pages = append(pages, func() (io.Reader, error) { return bytes.NewReader(b), nil })
	}
	n, rerr := readCounter(pages, "inference_objective_request_total")
	*t.routed = n
	return errors.Join(err, rerr, t.externalTarget.Close())
}

// TestRaceExecEPPFailsClearly: a command that dies at start is reported
// as the policy's first error, with its output; the run goes on.
func TestRaceExecEPPFailsClearly(t *testing.T) {
	o := smallOptions(t)
	o.Policies = []string{"exec:broken=echo no such flag -x >&2; exit 2", "round-robin"}
	rep, err := Run(context.Background(), o, rig.EPPLauncher(o.Log, rig.ExternalOptions{Dir: t.TempDir()}))
	require.NoError(t, err)
	require.Equal(t, rep.Requests, rep.Results[0].Errors)
	require.Equal(t, rig.KindExec, rep.Results[0].Kind)
	require.Contains(t, rep.Results[0].FirstError, "exited during start-up")
	require.Contains(t, rep.Results[0].FirstError, "no such flag -x")
	require.Zero(t, rep.Results[1].Errors, rep.Results[1].FirstError)
}

// urlFleet starts replicas the bench did not start, as real endpoints are,
// and returns them and their base URLs.
func urlFleet(t *testing.T, replicas int) ([]endpoint.Endpoint, []string) {
	o := smallOptions(t)
	o.Fleet.Replicas = replicas
	o = o.WithDefaults()
	f, err := rig.StartFleet(context.Background(), o.Fleet, 1, 1000, o.Log)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, f.Stop()) })
	var urls []string
	for _, ep := range f.Endpoints() {
		urls = append(urls, "http://"+ep.Addr)
	}
	return f.Endpoints(), urls
}

// TestRaceAddrEPP races bin/epp that the test started itself, configured
// for a fleet of real endpoints (addr:): the bench waits for its health,
// scrapes its metrics, and leaves it running.
func TestRaceAddrEPP(t *testing.T) {
	eps, urls := urlFleet(t, 2)
	sc, err := launch.Tuning{Policy: "precise", ScrapeInterval: rig.ScrapeInterval, ScrapeTimeout: rig.ScrapeInterval}.Config()
	require.NoError(t, err)
	e, err := launch.StartProcess(launch.ProcessConfig{Spec: launch.Spec{Scheduler: sc, Endpoints: eps, Tokenizer: launch.TokenizerStandIn,
		DrainTimeout: time.Second}, Bin: launchtest.EPPBinary(t), Dir: t.TempDir()})
	require.NoError(t, err)
	defer func() { require.NoError(t, e.Stop()) }()
	_, err = e.WaitReady(context.Background(), len(eps))
	require.NoError(t, err)

	o := smallOptions(t)
	o.Fleet = rig.FleetOptions{Mode: rig.FleetURLs, URLs: urls}
	o.Workload.SharedPrefix.QPS = []float64{10}
	metrics := strings.TrimSuffix(strings.TrimPrefix(e.MetricsURL(), "http://"), "/metrics")
	o.Policies = []string{"addr:mine=" + e.GRPCAddr() + "+" + metrics, "addr:" + e.GRPCAddr()}
	settle := time.Duration(0)
	rep, err := Run(context.Background(), o, rig.EPPLauncher(o.Log, rig.ExternalOptions{Dir: t.TempDir(), Settle: &settle}))
	require.NoError(t, err)
	mine, bare := rep.Results[0], rep.Results[1]
	require.Equal(t, "mine", mine.Policy)
	require.Equal(t, "addr:"+e.GRPCAddr(), bare.Policy)
	for _, pr := range rep.Results {
		require.Equal(t, rig.KindAddr, pr.Kind)
		require.Zero(t, pr.Errors, pr.FirstError)
		require.Greater(t, pr.HitRate, 0.0, "the engines' counters are read as for any policy")
		require.Equal(t, e.GRPCAddr(), pr.EPP.Addr)
		require.Empty(t, pr.EPP.Log, "not started by the bench: no log of its own")
	}
	require.Equal(t, float64(rep.Requests), mine.EPP.Requests)
	require.Greater(t, mine.DecisionP99us, 0.0)
	require.Empty(t, bare.EPP.MetricsURL, "no metrics address given")
	require.True(t, isNaN(bare.DecisionP99us))
	require.Contains(t, describeEPP(bare.EPP), "metrics not known")

	// The bench did not stop it.
	require.NoError(t, e.WaitServing(context.Background(), 5*time.Second))
}

func isNaN(f float64) bool { return f != f }

// echoHeaders is a stream interceptor that makes an ext_proc server set
// every request header back in its routing reply, pseudo-headers and host
// included, as llm-d-router's EPP does with the headers Envoy sent it.
func echoHeaders(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	return handler(srv, &echoing{ServerStream: ss})
}

// echoing is one stream of echoHeaders; the Floor receives and sends on
// one goroutine.
type echoing struct {
	grpc.ServerStream
	seen []*corev3.HeaderValue
}

func (e *echoing) RecvMsg(m any) error {
	err := e.ServerStream.RecvMsg(m)
	if req, ok := m.(*extprocv3.ProcessingRequest); ok && err == nil && req.GetRequestHeaders() != nil {
		e.seen = req.GetRequestHeaders().GetHeaders().GetHeaders()
	}
	return err
}

func (e *echoing) SendMsg(m any) error {
	resp, _ := m.(*extprocv3.ProcessingResponse)
	if hm := resp.GetRequestHeaders().GetResponse().GetHeaderMutation(); hm != nil {
		for _, h := range e.seen {
			hm.SetHeaders = append(hm.SetHeaders, &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: h.Key, RawValue: h.RawValue}})
			if h.Key == ":authority" {
				hm.SetHeaders = append(hm.SetHeaders, &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: "host", RawValue: h.RawValue}})
			}
		}
	}
	return e.ServerStream.SendMsg(m)
}

// TestRaceEchoingEPP: an EPP that echoes the request's headers in its
// routing reply (":method", ":authority", "host" among them) fails no
// request behind the test gateway, which ignores those mutations as Envoy
// does under its default header-mutation rules.
func TestRaceEchoingEPP(t *testing.T) {
	eps, urls := urlFleet(t, 2)
	var dests []string
	for _, ep := range eps {
		dests = append(dests, ep.Addr)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := grpc.NewServer(grpc.StreamInterceptor(echoHeaders))
	extprocv3.RegisterExternalProcessorServer(srv, &testgw.Floor{Dests: dests})
	hs := health.NewServer()
	hs.SetServingStatus(testgw.HealthService, healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(srv, hs)
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()

	o := smallOptions(t)
	o.Log = zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))
	o.Fleet = rig.FleetOptions{Mode: rig.FleetURLs, URLs: urls}
	o.Workload.SharedPrefix.QPS = []float64{10}
	o.Policies = []string{"addr:echo=" + lis.Addr().String()}
	rejected := testgw.RejectedMutations()
	settle := time.Duration(0)
	rep, err := Run(context.Background(), o, rig.EPPLauncher(o.Log, rig.ExternalOptions{Dir: t.TempDir(), Settle: &settle}))
	require.NoError(t, err)
	pr := rep.Results[0]
	require.Zero(t, pr.Errors, pr.FirstError)
	require.Equal(t, rep.Requests, pr.Requests)
	// :method, :authority, :scheme and host are ignored in every reply.
	require.GreaterOrEqual(t, testgw.RejectedMutations()-rejected, int64(4*rep.Requests))
}

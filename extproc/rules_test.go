package extproc

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/omnious/provider-node/endpoint"
	enginemetrics "github.com/omnious/provider-node/engines/metrics"
	"github.com/omnious/provider-node/kvindex"
	"github.com/omnious/provider-node/rules"
	"github.com/omnious/provider-node/scheduler"
)

func p32(v int32) *int32 { return &v }

// schedBands are the scheduler's default bands as the rules see them.
func schedBands() []rules.Band {
	var out []rules.Band
	for _, b := range scheduler.DefaultConfig().Admission.Bands {
		out = append(out, rules.Band{Name: b.Name, Priority: b.Priority})
	}
	return out
}

func ruleStore(t testing.TB, spec *rules.Spec) *rules.Store {
	t.Helper()
	st := rules.NewStore(schedBands(), scheduler.DefaultConfig().Admission.DefaultBand)
	require.NoError(t, st.Set("test", spec))
	return st
}

// TestRulesObjectiveBand: the objective a request names picks its band by
// priority; a header naming no objective is taken as a band name, as
// before rules existed.
func TestRulesObjectiveBand(t *testing.T) {
	st := ruleStore(t, &rules.Spec{Objectives: []rules.Objective{
		{Name: "batch", Priority: p32(100)},
		{Name: "interactive", Priority: p32(450)},
		{Name: "standard"},
	}})
	p := &fakePicker{addrs: []string{ep1}}
	s := NewServer(Config{}, p, nil, nil, zap.NewNop())
	s.SetRules(st, nil)
	c := serve(t, Config{}, s)
	for _, objective := range []string{"batch", "interactive", "standard", "silver", ""} {
		hdr := chatHeaders()
		if objective != "" {
			hdr = chatHeaders("x-gateway-inference-objective", objective)
		}
		var strip []string
		if objective != "" {
			strip = []string{"x-gateway-inference-objective"}
		}
		require.NoError(t, runSteps(t, c, []step{
			{hdr, nil},
			{reqBody(chatBody, true), []*extprocv3.ProcessingResponse{expRouted(ep1, strconv.Itoa(len(chatBody)), strip...), expReqBody(chatBody, true)}},
		}))
	}
	reqs, _ := p.snapshot()
	var bands []string
	for _, r := range reqs {
		bands = append(bands, r.Band)
	}
	require.Equal(t, []string{"bronze", "platinum", "gold", "silver", ""}, bands)
}

// TestRulesRewrite: a rewrite rule and an alias change the model the
// engine gets (body and Content-Length rewritten) and the response names
// the client's model again; a rule wins over the rewrite header.
func TestRulesRewrite(t *testing.T) {
	to := func(model string) string { return strings.Replace(chatBody, `"model":"m1"`, `"model":"`+model+`"`, 1) }
	resp := func(model string) string { return strings.Replace(jsonResp, `"model":"m1"`, `"model":"`+model+`"`, 1) }
	evTo := func(model string) string { return strings.Replace(ev1, `"model":"m1"`, `"model":"`+model+`"`, 1) }
	spec := &rules.Spec{
		Rewrites: []rules.Rewrite{{Name: "canary", Rules: []rules.Rule{
			{Matches: []rules.Match{{Model: &rules.ModelMatch{Type: rules.MatchExact, Value: "m1"}}}, Targets: []rules.Target{{ModelRewrite: "m1-canary", Weight: p32(5)}}},
			{Matches: []rules.Match{{Model: &rules.ModelMatch{Value: "short"}}}, Targets: []rules.Target{{ModelRewrite: "big"}}},
		}}},
		Models: []rules.Model{{Name: "qwen2.5-32b", Aliases: []string{"qwen", "big"}}},
	}
	tests := []struct {
		name, client, header, target string
		sse                          bool
	}{
		{"rewrite rule, JSON response", "m1", "", "m1-canary", false},
		{"rewrite rule, SSE response", "m1", "", "m1-canary", true},
		{"a rule wins over the rewrite header", "m1", "m1-lora", "m1-canary", false},
		{"alias", "qwen", "", "qwen2.5-32b", false},
		{"the rewrite header's model is an alias", "x", "qwen", "qwen2.5-32b", false},
		{"a rule's target is an alias", "short", "", "qwen2.5-32b", true},
		{"no rule: unchanged", "m2", "", "m2", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			p := &fakePicker{addrs: []string{ep1}}
			s := NewServer(Config{}, p, nil, reg, zap.NewNop())
			s.SetRules(ruleStore(t, spec), nil)
			c := serve(t, Config{}, s)
			hdr, strip := chatHeaders(), []string(nil)
			if tt.header != "" {
				hdr, strip = chatHeaders(HeaderModelRewrite, tt.header), []string{HeaderModelRewrite}
			}
			in, out := to(tt.client), to(tt.target)
			ctype, upstream, client := "application/json", resp(tt.target), resp(tt.client)
			if tt.sse {
				ctype, upstream, client = "text/event-stream", evTo(tt.target), evTo(tt.client)
			}
			require.NoError(t, runSteps(t, c, []step{
				{hdr, nil},
				{reqBody(in, true), []*extprocv3.ProcessingResponse{expRouted(ep1, strconv.Itoa(len(out)), strip...), expReqBody(out, true)}},
				{okHeaders(ctype), []*extprocv3.ProcessingResponse{expRespHeaders(tt.target != tt.client)}},
				{respBody(upstream, true), []*extprocv3.ProcessingResponse{expRespBody(client, true)}},
			}))
			reqs, _ := p.snapshot()
			require.Equal(t, tt.target, reqs[0].Model)
			want := 0.0
			if tt.client == "m1" || tt.client == "short" {
				want = 1
			}
			require.Equal(t, want, metricValue(t, reg, "inference_extension_model_rewrite_decisions_total", "model_rewrite_name", "canary"))
		})
	}
}

// fallbackFleet is a real scheduler over one replica of "big" and one of
// "small", with "big" falling back to "small".
type fallbackFleet struct {
	sched *scheduler.Scheduler
	reg   *prometheus.Registry
	c     extprocv3.ExternalProcessorClient
}

const (
	bigAddr, smallAddr = "10.0.0.1:8000", "10.0.0.2:8000"
	bigURL, smallURL   = "http://10.0.0.1:8000/metrics", "http://10.0.0.2:8000/metrics"
)

func newFallbackFleet(t *testing.T, withBig bool) *fallbackFleet {
	reg := prometheus.NewRegistry()
	sched, err := scheduler.New(must(scheduler.ParseConfig(nil)), nil, reg, nil)
	require.NoError(t, err)
	targets := []scheduler.Target{{Endpoint: endpoint.Endpoint{Addr: smallAddr, Model: "small", MetricsURL: smallURL}, Replica: 1}}
	if withBig {
		targets = append(targets, scheduler.Target{Endpoint: endpoint.Endpoint{Addr: bigAddr, Model: "big", MetricsURL: bigURL}, Replica: kvindex.Replica(0)})
	}
	sched.SetEndpoints(targets)
	f := &fallbackFleet{sched: sched, reg: reg}
	f.observe(bigURL, 0, nil)
	f.observe(smallURL, 0, nil)
	st := ruleStore(t, &rules.Spec{
		Objectives: []rules.Objective{{Name: "premium", Priority: p32(400)}},
		Models:     []rules.Model{{Name: "big", Aliases: []string{"b"}, Fallbacks: []string{"small"}}},
	})
	s := NewServer(Config{}, sched, nil, reg, zap.NewNop())
	s.SetRules(st, sched)
	f.c = serve(t, Config{}, s)
	return f
}

// observe feeds one scrape result: waiting requests, or a failed scrape.
func (f *fallbackFleet) observe(url string, waiting float64, err error) {
	sm := &enginemetrics.Sample{URL: url, Err: err}
	if err == nil {
		sm.Signals, sm.At = enginemetrics.Signals{Engine: enginemetrics.EngineVLLM, Waiting: waiting}, time.Now()
	}
	f.sched.Observe(sm)
}

// routed is what one request through the fleet came to.
type routed struct {
	dest, body, reason, model string // reason: the response's HeaderReason; model: as the client sees it
	rejected                  *extprocv3.ImmediateResponse
}

// send runs one chat request for model (headers kv added) through a
// whole exchange whose engine answers in the model it was asked for.
func (f *fallbackFleet) send(t *testing.T, model string, kv ...string) routed {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, err := f.c.Process(ctx)
	require.NoError(t, err)
	require.NoError(t, st.Send(chatHeaders(kv...)))
	require.NoError(t, st.Send(reqBody(strings.Replace(chatBody, `"m1"`, `"`+model+`"`, 1), true)))
	first, err := st.Recv()
	require.NoError(t, err)
	if ir := first.GetImmediateResponse(); ir != nil {
		return routed{rejected: ir}
	}
	var r routed
	for _, h := range first.GetRequestHeaders().GetResponse().GetHeaderMutation().GetSetHeaders() {
		if h.Header.Key == HeaderDestination {
			r.dest = string(h.Header.RawValue)
		}
	}
	body, err := st.Recv()
	require.NoError(t, err)
	r.body = string(body.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse().GetBody())
	served := "big"
	if r.dest == smallAddr {
		served = "small"
	}
	require.NoError(t, st.Send(withServed(respHeaders(false, ":status", "200", "content-type", "application/json"), r.dest)))
	rh, err := st.Recv()
	require.NoError(t, err)
	for _, h := range rh.GetResponseHeaders().GetResponse().GetHeaderMutation().GetSetHeaders() {
		if h.Header.Key == HeaderReason {
			r.reason = string(h.Header.RawValue)
		}
	}
	require.NoError(t, st.Send(respBody(strings.Replace(jsonResp, `"m1"`, `"`+served+`"`, 1), true)))
	rb, err := st.Recv()
	require.NoError(t, err)
	out := string(rb.GetResponseBody().GetResponse().GetBodyMutation().GetStreamedResponse().GetBody())
	_, after, _ := strings.Cut(out, `"model":"`)
	r.model, _, _ = strings.Cut(after, `"`)
	require.NoError(t, st.CloseSend())
	_, _ = st.Recv()
	return r
}

func (f *fallbackFleet) fallbacks(t *testing.T, reason string) float64 {
	return metricValue(t, f.reg, "omnious_extproc_model_fallbacks_total", "reason", reason)
}

// TestRulesFallback covers each condition that sends a request to its
// model's fallback, and those that do not.
func TestRulesFallback(t *testing.T) {
	smallBody := strings.Replace(chatBody, `"m1"`, `"small"`, 1)
	t.Run("healthy model: no fallback", func(t *testing.T) {
		f := newFallbackFleet(t, true)
		got := f.send(t, "b")
		require.Equal(t, routed{dest: bigAddr, body: strings.Replace(chatBody, `"m1"`, `"big"`, 1), model: "b"}, got,
			"the alias is resolved and mapped back")
		require.Zero(t, f.fallbacks(t, "no_endpoint")+f.fallbacks(t, "saturated"))
	})
	t.Run("model not served", func(t *testing.T) {
		f := newFallbackFleet(t, false)
		require.Equal(t, routed{dest: smallAddr, body: smallBody, reason: ReasonFallbackNoEndpoint, model: "small"}, f.send(t, "big"),
			"the response names the model that answered")
		require.Equal(t, 1.0, f.fallbacks(t, "no_endpoint"))
	})
	t.Run("every replica's breaker open", func(t *testing.T) {
		f := newFallbackFleet(t, true)
		for range 3 {
			f.observe(bigURL, 0, errors.New("connection refused"))
		}
		require.Equal(t, routed{dest: smallAddr, body: smallBody, reason: ReasonFallbackNoEndpoint, model: "small"}, f.send(t, "b"))
		require.Equal(t, 1.0, f.fallbacks(t, "no_endpoint"))
	})
	t.Run("band past its ceiling", func(t *testing.T) {
		f := newFallbackFleet(t, true)
		f.observe(bigURL, 3.6, nil) // waiting/target_waiting 0.9: past gold's 0.85, under platinum's 1.0
		require.Equal(t, routed{dest: smallAddr, body: smallBody, reason: ReasonFallbackSaturated, model: "small"}, f.send(t, "big"))
		require.Equal(t, 1.0, f.fallbacks(t, "saturated"))
		got := f.send(t, "big", "x-gateway-inference-objective", "premium")
		require.Equal(t, bigAddr, got.dest, "the premium objective's band (platinum) still has room")
		require.Empty(t, got.reason)
		require.Equal(t, 1.0, f.fallbacks(t, "saturated"))
	})
	t.Run("no fallback with headroom: the model's own answer", func(t *testing.T) {
		f := newFallbackFleet(t, false)
		for range 3 {
			f.observe(smallURL, 0, errors.New("connection refused"))
		}
		got := f.send(t, "big")
		require.NotNil(t, got.rejected)
		require.Equal(t, int32(404), int32(got.rejected.Status.Code))
		require.Zero(t, f.fallbacks(t, "no_endpoint"))
	})
}

package extproc

import (
	"context"
	"strconv"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/omnious/provider-node/endpoint"
	"github.com/omnious/provider-node/scheduler"
)

// TestClientValuesAreBounded sends 100,000 requests, each with a model
// name, an alias (a rewrite to the served model) and a tenant nobody sent
// before: past the bounds, neither the server's sets nor any metric's series
// count grows.
func TestClientValuesAreBounded(t *testing.T) {
	reg := prometheus.NewRegistry()
	sched, err := scheduler.New(must(scheduler.ParseConfig(nil)), nil, reg, nil)
	require.NoError(t, err)
	sched.SetEndpoints([]scheduler.Target{{Endpoint: endpoint.Endpoint{Addr: ep1, Model: "m1"}}})
	s := NewServer(Config{}, sched, NewStandInPrompter(), reg, zap.NewNop())

	series := func() map[string]int {
		mfs, err := reg.Gather()
		require.NoError(t, err)
		n := map[string]int{}
		for _, mf := range mfs {
			n[mf.GetName()] = len(mf.GetMetric())
		}
		return n
	}
	send := func(i int) {
		st := &stream{s: s, ctx: context.Background(), send: func(*extprocv3.ProcessingResponse) error { return nil },
			reqMode: s.defaultMode(), respMode: s.defaultMode()}
		id := strconv.Itoa(i)
		var steps []*extprocv3.ProcessingRequest
		if i%2 == 0 {
			// A model nobody serves: 404 before routing.
			steps = []*extprocv3.ProcessingRequest{
				chatHeaders("x-gateway-inference-fairness-id", "tenant-"+id),
				reqBody(`{"model":"nobody-`+id+`",`+msgs+`}`, true),
			}
		} else {
			// A fresh alias rewritten to the served model, with usage.
			steps = []*extprocv3.ProcessingRequest{
				chatHeaders("x-gateway-inference-fairness-id", "tenant-"+id, HeaderModelRewrite, "m1"),
				reqBody(`{"model":"alias-`+id+`","stream":true,`+msgs+`}`, true),
				okHeaders("text/event-stream"), respBody(ev1+evUsage, true),
			}
		}
		for _, m := range steps {
			require.NoError(t, st.handle(m))
		}
		st.close(nil)
	}
	const n = 100_000
	for i := range n / 2 {
		send(i)
	}
	half := series()
	for i := n / 2; i < n; i++ {
		send(i)
	}
	require.Equal(t, half, series(), "no metric grew past the bounds")
	require.LessOrEqual(t, s.models.Len(), maxModelLabels)
	require.LessOrEqual(t, s.aliases.Len(), maxAliasLabels)
	require.LessOrEqual(t, s.approxModels.Len(), maxApproxModels)
	require.LessOrEqual(t, series()["omnious_epp_tenant_tokens_total"], 3*(100+2), "100 tenants, other and default-flow")
	require.Equal(t, float64(n/2), metricValue(t, reg, "inference_objective_request_error_total", "model_name", unknownLabel),
		"every unserved model is counted under unknown")
}

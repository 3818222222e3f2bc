package extproc

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/omnious/provider-node/endpoint"
	"github.com/omnious/provider-node/rules"
	"github.com/omnious/provider-node/scheduler"
)

// BenchmarkApplyRules is the rules' share of one request's routing: the
// table lookups (and, for fallback, two Headroom probes of the real
// scheduler) between the body parse and Admit.
func BenchmarkApplyRules(b *testing.B) {
	spec := &rules.Spec{
		Objectives: []rules.Objective{{Name: "batch", Priority: p32(100)}},
		Rewrites: []rules.Rewrite{{Name: "canary", Rules: []rules.Rule{{
			Matches: []rules.Match{{Model: &rules.ModelMatch{Value: "m1"}}},
			Targets: []rules.Target{{ModelRewrite: "m1-canary", Weight: p32(10)}, {ModelRewrite: "m1", Weight: p32(90)}},
		}}}},
		Models: []rules.Model{{Name: "big", Aliases: []string{"b"}, Fallbacks: []string{"small"}}},
	}
	sched, err := scheduler.New(must(scheduler.ParseConfig(nil)), nil, prometheus.NewRegistry(), nil)
	if err != nil {
		b.Fatal(err)
	}
	sched.SetEndpoints([]scheduler.Target{{Endpoint: endpoint.Endpoint{Addr: smallAddr, Model: "small"}}})
	tests := []struct {
		name, band, model string
		rules             bool
	}{
		{"no rules", "", "m2", false},
		{"no rule matches", "", "m2", true},
		{"objective and weighted rewrite", "batch", "m1", true},
		{"alias, fallback", "", "b", true},
	}
	for _, tt := range tests {
		b.Run(tt.name, func(b *testing.B) {
			s := NewServer(Config{}, sched, nil, prometheus.NewRegistry(), zap.NewNop())
			if tt.rules {
				s.SetRules(ruleStore(b, spec), sched)
			}
			st := &stream{s: s}
			b.ReportAllocs()
			for b.Loop() {
				st.band, st.clientModel, st.targetModel, st.fallback = tt.band, tt.model, tt.model, ""
				st.applyRules()
			}
		})
	}
}

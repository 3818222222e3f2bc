package scheduler

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/omnious/provider-node/engines/metrics"
)

// TestHeadroom: four replicas, 0-1 serving testModel and 2-3 "other", with
// target_waiting 4, so a replica's waiting/4 is its saturation.
func TestHeadroom(t *testing.T) {
	e := newEnv(t, 4, func(c *Config) { c.Admission.Enabled = ptr(true) })
	eps := endpoints(4, testModel)
	eps[2].Model, eps[3].Model = "other", "other"
	e.s.SetEndpoints(eps)
	e.freshAll()
	trip := func(i int) {
		for range e.s.cfg.Breaker.FailureThreshold {
			e.rep(i).br.request(false, e.clock.Now(), e.s.cfg.Breaker.FailureThreshold)
		}
	}
	type probe struct {
		model, band string
		subset      []string
		want        Headroom
	}
	tests := []struct {
		name   string
		set    func()
		probes []probe
	}{
		{"idle pool", func() {}, []probe{
			{testModel, "gold", nil, HeadroomOK},
			{testModel, "", nil, HeadroomOK},
			{"unknown", "gold", nil, HeadroomNoEndpoint},
			{testModel, "gold", []string{addr(2)}, HeadroomNoEndpoint},
			{testModel, "gold", []string{addr(1)}, HeadroomOK},
		}},
		{"one model's replicas busy", func() {
			e.setSignals(0, metrics.Signals{Waiting: 3.6})
			e.setSignals(1, metrics.Signals{Waiting: 3.6})
		}, []probe{
			{testModel, "gold", nil, HeadroomSaturated}, // 0.9 >= 0.85
			{testModel, "platinum", nil, HeadroomOK},    // 0.9 < 1.0
			{testModel, "unknown-band", nil, HeadroomSaturated},
			{"other", "bronze", nil, HeadroomOK}, // the pool's mean (0.45) is past bronze's 0.30; other's own is 0
		}},
		{"one breaker open: the other replica decides", func() { trip(0); e.setSignals(1, metrics.Signals{}) }, []probe{
			{testModel, "bronze", nil, HeadroomOK},
			{testModel, "gold", []string{addr(0)}, HeadroomNoEndpoint},
		}},
		{"every breaker of the model open", func() { trip(1) }, []probe{
			{testModel, "platinum", nil, HeadroomNoEndpoint},
			{"other", "gold", nil, HeadroomOK},
		}},
		{"cooldown passed: half-open is not healthy yet", func() { e.clock.Add(e.s.cfg.Breaker.Cooldown) }, []probe{
			{testModel, "gold", nil, HeadroomNoEndpoint},
		}},
	}
	for _, tt := range tests {
		tt.set()
		for _, p := range tt.probes {
			require.Equal(t, p.want, e.s.Headroom(p.model, p.band, p.subset), "%s: %s in %s %v", tt.name, p.model, p.band, p.subset)
		}
	}
}

func TestHeadroomAdmissionOff(t *testing.T) {
	e := newEnv(t, 1, nil) // newEnv turns admission off
	e.setSignals(0, metrics.Signals{Waiting: 100})
	require.Equal(t, HeadroomOK, e.s.Headroom(testModel, "bronze", nil), "no admission: no band waits")
	require.Equal(t, "saturated", HeadroomSaturated.String())
}

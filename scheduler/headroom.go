package scheduler

// Headroom says whether a request for a model could be served now.
type Headroom uint8

const (
	// HeadroomOK: a healthy replica serves the model and its band is
	// below its ceiling there.
	HeadroomOK Headroom = iota
	// HeadroomNoEndpoint: no replica serves the model (within the subset
	// hint), or every one that does has a breaker that is not closed.
	HeadroomNoEndpoint
	// HeadroomSaturated: the saturation of the model's healthy replicas is
	// at or past the ceiling of the request's band, so admission would
	// hold it.
	HeadroomSaturated
)

var headroomNames = [...]string{HeadroomOK: "ok", HeadroomNoEndpoint: "no_endpoint", HeadroomSaturated: "saturated"}

func (h Headroom) String() string { return headroomNames[h] }

// Headroom reports, without waiting and without changing any state,
// whether a request for model in band (subset as Request.Subset) would find
// a healthy replica with room under the band's ceiling: the question a
// model's fallbacks turn on, asked before Admit.
//
// Saturation is Admit's formula over the model's healthy replicas only, so
// one model's load does not hide another's headroom in a pool serving
// several; Admit itself compares the whole pool's. With admission off no
// band is ever past its ceiling.
func (s *Scheduler) Headroom(model, band string, subset []string) Headroom {
	snap := s.snap.Load()
	_, _, g, err := s.serving(snap, model)
	if err != nil {
		return HeadroomNoEndpoint
	}
	now := s.now()
	healthy := func(r *replica) bool {
		return (subset == nil || inSubset(subset, r.ep.Addr)) && r.br.current(now, s.cfg.Breaker.Cooldown) == BreakerClosed
	}
	sum, n := s.flow.load(g.reps, now, healthy)
	switch {
	case n == 0:
		return HeadroomNoEndpoint
	case s.flow.enabled && sum/float64(n) >= s.flow.band(band).SaturationCeiling:
		return HeadroomSaturated
	}
	return HeadroomOK
}

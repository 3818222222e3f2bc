package scheduler

import "math"

// guard is the imbalance guard: prefix affinity to a replica is abandoned
// only when that replica is both balance_abs requests and balance_rel times
// busier than the least loaded candidate. The absolute test alone would
// fire on an idle pool (2 against 0), the relative one alone on a busy pool
// (200 against 180). It reports whether any affinity was abandoned.
func (s *Scheduler) guard(cands []cand) bool {
	minLoad := math.Inf(1)
	for i := range cands {
		minLoad = min(minLoad, cands[i].load)
	}
	tripped := false
	for i := range cands {
		c := &cands[i]
		if c.prefixOK && guardTrips(c.load, minLoad, *s.cfg.Prefix.BalanceAbs, s.cfg.Prefix.BalanceRel) {
			c.prefixOK = false
			tripped = true
		}
	}
	return tripped
}

func guardTrips(load, minLoad, abs, rel float64) bool {
	return load-minLoad >= abs && load >= rel*minLoad
}

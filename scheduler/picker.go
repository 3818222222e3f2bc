package scheduler

import "math"

// tieEpsilon: scores closer than this are ties, broken at random so equal
// replicas share load instead of the first one taking everything.
const tieEpsilon = 1e-9

// pickPrimary returns the index of the best-scored candidate, ties broken
// uniformly at random; with a positive temperature it samples with
// probability proportional to exp(score/temperature) instead.
func (s *Scheduler) pickPrimary(cands []cand) int {
	if t := s.cfg.Scoring.Temperature; t > 0 && len(cands) > 1 {
		return s.softmax(cands, t)
	}
	return s.pickBest(cands)
}

func (s *Scheduler) pickBest(cands []cand) int {
	best, ties := 0, 1
	for i := 1; i < len(cands); i++ {
		switch d := cands[i].score - cands[best].score; {
		case d > tieEpsilon:
			best, ties = i, 1
		case d >= -tieEpsilon:
			// Reservoir sampling over the tied candidates.
			ties++
			if s.rnd()*float64(ties) < 1 {
				best = i
			}
		}
	}
	return best
}

func (s *Scheduler) softmax(cands []cand, t float64) int {
	hi := math.Inf(-1)
	for i := range cands {
		hi = max(hi, cands[i].score)
	}
	var sum float64
	for i := range cands {
		sum += math.Exp((cands[i].score - hi) / t)
	}
	x := s.rnd() * sum
	for i := range cands {
		x -= math.Exp((cands[i].score - hi) / t)
		if x <= 0 {
			return i
		}
	}
	return len(cands) - 1
}

// rankByLoad scores candidates by load alone (fewest waiting plus in
// flight first), for the baseline policies and their fallbacks.
func (s *Scheduler) rankByLoad(cands []cand) {
	for i := range cands {
		c := &cands[i]
		c.score = -(waitingOf(c) + c.infl)
	}
}

// fallbacks sets sc.order to the primary followed by up to cfg.Fallbacks
// other candidates, best score first (the lower index first among equal
// scores), in one pass that keeps the best so far in order.
func (s *Scheduler) fallbacks(sc *scratch, cands []cand, primary int) {
	n := min(*s.cfg.Fallbacks, len(cands)-1)
	order := append(sc.order[:0], primary)
	for i := range cands {
		if i == primary || n == 0 {
			continue
		}
		v := cands[i].score
		if len(order) > n && !(v > cands[order[n]].score) {
			continue
		}
		if len(order) <= n {
			order = append(order, i)
		}
		j := len(order) - 1
		for ; j > 1 && v > cands[order[j-1]].score; j-- {
			order[j] = order[j-1]
		}
		order[j] = i
	}
	sc.order = order
}

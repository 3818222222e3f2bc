package scheduler

import (
	"math"
	"slices"
	"time"
)

// cand is one candidate replica during a decision. A decision writes and
// reads one per replica several times: it takes one cache line
// (TestCandFitsALine), and what follows from its fields (load, the queue
// and KV scores) is computed where it is used.
type cand struct {
	r      *replica
	sig    *sampled // nil when never scraped
	infl   float64
	queued float64 // requests not started yet, see queuedOf

	prefixShare float64 // tier-weighted share of the prompt, 0..1
	score       float64

	prefixUnits int32 // matched tokens (precise) or bytes (approximate)
	heldUnits   int32 // the index's (and speculative) match when recalled

	stale      bool
	probe      bool // breaker half-open: routing here claims the probe
	admit      bool // the breaker lets it be a candidate
	prefixOK   bool // above min_match and match_ratio, not overridden
	recalled   bool // the match is the routing memory's, longer than the index's
	sessionHit bool
	lora       bool // loraScorer, set by scoreAll for a request for an adapter
}

// filtered is the filter's outcome: the candidates, whether the breaker
// stage was relaxed, whether the candidates are all of the replicas it was
// given in their order (no subset hint, nothing filtered out), and the
// candidates' load sum and least queue, summed in candidate order as
// scoring would (the scorers' mean load and the guard's reference; the
// same order gives the same sum, TestDecisionsGolden).
type filtered struct {
	cands              []cand
	relaxed, whole     bool
	loadSum, minQueued float64
}

// filter builds the candidate list in sc.cands: the replicas serving the
// model, restricted to the subset hint (exact ip:port), without open
// breakers and without replicas above the KV ceiling. Each of the last two
// stages is skipped when it would leave nothing (relaxed reports that the
// breaker stage was): a pool that looks entirely bad still routes.
func (s *Scheduler) filter(sc *scratch, reps []*replica, req *Request, now time.Time) (f filtered, err *Error) {
	// One pass builds the candidates and tallies both stages, for the
	// admitted candidates and for all of them (the KV stage runs on
	// whichever list the breaker stage leaves); a second pass, only when a
	// stage removes something, compacts. The subset and breakers that are
	// not closed, which need calls, are dealt with apart: a call in the
	// loop over every replica spills every register.
	f.whole = req.Subset == nil
	if req.Subset != nil {
		sc.subset = sc.subset[:0]
		for _, r := range reps {
			if inSubset(req.Subset, r.ep.Addr) {
				sc.subset = append(sc.subset, r)
			}
		}
		reps = sc.subset
	}
	cands := slices.Grow(sc.cands[:0], len(reps))[:len(reps)]
	staleBefore := s.staleBefore(now)
	cooldown, targetWaiting := s.cfg.Breaker.Cooldown, s.cfg.Scoring.TargetWaiting
	var all, kept stageTally
	unsure := false // a breaker is not closed
	loadSum, minQueued := 0.0, math.Inf(1)
	for i, r := range reps {
		// Filled in place, not copied from a literal: see matchFirst in
		// kvindex on store forwarding.
		c := &cands[i]
		*c = cand{}
		c.r = r
		c.sig = r.signal()
		c.stale = r.staleAt(c.sig, staleBefore)
		c.infl = float64(r.inflight.Load())
		c.queued = queuedOf(c)
		loadSum += loadOf(c)
		minQueued = min(minQueued, c.queued)
		over, ready := kvOver(c), waitingOf(c) < targetWaiting
		all.add(over, ready)
		if c.admit = r.br.state.Load() == BreakerClosed; c.admit {
			kept.add(over, ready)
		} else {
			unsure = true
		}
	}
	for i := 0; unsure && i < len(cands); i++ {
		if c := &cands[i]; !c.admit {
			if c.admit, c.probe = c.r.br.admit(now, cooldown); c.admit {
				kept.add(kvOver(c), waitingOf(c) < targetWaiting)
			}
		}
	}
	sc.cands = cands
	if len(cands) == 0 {
		return filtered{}, ErrNoEndpoint
	}

	// Breaker stage: without open breakers, unless that leaves nothing.
	relaxed := kept.n == 0
	stage := kept
	if relaxed {
		stage = all
	}
	// KV ceiling stage: stale signals are not trusted to exclude. It only
	// applies while some replica under the ceiling can also start the
	// request soon (engine queue below target_waiting): a replica whose
	// requests wait for prefill holds little KV, and under load it would
	// otherwise become the only candidate and take every request (bench
	// llmd-73: max/mean load 3.0).
	// The agent policy skips it: a replica holding sessions' histories
	// runs with a full cache by design, and the history is there.
	kvStage := stage.over > 0 && stage.over < stage.n && stage.ready && s.cfg.Policy != PolicyAgent
	if stage.n == len(cands) && !kvStage {
		return filtered{cands: cands, relaxed: relaxed, whole: f.whole, loadSum: loadSum, minQueued: minQueued}, nil
	}
	n := 0
	loadSum, minQueued = 0, math.Inf(1)
	for i := range cands {
		c := &cands[i]
		if (relaxed || c.admit) && !(kvStage && kvOver(c)) {
			cands[n] = *c
			loadSum += loadOf(c)
			minQueued = min(minQueued, c.queued)
			n++
		}
	}
	return filtered{cands: cands[:n], relaxed: relaxed, loadSum: loadSum, minQueued: minQueued}, nil
}

// stageTally counts candidates for filter: how many, how many above the
// KV ceiling, and whether one below it has a short queue.
type stageTally struct {
	n, over int
	ready   bool
}

func (t *stageTally) add(over, ready bool) {
	t.n++
	if over {
		t.over++
	} else if ready {
		t.ready = true
	}
}

func kvOver(c *cand) bool { return !c.stale && c.sig != nil && c.sig.over }

// waitingOf is the engine's queue, 0 without a sample.
func waitingOf(c *cand) float64 {
	if c.sig == nil {
		return 0
	}
	return c.sig.waiting
}

// loadOf is a replica's load in requests: what the EPP has routed and not
// seen finish, or what the engine reports running and waiting if that is
// more (other routers, or requests the EPP has lost track of). Engine
// metrics lag by up to a scrape interval; the in-flight count does not.
func loadOf(c *cand) float64 {
	load := c.infl
	if c.sig != nil && !c.stale {
		load = max(load, c.sig.engine)
	}
	return load
}

// queuedOf is how many of a replica's requests have not started: the
// engine's waiting queue plus what the EPP routed since that sample (not
// yet seen either running or waiting), or the EPP's in-flight count when
// there is no fresh sample. A batching engine runs up to max_num_seqs
// requests in one step, so its running requests share the GPU rather than
// wait for it: only the queue is a hot spot.
func queuedOf(c *cand) float64 {
	if c.sig == nil || c.stale {
		return c.infl
	}
	return c.sig.waiting + max(c.infl-float64(c.r.inflightAtSample.Load()), 0)
}

func inSubset(subset []string, addr string) bool {
	for _, a := range subset {
		if a == addr {
			return true
		}
	}
	return false
}

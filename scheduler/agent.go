package scheduler

import (
	"math"
	"time"
)

// The agent policy places the calls of sessions: chains of calls that
// share one growing history (an agent's system prompt and tool schema,
// then every output and tool result so far). Its rule, in seconds of
// prefill work:
//
//	work(r)  = (pending(r) + uncached(r)) / rate(r)
//	holder   = the session's last replica (session header); without a
//	           key, the one candidate holding a longer prefix than any
//	           other; else a new session: least work, then fewest placed
//	stay     on the least-worked holder while work(holder) <= ttft_objective
//	else     the candidate of least work; a session that leaves a holder
//	         is a move (omnious_epp_session_moves_total)
//
// pending(r) is the uncached prompt tokens this EPP routed to r that have
// not finished, uncached(r) what of this prompt r does not hold, and
// rate(r) r's prefill rate as its capacity curve measured it
// (sessions.prefill_rate until then). A holder is left only when its own
// queue of prefill work, not its cache, makes the call miss the TTFT
// objective: re-prefilling the history elsewhere costs the whole history
// (TestAgentStayMove).

// agentView is what the rule reads of one candidate.
type agentView struct {
	pending, uncached float64 // tokens
	rate              float64 // tokens per second, > 0
	// placed is how many new sessions were placed on the replica: among
	// replicas of equal work a new session goes to the fewest.
	placed int64
	holder bool
}

// work is the view's prefill work in seconds, this call's included.
func (v agentView) work() float64 { return (v.pending + v.uncached) / v.rate }

// agentRule returns the chosen candidate among views, whether it is a
// holder's, and whether the session moved (had holders and left them).
// ties are broken by tie(n), which returns 0..n-1. objective is in
// seconds.
func agentRule(views []agentView, objective float64, tie func(n int) int) (best int, stayed, moved bool) {
	pick := func(holdersOnly bool) (int, float64) {
		best, bestW, ties := -1, math.Inf(1), 0
		for i, v := range views {
			if holdersOnly && !v.holder {
				continue
			}
			switch w := v.work(); {
			case best < 0 || w < bestW-tieEpsilon || (w <= bestW+tieEpsilon && v.placed < views[best].placed):
				best, bestW, ties = i, w, 1
			case w <= bestW+tieEpsilon && v.placed == views[best].placed:
				ties++
				if tie(ties) == 0 {
					best = i
				}
			}
		}
		return best, bestW
	}
	h, hw := pick(true)
	if h >= 0 && hw <= objective {
		return h, true, false
	}
	b, _ := pick(false)
	return b, false, h >= 0 && !views[b].holder
}

// unitsPerToken converts the agent policy's units to tokens: precise
// matching counts tokens, approximate bytes (about 4 per token in English
// text and code).
func unitsPerToken(mode string) float64 {
	if mode == ModeApproximate {
		return 4
	}
	return 1
}

// agentPick applies agentRule to the scored candidates (matchPrefix has
// filled their matches) and returns the primary and the decision reason.
// It also sets every candidate's score to minus its work, so the
// fallbacks are the least-worked other replicas.
func (s *Scheduler) agentPick(sc *scratch, cands []cand, req *Request, promptUnits int, mode string, now time.Time) (int, string) {
	perTok := unitsPerToken(mode)
	prompt := float64(promptUnits) / perTok
	minMatch := *s.cfg.Prefix.MinMatch
	if mode == ModeApproximate {
		minMatch = *s.cfg.Prefix.MinMatchBytes
	}
	sessR, known := s.sess.get(req.SessionKey, now)
	byKey := false
	if known {
		for i := range cands {
			if cands[i].r.id == sessR {
				byKey = true
				break
			}
		}
	}
	// Without a known holder, the holder is the one candidate holding a
	// longer prefix than any other: a prefix two replicas hold alike is
	// the shared system prompt and tools (or a history held twice), no
	// reason to stay (TestAgentInfersSessionByPrefix).
	// A key the session memory does not know is a new session.
	longest, second := 0, 0
	if !byKey && req.SessionKey != "" {
		longest = -1
	} else if !byKey {
		for i := range cands {
			switch u := int(cands[i].prefixUnits); {
			case u > longest:
				longest, second = u, longest
			case u > second:
				second = u
			}
		}
		if longest < max(minMatch, 1) || longest == second {
			longest = -1
		}
	}
	views := sc.agent[:0]
	for i := range cands {
		c := &cands[i]
		held := c.prefixUnits
		if c.recalled {
			held = c.heldUnits
		}
		rate := float64frombits(c.r.prefillRate.Load())
		if !(rate > 0) {
			rate = s.cfg.Sessions.PrefillRate
		}
		v := agentView{pending: float64(c.r.pending.Load()), uncached: max(prompt-float64(held)/perTok, 0), rate: rate}
		if byKey {
			v.holder = c.r.id == sessR
		} else {
			v.holder = longest > 0 && int(c.prefixUnits) == longest
		}
		views = append(views, v)
	}
	sc.agent = views
	newSession := !byKey && longest < 0
	if newSession {
		// No holder: a new session. Where the
		// shared prefix happens to be cached is no reason to pile new
		// sessions onto one replica, whose cache they would then fight
		// over: each is charged the prompt beyond the longest prefix
		// any candidate holds, and among equal work the replica with
		// the fewest sessions placed wins (TestAgentSpreadsNewSessions).
		common := 0
		for i := range cands {
			common = max(common, int(cands[i].prefixUnits))
		}
		for i := range views {
			views[i].holder = false
			views[i].uncached = max(prompt-float64(common)/perTok, 0)
			views[i].placed = cands[i].r.sessionsPlaced.Load()
		}
	}
	for i := range cands {
		cands[i].score = -views[i].work()
	}
	best, stayed, moved := agentRule(views, s.cfg.Sessions.TTFTObjective.Seconds(), func(n int) int { return int(s.rnd() * float64(n)) })
	if newSession {
		cands[best].r.sessionsPlaced.Add(1)
	}
	switch {
	case moved:
		s.m.sessionMoves.Inc()
		return best, ReasonSessionMove
	case stayed && byKey:
		return best, ReasonSession
	case stayed:
		return best, ReasonPrefix
	}
	return best, ReasonCold
}

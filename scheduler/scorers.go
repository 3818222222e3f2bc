package scheduler

import (
	"math"
	"time"

	"github.com/omnious/provider-node/kvindex"
)

// The scorers. Each maps one signal to 0..1 (1 = best); scoreAll weights
// and sums them in this order: prefix, queue, inflight, kv, session, lora.
// Load scorers use target/(target+x): 1 when idle, 0.5 at the target,
// never 0, so a busy replica stays comparable with a busier one.

// prefixScorer is the tier-weighted share of the prompt the replica holds,
// counted only when the match passed min_match and match_ratio and the
// imbalance guard did not override it.
func prefixScorer(c *cand) float64 {
	if !c.prefixOK {
		return 0
	}
	return clamp01(c.prefixShare)
}

// queueScorer scores the requests a replica has not started (queuedOf:
// the engine's waiting queue and what this EPP routed since that scrape)
// against target_waiting.
func queueScorer(queued, target float64) float64 { return target / (target + max(queued, 0)) }

// inflightScorer scores the EPP's in-flight count against target_inflight.
func inflightScorer(inflight, target float64) float64 { return target / (target + max(inflight, 0)) }

// kvScorer is the KV headroom below kv_ceiling: 1 when empty, 0 at or above
// the ceiling.
func kvScorer(kv, ceiling float64) float64 { return clamp01(1 - kv/ceiling) }

// sessionScorer is 1 for the session's replica while its load is at most
// session_load_factor times the mean plus one request (the one in hand), so
// a session leaves a replica that has become hot but not over jitter.
func sessionScorer(isSessionReplica bool, load, meanLoad, factor float64) float64 {
	if isSessionReplica && load <= factor*meanLoad+1 {
		return 1
	}
	return 0
}

// loraScorer is 1 when the adapter is already loaded (running or waiting)
// on the replica: no load, no eviction of another adapter.
func loraScorer(c *cand, adapter string) float64 {
	if adapter != "" && c.sig != nil && c.sig.sm.Signals.HasAdapter(adapter) {
		return 1
	}
	return 0
}

func clamp01(v float64) float64 {
	switch {
	case v < 0 || math.IsNaN(v):
		return 0
	case v > 1:
		return 1
	}
	return v
}

// matchPrefix fills each candidate's prefix match and returns the mode and
// the prompt size in the mode's units (tokens or bytes; 0 when unknown).
// Precise matching keys the tokens under the (base model, adapter, salt)
// root the KV-event ingestion uses, then adds speculative credits and the
// routing memory.
func (s *Scheduler) matchPrefix(sc *scratch, snap *snapshot, cands []cand, req *Request, base, adapter string, now time.Time) (string, int) {
	sc.keys, sc.matches, sc.hits, sc.hashes, sc.seen = sc.keys[:0], sc.matches[:0], sc.hits[:0], sc.hashes[:0], sc.seen[:0]
	precise := (s.cfg.Policy == PolicyPrecise || s.cfg.Policy == PolicyAgent) && s.ix != nil && req.HasTokens()
	if !precise && len(req.PromptText) == 0 {
		if req.HasTokens() {
			return ModePrecise, 0
		}
		return ModeApproximate, 0
	}
	byID := sc.pos
	if byID == nil {
		if cap(sc.byID) <= snap.maxID {
			sc.byID = make([]int32, snap.maxID+1)
		}
		byID = sc.byID[:snap.maxID+1]
		for i := range cands {
			byID[cands[i].r.id] = int32(i + 1)
		}
		defer func() {
			for i := range cands {
				byID[cands[i].r.id] = 0
			}
		}()
	}

	if precise {
		bs := s.cfg.BlockSize
		n := req.TokenCount()
		root := kvindex.RootKey(base, adapter, req.CacheSalt)
		lookupStart := time.Now()
		sc.keys = s.keys.AppendPrefixKeys(sc.keys, root, req.Prefix, req.Tokens)
		sc.matches = s.ix.Match(sc.keys, sc.matches)
		s.m.lookup.Observe(time.Since(lookupStart).Seconds())
		cpuW, storageW := *s.cfg.Prefix.CPUWeight, *s.cfg.Prefix.StorageWeight
		longest := 0 // the longest match of any candidate, see below
		for _, m := range sc.matches {
			if j := candOf(byID, m.Replica); j > 0 {
				c := &cands[j-1]
				eff := float64(m.ByTier[kvindex.TierGPU]) + cpuW*float64(m.ByTier[kvindex.TierCPU]) +
					storageW*float64(m.ByTier[kvindex.TierStorage])
				c.prefixUnits = int32(m.Blocks * bs)
				c.prefixShare = eff * float64(bs) / float64(n)
				longest = max(longest, int(c.prefixUnits))
			}
		}
		sc.hits = s.spec.match(sc.keys, now, sc.hits)
		for _, h := range sc.hits {
			if j := candOf(byID, h.r); j > 0 {
				c := &cands[j-1]
				if u := h.n * bs; u > int(c.prefixUnits) {
					c.prefixUnits = int32(u)
					c.prefixShare = float64(u) / float64(n)
					longest = max(longest, u)
				}
			}
		}
		// The routing memory: where the prefix was routed, for as long as
		// approximate records last. A replica that evicted it is still
		// credited, so it recomputes the prefix rather than see the group
		// copied by load onto another replica, where the copy would evict
		// what that one holds: under cache pressure copies that chase each
		// other cost more hits than the recomputation. It extends only the
		// longest match any candidate has (none at all: the index shows the
		// prefix nowhere): a replica the index shows holding part of the
		// prompt wins over one the memory recalls but the index shows
		// without it, which would have to recompute the part held
		// elsewhere, a copy made by routing there.
		sc.hashes = strideKeys(sc.hashes, sc.keys)
		sc.hits, sc.seen = s.recall.match(sc.hashes, now, sc.hits[:0], sc.seen, func(i int) int { return strideBlocks(i, len(sc.keys)) })
		for _, h := range sc.hits {
			if j := candOf(byID, h.r); j > 0 {
				c := &cands[j-1]
				if u := h.n * bs; int(c.prefixUnits) == longest && u > int(c.prefixUnits) {
					c.heldUnits = c.prefixUnits
					c.prefixUnits = int32(u)
					c.prefixShare = float64(u) / float64(n)
					c.recalled = true
				}
			}
		}
		return ModePrecise, n
	}
	n := len(req.PromptText)
	sc.hashes = s.approx.chunkHashes(sc.hashes, req.PromptText)
	sc.hits, sc.seen = s.approx.matchText(sc.hashes, n, now, sc.hits, sc.seen)
	for _, h := range sc.hits {
		if j := candOf(byID, h.r); j > 0 {
			c := &cands[j-1]
			c.prefixUnits = int32(h.n)
			c.prefixShare = float64(h.n) / float64(n)
		}
	}
	return ModeApproximate, n
}

// scoreAll applies the thresholds, the imbalance guard (guardTrips) and
// every scorer in one pass over the candidates, with the load sum and the
// least queue the filter tallied; it reports whether the guard overrode
// an affinity.
func (s *Scheduler) scoreAll(cands []cand, f *filtered, req *Request, adapter string, promptUnits int, mode string, now time.Time) bool {
	sc := &s.cfg.Scoring
	minMatch := *s.cfg.Prefix.MinMatch
	if mode == ModeApproximate {
		minMatch = *s.cfg.Prefix.MinMatchBytes
	}
	minRatio := *s.cfg.Prefix.MatchRatio * float64(promptUnits)
	meanLoad, minQueued := f.loadSum/float64(len(cands)), f.minQueued
	balanceAbs, balanceRel := *s.cfg.Prefix.BalanceAbs, s.cfg.Prefix.BalanceRel
	override := false

	sessR, hasSess := s.sess.get(req.SessionKey, now)
	w := weights{
		prefix: *sc.Weights.Prefix, queue: *sc.Weights.Queue, inflight: *sc.Weights.Inflight,
		kv: *sc.Weights.KV, session: *sc.Weights.Session, lora: *sc.Weights.LoRA,
	}
	// loraScorer calls out of line (it reads the adapter lists): in a pass
	// of its own, only requests for an adapter pay for it, and the scoring
	// loop has no call in it, which would spill every register.
	if adapter != "" {
		for i := range cands {
			cands[i].lora = loraScorer(&cands[i], adapter) > 0
		}
	}
	targetWaiting := sc.TargetWaiting
	idleQueue, idleKV := queueScorer(0, targetWaiting), kvScorer(0, sc.KVCeiling)
	for i := range cands {
		c := &cands[i]
		c.prefixOK = promptUnits > 0 && c.prefixUnits > 0 && int(c.prefixUnits) >= minMatch &&
			float64(c.prefixUnits) >= minRatio
		if c.prefixOK && guardTrips(c.queued, minQueued, balanceAbs, balanceRel) {
			c.prefixOK, override = false, true
		}
		// Without a sample, an idle replica's queue and KV scores. With
		// one, what was routed since the sample has not been seen to
		// start: scored on the sample's queue alone, every decision
		// between two scrapes would see the same best replica.
		queueScore, kvScore := idleQueue, idleKV
		if c.sig != nil {
			queueScore, kvScore = queueScorer(c.queued, targetWaiting), c.sig.kvScore
		}
		sess := 0.0
		if hasSess && c.r.id == sessR {
			sess = sessionScorer(true, loadOf(c), meanLoad, sc.SessionLoadFactor)
		}
		c.sessionHit = sess > 0 && w.session > 0
		total := w.prefix*prefixScorer(c) +
			w.queue*queueScore +
			w.inflight*inflightScorer(c.infl, sc.TargetInflight) +
			w.kv*kvScore +
			w.session*sess +
			w.lora*b2f(c.lora)
		if c.stale {
			total *= *sc.StaleFactor
		}
		c.score = total
		// An atomic store is a full barrier on amd64, dear per replica
		// per decision; most replicas' scores are what they were.
		if b := math.Float64bits(total); c.r.score.Load() != b {
			c.r.score.Store(b)
		}
	}
	return override
}

// candOf returns 1 + the candidate index of replica r, 0 when r is not a
// candidate (filtered, or an id the snapshot does not know: the index and
// the prefix records may name replicas that have left).
func candOf(byID []int32, r kvindex.Replica) int32 {
	if int(r) < len(byID) {
		return byID[r]
	}
	return 0
}

type weights struct{ prefix, queue, inflight, kv, session, lora float64 }

func float64frombits(b uint64) float64 { return math.Float64frombits(b) }

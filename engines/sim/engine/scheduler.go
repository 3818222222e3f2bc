package engine

import (
	"time"

	"go.uber.org/zap"

	"github.com/omnious/provider-node/engines/kvevents"
)

type scheduled struct {
	r *request
	n int // tokens computed this step
}

// scheduleLocked plans one step. The step's effects on the cache and queues
// are applied at once; its tokens are delivered by commit at the step's end.
func (e *Engine) scheduleLocked() plan {
	if len(e.running) == 0 && len(e.waiting) == 0 {
		return plan{}
	}
	start := max(e.lastEnd, e.modelNow())
	var sched []scheduled
	cpuLoad := 0
	if e.cfg.Flavour == FlavourSGLang {
		sched, cpuLoad = e.scheduleSGLangLocked(start)
	} else {
		sched, cpuLoad = e.scheduleVLLMLocked(start)
	}
	if len(sched) == 0 {
		return plan{}
	}

	kvOcc := e.cache.usage()
	prefillTokens, decodeSeqs := 0, 0
	var ems []emission
	finished := 0
	for _, s := range sched {
		r := s.r
		if s.n == 1 && r.decoding() {
			decodeSeqs++
		} else {
			prefillTokens += s.n
		}
		r.numComputed += s.n
		e.registerFullLocked(r)
		if r.numComputed < r.numTokens() {
			continue // mid-prefill chunk
		}
		r.generated++
		e.stats.GenerationTokens++
		first := !r.promptCounted
		if first {
			r.promptCounted = true
			e.stats.PromptTokens += int64(len(r.Prompt))
		}
		done := r.generated == len(r.Output)
		if done {
			e.cache.release(r.blocks, r.Priority)
			r.blocks = nil
			r.state = stateFinishing
			finished++
		}
		ems = append(ems, emission{req: r, generated: r.generated, first: first, done: done})
	}
	if finished > 0 {
		kept := e.running[:0]
		for _, r := range e.running {
			if r.state == stateRunning {
				kept = append(kept, r)
			}
		}
		clear(e.running[len(kept):])
		e.running = kept
	}

	dur := e.cfg.Timing.StepTime(prefillTokens, decodeSeqs, kvOcc, cpuLoad)
	if dur <= 0 {
		dur = 1
	}
	e.lastEnd = start + dur
	return plan{start: start, end: e.lastEnd, dur: dur, emissions: ems,
		prefillTokens: prefillTokens, decodeSeqs: decodeSeqs, cpuLoadTokens: cpuLoad, kvOccupancy: kvOcc}
}

// scheduleVLLMLocked batches the way vLLM's v1 scheduler does: running
// requests first (one decode token each, or their next prefill chunk), with
// recompute preemption of the newest running request when blocks run out;
// then, if nothing was preempted, waiting requests in FCFS order within the
// remaining token budget and max_num_seqs. Prefill chunks and decodes share
// a step.
func (e *Engine) scheduleVLLMLocked(start time.Duration) ([]scheduled, int) {
	sched, budget, preempted := e.scheduleRunningLocked(nil, e.cfg.MaxNumBatchedTokens, phaseAny)
	if preempted {
		return sched, 0
	}
	return e.admitWaitingLocked(sched, budget, start)
}

// scheduleSGLangLocked batches the way SGLang's scheduler does by default
// (mixed chunks off): a step is either a prefill batch (the request being
// chunk-prefilled, then new requests within the chunked-prefill budget),
// which takes priority, or a decode batch of every running request.
func (e *Engine) scheduleSGLangLocked(start time.Duration) ([]scheduled, int) {
	sched, budget, preempted := e.scheduleRunningLocked(nil, e.cfg.MaxNumBatchedTokens, phasePrefill)
	cpuLoad := 0
	if !preempted {
		sched, cpuLoad = e.admitWaitingLocked(sched, budget, start)
	}
	if len(sched) > 0 {
		return sched, cpuLoad
	}
	sched, _, _ = e.scheduleRunningLocked(nil, len(e.running), phaseDecode)
	return sched, 0
}

type phase uint8

const (
	phaseAny phase = iota
	phasePrefill
	phaseDecode
)

// decoding reports whether r's next step computes just its last sampled token.
func (r *request) decoding() bool {
	return r.generated > 0 && r.numComputed+1 == r.numTokens()
}

// scheduleRunningLocked schedules running requests of the given phase in
// order within budget, preempting the newest running request while the
// cache cannot hold the next one's tokens.
func (e *Engine) scheduleRunningLocked(sched []scheduled, budget int, ph phase) ([]scheduled, int, bool) {
	preempted := false
	for i := 0; i < len(e.running) && budget > 0; i++ {
		r := e.running[i]
		if (ph == phasePrefill && r.decoding()) || (ph == phaseDecode && !r.decoding()) {
			continue
		}
		n := min(r.numTokens()-r.numComputed, budget)
		if n <= 0 {
			continue
		}
		fits := true
		for !e.growLocked(r, r.numComputed+n) {
			victim := e.running[len(e.running)-1]
			e.preemptLocked(victim)
			preempted = true
			if victim == r {
				fits = false
				break
			}
		}
		if !fits {
			break
		}
		budget -= n
		sched = append(sched, scheduled{r, n})
	}
	return sched, budget, preempted
}

// admitWaitingLocked admits waiting requests in FCFS order; the head waits
// when the cache cannot hold its first chunk.
func (e *Engine) admitWaitingLocked(sched []scheduled, budget int, start time.Duration) ([]scheduled, int) {
	cpuLoad := 0
	for len(e.waiting) > 0 && budget > 0 && len(e.running) < e.cfg.MaxNumSeqs {
		r := e.waiting[0]
		n, cpuTokens, ok := e.admitLocked(r, budget, start)
		if !ok {
			break
		}
		e.waiting[0] = nil
		e.waiting = e.waiting[1:]
		r.state = stateRunning
		e.running = append(e.running, r)
		budget -= n
		cpuLoad += cpuTokens
		sched = append(sched, scheduled{r, n})
	}
	return sched, cpuLoad
}

// growLocked gives r blocks for its first total tokens; false when the cache
// has too few free blocks (nothing is allocated then).
func (e *Engine) growLocked(r *request, total int) bool {
	need := ceilDiv(total, e.cfg.BlockSize) - len(r.blocks)
	if need <= 0 {
		return true
	}
	if need > e.cache.numFree {
		return false
	}
	for range need {
		r.blocks = append(r.blocks, e.cache.allocate())
	}
	return true
}

// preemptLocked frees victim, the newest running request, and puts it back at
// the head of the waiting queue to be recomputed (vLLM recompute preemption).
func (e *Engine) preemptLocked(victim *request) {
	e.running[len(e.running)-1] = nil
	e.running = e.running[:len(e.running)-1]
	e.cache.release(victim.blocks, victim.Priority)
	victim.blocks = nil
	victim.numComputed, victim.numRegistered = 0, 0
	victim.state = stateWaiting
	e.waiting = append(e.waiting, nil)
	copy(e.waiting[1:], e.waiting)
	e.waiting[0] = victim
	e.stats.Preemptions++
	e.log.Debug("preempted request", zap.String("request_id", victim.ID), zap.Int("generated", victim.generated))
}

// admitLocked looks r's prefix up in the cache and gives it blocks for its
// hits and its first chunk. It returns the chunk size and the tokens loaded
// from the CPU tier; ok is false when the cache cannot hold the chunk.
func (e *Engine) admitLocked(r *request, budget int, start time.Duration) (n, cpuTokens int, ok bool) {
	bs := e.cfg.BlockSize
	var hits []*block
	cpuHits := 0
	if !e.cfg.DisablePrefixCaching {
		// At least one token is always computed, so the logits exist.
		maxHit := (r.numTokens() - 1) / bs
		e.ensureDigestsLocked(r, maxHit)
		for j := 0; j < maxHit; j++ {
			b := e.cache.lookupGPU(r.digests[j])
			if b == nil {
				break
			}
			hits = append(hits, b)
		}
		for j := len(hits); j < maxHit && e.cache.lookupCPU(r.digests[j]); j++ {
			cpuHits++
		}
	}
	computed := (len(hits) + cpuHits) * bs
	n = min(r.numTokens()-computed, budget)
	need := ceilDiv(computed+n, bs) - len(hits)
	avail := e.cache.numFree
	for _, b := range hits {
		if b.ref == 0 {
			avail--
		}
	}
	if need > avail {
		return 0, 0, false
	}
	for _, b := range hits {
		e.cache.acquire(b)
	}
	for j := len(hits); j < len(hits)+cpuHits; j++ {
		e.cache.touchCPU(r.digests[j])
	}
	r.blocks = append(r.blocks[:0], hits...)
	for range need {
		r.blocks = append(r.blocks, e.cache.allocate())
	}
	r.numRegistered = len(hits)
	r.numComputed = computed
	if !e.cfg.DisablePrefixCaching {
		e.stats.PrefixCacheQueries += int64(r.numTokens())
		e.stats.PrefixCacheHits += int64(len(hits) * bs)
		e.stats.CPUCacheHits += int64(cpuHits * bs)
	}
	if !r.admitted {
		r.admitted = true
		r.firstSched = start
		r.cachedTokens = computed
	}
	return n, cpuHits * bs, true
}

// ensureDigestsLocked computes r's chain digests for its first n blocks.
func (e *Engine) ensureDigestsLocked(r *request, n int) {
	bs := e.cfg.BlockSize
	for j := len(r.digests); j < n; j++ {
		var parent digest
		hasParent := true
		if j == 0 {
			parent, hasParent = e.hash.root(r.LoraName, r.CacheSalt)
		} else {
			parent = r.digests[j-1]
		}
		e.tokBuf = e.tokBuf[:0]
		for k := j * bs; k < (j+1)*bs; k++ {
			e.tokBuf = append(e.tokBuf, r.tokenAt(k))
		}
		r.digests = append(r.digests, e.hash.block(parent, hasParent, e.tokBuf, j, r.LoraName, r.CacheSalt))
	}
}

// registerFullLocked caches r's blocks that became full and emits BlockStored:
// vLLM one event per request and step covering the contiguous newly cached
// blocks, SGLang one event per page.
func (e *Engine) registerFullLocked(r *request) {
	if e.cfg.DisablePrefixCaching {
		return
	}
	bs := e.cfg.BlockSize
	full := r.numComputed / bs
	if full <= r.numRegistered {
		return
	}
	e.ensureDigestsLocked(r, full)
	run := -1 // index in e.pending of the event being extended
	for j := r.numRegistered; j < full; j++ {
		b := r.blocks[j]
		if b.cached {
			run = -1
			continue
		}
		hash := e.hash.wire(r.digests[j])
		var parent uint64
		if j > 0 {
			parent = e.hash.wire(r.digests[j-1])
		}
		tokens := r.blockTokens(j, bs)
		if !e.cache.register(b, r.digests[j], hash, parent, j > 0, tokens, r.LoraName, r.CacheSalt) {
			run = -1
			continue
		}
		if run >= 0 && e.cfg.Flavour == FlavourVLLM {
			ev := &e.pending[run]
			ev.BlockHashes = append(ev.BlockHashes, hash)
			ev.TokenIDs = append(ev.TokenIDs, tokens...)
			continue
		}
		e.pending = append(e.pending, kvevents.Event{
			Kind:        kvevents.KindBlockStored,
			BlockHashes: []uint64{hash},
			ParentHash:  parent,
			HasParent:   j > 0,
			TokenIDs:    append(make([]uint32, 0, len(tokens)), tokens...),
			BlockSize:   bs,
			LoraName:    r.LoraName,
			CacheSalt:   r.CacheSalt,
			Medium:      MediumGPU,
			SpecKind:    specKindFull,
		})
		run = len(e.pending) - 1
	}
	r.numRegistered = full
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }

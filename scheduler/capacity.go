package scheduler

import (
	"sort"

	"github.com/omnious/provider-node/capacity"
)

// Capacity summarises the pool per base model from the same signals the
// scheduler routes on. Free KV is counted over healthy replicas only
// (breaker closed, metrics fresh): the quoter must not sell what a sick
// replica nominally has.
func (s *Scheduler) Capacity() capacity.Snapshot {
	snap := s.snap.Load()
	now := s.now()
	staleBefore := s.staleBefore(now)
	byModel := make(map[string]*capacity.Model)
	var hits, queries map[string]float64
	hits, queries = make(map[string]float64), make(map[string]float64)
	for _, r := range snap.all {
		m := byModel[r.ep.Model]
		if m == nil {
			m = &capacity.Model{Model: r.ep.Model}
			byModel[r.ep.Model] = m
		}
		m.Replicas++
		m.InFlight += int(r.inflight.Load())
		sm, stale := s.signals(r, staleBefore)
		if stale {
			m.Stale++
		}
		healthy := !stale && r.br.current(now, s.cfg.Breaker.Cooldown) == BreakerClosed
		if sm != nil && !stale {
			sig := &sm.Signals
			m.Waiting += int(sig.Waiting)
			m.Running += int(sig.Running)
			m.OutputTokensPerSec += sm.GenerationTokensPerSec
			m.PromptTokensPerSec += sm.PromptTokensPerSec
			hits[r.ep.Model] += sm.PrefixHitsPerSec
			queries[r.ep.Model] += sm.PrefixQueriesPerSec
		}
		if !healthy {
			continue
		}
		m.Healthy++
		// The saturation target, not the in-flight score's knee: a batching
		// engine runs admission.target_inflight requests at once.
		m.MaxConcurrency += int(s.cfg.Admission.TargetInflight)
		if sm == nil {
			continue
		}
		sig := &sm.Signals
		free := 1 - clamp01(sig.KVUsage)
		total := sig.KVCapacityTokens()
		m.TotalKVTokens += total
		m.FreeKVTokens += int64(float64(total) * free)
		m.FreeKVBlocks += int64(float64(sig.NumGPUBlocks) * free)
	}
	out := capacity.Snapshot{Taken: now, Models: make([]capacity.Model, 0, len(byModel))}
	for name, m := range byModel {
		if q := queries[name]; q > 0 {
			m.PrefixHitRate = clamp01(hits[name] / q)
		}
		out.Models = append(out.Models, *m)
	}
	sort.Slice(out.Models, func(i, j int) bool { return out.Models[i].Model < out.Models[j].Model })
	return out
}

package scheduler

import (
	"sort"
	"sync"

	"github.com/omnious/provider-node/capacity"
	"github.com/omnious/provider-node/engines/metrics"
)

// curveLearner is a replica's capacity curve; the scraper feeds it and the
// admin handler reads it.
type curveLearner struct {
	mu sync.Mutex
	l  *capacity.Learner
}

// learn adds the sample's window to the replica's capacity curve. An
// engine shared by several replicas (data parallel behind one metrics URL)
// has its counts split evenly between them, as the scorers do. It returns
// the window learnt.
func (r *replica) learn(sm *metrics.Sample) capacity.Window {
	w := &sm.Window
	share := float64(max(r.sharing.Load(), 1))
	cw := capacity.Window{Seconds: w.Seconds, Running: w.Running / share, ConcurrencyNow: (sm.Signals.Running + sm.Signals.Waiting) / share,
		Waiting: w.Waiting / share, WaitingMin: w.WaitingMin / share, KVUsage: w.KVUsage,
		OutputTokensPerSec: sm.GenerationTokensPerSec / share, PromptTokensPerSec: sm.PromptTokensPerSec / share,
		NewPromptTokensPerSec: newPromptTokensPerSec(sm) / share, FirstTokens: w.TTFT.Count / share}
	cw.TTFTBounds, cw.TTFT = curveHistogram(&w.TTFT)
	cw.ITLBounds, cw.ITL = curveHistogram(&w.ITL)
	r.curve.mu.Lock()
	r.curve.l.Add(cw)
	r.curve.mu.Unlock()
	return cw
}

// newPromptTokensPerSec is what the engine computed of its prompts: the
// prefix cache's queries minus its hits, or every prompt token when the
// engine exports no prefix-cache counters.
func newPromptTokensPerSec(sm *metrics.Sample) float64 {
	if sm.Signals.Has&metrics.HasPrefixQueries == 0 {
		return sm.PromptTokensPerSec
	}
	return max(sm.PrefixQueriesPerSec-sm.PrefixHitsPerSec, 0)
}

func curveHistogram(h *metrics.Histogram) ([]float64, capacity.Histogram) {
	return h.Bounds[:h.N], capacity.Histogram{Counts: h.Counts[:h.N], Count: h.Count, Sum: h.Sum}
}

// recentLoad is the output rate and the mean requests in the engine over
// the learner's last 30 s of scrapes.
func (r *replica) recentLoad() (tokensPerSec, requests float64) {
	r.curve.mu.Lock()
	defer r.curve.mu.Unlock()
	return r.curve.l.OutputRate(), r.curve.l.Load()
}

func (r *replica) curveCopy() capacity.Curve {
	r.curve.mu.Lock()
	defer r.curve.mu.Unlock()
	return r.curve.l.Curve()
}

// admission is flow control as the snapshot carries it, nil when off: the
// default band's ceiling, as market traffic carries no band of its own.
func (s *Scheduler) admission() *capacity.Admission {
	if !s.flow.enabled || s.flow.def == nil {
		return nil
	}
	return &capacity.Admission{TargetWaiting: s.cfg.Scoring.TargetWaiting, KVCeiling: s.cfg.Scoring.KVCeiling,
		Ceiling: s.flow.def.SaturationCeiling}
}

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
	for _, r := range snap.all.reps {
		m := byModel[r.ep.Model]
		if m == nil {
			m = &capacity.Model{Model: r.ep.Model, Admission: s.admission()}
			byModel[r.ep.Model] = m
		}
		m.Replicas++
		inflight := int(r.inflight.Load())
		m.InFlight += inflight
		var sm *metrics.Sample
		g, stale := signals(r, staleBefore)
		if g != nil {
			sm = g.sm
		}
		if stale {
			m.Stale++
		}
		// A metered replica not yet scraped is not stale (scored as idle)
		// but not healthy either: nothing is known of what it can take.
		healthy := !stale && (g != nil || !r.metered) && r.br.current(now, s.cfg.Breaker.Cooldown) == BreakerClosed
		rc := capacity.Replica{Addr: r.ep.Addr, Healthy: healthy, Stale: stale, InFlight: inflight,
			MaxRunning: int(s.cfg.Admission.TargetInflight), Curve: r.curveCopy()}
		if sm != nil && !stale {
			sig := &sm.Signals
			rc.Running, rc.Waiting = int(sig.Running), int(sig.Waiting)
			rc.OutputTokensPerSec, rc.Load = r.recentLoad()
			m.Waiting += int(sig.Waiting)
			m.Running += int(sig.Running)
			m.OutputTokensPerSec += sm.GenerationTokensPerSec
			m.PromptTokensPerSec += sm.PromptTokensPerSec
			hits[r.ep.Model] += sm.PrefixHitsPerSec
			queries[r.ep.Model] += sm.PrefixQueriesPerSec
		}
		m.ReplicaCapacity = append(m.ReplicaCapacity, rc)
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
		last := &m.ReplicaCapacity[len(m.ReplicaCapacity)-1]
		last.TotalKVTokens, last.FreeKVTokens = total, int64(float64(total)*free)
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

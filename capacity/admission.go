package capacity

import (
	"math"
	"sort"

	"github.com/omnious/provider-node/internal/isotonic"
)

// Admission is the EPP's flow control as a quote reads it. A replica's
// saturation term is max(waiting/TargetWaiting, kv_usage/KVCeiling); once
// the pool's mean term reaches Ceiling, the ceiling of the band market
// traffic is admitted under, the EPP holds that traffic in its own queue.
// The engines never see that wait, so their times to first token cannot
// show it: a curve read past the crossing sells load the EPP would queue.
type Admission struct {
	TargetWaiting float64 `json:"target_waiting"`
	KVCeiling     float64 `json:"kv_ceiling"`
	Ceiling       float64 `json:"ceiling"`
}

// Saturation is a replica's saturation term: the larger of its queue over
// targetWaiting and its KV usage over kvCeiling. The EPP admits on it and
// a quote reads it (Curve.AdmissionBound), so both use this one.
func Saturation(waiting, kvUsage, targetWaiting, kvCeiling float64) float64 {
	return max(waiting/targetWaiting, kvUsage/kvCeiling)
}

// AdmissionBound is the load (requests in the engine) at which an
// engine's saturation term reaches a.Ceiling, its output tokens per second
// there, and whether the term reaches it within the measured loads. The
// term is read from each bin's mean queue and KV usage, made non-decreasing
// in the load (weighted pool-adjacent-violators: one bin's burst of
// waiting does not stop the curve early) and interpolated between the bins
// either side of the crossing, from an idle engine's 0; the output rate
// there from its fit as At reads it (ratesAt). Read at the mean load, as
// the EPP compares the pool's mean term with the ceiling.
func (c Curve) AdmissionBound(a Admission) (concurrency, tokensPerSec float64, ok bool) {
	if !(a.TargetWaiting > 0) || !(a.KVCeiling > 0) || !(a.Ceiling > 0) {
		return 0, 0, false
	}
	bins := c.pooled()
	if len(bins) == 0 {
		return 0, 0, false
	}
	sat, w := make([]float64, len(bins)), make([]float64, len(bins))
	for i, b := range bins {
		sat[i], w[i] = Saturation(b.Waiting, b.KVUsage, a.TargetWaiting, a.KVCeiling), b.Seconds
	}
	isotonic.NonDecreasing(sat, w)
	j := sort.Search(len(bins), func(i int) bool { return sat[i] >= a.Ceiling })
	if j == len(bins) {
		return 0, 0, false
	}
	x0, s0 := 0.0, 0.0
	if j > 0 {
		x0, s0 = bins[j-1].Concurrency, sat[j-1]
	}
	x := x0 + (bins[j].Concurrency-x0)*(a.Ceiling-s0)/(sat[j]-s0)
	tps, _ := ratesAt(bins, x)
	if math.IsNaN(x) || math.IsInf(x, 0) || math.IsNaN(tps) || math.IsInf(tps, 0) {
		return 0, 0, false
	}
	return x, tps, true
}

// AtAdmitted is At bounded by flow control as well, when adm is not nil:
// where the EPP starts to queue at a lighter load than the objectives
// allow, the capacity is that load and at most the output tokens per
// second the engine serves there (Limit "admission"). The load the
// engine held at the rate bounds the concurrency last, as in At.
func (c Curve) AtAdmitted(o Objectives, adm *Admission) (AtObjectives, error) {
	at, err := c.atObjectives(o)
	if err != nil {
		return at, err
	}
	if adm != nil {
		at.admit(c, *adm)
	}
	at.hold(c)
	return at, nil
}

// admit bounds the capacity by where the EPP starts to queue.
func (a *AtObjectives) admit(c Curve, adm Admission) {
	conc, tps, ok := c.AdmissionBound(adm)
	if !ok {
		return
	}
	a.AdmissionBoundConcurrency, a.AdmissionBoundTokensPerSec = conc, tps
	if a.Concurrency <= conc {
		// The EPP does not queue at the objectives' load.
		return
	}
	a.lower(tps, LimitAdmission)
	a.Concurrency, a.Limit = conc, LimitAdmission
}

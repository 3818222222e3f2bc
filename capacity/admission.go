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
	return admissionBound(c.pooled(), a)
}

// admissionBound is AdmissionBound on the curve's pooled bins.
func admissionBound(bins []*Bin, a Admission) (concurrency, tokensPerSec float64, ok bool) {
	if !(a.TargetWaiting > 0) || !(a.KVCeiling > 0) || !(a.Ceiling > 0) {
		return 0, 0, false
	}
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
// where the EPP queues at a lighter load than the objectives allow, the
// capacity is that load and at most the output tokens per second the
// engine serves there (Limit "admission"). pool is how many replicas'
// terms the EPP averages (AdmittedLoad). The load the engine held at the
// rate bounds the concurrency last, as in At.
func (c Curve) AtAdmitted(o Objectives, adm *Admission, pool int) (AtObjectives, error) {
	return reading{}.at(c, o, adm, pool)
}

// admit bounds the capacity by where the EPP queues. A client keeping
// streams open meets that queue only past the crossing itself (Streams).
func (a *AtObjectives) admit(c Curve, adm Admission, q float64, pool int) {
	bins := c.pooled()
	conc, tps, ok := admissionBound(bins, adm)
	if !ok {
		return
	}
	a.AdmissionBoundConcurrency, a.AdmissionBoundTokensPerSec = conc, tps
	a.Streams = min(a.Streams, conc)
	mean := AdmittedLoad(conc, pool, q)
	if a.Concurrency <= mean {
		// The EPP seldom queues at the objectives' load.
		return
	}
	tps, _ = ratesAt(bins, mean)
	a.lower(tps, LimitAdmission)
	a.Concurrency, a.Limit = mean, LimitAdmission
}

// AdmittedLoad is the largest mean load per replica at which a pool of
// pool replicas reaches crossing, the load per replica where the EPP's
// mean saturation term meets its ceiling, at most 1-q of the time. The
// EPP compares the pool's mean term, not one replica's, and the pool's
// load is not its mean: with arrivals from many independent clients the
// requests in the pool are the occupancy of an M/G/infinity queue, a
// Poisson count around pool times the mean, however a router spreads
// them. Read at the crossing itself, the pool would reach it about half
// the time, and every request arriving then waits in the EPP's queue,
// where the engines' latencies cannot show it; so the load is read where
// the pool reaches the crossing at most 1-q of the time
// (TestAdmittedLoad). A request meeting the queue is counted as missing
// its objective, as a request in an engine past the measured loads is
// (Curve.At). The tail is interpolated between whole
// counts, so the answer moves smoothly with the crossing; 0 when the
// crossing or pool gives nothing to read.
func AdmittedLoad(crossing float64, pool int, q float64) float64 {
	if !(crossing > 0) || math.IsInf(crossing, 0) || pool < 1 || !(q > 0 && q < 1) {
		return 0
	}
	n := float64(pool)
	t := crossing * n
	k := math.Floor(t)
	lg, _ := math.Lgamma(k + 1)
	// reach is the share of time the pool holds t requests or more at
	// mean load m per replica: 1 less the Poisson terms below k and the
	// fraction t-k of the term at k, summed down from k (above the mean,
	// as m < crossing) past the mode until they no longer count.
	reach := func(m float64) float64 {
		lambda := m * n
		if lambda <= 0 {
			return 0
		}
		p := math.Exp(k*math.Log(lambda) - lambda - lg)
		if p == 0 {
			// So far below k (lambda < k here) that the tail is nothing.
			return 0
		}
		sum := (t - k) * p
		for j := k; j > 0; j-- {
			p *= j / lambda
			sum += p
			if p < 1e-16*sum {
				break
			}
		}
		return max(1-sum, 0)
	}
	// The answer is within 8 standard deviations of the crossing.
	lo, hi := max(0, crossing-8*math.Sqrt(crossing/n)-1/n), crossing
	for hi-lo > 1e-6*crossing {
		mid := (lo + hi) / 2
		if reach(mid) <= 1-q {
			lo = mid
		} else {
			hi = mid
		}
	}
	return lo
}

package capacity

import "math"

// dispersion is the spread of an engine's load: exponentially weighted
// moments of the requests in it at each busy scrape (ConcurrencyNow) over
// the last dispersionSamples of them, read as their variance over their
// mean (Curve.Dispersion).
type dispersion struct {
	mean, sq float64
	n        int // samples taken, up to dispersionSamples
}

// dispersionSamples is how many recent busy scrapes the load's spread is
// measured over: enough for a variance, few enough to follow the load.
const dispersionSamples = 32

// add takes one scrape's count of requests in the engine; a negative or
// non-finite count is no sample.
func (d *dispersion) add(x float64) {
	if x >= 0 && !math.IsNaN(x) && !math.IsInf(x, 0) {
		d.n = min(d.n+1, dispersionSamples)
		a := 1 / float64(d.n)
		d.mean += a * (x - d.mean)
		d.sq += a * (x*x - d.sq)
	}
}

// value is the variance over the mean once half the samples are in and
// the mean load is a request or more, else 0 (not measured).
func (d *dispersion) value() float64 {
	if d.n >= dispersionSamples/2 && d.mean >= 1 {
		return max(d.sq-d.mean*d.mean, 0) / d.mean
	}
	return 0
}

// readDispersion is the dispersion d a curve is read with (Curve.At): the
// load is d times a Poisson(m/d) count, mean m, variance d*m.
// d is at most 1: a measured spread wider than Poisson comes mostly
// from the load changing under the measurement (a step ending, a
// queue draining), not from the traffic's arrivals, and is read as
// Poisson's. It is at least 0.25, so a noisy estimate cannot make the
// load look steadier than a router could hold it. Not measured (0, not
// a number, infinite) reads as 1 (TestReadDispersion).
func readDispersion(d float64) float64 {
	if !(d > 0) || math.IsInf(d, 0) {
		d = 1
	}
	return min(max(d, 0.25), 1)
}

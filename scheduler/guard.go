package scheduler

// guardTrips is the imbalance guard, which scoreAll applies to every
// candidate whose prefix match passed the thresholds, on queued requests
// (cand.queued): prefix affinity to a replica is abandoned only when that
// replica has both balance_abs more and balance_rel times as many queued
// as the least queued candidate. The absolute test alone would fire on an
// idle pool (2 against 0), the relative one alone on a busy pool (200
// against 180).
func guardTrips(load, minLoad, abs, rel float64) bool {
	return load-minLoad >= abs && load >= rel*minLoad
}

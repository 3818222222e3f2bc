package scheduler

import (
	"sync"
	"sync/atomic"
	"time"
)

// Breaker states, as exported on omnious_epp_breaker_state.
const (
	BreakerClosed   = 0
	BreakerOpen     = 1
	BreakerHalfOpen = 2
)

// breaker is one replica's circuit breaker. Request failures (Done with
// status >= 500 or an error) and scrape failures are counted separately,
// each reset by its own kind of success, so a replica that answers scrapes
// but fails every request still trips. Either count reaching the threshold
// opens it; after the cooldown one probe request is let through (half-open);
// the probe's success closes it, any failure reopens it.
//
// state is read without the lock on the hot path (closed is the common
// case); transitions hold mu.
type breaker struct {
	state atomic.Uint32

	// probing sits beside mu, in what would be padding: a replica's hot
	// fields and its breaker fill whole cache lines (TestReplicaHotLine).
	mu           sync.Mutex
	probing      bool
	reqFailures  int
	scrapeFails  int
	openedAt     time.Time
	probeStarted time.Time
}

// admit says whether the replica may be a candidate at now: closed yes;
// open no until the cooldown has passed, then half-open; half-open only
// while no probe is in flight (probe is then true: the caller must claim
// it if it routes there). A probe that never reported back (lost Done) is
// given up after another cooldown.
func (b *breaker) admit(now time.Time, cooldown time.Duration) (ok, probe bool) {
	if b.state.Load() == BreakerClosed {
		return true, false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.state.Load() {
	case BreakerClosed:
		return true, false
	case BreakerOpen:
		if now.Sub(b.openedAt) < cooldown {
			return false, false
		}
		b.state.Store(BreakerHalfOpen)
		b.probing = false
	}
	if b.probing && now.Sub(b.probeStarted) < cooldown {
		return false, false
	}
	return true, true
}

// claimProbe reserves the half-open probe; false when another request
// already holds it or the breaker is no longer half-open.
func (b *breaker) claimProbe(now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.state.Load() != BreakerHalfOpen || b.probing {
		return false
	}
	b.probing, b.probeStarted = true, now
	return true
}

// releaseProbe ends a probe without a verdict (the request ended with no
// upstream response, e.g. the client went away).
func (b *breaker) releaseProbe() {
	b.mu.Lock()
	b.probing = false
	b.mu.Unlock()
}

// request records a routed request's outcome.
func (b *breaker) request(ok bool, now time.Time, threshold int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.state.Load() {
	case BreakerClosed:
		if ok {
			b.reqFailures = 0
			return
		}
		b.reqFailures++
		if b.reqFailures >= threshold {
			b.openLocked(now)
		}
	case BreakerHalfOpen:
		b.probing = false
		if ok {
			b.state.Store(BreakerClosed)
			b.reqFailures, b.scrapeFails = 0, 0
			return
		}
		b.openLocked(now)
	case BreakerOpen:
		// Late outcomes of requests routed before the breaker opened say
		// nothing about the replica now.
	}
}

// scrape records a metrics scrape's outcome. A scrape success never closes
// an open breaker: only a served request proves the replica serves.
func (b *breaker) scrape(ok bool, now time.Time, threshold int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if ok {
		b.scrapeFails = 0
		return
	}
	b.scrapeFails++
	switch b.state.Load() {
	case BreakerClosed:
		if b.scrapeFails >= threshold {
			b.openLocked(now)
		}
	case BreakerHalfOpen:
		b.openLocked(now)
	}
}

// current returns the state at now, reporting an open breaker whose
// cooldown has passed as half-open, without changing it.
func (b *breaker) current(now time.Time, cooldown time.Duration) int {
	st := b.state.Load()
	if st != BreakerOpen {
		return int(st)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.state.Load() == BreakerOpen && now.Sub(b.openedAt) >= cooldown {
		return BreakerHalfOpen
	}
	return int(b.state.Load())
}

func (b *breaker) openLocked(now time.Time) {
	b.state.Store(BreakerOpen)
	b.openedAt = now
	b.probing = false
	b.reqFailures, b.scrapeFails = 0, 0
}

package quoter

import (
	"errors"
	"strconv"
	"sync"
	"time"

	"github.com/omnious/provider-node/internal/opt"
)

// BreakerState is the health breaker's state.
type BreakerState int

// Breaker states; the numeric values are exported as the
// omnious_quoter_breaker_state gauge.
const (
	BreakerClosed   BreakerState = 0 // healthy: quotes are signed
	BreakerHalfOpen BreakerState = 1 // probing: canaries only, nothing signed
	BreakerOpen     BreakerState = 2 // unhealthy: nothing signed until hold-down ends
)

func (s BreakerState) String() string {
	switch s {
	case BreakerClosed:
		return "closed"
	case BreakerHalfOpen:
		return "half-open"
	case BreakerOpen:
		return "open"
	}
	return "unknown"
}

// BreakerConfig tunes the breaker; a zero field takes the documented
// default, a negative one is refused by Validate.
type BreakerConfig struct {
	// ConsecutiveFailures canary failures in a row trip it. Default 3.
	ConsecutiveFailures int
	// FailureRate over the last Window canaries trips it once at least
	// MinSamples were seen. Default 0.5.
	FailureRate float64
	// Window is how many recent canaries the rate covers. Default 10.
	Window int
	// MinSamples before the rate applies. Default 4.
	MinSamples int
	// CloseAfter consecutive successful half-open probes close it. Default 3.
	CloseAfter int
	// HoldDown is how long the first trip stays open before probing.
	// Default 30s.
	HoldDown time.Duration
	// MaxHoldDown caps the exponential back-off of repeated trips
	// (HoldDown * 2^(trips-1)). Default 10m.
	MaxHoldDown time.Duration
	// ResetAfter closed time forgets earlier trips. Default 10m.
	ResetAfter time.Duration
}

// breakerDefaults are BreakerConfig's defaults, written once.
var breakerDefaults = BreakerConfig{ConsecutiveFailures: 3, FailureRate: 0.5, Window: 10, MinSamples: 4, CloseAfter: 3,
	HoldDown: 30 * time.Second, MaxHoldDown: 10 * time.Minute, ResetAfter: 10 * time.Minute}

// WithDefaults fills unset (zero) fields.
func (c BreakerConfig) WithDefaults() BreakerConfig {
	d := breakerDefaults
	opt.Zero(&c.ConsecutiveFailures, d.ConsecutiveFailures)
	opt.Zero(&c.FailureRate, d.FailureRate)
	opt.Zero(&c.Window, d.Window)
	opt.Zero(&c.MinSamples, d.MinSamples)
	opt.Zero(&c.CloseAfter, d.CloseAfter)
	opt.Zero(&c.HoldDown, d.HoldDown)
	opt.Zero(&c.MaxHoldDown, d.MaxHoldDown)
	opt.Zero(&c.ResetAfter, d.ResetAfter)
	return c
}

// Validate refuses a negative field of a defaulted config.
func (c BreakerConfig) Validate() error {
	d := breakerDefaults
	return errors.Join(
		opt.DefaultNonNegative("Breaker.ConsecutiveFailures", c.ConsecutiveFailures, d.ConsecutiveFailures),
		opt.DefaultNonNegative("Breaker.FailureRate", c.FailureRate, d.FailureRate),
		opt.DefaultNonNegative("Breaker.Window", c.Window, d.Window),
		opt.DefaultNonNegative("Breaker.MinSamples", c.MinSamples, d.MinSamples),
		opt.DefaultNonNegative("Breaker.CloseAfter", c.CloseAfter, d.CloseAfter),
		opt.DefaultNonNegative("Breaker.HoldDown", c.HoldDown, d.HoldDown),
		opt.DefaultNonNegative("Breaker.MaxHoldDown", c.MaxHoldDown, d.MaxHoldDown),
		opt.DefaultNonNegative("Breaker.ResetAfter", c.ResetAfter, d.ResetAfter))
}

// Breaker is the quoter's local health breaker:
//
//	closed -> open      on a health failure (EPP unreachable, no healthy
//	                    replica, stale metrics) or canary failures over the
//	                    consecutive or rate threshold
//	open -> half-open   when the hold-down elapses
//	half-open -> closed after CloseAfter consecutive good probes
//	half-open -> open   on any failure, with a doubled hold-down
//
// It is safe for concurrent use; time comes from the injected clock.
type Breaker struct {
	cfg BreakerConfig
	now func() time.Time
	// onChange, when set, is called (with the lock held: keep it cheap)
	// on every transition.
	onChange func(from, to BreakerState, reason string)

	mu          sync.Mutex
	state       BreakerState
	reason      string
	openUntil   time.Time
	closedSince time.Time
	trips       int // consecutive trips without a ResetAfter-long closed spell
	consecutive int // canary failures in a row (closed)
	window      []bool
	successes   int // good probes in a row (half-open)
}

// NewBreaker returns a closed breaker. now defaults to time.Now.
func NewBreaker(cfg BreakerConfig, now func() time.Time) *Breaker {
	if now == nil {
		now = time.Now
	}
	return &Breaker{cfg: cfg.WithDefaults(), now: now, closedSince: now()}
}

// State returns the current state, moving open to half-open when the
// hold-down has elapsed.
func (b *Breaker) State() BreakerState {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.stateLocked()
}

// Reason is why the breaker last left closed ("" while never tripped).
func (b *Breaker) Reason() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.reason
}

func (b *Breaker) stateLocked() BreakerState {
	if b.state == BreakerOpen && !b.now().Before(b.openUntil) {
		b.transition(BreakerHalfOpen, "hold-down elapsed")
		b.successes = 0
	}
	return b.state
}

func (b *Breaker) transition(to BreakerState, reason string) {
	from := b.state
	b.state = to
	if b.onChange != nil && from != to {
		b.onChange(from, to, reason)
	}
}

func (b *Breaker) tripLocked(reason string) {
	now := b.now()
	if b.state == BreakerClosed && now.Sub(b.closedSince) >= b.cfg.ResetAfter {
		b.trips = 0
	}
	b.trips++
	hold := b.cfg.HoldDown
	for i := 1; i < b.trips && hold < b.cfg.MaxHoldDown; i++ {
		hold *= 2
	}
	hold = min(hold, b.cfg.MaxHoldDown)
	b.openUntil = now.Add(hold)
	b.reason = reason
	b.consecutive, b.successes, b.window = 0, 0, b.window[:0]
	b.transition(BreakerOpen, reason)
}

// ReportHealth records the result of a health check (nil = healthy). A
// failure opens a closed or half-open breaker at once; success alone
// never closes it (only canary probes do).
func (b *Breaker) ReportHealth(err error) {
	if err == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if st := b.stateLocked(); st == BreakerClosed || st == BreakerHalfOpen {
		b.tripLocked(err.Error())
	}
}

// ReportCanary records one canary probe (nil = passed).
func (b *Breaker) ReportCanary(err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.stateLocked() {
	case BreakerOpen:
		return // probes from before the trip do not count
	case BreakerHalfOpen:
		if err != nil {
			b.tripLocked("half-open probe failed: " + err.Error())
			return
		}
		b.successes++
		if b.successes >= b.cfg.CloseAfter {
			b.closedSince = b.now()
			b.consecutive, b.window = 0, b.window[:0]
			b.transition(BreakerClosed, "probes passed")
		}
		return
	}
	if len(b.window) == b.cfg.Window {
		copy(b.window, b.window[1:])
		b.window = b.window[:len(b.window)-1]
	}
	b.window = append(b.window, err != nil)
	if err == nil {
		b.consecutive = 0
		return
	}
	b.consecutive++
	if b.consecutive >= b.cfg.ConsecutiveFailures {
		b.tripLocked("canary failed " + strconv.Itoa(b.consecutive) + " times in a row: " + err.Error())
		return
	}
	if len(b.window) >= b.cfg.MinSamples {
		failed := 0
		for _, f := range b.window {
			if f {
				failed++
			}
		}
		if float64(failed)/float64(len(b.window)) >= b.cfg.FailureRate {
			b.tripLocked("canary failure rate " + strconv.Itoa(failed) + "/" + strconv.Itoa(len(b.window)) + ": " + err.Error())
		}
	}
}

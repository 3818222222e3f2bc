package quoter

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// fakeClock is an injectable clock advanced by hand.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

var errProbe = errors.New("probe failed")

func TestBreakerTransitions(t *testing.T) {
	clk := &fakeClock{t: time.Unix(1_800_000_000, 0)}
	cfg := BreakerConfig{ConsecutiveFailures: 3, FailureRate: 0.5, Window: 6, MinSamples: 4, CloseAfter: 2,
		HoldDown: 10 * time.Second, MaxHoldDown: 35 * time.Second, ResetAfter: time.Minute}
	b := NewBreaker(cfg, clk.Now)
	var seen []string
	b.onChange = func(from, to BreakerState, _ string) { seen = append(seen, from.String()+">"+to.String()) }

	// Consecutive threshold.
	b.ReportCanary(errProbe)
	b.ReportCanary(errProbe)
	require.Equal(t, BreakerClosed, b.State())
	b.ReportCanary(errProbe)
	require.Equal(t, BreakerOpen, b.State())
	require.Contains(t, b.Reason(), "3 times in a row")
	require.Equal(t, clk.Now().Add(10*time.Second), b.OpenUntil())

	// Open ignores probes and health successes; hold-down then half-open.
	b.ReportCanary(nil)
	b.ReportHealth(nil)
	clk.Advance(9 * time.Second)
	require.Equal(t, BreakerOpen, b.State())
	clk.Advance(time.Second)
	require.Equal(t, BreakerHalfOpen, b.State())

	// A half-open failure re-opens with a doubled hold-down.
	b.ReportCanary(errProbe)
	require.Equal(t, BreakerOpen, b.State())
	require.Equal(t, clk.Now().Add(20*time.Second), b.OpenUntil())
	clk.Advance(20 * time.Second)
	require.Equal(t, BreakerHalfOpen, b.State())
	// Health failure in half-open also re-opens: 40s capped at 35s.
	b.ReportHealth(ErrNoHealthyReplica)
	require.Equal(t, clk.Now().Add(35*time.Second), b.OpenUntil())
	clk.Advance(35 * time.Second)

	// Consecutive successes close it.
	b.ReportCanary(nil)
	require.Equal(t, BreakerHalfOpen, b.State())
	b.ReportCanary(nil)
	require.Equal(t, BreakerClosed, b.State())

	// Rate threshold: alternating failures never reach 3 in a row but hit
	// 50% once 4 samples are in.
	b.ReportCanary(errProbe)
	b.ReportCanary(nil)
	b.ReportCanary(errProbe)
	require.Equal(t, BreakerClosed, b.State())
	b.ReportCanary(nil)
	require.Equal(t, BreakerClosed, b.State(), "2/4 failures with the last one a success does not trip")
	b.ReportCanary(errProbe)
	require.Equal(t, BreakerOpen, b.State())
	require.Contains(t, b.Reason(), "failure rate 3/5")
	require.Equal(t, clk.Now().Add(35*time.Second), b.OpenUntil(), "trips within ResetAfter keep backing off")

	// A long healthy spell forgets earlier trips.
	clk.Advance(35 * time.Second)
	b.ReportCanary(nil)
	b.ReportCanary(nil)
	require.Equal(t, BreakerClosed, b.State())
	clk.Advance(2 * time.Minute)
	b.ReportHealth(ErrEPPUnreachable)
	require.Equal(t, clk.Now().Add(10*time.Second), b.OpenUntil())

	require.Equal(t, []string{"closed>open", "open>half-open", "half-open>open", "open>half-open", "half-open>open",
		"open>half-open", "half-open>closed", "closed>open", "open>half-open", "half-open>closed", "closed>open"}, seen)
}

func TestBreakerHealthTripsImmediately(t *testing.T) {
	for _, err := range []error{ErrEPPUnreachable, ErrNoHealthyReplica, ErrStaleMetrics} {
		t.Run(err.Error(), func(t *testing.T) {
			b := NewBreaker(BreakerConfig{}, nil)
			b.ReportHealth(nil)
			require.Equal(t, BreakerClosed, b.State())
			b.ReportHealth(err)
			require.Equal(t, BreakerOpen, b.State())
			require.Equal(t, err.Error(), b.Reason())
		})
	}
}

func TestBreakerDefaults(t *testing.T) {
	c := BreakerConfig{}.WithDefaults()
	require.Equal(t, BreakerConfig{ConsecutiveFailures: 3, FailureRate: 0.5, Window: 10, MinSamples: 4, CloseAfter: 3,
		HoldDown: 30 * time.Second, MaxHoldDown: 10 * time.Minute, ResetAfter: 10 * time.Minute}, c)
}

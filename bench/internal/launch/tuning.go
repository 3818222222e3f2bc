package launch

import (
	"time"

	"github.com/omnious/provider-node/scheduler"
)

// Tuning is what a harness changes in the scheduler's defaults; zero fields
// keep the default. Every scheduler.Config field the bench reads or writes
// is touched in this file, so that a change to the config's shape is one
// edit here.
type Tuning struct {
	Policy string
	Seed   int64
	// ScrapeInterval and ScrapeTimeout pace the metric scrapes, and
	// StaleAfter is when a replica without a fresh scrape turns stale.
	ScrapeInterval, ScrapeTimeout, StaleAfter time.Duration
	// BreakerCooldown is how long an open breaker waits before a probe.
	BreakerCooldown time.Duration
	// SpeculativeTTL is how long a routing decision credits its replica
	// with the prompt's blocks before the KV events confirm them.
	SpeculativeTTL time.Duration
}

// Config is the scheduler's default config with t applied, validated.
func (t Tuning) Config() (scheduler.Config, error) {
	c := scheduler.DefaultConfig()
	set := func(dst *time.Duration, v time.Duration) {
		if v != 0 {
			*dst = v
		}
	}
	if t.Policy != "" {
		c.Policy = t.Policy
	}
	if t.Seed != 0 {
		c.Seed = t.Seed
	}
	set(&c.Signals.ScrapeInterval, t.ScrapeInterval)
	set(&c.Signals.ScrapeTimeout, t.ScrapeTimeout)
	set(&c.Signals.StaleAfter, t.StaleAfter)
	set(&c.Breaker.Cooldown, t.BreakerCooldown)
	if t.SpeculativeTTL != 0 {
		c.Prefix.SpeculativeTTL = &t.SpeculativeTTL
	}
	return c, c.Validate()
}

// BreakerThreshold is how many failed scrapes in a row open a replica's
// breaker by default (breaker.failure_threshold).
func BreakerThreshold() int { return scheduler.DefaultConfig().Breaker.FailureThreshold }

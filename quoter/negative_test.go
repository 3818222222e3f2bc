package quoter

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestConfigNegative: a negative setting is refused naming its flag (or
// field), never taken as the default; zero takes the default.
func TestConfigNegative(t *testing.T) {
	for _, tc := range []struct {
		name string
		set  func(*Config)
		want string
	}{
		{"refresh", func(c *Config) { c.Refresh = -5 * time.Second }, "--refresh -5s is negative; give a positive duration, or 0 for the default (10s)"},
		{"ttl", func(c *Config) { c.TTL = -time.Second }, "--ttl -1s is negative"},
		{"snapshot age", func(c *Config) { c.MaxSnapshotAge = -time.Second }, "--max-snapshot-age -1s is negative"},
		{"canary", func(c *Config) { c.CanaryInterval = -time.Second }, "--canary-interval -1s is negative"},
		{"publish backoff", func(c *Config) { c.PublishMaxBackoff = -time.Second }, "PublishMaxBackoff -1s is negative"},
		{"objective", func(c *Config) { c.Objectives.ITL = -time.Millisecond }, "--slo-itl-p95 -1ms is negative"},
		{"first-token objective", func(c *Config) { c.Objectives.TTFT = -time.Second }, "--slo-ttft-p95 -1s is negative"},
		{"breaker", func(c *Config) { c.Breaker.HoldDown = -time.Second }, "Breaker.HoldDown -1s is negative"},
		{"conformance", func(c *Config) { c.Conformance.CheckTimeout = -time.Second }, "--timeout -1s is negative"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := (&testEnv{}).config()
			tc.set(&c)
			require.ErrorContains(t, c.WithDefaults().Validate(), tc.want)
		})
	}
	c := (&testEnv{}).config()
	c.Refresh, c.Objectives.TTFT = 0, 0
	d := c.WithDefaults()
	require.Equal(t, 10*time.Second, d.Refresh)
	require.Equal(t, 2*time.Second, d.Objectives.TTFT)
	require.Nil(t, d.Conformance.HTTP, "the checks get the service's client in New")
}

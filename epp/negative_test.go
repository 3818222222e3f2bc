package epp

import (
	"testing"

	"github.com/omnious/provider-node/internal/testutil/conftest"
)

// TestConfigNegative: every numeric key of the EPP's YAML, its sections'
// included, set negative, is refused by Validate naming the key and the
// value; the idle timeouts say negative means never, and the scheduler's
// seed takes any value.
func TestConfigNegative(t *testing.T) {
	conftest.Negative(t, Config{}, func(c Config) error { return c.WithDefaults().Validate() },
		"extproc.request_idle_timeout", "extproc.response_idle_timeout", "scheduler.seed")
}

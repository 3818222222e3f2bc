package extproc

import (
	"testing"

	"github.com/omnious/provider-node/internal/testutil/conftest"
)

// TestConfigNegative: every numeric key, set negative, is refused by
// Validate naming it, but the idle timeouts, where negative means never.
func TestConfigNegative(t *testing.T) {
	conftest.Negative(t, Config{}, func(c Config) error { return c.WithDefaults().Validate() },
		"request_idle_timeout", "response_idle_timeout")
}

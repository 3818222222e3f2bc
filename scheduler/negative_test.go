package scheduler

import (
	"testing"

	"github.com/omnious/provider-node/internal/testutil/conftest"
)

// TestConfigNegative: every numeric key of the YAML config, set negative,
// is refused by Validate naming the key and the value; seed is the one
// whose negative values are seeds like any other.
func TestConfigNegative(t *testing.T) {
	conftest.Negative(t, Config{}, func(c Config) error {
		c = c.WithDefaults()
		return c.Validate()
	}, "seed")
}

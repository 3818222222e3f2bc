package sim

import (
	"testing"

	"github.com/omnious/provider-node/internal/testutil/conftest"
)

// TestConfigNegative: every numeric key of the simulator's YAML, set
// negative, is refused by Validate naming the key and the value; the seeds
// take any value.
func TestConfigNegative(t *testing.T) {
	conftest.Negative(t, Config{}, func(c Config) error { return c.WithDefaults().Validate() }, "seed", "engine.seed")
}

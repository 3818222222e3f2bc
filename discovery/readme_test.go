package discovery

import (
	"testing"

	"github.com/omnious/provider-node/internal/testutil/conftest"
)

// TestREADMEDefaults keeps the README's configuration table equal to
// WithDefaults of empty configs.
func TestREADMEDefaults(t *testing.T) {
	cfgs := struct {
		FileConfig FileConfig
		PoolConfig PoolConfig
	}{FileConfig{}.WithDefaults(), PoolConfig{}.WithDefaults()}
	conftest.Check(t, conftest.Table(t, "README.md", "Configuration", "field", "default"), 0, 1, conftest.Fields(cfgs), nil)
}

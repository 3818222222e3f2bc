package sim

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/omnious/provider-node/internal/testutil/conftest"
)

// TestREADMEDefaults keeps the configuration table of the package README
// equal to WithDefaults of an empty config.
func TestREADMEDefaults(t *testing.T) {
	rows := conftest.Table(t, "README.md", "Configuration", "key", "default")
	conftest.Check(t, rows, 0, 1, conftest.Fields(Config{}.WithDefaults()), nil)
}

// load parses doc as a config file, as -config does, and applies defaults.
func load(t *testing.T, doc string) Config {
	t.Helper()
	path := filepath.Join(t.TempDir(), "sim.yaml")
	require.NoError(t, os.WriteFile(path, []byte(doc), 0o600))
	c, err := LoadConfig(path)
	require.NoError(t, err, doc)
	c = c.WithDefaults()
	require.NoError(t, c.Validate())
	return c
}

// TestZeroIsASetting: every key whose zero is legal keeps an explicit zero.
func TestZeroIsASetting(t *testing.T) {
	for _, key := range []string{
		"seed", "enable_auto_tool_choice",
		"engine.seed", "engine.num_cpu_blocks", "engine.disable_prefix_caching",
		"engine.timing.prefill_base", "engine.timing.prefill_per_token", "engine.timing.decode_base",
		"engine.timing.decode_per_seq", "engine.timing.kv_term", "engine.timing.cpu_load_per_token",
		"kv_events.enable_kv_cache_events",
		"faults.error_rate", "faults.latency", "faults.stall_after_tokens", "faults.stall_for",
		"faults.reject_auto_tool_choice", "faults.metrics_hang",
	} {
		t.Run(key, func(t *testing.T) {
			doc := conftest.ZeroYAML(key, conftest.Lookup(t, conftest.Fields(Config{}.WithDefaults()), key))
			c := load(t, doc)
			require.True(t, conftest.IsZero(conftest.Lookup(t, conftest.Fields(c), key)), "%s after defaults", doc)
		})
	}
}

// TestEngineSeed: an unset engine seed is the simulator's; a set one, 0
// included, is kept.
func TestEngineSeed(t *testing.T) {
	tests := []struct {
		name, doc string
		want      int64
	}{
		{"inherited", "seed: 5\n", 5},
		{"explicit zero", "seed: 5\nengine:\n  seed: 0\n", 0},
		{"explicit", "seed: 5\nengine:\n  seed: 9\n", 9},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, *load(t, tt.doc).Engine.Seed)
		})
	}
}

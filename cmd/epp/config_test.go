package main

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/omnious/provider-node/epp"
	"github.com/omnious/provider-node/internal/testutil/conftest"
)

// TestFlagsNegative walks every numeric flag: its help says what 0 means,
// and a negative value is refused naming the flag, or its help says what
// negative means.
func TestFlagsNegative(t *testing.T) {
	cfg := epp.Config{}.WithDefaults()
	fs, _ := newFlags(&cfg)
	conftest.Flags(t, fs, func(name, value string) string {
		err := run([]string{"-" + name, value})
		require.Error(t, err)
		return err.Error()
	})
}

// TestFlagZeroIsTheDefault: a flag set to 0, where 0 is not a setting,
// takes the default, as a zero in the file does.
func TestFlagZeroIsTheDefault(t *testing.T) {
	cfg, err := epp.Load("")
	require.NoError(t, err)
	fs, _ := newFlags(&cfg)
	require.NoError(t, fs.Parse([]string{"-block-size", "0", "-index-memory-budget", "0"}))
	cfg = cfg.WithDefaults()
	require.Equal(t, 16, cfg.Scheduler.BlockSize)
	require.Equal(t, int64(256<<20), cfg.Index.MemoryBudget)
	require.NoError(t, cfg.Validate())
}

package main

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/omnious/provider-node/engines/sim"
	"github.com/omnious/provider-node/internal/testutil/conftest"
)

// TestFlagsNegative walks every numeric flag: its help says what 0 means,
// and a negative value is refused naming the flag, or its help says what
// negative means.
func TestFlagsNegative(t *testing.T) {
	var c sim.Config
	fs, _ := newFlags(&c, "")
	conftest.Flags(t, fs, func(name, value string) string {
		err := run([]string{"-" + name, value})
		require.Error(t, err)
		return err.Error()
	})
}

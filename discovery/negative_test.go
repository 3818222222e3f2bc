package discovery

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestConfigNegative: a negative interval is refused naming it, not
// taken as the default.
func TestConfigNegative(t *testing.T) {
	_, err := NewFile(FileConfig{Path: "endpoints.yaml", PollInterval: -1}, nil)
	require.EqualError(t, err, "PollInterval -1ns is negative; give a positive duration, or 0 for the default (1s)")
	c := PoolConfig{Name: "p", Namespace: "ns", CRDRecheck: -1}
	require.EqualError(t, c.fill(), "CRDRecheck -1ns is negative; give a positive duration, or 0 for the default (1m0s)")
}

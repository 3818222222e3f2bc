//go:build unix

package cputime

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestNowAdvancesWithWork(t *testing.T) {
	start, ok := Now()
	require.True(t, ok)
	x := 0
	for i := 0; i < 50_000_000; i++ {
		x += i ^ (x >> 3)
	}
	end, _ := Now()
	require.Greater(t, end, start, "CPU time grows with work (%d)", x)
}

package scheduler

import (
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"
)

// TestReplicaHotLine keeps what the loops over every replica read of a
// replica (in-flight count, sample, in-flight at the sample, score,
// sharing, id, metered, breaker state) in its first 64 bytes, and the
// replica's size a multiple of 64, so Go's allocator (size classes that
// are multiples of 64 hold objects at multiples of their size) starts
// each replica on a cache line.
func TestReplicaHotLine(t *testing.T) {
	var r replica
	require.Less(t, unsafe.Offsetof(r.br)+unsafe.Offsetof(r.br.state)+unsafe.Sizeof(r.br.state), uintptr(65))
	require.Zero(t, unsafe.Sizeof(r)%64, "replica is %d bytes", unsafe.Sizeof(r))
}

// TestSampledFitsALine keeps a sample's decision fields in one 64-byte
// allocation (a size class of its own, aligned to a cache line).
func TestSampledFitsALine(t *testing.T) {
	require.LessOrEqual(t, unsafe.Sizeof(sampled{}), uintptr(64))
	require.Greater(t, unsafe.Sizeof(sampled{}), uintptr(48), "the 48-byte class is not line aligned")
}

// TestStampOrder: stamps order as the times they stand for, on the
// monotonic clock and on a wall clock (a replay's, a test's), and a
// zero time is before every other.
func TestStampOrder(t *testing.T) {
	s, err := New(DefaultConfig(), nil, nil, nil)
	require.NoError(t, err)
	mono := time.Now()
	wall := time.Unix(1_700_000_000, 0)
	for _, tt := range []struct {
		name string
		a, b time.Time
	}{
		{"monotonic", mono, mono.Add(time.Nanosecond)},
		{"monotonic, an hour", mono.Add(-time.Hour), mono},
		{"wall", wall, wall.Add(time.Nanosecond)},
		{"wall, years before the epoch", wall.Add(-time.Hour), wall},
		{"zero", time.Time{}, wall},
	} {
		require.True(t, tt.a.Before(tt.b), tt.name)
		require.Less(t, s.stamp(tt.a), s.stamp(tt.b), tt.name)
		require.Equal(t, s.stamp(tt.a), s.stamp(tt.a), tt.name)
	}
}

// TestCandFitsALine keeps a candidate in one cache line: a decision
// writes one per replica and reads it back in every later pass.
func TestCandFitsALine(t *testing.T) {
	require.LessOrEqual(t, unsafe.Sizeof(cand{}), uintptr(64))
}

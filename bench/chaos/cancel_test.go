package chaos

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// kept counts a run's tagged requests on their tag's baseline home: the
// endpoint that served most of the tag there (ties to the first address).
// Tags the baseline never served are left out.
func TestKept(t *testing.T) {
	counts := func(m map[string]map[string]int) served {
		s := newServed()
		for tag, by := range m {
			for addr, n := range by {
				for range n {
					s.add(tag, addr)
				}
			}
		}
		return s
	}
	for _, tc := range []struct {
		name      string
		base, got map[string]map[string]int
		share     float64
		tags      int
	}{
		{"moved and new tags", map[string]map[string]int{"g1": {"a": 3}, "g2": {"b": 2, "a": 1}},
			map[string]map[string]int{"g1": {"a": 4, "b": 1}, "g2": {"b": 5}, "g3": {"c": 7}}, 0.9, 2},
		{"a tie goes to the first address", map[string]map[string]int{"g": {"b": 1, "a": 1}},
			map[string]map[string]int{"g": {"b": 2}}, 0, 1},
		{"nothing served", map[string]map[string]int{"g": {"a": 1}}, nil, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			share, tags := kept(counts(tc.base), counts(tc.got))
			require.InDelta(t, tc.share, share, 1e-12)
			require.Equal(t, tc.tags, tags)
		})
	}
	s := newServed()
	s.add("", "a")
	require.Equal(t, map[string]int{"a": 1}, s.addr)
	require.Empty(t, s.tag, "an untagged request counts by endpoint only")
}

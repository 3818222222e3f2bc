package tokenizer

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestPairTable checks the table against a map: every stored pair is
// found with the first value stored for it, absent pairs are not, at
// sizes from empty to many collisions.
func TestPairTable(t *testing.T) {
	for _, n := range []int{0, 1, 7, 1000, 100_000} {
		rng := rand.New(rand.NewPCG(uint64(n), 3))
		p := newPairTable(n)
		want := map[uint64]uint64{}
		for i := 0; i < n; i++ {
			// Small ids: dense keys, as real vocabularies have.
			k := uint64(rng.IntN(2000))<<32 | uint64(rng.IntN(2000))
			v := uint64(i)<<32 | uint64(rng.IntN(maxPairID))
			p.putNew(k, v)
			if _, dup := want[k]; !dup {
				want[k] = v
			}
		}
		for k, v := range want {
			got, ok := p.get(k)
			require.True(t, ok, "n=%d key %#x", n, k)
			require.Equal(t, v, got)
			m := p.lookup(k)
			require.NotEqual(t, noMerge, m)
			require.Equal(t, v>>32, m>>32)
			require.Equal(t, uint32(v), uint32(m)&mergedIDMask)
		}
		for i := 0; i < 10_000; i++ {
			k := uint64(rng.IntN(4000))<<32 | uint64(rng.IntN(4000))
			_, ok := p.get(k)
			_, in := want[k]
			require.Equal(t, in, ok, "n=%d key %#x", n, k)
			require.Equal(t, in, p.lookup(k) != noMerge, "n=%d key %#x", n, k)
		}
		seen := 0
		p.each(func(k, v uint64) {
			require.Equal(t, want[k], v)
			seen++
		})
		require.Equal(t, len(want), seen)
		p.markEnds()
		for k, v := range want {
			got, ok := p.get(k)
			require.True(t, ok)
			require.Equal(t, v, got, "markEnds changed a merge")
		}
	}
}

// TestPairTableEnds checks the end flags markEnds sets on merged ids
// against the pairs stored: a merged token flagged as no merge's left
// (right) is the left (right) of no pair, and one that is not flagged is
// of some pair.
func TestPairTableEnds(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 5))
	p := newPairTable(3000)
	left, right := map[uint32]bool{}, map[uint32]bool{}
	for i := 0; i < 3000; i++ {
		l, r := uint32(rng.IntN(3000)), uint32(rng.IntN(3000))
		p.putNew(uint64(l)<<32|uint64(r), uint64(i)<<32|uint64(rng.IntN(6000)))
		left[l], right[r] = true, true
	}
	p.markEnds()
	flagged := 0
	for i := 0; i < len(p.slots); i += 2 {
		if p.slots[i] == noPair {
			continue
		}
		m := uint32(p.slots[i+1])
		id := m & mergedIDMask
		require.Equal(t, !left[id], m&mergedNoLeft != 0, "id %d", id)
		require.Equal(t, !right[id], m&mergedNoRight != 0, "id %d", id)
		if m&(mergedNoLeft|mergedNoRight) != 0 {
			flagged++
		}
	}
	require.Greater(t, flagged, 100)
}

package scheduler

import (
	"math/rand/v2"
	"testing"

	"github.com/hashicorp/golang-lru/v2/simplelru"
	"github.com/stretchr/testify/require"

	"github.com/omnious/provider-node/kvindex"
)

// TestRecordTableAgainstSimpleLRU runs random gets and adds through the
// table and through golang-lru's simplelru, whose semantics it keeps: the
// same keys survive, with the same records, in the same order. Few
// distinct keys and small tables make evictions, probe runs crossing the
// table's end and backward shifts frequent.
func TestRecordTableAgainstSimpleLRU(t *testing.T) {
	for _, tt := range []struct {
		name      string
		max, keys int
		key       func(rng *rand.Rand, n int) uint64
	}{
		{"one", 1, 4, spreadKey},
		{"small", 7, 20, spreadKey},
		{"grows", 300, 1000, spreadKey},
		{"never full", 5000, 1000, spreadKey},
		{"small ints and zero", 50, 200, func(rng *rand.Rand, n int) uint64 { return uint64(rng.IntN(n)) }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(tt.max), uint64(tt.keys)))
			tab, err := newRecordTable(tt.max)
			require.NoError(t, err)
			want, err := simplelru.NewLRU[uint64, specVal](tt.max, nil)
			require.NoError(t, err)
			for i := range 20000 {
				k := tt.key(rng, tt.keys)
				if rng.IntN(2) == 0 {
					w, ok := want.Get(k)
					got := tab.get(k)
					require.Equal(t, ok, got != nil, "get %d at op %d", k, i)
					if ok {
						require.Equal(t, w, *got)
					}
					continue
				}
				var v specVal
				v.put(kvindex.Replica(i), int64(i+1))
				want.Add(k, v)
				tab.add(k, v)
				require.Equal(t, want.Len(), tab.len())
			}
			var order []uint64
			for n := tab.tail; n >= 0; n = tab.nodes[n].prev {
				order = append(order, tab.nodes[n].key)
			}
			require.Equal(t, want.Keys(), order, "oldest first")
			for _, k := range want.Keys() {
				w, _ := want.Peek(k)
				require.Equal(t, w, *tab.get(k))
			}
			require.LessOrEqual(t, 2*tab.len(), len(tab.slots))
		})
	}
}

// spreadKey is one of n keys spread over 64 bits, as block keys and chunk
// hashes are.
func spreadKey(rng *rand.Rand, n int) uint64 { return uint64(rng.IntN(n)+1) * 0xbf58476d1ce4e5b9 }

func TestRecordTableRejectsNoSize(t *testing.T) {
	_, err := newRecordTable(0)
	require.Error(t, err)
}

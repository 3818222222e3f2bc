package scheduler

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/omnious/provider-node/kvindex"
)

// TestSpecTableAgainstMap inserts and reads random keys through several
// growths against a map; at up to half load, probes run past occupied
// slots often.
func TestSpecTableAgainstMap(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, hint := range []int{0, 5, 1000} {
		tab := newSpecTable(hint)
		want := map[kvindex.Key]kvindex.Replica{}
		for i := 0; i < 5000; i++ {
			k := kvindex.Key(rng.Uint64() | 1)
			if tab.get(k) == nil {
				tab.insert(k).put(kvindex.Replica(i), 1)
				want[k] = kvindex.Replica(i)
			}
			if i%7 == 0 {
				require.Nil(t, tab.get(kvindex.Key(rng.Uint64()|1)))
			}
		}
		require.Equal(t, len(want), tab.n)
		require.LessOrEqual(t, 2*tab.n, len(tab.slots))
		for k, r := range want {
			v := tab.get(k)
			require.NotNil(t, v)
			require.Equal(t, r, v.r[0])
		}
	}
}

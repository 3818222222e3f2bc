package scheduler

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omnious/provider-node/kvindex"
)

// A shared prefix that load sent to a second replica is cached on both:
// the matcher must credit both, each with the prefix it was sent, and
// forget a replica only after its records expire.
func TestApproximateKeepsEveryCopy(t *testing.T) {
	a, err := newApproximate(4, 1000, time.Minute)
	require.NoError(t, err)
	now := time.Unix(1_700_000_000, 0)
	shared := []byte("the shared document, sixteen+ bytes of it")
	long := append(append([]byte(nil), shared...), " and question one"...)
	short := shared[:20]

	a.record(a.chunkHashes(nil, long), nil, 1, now)
	a.record(a.chunkHashes(nil, short), nil, 2, now.Add(30*time.Second))
	probe := append(append([]byte(nil), shared...), " and another question"...)
	hits, _ := a.matchText(a.chunkHashes(nil, probe), len(probe), now.Add(40*time.Second), nil, nil)
	common := len(shared) + len(" and ") // long and probe agree this far
	require.ElementsMatch(t, []prefixHit{{r: 1, n: common / 4 * 4}, {r: 2, n: 20}}, hits)

	// Replica 1's records expire first; replica 2's prefix is still known.
	hits, _ = a.matchText(a.chunkHashes(nil, probe), len(probe), now.Add(61*time.Second), nil, nil)
	require.Equal(t, []prefixHit{{r: 2, n: 20}}, hits)

	// More replicas than slots: the ones recorded longest ago give way.
	for r := kvindex.Replica(3); r < 3+specSlots; r++ {
		a.record(a.chunkHashes(nil, short), nil, r, now.Add(time.Duration(r)*time.Second+30*time.Second))
	}
	hits, _ = a.matchText(a.chunkHashes(nil, short), len(short), now.Add(40*time.Second), nil, nil)
	require.Len(t, hits, specSlots)
	for _, h := range hits {
		require.GreaterOrEqual(t, h.r, kvindex.Replica(3))
	}
}

// Past the dense part only every approxStride-th chunk is recorded: a long
// shared prefix still matches, to the last stride boundary inside it.
func TestApproximateStride(t *testing.T) {
	a, err := newApproximate(4, 1000, time.Minute)
	require.NoError(t, err)
	now := time.Unix(1_700_000_000, 0)
	doc := make([]byte, 4*100) // 100 chunks of 4 bytes
	for i := range doc {
		doc[i] = byte('a' + i%23)
	}
	first := append(append([]byte(nil), doc...), "question one, which is long"...)
	hashes := a.chunkHashes(nil, first)
	chunks := (len(first) + 3) / 4
	require.Len(t, hashes, approxDense+(chunks-approxDense)/approxStride+1, "dense part, every stride-th, and the last")
	a.record(hashes, nil, 1, now)

	second := append(append([]byte(nil), doc...), "another question"...)
	hits, _ := a.matchText(a.chunkHashes(nil, second), len(second), now, nil, nil)
	// The shared 100 chunks end between the stride boundaries 96 and 104.
	require.Equal(t, []prefixHit{{r: 1, n: 96 * 4}}, hits)

	for k, want := range map[int]int{0: 1, 15: 16, 16: 24, 17: 32} {
		require.Equal(t, want, approxChunks(k), k)
	}
}

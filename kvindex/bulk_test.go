package kvindex

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// indexImage is everything observable about an index, as comparable
// values: counters, per-replica counts, each key's residencies (replica
// to tier mask) and the LRU order, which decides what is evicted next.
type indexImage struct {
	Stats  Stats
	Counts []replicaCount
	Res    map[Key]map[Replica]uint8
	LRU    []Key
}

func imageOf(ix *Index) indexImage {
	img := indexImage{Stats: ix.Stats(), Res: map[Key]map[Replica]uint8{}}
	img.Stats.Lookups = 0
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	img.Counts = append(img.Counts, ix.counts...)
	for i := ix.head; i >= 0; i = ix.entries.at(i).next {
		e := ix.entries.at(i)
		img.LRU = append(img.LRU, e.key)
		m := map[Replica]uint8{}
		for p := int32(0); p < int32(e.n); p++ {
			v := *ix.resPtr(e, p)
			m[v.replica()] = v.mask()
		}
		img.Res[e.key] = m
	}
	return img
}

// TestBulkStoreEqualsStore: stores written replica after replica through
// writeBulk build the index Store builds from the same calls, with the
// same residencies, counters and LRU order, also when a key is stored
// twice by one replica, on several tiers, by hundreds of replicas (many
// overflow chunks), and when the budget evicts while loading.
func TestBulkStoreEqualsStore(t *testing.T) {
	for _, tc := range []struct {
		name     string
		replicas int
		budget   int64
	}{
		{"few", 4, 0},
		{"many", 300, 0},
		{"evicting", 120, 64 << 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(tc.replicas), 9))
			shared := AppendBlockKeys(nil, RootKey(testModel, "", ""), randTokens(rng, 16*40), 16)
			var w Writes
			for r := range tc.replicas {
				for range 1 + rng.IntN(6) {
					var keys []Key
					switch rng.IntN(3) {
					case 0: // a prefix every replica may hold, maybe again
						keys = shared[:1+rng.IntN(len(shared))]
					case 1: // a chain of the replica's own, after a shared prefix
						keys = append(append(keys, shared[:rng.IntN(8)]...),
							AppendBlockKeys(nil, RootKey(testModel, "", fmt.Sprint(r)), randTokens(rng, 16*(1+rng.IntN(30))), 16)...)
					default: // a key of another replica's chain
						keys = []Key{shared[rng.IntN(len(shared))], Key(rng.Uint64()) | 1}
					}
					w.add(Replica(r), Tier(rng.IntN(NumTiers)), false, keys)
				}
			}
			cfg := Config{MemoryBudget: tc.budget}
			want, got := New(cfg), New(cfg)
			var bs bulkStore
			// Split as LoadSnapshot hands batches over, at arbitrary ops.
			from := 0
			for from < len(w.ops) {
				to := min(len(w.ops), from+1+rng.IntN(40))
				var part Writes
				start := 0
				if from > 0 {
					start = w.ops[from-1].end
				}
				for _, op := range w.ops[from:to] {
					part.add(op.r, op.t, op.remove, w.keys[start:op.end])
					start = op.end
				}
				want.Write(&Writes{ops: append([]writeOp(nil), part.ops...), keys: append([]Key(nil), part.keys...)})
				got.writeBulk(&part, &bs)
				require.Zero(t, part.Len())
				from = to
			}
			checkInvariants(t, got)
			require.Equal(t, imageOf(want), imageOf(got))
			if tc.budget > 0 {
				require.Positive(t, got.Stats().Evictions)
			}
			if tc.replicas > 100 {
				require.Greater(t, len(got.Match(shared[:1], nil)), 100)
			}
			for n := 1; n <= len(shared); n += 7 {
				require.Equal(t, norm(want.Match(shared[:n], nil)), norm(got.Match(shared[:n], nil)))
			}
		})
	}
}

// TestBulkStoreAfterRemove: a removal in a bulk write, or a replica
// storing again after another one did, falls back to Store's search, so
// the index still equals Store's.
func TestBulkStoreAfterRemove(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	keys := AppendBlockKeys(nil, RootKey(testModel, "", ""), randTokens(rng, 16*20), 16)
	for _, tc := range []struct {
		name string
		tail func(w *Writes)
	}{
		{"removal", func(w *Writes) {
			w.add(3, TierGPU, true, keys[:5])
			w.add(3, TierCPU, false, keys)
			w.add(11, TierCPU, false, keys)
		}},
		{"replica again", func(w *Writes) {
			w.add(3, TierCPU, false, keys[2:])
			w.add(11, TierCPU, false, keys)
			w.add(3, TierGPU, false, keys[:4])
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var w Writes
			for r := range Replica(12) {
				w.add(r, TierGPU, false, keys)
			}
			tc.tail(&w)
			want, got := New(Config{}), New(Config{})
			want.Write(&Writes{ops: append([]writeOp(nil), w.ops...), keys: append([]Key(nil), w.keys...)})
			got.writeBulk(&w, &bulkStore{})
			checkInvariants(t, got)
			require.Equal(t, imageOf(want), imageOf(got))
		})
	}
}

// TestSnapshotLoadAtScale: 1,024 replicas of random event streams (shared
// prefixes, offloads, removals, clears), snapshotted and loaded, give the
// index that applying the snapshot's blocks as engine events builds: the
// same keys, residencies, per-tier counts and bytes, and the same match
// for every prompt. (The senders' own index can hold fewer residencies:
// a stream that stores the same tokens under two engine hashes and then
// removes one, which no engine does, loses the residency there; see
// ReplicaState.)
func TestSnapshotLoadAtScale(t *testing.T) {
	const replicas, batches = 1024, 40
	rng := rand.New(rand.NewPCG(11, 12))
	shared := make([][]uint32, 6)
	for i := range shared {
		shared[i] = randTokens(rng, 16)
	}
	ix := New(Config{})
	states := make([]*ReplicaState, replicas)
	var prompts [][]uint32
	for r := range states {
		states[r] = NewReplicaState(ix, Replica(r), testModel)
		g := newStreamGen(uint64(r+1), shared)
		for range batches {
			states[r].ApplyBatch(g.batch())
		}
		prompts = append(prompts, g.toks...)
	}
	var buf bytes.Buffer
	sw := NewSnapshotWriter(&buf, testHeader)
	for r, s := range states {
		require.NoError(t, sw.AddReplica(ReplicaTag{Name: fmt.Sprintf("10.1.%d.%d:8000", r/256, r%256)}, s))
	}
	require.NoError(t, sw.Close())
	_, blocks, skipped := sw.Stats()
	require.Zero(t, skipped)
	require.Greater(t, blocks, 8000)
	data := buf.Bytes()

	// The reference: every block of the snapshot as a BlockStored event
	// per tier, applied in the snapshot's order.
	ref, refIDs := New(Config{}), NewIDs()
	sr, err := NewSnapshotReader(bytes.NewReader(data), 0)
	require.NoError(t, err)
	media := [NumTiers]string{"GPU", "CPU", "DISK"}
	for {
		sec, err := sr.NextReplica()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
		id, err := refIDs.Assign(sec.Name)
		require.NoError(t, err)
		rs := NewReplicaState(ref, id, sec.Model)
		for {
			b, err := sr.NextBlock()
			if errors.Is(err, io.EOF) {
				break
			}
			require.NoError(t, err)
			for tier := range Tier(NumTiers) {
				if b.Tiers&(1<<tier) != 0 {
					ev := stored([]uint64{b.Hash}, b.Parent, b.Tokens, media[tier])
					ev.HasParent, ev.LoraName, ev.CacheSalt = b.HasParent, b.Lora, b.Salt
					rs.Apply(&ev)
				}
			}
		}
		require.Zero(t, rs.Stats().UnknownParent)
	}

	snap, err := LoadSnapshot(bytes.NewReader(data), LoadOptions{Want: testHeader, Assign: NewIDs().Assign})
	require.NoError(t, err)
	require.Equal(t, blocks, snap.Blocks)
	checkInvariants(t, snap.Index)
	want, got := imageOf(ref), imageOf(snap.Index)
	// Stores are batched per tier in a load, so the LRU order differs
	// where a replica holds blocks on several tiers; and growth is
	// prepared earlier for a batch, so allocated bytes may too.
	want.LRU, got.LRU = nil, nil
	want.Stats.AllocatedBytes, got.Stats.AllocatedBytes = 0, 0
	require.Equal(t, want, got)
	for r, lr := range snap.Replicas {
		require.Equal(t, dump(states[r]), dump(lr.State))
	}
	for i, p := range append(shared, prompts...) {
		if i%4 != 0 && i >= len(shared) {
			continue // a quarter of the prompts: the race detector is slow
		}
		keys := AppendBlockKeys(nil, RootKey(testModel, "", ""), p, 16)
		require.Equal(t, norm(ref.Match(keys, nil)), norm(snap.Index.Match(keys, nil)))
	}
	// The shared prefixes are held by hundreds of replicas: chunks were
	// walked.
	require.Greater(t, len(snap.Index.Match(AppendBlockKeys(nil, RootKey(testModel, "", ""), shared[0], 16), nil)), 300)
}

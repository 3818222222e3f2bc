package kvindex

import (
	"math/bits"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// m builds an expected match: blocks per tier (GPU, CPU, Storage).
func m(r Replica, gpu, cpu, storage int) Match {
	return Match{Replica: r, Blocks: gpu + cpu + storage, ByTier: [NumTiers]int{gpu, cpu, storage}}
}

// norm sorts matches by replica and hides the internal position hint.
func norm(ms []Match) []Match {
	out := slices.Clone(ms)
	for i := range out {
		out[i].pos, out[i].tier, out[i].seen = 0, 0, 0
	}
	slices.SortFunc(out, func(a, b Match) int { return int(a.Replica) - int(b.Replica) })
	if out == nil {
		out = []Match{}
	}
	return out
}

// chainTokens and chain are a prompt of n blocks of 4 tokens and its keys.
func chainTokens(n int) []uint32 {
	toks := make([]uint32, n*4)
	for i := range toks {
		toks[i] = uint32(i)
	}
	return toks
}

func chain(n int) []Key {
	return AppendBlockKeys(nil, RootKey("m", "", ""), chainTokens(n), 4)
}

type op struct {
	kind string // store, remove, clear
	r    Replica
	tier Tier
	from int
	to   int
}

func apply(ix *Index, keys []Key, ops []op) {
	for _, o := range ops {
		switch o.kind {
		case "store":
			ix.Store(o.r, o.tier, keys[o.from:o.to])
		case "remove":
			ix.Remove(o.r, o.tier, keys[o.from:o.to])
		case "clear":
			ix.ClearReplica(o.r)
		}
	}
}

func TestStoreMatchRemove(t *testing.T) {
	keys := chain(10)
	for _, tc := range []struct {
		name     string
		ops      []op
		query    []Key
		want     []Match
		resident map[Replica]int
	}{
		{"empty index", nil, keys, []Match{}, nil},
		{"empty query", []op{{"store", 1, TierGPU, 0, 10}}, nil, []Match{}, map[Replica]int{1: 10}},
		{"full prefix", []op{{"store", 1, TierGPU, 0, 10}}, keys, []Match{m(1, 10, 0, 0)}, map[Replica]int{1: 10}},
		{"query longer than held", []op{{"store", 1, TierGPU, 0, 4}}, keys, []Match{m(1, 4, 0, 0)}, nil},
		{"first key missing", []op{{"store", 1, TierGPU, 1, 10}}, keys, []Match{}, nil},
		{"hole stops the run", []op{{"store", 1, TierGPU, 0, 3}, {"store", 1, TierGPU, 4, 10}}, keys,
			[]Match{m(1, 3, 0, 0)}, map[Replica]int{1: 9}},
		{"nested prefixes", []op{
			{"store", 0, TierGPU, 0, 2}, {"store", 1, TierGPU, 0, 5}, {"store", 2, TierGPU, 0, 10},
		}, keys, []Match{m(0, 2, 0, 0), m(1, 5, 0, 0), m(2, 10, 0, 0)}, map[Replica]int{0: 2, 1: 5, 2: 10}},
		{"replica without the first block", []op{
			{"store", 0, TierGPU, 0, 3}, {"store", 1, TierGPU, 1, 10},
		}, keys, []Match{m(0, 3, 0, 0)}, nil},
		{"remove tail", []op{{"store", 1, TierGPU, 0, 10}, {"remove", 1, TierGPU, 6, 10}}, keys,
			[]Match{m(1, 6, 0, 0)}, map[Replica]int{1: 6}},
		{"remove other tier is a no-op", []op{{"store", 1, TierGPU, 0, 10}, {"remove", 1, TierCPU, 0, 10}}, keys,
			[]Match{m(1, 10, 0, 0)}, map[Replica]int{1: 10}},
		{"remove middle", []op{{"store", 1, TierGPU, 0, 10}, {"store", 2, TierGPU, 0, 10}, {"remove", 1, TierGPU, 5, 6}}, keys,
			[]Match{m(1, 5, 0, 0), m(2, 10, 0, 0)}, map[Replica]int{1: 9, 2: 10}},
		{"clear replica", []op{{"store", 1, TierGPU, 0, 10}, {"store", 2, TierCPU, 0, 4}, {"clear", 1, 0, 0, 0}}, keys,
			[]Match{m(2, 0, 4, 0)}, map[Replica]int{1: 0, 2: 4}},
		{"cpu tier", []op{{"store", 1, TierCPU, 0, 10}}, keys, []Match{m(1, 0, 10, 0)}, nil},
		{"gpu wins over cpu", []op{{"store", 1, TierCPU, 0, 10}, {"store", 1, TierGPU, 0, 3}}, keys,
			[]Match{m(1, 3, 7, 0)}, map[Replica]int{1: 10}},
		{"offload then drop gpu", []op{
			{"store", 1, TierGPU, 0, 10}, {"store", 1, TierCPU, 0, 10}, {"remove", 1, TierGPU, 0, 5},
		}, keys, []Match{m(1, 5, 5, 0)}, map[Replica]int{1: 10}},
		{"storage tier", []op{{"store", 1, TierStorage, 0, 2}, {"store", 1, TierCPU, 2, 4}}, keys,
			[]Match{m(1, 0, 2, 2)}, nil},
		{"invalid tier ignored", []op{{"store", 1, NumTiers, 0, 10}}, keys, []Match{}, map[Replica]int{1: 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ix := New(Config{})
			apply(ix, keys, tc.ops)
			require.Equal(t, tc.want, norm(ix.Match(tc.query, nil)))
			for r, n := range tc.resident {
				require.Equal(t, n, ix.Resident(r), "replica %d", r)
			}
			checkInvariants(t, ix)
		})
	}
}

func TestResidentTier(t *testing.T) {
	keys := chain(6)
	ix := New(Config{})
	ix.Store(3, TierGPU, keys[:4])
	ix.Store(3, TierCPU, keys[2:])
	ix.Remove(3, TierGPU, keys[:1])
	require.Equal(t, 5, ix.Resident(3)) // keys[0] is on no tier any more
	require.Equal(t, 3, ix.ResidentTier(3, TierGPU))
	require.Equal(t, 4, ix.ResidentTier(3, TierCPU))
	require.Equal(t, 0, ix.ResidentTier(3, TierStorage))
	require.Equal(t, 0, ix.Resident(200))
	st := ix.Stats()
	require.Equal(t, 5, st.Keys) // keys[0] left with no tier
	require.Equal(t, 5, st.Residencies)
}

// TestManyReplicas exercises overflow chunks: a key held by 300 replicas.
func TestManyReplicas(t *testing.T) {
	keys := chain(3)
	ix := New(Config{})
	for r := Replica(0); r < 300; r++ {
		ix.Store(r, TierGPU, keys[:1+int(r)%3])
	}
	checkInvariants(t, ix)
	got := norm(ix.Match(keys, nil))
	require.Len(t, got, 300)
	for _, g := range got {
		require.Equal(t, 1+int(g.Replica)%3, g.Blocks, "replica %d", g.Replica)
	}
	// Remove every other replica in an order that moves residencies around.
	for r := Replica(299); r < 300; r -= 2 {
		ix.Remove(r, TierGPU, keys)
	}
	checkInvariants(t, ix)
	got = norm(ix.Match(keys, nil))
	require.Len(t, got, 150)
	for _, g := range got {
		require.Equal(t, Replica(0), g.Replica%2)
		require.Equal(t, 1+int(g.Replica)%3, g.Blocks, "replica %d", g.Replica)
	}
	for r := Replica(0); r < 300; r += 2 {
		ix.ClearReplica(r)
	}
	checkInvariants(t, ix)
	require.Equal(t, Stats{Bytes: ix.Stats().Bytes, AllocatedBytes: ix.Stats().AllocatedBytes, Lookups: 2}, ix.Stats())
	require.Equal(t, int64(minSlots)*slotBytes+300*countBytes, ix.Stats().Bytes)
}

func TestMatchDoesNotAllocate(t *testing.T) {
	keys := chain(64)
	ix := New(Config{})
	for r := Replica(0); r < 8; r++ {
		ix.Store(r, TierGPU, keys[:8*(int(r)+1)])
	}
	out := make([]Match, 0, 8)
	require.Zero(t, testing.AllocsPerRun(50, func() { out = ix.Match(keys, out) }))
	require.Len(t, out, 8)
}

func TestEviction(t *testing.T) {
	keys := chain(8)
	// Budget: the empty table, counters for replicas 0 and 1, and exactly 4 keys.
	budget := int64(minSlots)*slotBytes + 2*countBytes + 4*entryBytes
	for _, tc := range []struct {
		name    string
		touch   []Key // matched after storing keys[0:4]
		store   int   // then store keys[4:4+store]
		present []int // key indexes expected afterwards
	}{
		{"within budget", nil, 0, []int{0, 1, 2, 3}},
		{"oldest evicted first", nil, 1, []int{1, 2, 3, 4}},
		{"oldest two evicted", nil, 2, []int{2, 3, 4, 5}},
		{"matched entry survives", keys[0:1], 1, []int{0, 2, 3, 4}},
		{"matched prefix survives", keys[0:2], 2, []int{0, 1, 4, 5}},
		{"missed lookup touches nothing", []Key{keys[7]}, 1, []int{1, 2, 3, 4}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ix := New(Config{MemoryBudget: budget})
			ix.Store(1, TierGPU, keys[:4])
			if tc.touch != nil {
				ix.Match(tc.touch, nil)
			}
			ix.Store(1, TierGPU, keys[4:4+tc.store])
			var present []int
			for i, k := range keys {
				if len(ix.Match([]Key{k}, nil)) == 1 {
					present = append(present, i)
				}
			}
			require.Equal(t, tc.present, present)
			st := ix.Stats()
			require.Equal(t, uint64(tc.store), st.Evictions)
			require.LessOrEqual(t, st.Bytes, budget)
			require.Equal(t, 4, ix.Resident(1))
			checkInvariants(t, ix)
		})
	}
}

func TestRestoreRefreshesLRU(t *testing.T) {
	keys := chain(5)
	ix := New(Config{MemoryBudget: int64(minSlots)*slotBytes + 2*countBytes + 4*entryBytes})
	ix.Store(1, TierGPU, keys[:4])
	ix.Store(2, TierCPU, keys[:1]) // storing again moves keys[0] to the tail
	ix.Store(1, TierGPU, keys[4:])
	require.Empty(t, ix.Match(keys[1:2], nil))
	require.Equal(t, []Match{m(1, 1, 0, 0), m(2, 0, 1, 0)}, norm(ix.Match(keys[:1], nil)))
	checkInvariants(t, ix)
}

// TestAgainstModel runs random operations against a naive model, which also
// exercises hash-table deletion with many colliding probes.
func TestAgainstModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	keys := chain(3000)
	type rk struct {
		r Replica
		k Key
	}
	model := map[rk]uint8{}
	ix := New(Config{})
	for step := 0; step < 20000; step++ {
		r := Replica(rng.IntN(12))
		tier := Tier(rng.IntN(NumTiers))
		from := rng.IntN(len(keys))
		to := min(len(keys), from+1+rng.IntN(40))
		switch x := rng.IntN(100); {
		case x < 60:
			ix.Store(r, tier, keys[from:to])
			for _, k := range keys[from:to] {
				model[rk{r, k}] |= 1 << tier
			}
		case x < 99:
			ix.Remove(r, tier, keys[from:to])
			for _, k := range keys[from:to] {
				if v := model[rk{r, k}] &^ (1 << tier); v == 0 {
					delete(model, rk{r, k})
				} else {
					model[rk{r, k}] = v
				}
			}
		default:
			ix.ClearReplica(r)
			for x := range model {
				if x.r == r {
					delete(model, x)
				}
			}
		}
		if step%1000 != 0 {
			continue
		}
		checkInvariants(t, ix)
		start := rng.IntN(len(keys) - 100)
		q := keys[start : start+100]
		var want []Match
		for r := Replica(0); r < 12; r++ {
			var mm Match
			mm.Replica = r
			for _, k := range q {
				v := model[rk{r, k}]
				if v == 0 {
					break
				}
				mm.Blocks++
				for tt := Tier(0); tt < NumTiers; tt++ {
					if v&(1<<tt) != 0 {
						mm.ByTier[tt]++
						break
					}
				}
			}
			if mm.Blocks > 0 {
				want = append(want, mm)
			}
		}
		require.Equal(t, norm(want), norm(ix.Match(q, nil)), "step %d", step)
	}
	require.Equal(t, len(model), ix.Stats().Residencies)
}

// refMatch is Match the plain way, for TestMatchEqualsReference: for every
// replica id, count the leading keys whose entry lists it, one key and one
// replica at a time.
func refMatch(ix *Index, keys []Key) []Match {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	out := []Match{}
	for r := range ix.counts {
		mm := Match{Replica: Replica(r)}
		for _, k := range keys {
			idx := ix.lookup(k)
			if idx < 0 {
				break
			}
			_, mask := ix.findRes(ix.entries.at(idx), Replica(r))
			if mask == 0 {
				break
			}
			mm.Blocks++
			mm.ByTier[bits.TrailingZeros8(mask)]++
		}
		if mm.Blocks > 0 {
			out = append(out, mm)
		}
	}
	return out
}

// TestMatchEqualsReference checks Match's walk (runs of equal residencies,
// the entry-after guess and its recorded sameBit, resolving through
// replica ids) against refMatch on
// random indexes: prompts branching from shared prefixes, stored by up to
// 80 replicas (residencies in overflow chunks) on random tiers, removed in
// random ranges, and with a budget small enough that eviction recycles
// entries, so chains lose their allocation order.
func TestMatchEqualsReference(t *testing.T) {
	for _, tc := range []struct {
		name     string
		replicas int
		budget   int64
	}{
		{"few", 3, 0},
		{"many", 80, 0},
		{"evicting", 80, int64(minSlots)*slotBytes + 80*countBytes + 400*entryBytes + 300*chunkBytes},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(tc.replicas), uint64(tc.budget)))
			root := RootKey("m", "", "")
			// Prompts of up to 60 blocks of 4 tokens, each continuing a
			// random earlier one from a random block.
			prompts := [][]Key{nil}
			toks := [][]uint32{nil}
			for len(prompts) < 60 {
				from := rng.IntN(len(toks))
				base := toks[from][:4*rng.IntN(len(toks[from])/4+1)]
				tail := make([]uint32, 4*(1+rng.IntN(30)))
				for i := range tail {
					tail[i] = rng.Uint32N(1000)
				}
				tt := append(slices.Clone(base), tail...)
				tt = tt[:min(len(tt), 240)]
				toks = append(toks, tt)
				prompts = append(prompts, AppendBlockKeys(nil, root, tt, 4))
			}
			prompts = prompts[1:]
			ix := New(Config{MemoryBudget: tc.budget})
			out := make([]Match, 0, tc.replicas)
			for step := 0; step < 3000; step++ {
				keys := prompts[rng.IntN(len(prompts))]
				r := Replica(rng.IntN(tc.replicas))
				tier := Tier(rng.IntN(NumTiers))
				switch x := rng.IntN(100); {
				case x < 70: // engines store prefixes
					ix.Store(r, tier, keys[:1+rng.IntN(len(keys))])
				case x < 98:
					from := rng.IntN(len(keys))
					ix.Remove(r, tier, keys[from:from+1+rng.IntN(len(keys)-from)])
				default:
					ix.ClearReplica(r)
				}
				q := prompts[rng.IntN(len(prompts))]
				out = ix.Match(q, out)
				require.Equal(t, norm(refMatch(ix, q)), norm(out), "step %d", step)
				if step%100 == 0 {
					checkInvariants(t, ix)
				}
			}
			checkInvariants(t, ix)
			if tc.budget > 0 {
				require.NotZero(t, ix.Stats().Evictions)
			}
		})
	}
}

func TestConcurrentReadersAndWriters(t *testing.T) {
	keys := chain(512)
	ix := New(Config{MemoryBudget: int64(minSlots)*slotBytes + 8*countBytes + 300*entryBytes})
	var wg sync.WaitGroup
	for w := 0; w < 2; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 9))
			for i := 0; i < 2000; i++ {
				r := Replica(rng.IntN(8))
				from := rng.IntN(len(keys))
				to := min(len(keys), from+1+rng.IntN(64))
				switch rng.IntN(10) {
				case 0:
					ix.ClearReplica(r)
				case 1, 2, 3:
					ix.Remove(r, TierGPU, keys[from:to])
				default:
					ix.Store(r, Tier(rng.IntN(2)), keys[from:to])
				}
			}
		}()
	}
	for rd := 0; rd < 4; rd++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out := make([]Match, 0, 8)
			for i := 0; i < 2000; i++ {
				out = ix.Match(keys[i%64:], out)
				for _, mm := range out {
					if mm.Blocks < 1 || mm.Blocks > len(keys) || mm.Replica >= 8 {
						t.Errorf("bad match %+v", mm)
						return
					}
				}
				_ = ix.Resident(Replica(i % 8))
				_ = ix.Stats()
			}
		}()
	}
	wg.Wait()
	st := ix.Stats()
	require.Equal(t, uint64(8000), st.Lookups)
	require.LessOrEqual(t, st.Bytes, int64(minSlots)*slotBytes+8*countBytes+300*entryBytes)
	checkInvariants(t, ix)
}

// checkInvariants recounts everything by walking the structures and checks
// the counters, the LRU list, the table and Stats.Bytes against it.
func checkInvariants(t *testing.T, ix *Index) {
	t.Helper()
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	live, res, chunks := 0, 0, 0
	counts := make([]replicaCount, len(ix.counts))
	for i := int32(0); i < ix.entries.used; i++ {
		e := ix.entries.at(i)
		if e.key == 0 {
			continue
		}
		live++
		require.NotZero(t, e.n, "empty entry kept")
		require.Equal(t, i, ix.lookup(e.key))
		for c := e.more; c >= 0; c = ix.chunks.at(c).next {
			chunks++
		}
		require.Equal(t, max(0, (int(e.n)-inlineRes+chunkRes-1)/chunkRes), func() int {
			n := 0
			for c := e.more; c >= 0; c = ix.chunks.at(c).next {
				n++
			}
			return n
		}())
		seen := map[Replica]bool{}
		var sig uint64
		for p := int32(0); p < int32(e.n); p++ {
			v := *ix.resPtr(e, p)
			sig ^= resSig(v)
			require.NotZero(t, v.mask())
			require.False(t, seen[v.replica()], "duplicate replica")
			seen[v.replica()] = true
			counts[v.replica()].blocks++
			for tt := Tier(0); tt < NumTiers; tt++ {
				if v.mask()&(1<<tt) != 0 {
					counts[v.replica()].byTier[tt]++
				}
			}
			res++
		}
		if e.more >= 0 {
			require.Equal(t, sig, ix.chunks.at(e.more).sig, "residency signature of key %x", e.key)
		}
		if e.ref&sameBit != 0 {
			require.Positive(t, i, "sameBit on the first entry")
			prev := ix.entries.at(i - 1)
			require.NotZero(t, prev.key, "sameBit after a free entry")
			var st matchState
			ix.setPrev(&st, i-1, prev)
			require.True(t, ix.sameRes(e, &st), "sameBit on an entry unlike the one before it")
		}
	}
	n := 0
	prev := int32(-1)
	for i := ix.head; i >= 0; i = ix.entries.at(i).next {
		require.Equal(t, prev, ix.entries.at(i).prev)
		prev = i
		n++
	}
	require.Equal(t, prev, ix.tail)
	occupied := 0
	for _, s := range ix.slots {
		if s.idx != 0 {
			occupied++
			require.Equal(t, tagOf(ix.entries.at(s.idx-1).key), s.tag)
		}
	}
	require.Equal(t, live, n, "LRU list length")
	require.Equal(t, live, occupied, "table occupancy")
	require.Equal(t, live, ix.keys)
	require.Equal(t, res, ix.residencies)
	require.Equal(t, chunks, ix.liveChunks)
	require.Len(t, ix.counts, len(counts))
	for r := range counts {
		require.Equal(t, counts[r], ix.counts[r], "replica %d counts", r)
	}
	want := int64(len(ix.slots))*8 + int64(live)*48 + int64(chunks)*40 + int64(len(ix.counts))*16
	require.Equal(t, want, ix.accountedBytes(), "byte accounting")
}

package kvindex

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/omnious/provider-node/engines/kvevents"
)

// streamGen makes one engine's event stream: requests that start from one
// of a few prefixes every engine shares (same tokens, so the same keys on
// every replica) and grow block by block, on GPU and sometimes offloaded to
// CPU, freed whole, and now and then AllBlocksCleared.
type streamGen struct {
	rng    *rand.Rand
	seed   uint64
	next   uint64
	chains [][]uint64 // engine hashes of running requests
	cpu    []bool     // request offloaded to CPU too
	toks   [][]uint32 // tokens of each request, block by block
	shared [][]uint32 // the shared prefixes' tokens, one block each
}

func newStreamGen(seed uint64, shared [][]uint32) *streamGen {
	return &streamGen{rng: rand.New(rand.NewPCG(seed, 7)), seed: seed, shared: shared}
}

func (g *streamGen) hash() uint64 {
	g.next++
	return g.seed<<32 | g.next
}

// batch returns the next batch of a few events.
func (g *streamGen) batch() *kvevents.Batch {
	b := &kvevents.Batch{}
	for range 1 + g.rng.IntN(4) {
		switch x := g.rng.IntN(40); {
		case x == 0:
			b.Events = append(b.Events, kvevents.Event{Kind: kvevents.KindAllBlocksCleared})
			g.chains, g.cpu, g.toks = nil, nil, nil
		case x < 8 && len(g.chains) > 0: // a request ends
			i := g.rng.IntN(len(g.chains))
			b.Events = append(b.Events, removed(g.chains[i], "GPU"))
			if g.cpu[i] {
				b.Events = append(b.Events, removed(g.chains[i], "CPU"))
			}
			g.chains = append(g.chains[:i], g.chains[i+1:]...)
			g.cpu = append(g.cpu[:i], g.cpu[i+1:]...)
			g.toks = append(g.toks[:i], g.toks[i+1:]...)
		case x < 12 && len(g.chains) > 0: // offload a request's blocks
			i := g.rng.IntN(len(g.chains))
			if !g.cpu[i] {
				g.cpu[i] = true
				ev := stored(g.chains[i], 0, g.toks[i], "CPU")
				b.Events = append(b.Events, ev)
			}
		case x < 20 || len(g.chains) == 0: // a request starts on a shared prefix
			p := g.shared[g.rng.IntN(len(g.shared))]
			h := g.hash()
			b.Events = append(b.Events, stored([]uint64{h}, 0, p, "GPU"))
			g.chains = append(g.chains, []uint64{h})
			g.cpu = append(g.cpu, false)
			g.toks = append(g.toks, append([]uint32(nil), p...))
		default: // a running request fills blocks
			i := g.rng.IntN(len(g.chains))
			if g.cpu[i] {
				continue
			}
			n := 1 + g.rng.IntN(3)
			hs := make([]uint64, n)
			for j := range hs {
				hs[j] = g.hash()
			}
			toks := randTokens(g.rng, 16*n)
			b.Events = append(b.Events, stored(hs, g.chains[i][len(g.chains[i])-1], toks, "GPU"))
			g.chains[i] = append(g.chains[i], hs...)
			g.toks[i] = append(g.toks[i], toks...)
		}
	}
	return b
}

// TestApplyBatchToInterleaved: many replicas' batches applied through one
// shared Writes, interleaved at random and written at random points, leave
// each replica exactly as applying its own stream alone to an index of its
// own does: the same state counters, the same residencies per tier, the
// same matches for every prefix it ever stored.
func TestApplyBatchToInterleaved(t *testing.T) {
	const replicas, batches = 16, 200
	rng := rand.New(rand.NewPCG(5, 6))
	shared := [][]uint32{randTokens(rng, 16), randTokens(rng, 16), randTokens(rng, 16)}
	streams := make([][]*kvevents.Batch, replicas)
	for r := range streams {
		g := newStreamGen(uint64(r+1), shared)
		for range batches {
			streams[r] = append(streams[r], g.batch())
		}
	}

	ix := New(Config{})
	states := make([]*ReplicaState, replicas)
	for r := range states {
		states[r] = NewReplicaState(ix, Replica(r+1), testModel)
	}
	var w Writes
	next := make([]int, replicas)
	for left := replicas * batches; left > 0; left-- {
		r := rng.IntN(replicas)
		for next[r] == batches {
			r = (r + 1) % replicas
		}
		states[r].ApplyBatchTo(&w, streams[r][next[r]])
		next[r]++
		if rng.IntN(8) == 0 {
			ix.Write(&w)
			require.Zero(t, w.Len())
		}
	}
	ix.Write(&w)

	for r := range replicas {
		id := Replica(r + 1)
		alone := New(Config{})
		st := NewReplicaState(alone, id, testModel)
		var prefixes [][]Key
		for _, b := range streams[r] {
			st.ApplyBatch(b)
			for _, ev := range b.Events {
				if ev.Kind == kvevents.KindBlockStored && !ev.HasParent {
					prefixes = append(prefixes, AppendBlockKeys(nil, RootKey(testModel, "", ""), ev.TokenIDs, 16))
				}
			}
		}
		msg := fmt.Sprintf("replica %d", id)
		require.Equal(t, st.Stats(), states[r].Stats(), msg)
		require.Equal(t, alone.Resident(id), ix.Resident(id), msg)
		for tier := range Tier(NumTiers) {
			require.Equal(t, alone.ResidentTier(id, tier), ix.ResidentTier(id, tier), msg)
		}
		// Every stored chain, as long as the state still holds it.
		for h, b := range st.blocks {
			keys := []Key{b.key}
			for b.hasParent {
				h = b.parent
				b = st.blocks[h]
				keys = append([]Key{b.key}, keys...)
			}
			require.Equal(t, onlyReplica(alone.Match(keys, nil), id), onlyReplica(ix.Match(keys, nil), id), msg)
		}
		for _, keys := range prefixes {
			require.Equal(t, onlyReplica(alone.Match(keys, nil), id), onlyReplica(ix.Match(keys, nil), id), msg)
		}
	}
	// Shared prefixes are held by several replicas in the shared index.
	key := AppendBlockKeys(nil, RootKey(testModel, "", ""), shared[0], 16)
	require.Greater(t, len(ix.Match(key, nil)), 1)
}

// onlyReplica returns r's match without its internal hints, or nil.
func onlyReplica(ms []Match, r Replica) []Match {
	for _, x := range norm(ms) {
		if x.Replica == r {
			return []Match{x}
		}
	}
	return nil
}

// TestWriteReleasesTheLock: a Writes longer than writeHold keys is applied
// whole, in order, across several holds of the lock.
func TestWriteReleasesTheLock(t *testing.T) {
	ix := New(Config{})
	rng := rand.New(rand.NewPCG(1, 2))
	keys := AppendBlockKeys(nil, RootKey(testModel, "", ""), randTokens(rng, 16*3*writeHold), 16)
	var w Writes
	w.add(1, TierGPU, false, keys)
	w.add(2, TierGPU, false, keys[:writeHold])
	w.add(1, TierGPU, true, keys[writeHold:])
	w.add(2, TierCPU, false, keys[:10])
	require.Equal(t, 6*writeHold+10, w.Len())
	ix.Write(&w)
	require.Zero(t, w.Len())
	require.Equal(t, writeHold, ix.Resident(1))
	require.Equal(t, writeHold, ix.Resident(2))
	require.Equal(t, 10, ix.ResidentTier(2, TierCPU))
	require.Equal(t, []Match{m(1, writeHold, 0, 0), m(2, writeHold, 0, 0)}, norm(ix.Match(keys, nil)))
}

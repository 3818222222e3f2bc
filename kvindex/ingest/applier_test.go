package ingest

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/omnious/provider-node/engines/kvevents"
	"github.com/omnious/provider-node/kvindex"
)

// orderGen is one engine's stream for TestApplierKeepsEachReplicasOrder:
// requests grow block by block and are freed whole; some start on a prefix
// every engine shares; now and then the stream is reset.
type orderGen struct {
	rng    *rand.Rand
	next   uint64
	seed   uint64
	hashes [][]uint64
	toks   [][]uint32
	shared []uint32
	// chains are the token lists of every request ever started, to look
	// up at the end.
	chains [][]uint32
}

// step fills dst with the next batch, or says the stream resets.
func (g *orderGen) step(dst *kvevents.Batch) (reset bool) {
	dst.Events = dst.Events[:0]
	if g.rng.IntN(100) == 0 {
		g.hashes, g.toks = nil, nil
		return true
	}
	for range 1 + g.rng.IntN(4) {
		switch x := g.rng.IntN(10); {
		case x == 0 && len(g.hashes) > 0:
			i := g.rng.IntN(len(g.hashes))
			dst.Events = append(dst.Events, kvevents.Event{Kind: kvevents.KindBlockRemoved, BlockHashes: g.hashes[i], Medium: "GPU"})
			g.hashes = slices.Delete(g.hashes, i, i+1)
			g.toks = slices.Delete(g.toks, i, i+1)
		case x < 3 || len(g.hashes) == 0:
			toks := make([]uint32, benchBlock)
			if x == 1 {
				copy(toks, g.shared)
			} else {
				for j := range toks {
					toks[j] = g.rng.Uint32N(151936)
				}
			}
			g.next++
			h := g.seed<<32 | g.next
			dst.Events = append(dst.Events, kvevents.Event{Kind: kvevents.KindBlockStored, BlockHashes: []uint64{h},
				TokenIDs: toks, BlockSize: benchBlock, Medium: "GPU"})
			g.hashes = append(g.hashes, []uint64{h})
			g.toks = append(g.toks, toks)
			g.chains = append(g.chains, nil)
		default:
			i := g.rng.IntN(len(g.hashes))
			toks := make([]uint32, benchBlock)
			for j := range toks {
				toks[j] = g.rng.Uint32N(151936)
			}
			g.next++
			h := g.seed<<32 | g.next
			last := g.hashes[i][len(g.hashes[i])-1]
			dst.Events = append(dst.Events, kvevents.Event{Kind: kvevents.KindBlockStored, BlockHashes: []uint64{h},
				ParentHash: last, HasParent: true, TokenIDs: toks, BlockSize: benchBlock, Medium: "GPU"})
			g.hashes[i] = append(slices.Clip(g.hashes[i]), h)
			g.toks[i] = append(slices.Clip(g.toks[i]), toks...)
			g.chains = append(g.chains, g.toks[i])
		}
	}
	return false
}

// TestApplierKeepsEachReplicasOrder: many feeds hand over batches and
// resets at once, each from its own goroutine reusing one batch as a
// subscriber does, through a queue small enough to fill; every replica
// ends exactly as its own stream applied alone to an index of its own.
func TestApplierKeepsEachReplicasOrder(t *testing.T) {
	const replicas, steps = 32, 200
	ix := kvindex.New(kvindex.Config{})
	m, err := New(Config{}, benchBlock, ix, zap.NewNop())
	require.NoError(t, err)
	defer m.Close()
	m.apply.close()
	m.apply = newApplier(ix, 8)
	rng := rand.New(rand.NewPCG(3, 4))
	shared := make([]uint32, benchBlock)
	for j := range shared {
		shared[j] = rng.Uint32N(151936)
	}
	feeds := make([]*feed, replicas)
	gens := make([]*orderGen, replicas)
	for i := range feeds {
		s := Source{Replica: kvindex.Replica(i + 1), Name: fmt.Sprintf("10.0.0.%d:8000", i), Model: model}
		feeds[i] = &feed{src: s, log: zap.NewNop(), blockSize: benchBlock, lag: m.lag, apply: m.apply,
			state: kvindex.NewReplicaState(ix, s.Replica, model)}
		gens[i] = &orderGen{rng: rand.New(rand.NewPCG(uint64(i), 9)), seed: uint64(i + 1), shared: shared}
	}
	// Each feed's stream, recorded to replay alone: nil is a reset.
	streams := make([][]*kvevents.Batch, replicas)
	var wg sync.WaitGroup
	for i, f := range feeds {
		wg.Go(func() {
			var b kvevents.Batch
			for seq := range uint64(steps) {
				if gens[i].step(&b) {
					streams[i] = append(streams[i], nil)
					f.HandleReset("", "test")
					continue
				}
				streams[i] = append(streams[i], cloneBatch(&b))
				hand := cloneBatch(&b) // the generator keeps b's slices
				f.HandleBatch("", kvevents.Position{Seq: seq}, hand)
				// The subscriber decodes its next batch into the memory
				// handed back: the applier must hold none of it.
				for j := range hand.Events[:cap(hand.Events)] {
					ev := &hand.Events[:cap(hand.Events)][j]
					clear(ev.BlockHashes[:cap(ev.BlockHashes)])
					clear(ev.TokenIDs[:cap(ev.TokenIDs)])
				}
			}
		})
	}
	wg.Wait()
	// A stop of another feed is applied after everything handed over before.
	m.apply.stop(&feed{state: kvindex.NewReplicaState(ix, replicas+1, model)})
	require.NotZero(t, m.apply.full.Load(), "the queue never filled")

	root := kvindex.RootKey(model, "", "")
	for i, f := range feeds {
		r := kvindex.Replica(i + 1)
		alone := kvindex.New(kvindex.Config{})
		st := kvindex.NewReplicaState(alone, r, model)
		for _, b := range streams[i] {
			if b == nil {
				st.Reset()
			} else {
				st.ApplyBatch(b)
			}
		}
		msg := fmt.Sprintf("replica %d", r)
		require.Equal(t, st.Stats(), f.stats, msg)
		require.Equal(t, alone.Resident(r), ix.Resident(r), msg)
		for _, toks := range gens[i].chains {
			keys := kvindex.AppendBlockKeys(nil, root, toks, benchBlock)
			require.Equal(t, replicaBlocks(alone.Match(keys, nil), r), replicaBlocks(ix.Match(keys, nil), r), msg)
		}
	}
}

// replicaBlocks returns r's matched blocks by tier.
func replicaBlocks(ms []kvindex.Match, r kvindex.Replica) [kvindex.NumTiers]int {
	for _, x := range ms {
		if x.Replica == r {
			return x.ByTier
		}
	}
	return [kvindex.NumTiers]int{}
}

// cloneBatch returns a copy of b that shares no memory with it.
func cloneBatch(b *kvevents.Batch) *kvevents.Batch {
	c := *b
	c.Events = slices.Clone(b.Events)
	for i := range c.Events {
		c.Events[i].BlockHashes = slices.Clone(b.Events[i].BlockHashes)
		c.Events[i].TokenIDs = slices.Clone(b.Events[i].TokenIDs)
	}
	return &c
}

// TestApplierGoesOnWhileASnapshotHoldsAFeed: while WriteSnapshot holds one
// feed (its lock taken for the encoding), the applier goes on with the
// others, and applies the held feed's batches and resets in their order
// once it is free.
func TestApplierGoesOnWhileASnapshotHoldsAFeed(t *testing.T) {
	ix := kvindex.New(kvindex.Config{})
	m, err := New(Config{}, benchBlock, ix, zap.NewNop())
	require.NoError(t, err)
	defer m.Close()
	newFeed := func(r kvindex.Replica) *feed {
		return &feed{src: Source{Replica: r, Name: fmt.Sprintf("10.0.0.%d:8000", r), Model: model}, log: zap.NewNop(),
			blockSize: benchBlock, lag: m.lag, apply: m.apply, state: kvindex.NewReplicaState(ix, r, model)}
	}
	block := func(h uint64) *kvevents.Batch {
		toks := make([]uint32, benchBlock)
		for j := range toks {
			toks[j] = uint32(h*100 + uint64(j))
		}
		return &kvevents.Batch{Events: []kvevents.Event{{Kind: kvevents.KindBlockStored, BlockHashes: []uint64{h},
			TokenIDs: toks, BlockSize: benchBlock, Medium: "GPU"}}}
	}
	held, free := newFeed(1), newFeed(2)
	held.mu.Lock() // as WriteSnapshot does while it encodes the replica
	held.HandleBatch("", kvevents.Position{Seq: 1}, block(11))
	held.HandleReset("", "test")
	held.HandleBatch("", kvevents.Position{Seq: 2}, block(12))
	free.HandleBatch("", kvevents.Position{Seq: 1}, block(21))
	free.HandleBatch("", kvevents.Position{Seq: 2}, block(22))
	require.Eventually(t, func() bool { return ix.Resident(2) == 2 }, 5*time.Second, time.Millisecond)
	require.Zero(t, ix.Resident(1))
	require.Equal(t, kvindex.ReplicaStats{}, held.stats)
	held.mu.Unlock()
	require.Eventually(t, func() bool { return ix.Resident(1) == 1 }, 5*time.Second, time.Millisecond)
	held.mu.Lock()
	defer held.mu.Unlock()
	require.Equal(t, kvindex.ReplicaStats{StoredBlocks: 2, Resets: 1, Blocks: 1}, held.stats)
	require.Equal(t, kvevents.Position{Seq: 2}, held.pos)
}

// TestApplierHandsBackTheFeedsOwnBatch: once a feed's batch is applied,
// its memory is what the feed's subscriber gets back with the next batch,
// so each engine's batches are decoded into memory of their own shapes.
func TestApplierHandsBackTheFeedsOwnBatch(t *testing.T) {
	ix := kvindex.New(kvindex.Config{})
	m, err := New(Config{}, benchBlock, ix, zap.NewNop())
	require.NoError(t, err)
	defer m.Close()
	newFeed := func(r kvindex.Replica) *feed {
		return &feed{src: Source{Replica: r, Name: fmt.Sprintf("10.0.0.%d:8000", r), Model: model}, log: zap.NewNop(),
			blockSize: benchBlock, lag: m.lag, apply: m.apply, state: kvindex.NewReplicaState(ix, r, model)}
	}
	steps := engineCycle(1)
	f, other := newFeed(1), newFeed(2)
	first := &kvevents.Batch{Events: slices.Clone(steps[0])}
	mem := &first.Events[0]
	f.HandleBatch("", kvevents.Position{Seq: 0}, first)
	require.Eventually(t, func() bool { return f.spare.Load() != nil }, 5*time.Second, time.Millisecond)
	// Another feed's batch does not take it.
	other.HandleBatch("", kvevents.Position{Seq: 0}, &kvevents.Batch{Events: slices.Clone(steps[0])})
	next := &kvevents.Batch{Events: slices.Clone(steps[1])}
	f.HandleBatch("", kvevents.Position{Seq: 1}, next)
	require.NotEmpty(t, next.Events[:cap(next.Events)])
	require.Same(t, mem, &next.Events[:1][0], "the feed's first batch is handed back with its second")
}

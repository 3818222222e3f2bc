package engine

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/omnious/provider-node/engines/kvevents"
)

// negGolden is SGLang's hash of tokens 3..18: the int64 -9067047621753565086.
var negGolden = func() uint64 { v := int64(-9067047621753565086); return uint64(v) }()

func TestHashGolden(t *testing.T) {
	// Expected values computed independently with Python's hashlib.
	tests := []struct {
		name    string
		flavour string
		tokens  []uint32 // 2 blocks of 16
		lora    string
		salt    string
		want    []uint64
	}{
		{"vllm seed 0", FlavourVLLM, seq(1, 32), "", "", []uint64{9906938952948778431, 5730299653210765147}},
		{"sglang", FlavourSGLang, seq(1, 32), "", "", []uint64{8635429971592222890, 1256577331724852459}},
		{"sglang negative int64", FlavourSGLang, seq(3, 16), "", "", []uint64{negGolden}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHasher(tt.flavour, 0)
			parent, hasParent := h.root(tt.lora, tt.salt)
			var got []uint64
			for j := 0; j < len(tt.tokens)/16; j++ {
				d := h.block(parent, hasParent, tt.tokens[j*16:(j+1)*16], j, tt.lora, tt.salt)
				got = append(got, h.wire(d))
				parent, hasParent = d, true
			}
			require.Equal(t, tt.want, got)
		})
	}

	t.Run("vllm extra keys", func(t *testing.T) {
		h := newHasher(FlavourVLLM, 0)
		root, _ := h.root("lora", "salt")
		require.Equal(t, uint64(912364318593411480), h.wire(h.block(root, true, seq(1, 16), 0, "lora", "salt")))
		// The salt only enters block 0; LoRA and salt never collide.
		require.Equal(t, h.block(root, true, seq(1, 16), 1, "", "salt"), h.block(root, true, seq(1, 16), 1, "", ""))
		require.NotEqual(t, h.block(root, true, seq(1, 16), 0, "x", ""), h.block(root, true, seq(1, 16), 0, "", "x"))
	})

	t.Run("seed changes vllm hashes", func(t *testing.T) {
		a, b := newHasher(FlavourVLLM, 0), newHasher(FlavourVLLM, 1)
		ra, _ := a.root("", "")
		rb, _ := b.root("", "")
		require.NotEqual(t, a.block(ra, true, seq(1, 16), 0, "", ""), b.block(rb, true, seq(1, 16), 0, "", ""))
	})
}

func TestEngineEmitsGoldenHashes(t *testing.T) {
	tests := []struct {
		flavour string
		want    [][]uint64 // per BlockStored event
		parents []bool
	}{
		{FlavourVLLM, [][]uint64{{9906938952948778431, 5730299653210765147}}, []bool{false}},
		{FlavourSGLang, [][]uint64{{8635429971592222890}, {1256577331724852459}}, []bool{false, true}},
	}
	for _, tt := range tests {
		t.Run(tt.flavour, func(t *testing.T) {
			h := newHarness(t, Config{Flavour: tt.flavour, Model: "m", BlockSize: 16, NumGPUBlocks: 8})
			h.complete("a", seq(1, 33), []uint32{7})
			evs := h.sink.take()
			require.Len(t, evs, len(tt.want))
			for i, ev := range evs {
				require.Equal(t, kvevents.KindBlockStored, ev.Kind)
				require.Equal(t, tt.want[i], ev.BlockHashes)
				require.Equal(t, tt.parents[i], ev.HasParent)
				require.Equal(t, MediumGPU, ev.Medium)
				require.Equal(t, 16, ev.BlockSize)
				require.Len(t, ev.TokenIDs, 16*len(ev.BlockHashes))
				if ev.HasParent {
					require.Equal(t, tt.want[i-1][len(tt.want[i-1])-1], ev.ParentHash)
				}
			}
			var toks []uint32
			for _, ev := range evs {
				toks = append(toks, ev.TokenIDs...)
			}
			require.Equal(t, seq(1, 32), toks)
		})
	}
}

func TestPrefixCaching(t *testing.T) {
	h := newHarness(t, Config{BlockSize: 4, NumGPUBlocks: 64})
	prompt, out := seq(1, 10), []uint32{100, 101, 102}

	chA := h.submit("a", prompt, out)
	h.runIdle()
	upsA := drain(t, chA)
	last := upsA[len(upsA)-1]
	require.Equal(t, Update{Generated: 3, PromptTokens: 10, CachedTokens: 0, Done: true}, last)

	evs := h.sink.take()
	require.Len(t, evs, 2, "prefill stores blocks 0-1, the second decode fills block 2")
	require.Len(t, evs[0].BlockHashes, 2)
	require.Equal(t, seq(1, 8), evs[0].TokenIDs)
	require.False(t, evs[0].HasParent)
	require.Equal(t, []uint32{9, 10, 100, 101}, evs[1].TokenIDs, "decode tokens are cached when the block fills")
	require.True(t, evs[1].HasParent)
	require.Equal(t, evs[0].BlockHashes[1], evs[1].ParentHash)
	require.Len(t, h.e.Resident(), 3)

	// The same prompt hits every full block but the one holding the last
	// prompt token, which is always recomputed.
	chB := h.submit("b", prompt, out)
	h.runIdle()
	upsB := drain(t, chB)
	require.Equal(t, 8, upsB[0].CachedTokens)
	require.Empty(t, h.sink.take(), "nothing new to store")
	st := h.e.Snapshot()
	require.Equal(t, int64(20), st.PrefixCacheQueries)
	require.Equal(t, int64(8), st.PrefixCacheHits)

	// A partial block is never cached.
	h.complete("c", seq(500, 6), []uint32{1})
	evs = h.sink.take()
	require.Len(t, evs, 1)
	require.Equal(t, seq(500, 4), evs[0].TokenIDs)
	require.Len(t, h.e.Resident(), 4)
}

func TestSharedPrefixRefcount(t *testing.T) {
	h := newHarness(t, Config{BlockSize: 4, NumGPUBlocks: 11}) // 10 and vLLM's null block
	// x leaves two cached, unreferenced blocks: the only eviction candidates.
	h.complete("x", seq(3000, 8), []uint32{1})
	x := h.sink.take()[0].BlockHashes

	h.submit("a", seq(1, 9), seq(1000, 20))
	h.step()
	stored := h.sink.take()
	require.Len(t, stored, 1)
	shared := stored[0].BlockHashes
	require.Len(t, shared, 2)

	h.submit("b", append(seq(1, 8), 900), seq(2000, 20))
	h.step()
	refs := func() map[uint64]int {
		m := map[uint64]int{}
		for _, r := range h.e.Resident() {
			m[r.Hash] = r.RefCount
		}
		return m
	}
	require.Equal(t, 2, refs()[shared[0]])
	require.Equal(t, 2, refs()[shared[1]])

	// c needs every remaining block: x's blocks are evicted, never the
	// shared prefix still referenced by a and b.
	h.submit("c", seq(5000, 24), seq(7000, 5))
	h.step()
	var removed []uint64
	for _, ev := range h.sink.take() {
		if ev.Kind == kvevents.KindBlockRemoved {
			removed = append(removed, ev.BlockHashes...)
		}
	}
	require.ElementsMatch(t, x, removed)
	require.Equal(t, 2, refs()[shared[0]])
	require.Equal(t, 2, refs()[shared[1]])
	require.Equal(t, 10, h.e.Snapshot().UsedBlocks)
}

func TestLRUEviction(t *testing.T) {
	h := newHarness(t, Config{BlockSize: 4, NumGPUBlocks: 5}) // 4 and vLLM's null block
	stored := func() []uint64 {
		var hs []uint64
		for _, ev := range h.sink.take() {
			require.Equal(t, kvevents.KindBlockStored, ev.Kind)
			hs = append(hs, ev.BlockHashes...)
		}
		return hs
	}
	h.complete("a", seq(1, 8), []uint32{1})
	a := stored()
	h.complete("b", seq(101, 8), []uint32{1})
	b := stored()
	require.Len(t, a, 2)
	require.Len(t, b, 2)

	// Reusing a's prefix makes b the least recently used: a's third block
	// evicts b's tail first (freed last-block-first), and the next request
	// takes the uncached block before evicting b's head.
	ups := h.complete("a2", append(seq(1, 8), 9), []uint32{1})
	require.Equal(t, 8, ups[0].CachedTokens)
	// a2's prefill covers only its last token: its hits need no compute.
	h.complete("c", seq(201, 8), []uint32{1})

	var removed []uint64
	for _, ev := range h.sink.take() {
		if ev.Kind == kvevents.KindBlockRemoved {
			require.Equal(t, MediumGPU, ev.Medium)
			removed = append(removed, ev.BlockHashes...)
		}
	}
	require.Equal(t, []uint64{b[1], b[0]}, removed)
	res := residentSet(h.e.Resident())
	require.Contains(t, res, residentKey{MediumGPU, a[0]})
	require.Contains(t, res, residentKey{MediumGPU, a[1]})
}

func TestCPUTierOffload(t *testing.T) {
	cfg := Config{BlockSize: 4, NumGPUBlocks: 4, NumCPUBlocks: 4} // 3 GPU blocks and vLLM's null block
	h := newHarness(t, cfg)
	h.complete("a", seq(1, 8), []uint32{1})
	a := h.sink.take()[0].BlockHashes
	h.complete("b", seq(101, 8), []uint32{1})

	evs := h.sink.take()
	require.Equal(t, kvevents.KindBlockRemoved, evs[0].Kind)
	require.Equal(t, MediumGPU, evs[0].Medium)
	require.Equal(t, []uint64{a[1]}, evs[0].BlockHashes)
	require.Equal(t, kvevents.KindBlockStored, evs[1].Kind)
	require.Equal(t, MediumCPU, evs[1].Medium)
	require.Equal(t, []uint64{a[1]}, evs[1].BlockHashes)
	require.True(t, evs[1].HasParent)
	require.Equal(t, a[0], evs[1].ParentHash)
	require.Equal(t, seq(5, 4), evs[1].TokenIDs)

	// a's first block is still on the GPU, its second only on the CPU.
	ch := h.submit("a2", append(seq(1, 8), 9), []uint32{1})
	d := h.step()
	ti := plain(h.e.Config().Timing)
	require.Equal(t, ti.PrefillBase+ti.PrefillPerToken+4*ti.CPULoadPerToken, d, "one token computed, one block loaded")
	ups := drain(t, ch)
	require.Equal(t, 8, ups[0].CachedTokens)
	st := h.e.Snapshot()
	require.Equal(t, int64(4), st.PrefixCacheHits)
	require.Equal(t, int64(4), st.CPUCacheHits)

	var gpuStored []uint64
	for _, ev := range h.sink.take() {
		if ev.Kind == kvevents.KindBlockStored && ev.Medium == MediumGPU {
			gpuStored = append(gpuStored, ev.BlockHashes...)
		}
	}
	require.Equal(t, []uint64{a[1]}, gpuStored, "the loaded block is cached on the GPU again")
}

func TestCPUTierLRU(t *testing.T) {
	h := newHarness(t, Config{BlockSize: 4, NumGPUBlocks: 3, NumCPUBlocks: 2}) // 2 and vLLM's null block
	for i := range 4 {
		h.complete("r", seq(100*i, 8), []uint32{1})
	}
	all := h.sink.take()
	var cpuStored, cpuRemoved []uint64
	for _, ev := range all {
		if ev.Medium != MediumCPU {
			continue
		}
		switch ev.Kind {
		case kvevents.KindBlockStored:
			cpuStored = append(cpuStored, ev.BlockHashes...)
		case kvevents.KindBlockRemoved:
			cpuRemoved = append(cpuRemoved, ev.BlockHashes...)
		}
	}
	// Three requests were evicted from the GPU (6 blocks); the CPU tier keeps
	// the 2 newest and drops the others oldest first.
	require.Len(t, cpuStored, 6)
	require.Equal(t, cpuStored[:4], cpuRemoved)
	require.Equal(t, residentSet(h.e.Resident()), replay(t, all, 4))
}

// TestPriorityEviction: under SGLang's priority radix eviction a
// high-priority session's prefix survives the pressure that evicts a
// low-priority one, though it is the least recently used; under LRU the
// same pressure evicts it. A block keeps the highest priority it was
// released at.
func TestPriorityEviction(t *testing.T) {
	for _, tc := range []struct {
		policy      string
		wantRemoved string // whose two prefix blocks the pressure evicts
	}{
		{"lru", "hi"},
		{"priority", "lo"},
	} {
		t.Run(tc.policy, func(t *testing.T) {
			h := newHarness(t, Config{Flavour: FlavourSGLang, BlockSize: 4, NumGPUBlocks: 6, RadixEvictionPolicy: tc.policy})
			run := func(id string, prompt []uint32, prio int) []uint64 {
				t.Helper()
				ch, err := h.e.Submit(context.Background(), &Request{ID: id, Prompt: prompt, Output: []uint32{1}, Priority: prio})
				require.NoError(t, err)
				h.runIdle()
				drain(t, ch)
				var stored []uint64
				for _, ev := range h.sink.take() {
					if ev.Kind == kvevents.KindBlockStored {
						stored = append(stored, ev.BlockHashes...)
					}
				}
				return stored
			}
			blocks := map[string][]uint64{
				"hi": run("hi", seq(1, 8), 5), // first, so least recently used
				"lo": run("lo", seq(101, 8), 0),
			}
			require.Len(t, blocks["hi"], 2)
			require.Len(t, blocks["lo"], 2)
			// 16 tokens take 4 blocks: the 2 never used, then 2
			// cached blocks evicted.
			ch, err := h.e.Submit(context.Background(), &Request{ID: "pressure", Prompt: seq(201, 16), Output: []uint32{1}})
			require.NoError(t, err)
			h.runIdle()
			drain(t, ch)
			var removed []uint64
			for _, ev := range h.sink.take() {
				if ev.Kind == kvevents.KindBlockRemoved {
					removed = append(removed, ev.BlockHashes...)
				}
			}
			require.ElementsMatch(t, blocks[tc.wantRemoved], removed)
			kept := "lo"
			if tc.wantRemoved == "lo" {
				kept = "hi"
			}
			res := residentSet(h.e.Resident())
			for _, hash := range blocks[kept] {
				require.Contains(t, res, residentKey{MediumGPU, hash})
			}
		})
	}
}

// TestPriorityLevelsBounded: priority levels are dropped when empty, so
// requests of ever new priorities cannot grow them past the free blocks.
func TestPriorityLevelsBounded(t *testing.T) {
	h := newHarness(t, Config{Flavour: FlavourSGLang, BlockSize: 4, NumGPUBlocks: 6, RadixEvictionPolicy: "priority"})
	for i := range 50 {
		ch, err := h.e.Submit(context.Background(), &Request{ID: fmt.Sprint(i), Prompt: seq(1000*(i+1), 8), Output: []uint32{1}, Priority: i + 1})
		require.NoError(t, err)
		h.runIdle()
		drain(t, ch)
	}
	require.LessOrEqual(t, len(h.e.cache.levels), 6)
}

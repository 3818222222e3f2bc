package kvindex

import (
	"math/rand/v2"
	"testing"

	"github.com/omnious/provider-node/engines/kvevents"
	"github.com/stretchr/testify/require"
)

const testModel = "meta-llama/Llama-3.1-8B-Instruct"

func stored(hashes []uint64, parent uint64, toks []uint32, medium string) kvevents.Event {
	return kvevents.Event{
		Kind: kvevents.KindBlockStored, BlockHashes: hashes, ParentHash: parent, HasParent: parent != 0,
		TokenIDs: toks, BlockSize: 16, Medium: medium,
	}
}

func removed(hashes []uint64, medium string) kvevents.Event {
	return kvevents.Event{Kind: kvevents.KindBlockRemoved, BlockHashes: hashes, Medium: medium}
}

func with(ev kvevents.Event, f func(*kvevents.Event)) kvevents.Event {
	f(&ev)
	return ev
}

func TestReplicaState(t *testing.T) {
	toks := randTokens(rand.New(rand.NewPCG(31, 32)), 64) // 4 blocks of 16
	b := func(i, j int) []uint32 { return toks[16*i : 16*j] }
	base := []kvevents.Event{
		stored([]uint64{101, 102}, 0, b(0, 2), "GPU"),
		stored([]uint64{103, 104}, 102, b(2, 4), ""),
	}
	cleared := kvevents.Event{Kind: kvevents.KindAllBlocksCleared}
	for _, tc := range []struct {
		name   string
		cfg    Config
		events []kvevents.Event
		lora   string
		want   []Match
		stats  ReplicaStats
	}{
		{"parents chain across events", Config{}, base, "",
			[]Match{m(0, 4, 0, 0)}, ReplicaStats{StoredBlocks: 4, Blocks: 4}},
		{"parent is our own insertion in the same batch", Config{}, []kvevents.Event{
			stored([]uint64{101}, 0, b(0, 1), "GPU"),
			stored([]uint64{102}, 101, b(1, 2), "GPU"),
			stored([]uint64{103}, 102, b(2, 3), "GPU"),
		}, "", []Match{m(0, 3, 0, 0)}, ReplicaStats{StoredBlocks: 3, Blocks: 3}},
		{"unknown parent is skipped and counted", Config{}, []kvevents.Event{
			stored([]uint64{103, 104}, 102, b(2, 4), "GPU"),
		}, "", []Match{}, ReplicaStats{UnknownParent: 1, SkippedBlocks: 2}},
		{"removed via engine hash", Config{}, append(base[:2:2], removed([]uint64{104}, "GPU")), "",
			[]Match{m(0, 3, 0, 0)}, ReplicaStats{StoredBlocks: 4, RemovedBlocks: 1, Blocks: 3}},
		{"unknown removal counted", Config{}, append(base[:2:2], removed([]uint64{104}, "GPU"), removed([]uint64{103, 104}, "GPU")), "",
			[]Match{m(0, 2, 0, 0)}, ReplicaStats{StoredBlocks: 4, RemovedBlocks: 2, UnknownRemoved: 1, Blocks: 2}},
		{"all blocks cleared", Config{}, append(base[:2:2], cleared), "",
			[]Match{}, ReplicaStats{StoredBlocks: 4, Clears: 1}},
		{"stores after a clear start over", Config{}, append(base[:2:2], cleared, base[0]), "",
			[]Match{m(0, 2, 0, 0)}, ReplicaStats{StoredBlocks: 6, Clears: 1, Blocks: 2}},
		{"non-full-attention group ignored", Config{}, []kvevents.Event{
			with(base[0], func(e *kvevents.Event) { e.SpecKind = "sliding_window"; e.GroupIdx = 1 }),
		}, "", []Match{}, ReplicaStats{IgnoredBlocks: 2}},
		{"explicit full attention indexed", Config{}, []kvevents.Event{
			with(base[0], func(e *kvevents.Event) { e.SpecKind = "full_attention"; e.GroupIdx = 1 }),
			// The SWA group reuses the hashes; its removal must not touch group 1.
			with(removed([]uint64{102}, "GPU"), func(e *kvevents.Event) { e.GroupIdx = 0 }),
		}, "", []Match{m(0, 2, 0, 0)}, ReplicaStats{StoredBlocks: 2, IgnoredBlocks: 1, Blocks: 2}},
		{"secondary full-attention group ignored", Config{}, []kvevents.Event{
			base[0],
			with(base[1], func(e *kvevents.Event) { e.GroupIdx = 2 }),
		}, "", []Match{m(0, 2, 0, 0)}, ReplicaStats{StoredBlocks: 2, IgnoredBlocks: 2, Blocks: 2}},
		{"offload to cpu then gpu eviction", Config{}, append(base[:2:2],
			stored([]uint64{101, 102, 103, 104}, 0, b(0, 4), "CPU"),
			removed([]uint64{103, 104}, "GPU"),
		), "", []Match{m(0, 2, 2, 0)}, ReplicaStats{StoredBlocks: 8, RemovedBlocks: 2, Blocks: 4}},
		{"dropped from both tiers", Config{}, append(base[:2:2],
			stored([]uint64{103, 104}, 102, b(2, 4), "CPU_PINNED"),
			removed([]uint64{104}, "GPU"),
			removed([]uint64{104}, "CPU_PINNED"),
		), "", []Match{m(0, 3, 0, 0)}, ReplicaStats{StoredBlocks: 6, RemovedBlocks: 2, Blocks: 3}},
		{"storage tier", Config{}, []kvevents.Event{stored([]uint64{101, 102}, 0, b(0, 2), "DISK")}, "",
			[]Match{m(0, 0, 0, 2)}, ReplicaStats{StoredBlocks: 2, Blocks: 2}},
		{"re-reported cache hit keeps its key", Config{}, append(base[:2:2],
			// kv_cache_report_mode="full" re-sends hits without a parent.
			stored([]uint64{103, 104}, 0, b(2, 4), "GPU"),
		), "", []Match{m(0, 4, 0, 0)}, ReplicaStats{StoredBlocks: 6, Blocks: 4}},
		{"lora mixes into the root", Config{}, []kvevents.Event{
			with(base[0], func(e *kvevents.Event) { e.LoraName = "sql" }),
		}, "sql", []Match{m(0, 2, 0, 0)}, ReplicaStats{StoredBlocks: 2, Blocks: 2}},
		{"lora blocks do not match the base model", Config{}, []kvevents.Event{
			with(base[0], func(e *kvevents.Event) { e.LoraName = "sql" }),
		}, "", []Match{}, ReplicaStats{StoredBlocks: 2, Blocks: 2}},
		{"token count mismatch is malformed", Config{}, []kvevents.Event{
			stored([]uint64{101, 102}, 0, b(0, 1), "GPU"),
			with(base[0], func(e *kvevents.Event) { e.BlockSize = 0 }),
			{Kind: 0},
		}, "", []Match{}, ReplicaStats{Malformed: 3}},
		{"map bound exceeded drops the replica", Config{MaxReplicaBlocks: 3}, base, "",
			[]Match{}, ReplicaStats{StoredBlocks: 4, Overflows: 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ix := New(tc.cfg)
			rs := NewReplicaState(ix, 0, testModel)
			rs.ApplyBatch(&kvevents.Batch{Events: tc.events})
			keys := AppendBlockKeys(nil, RootKey(testModel, tc.lora, ""), toks, 16)
			require.Equal(t, tc.want, norm(ix.Match(keys, nil)))
			require.Equal(t, tc.stats, rs.Stats())
			// The index holds exactly the blocks the map tracks.
			require.Equal(t, rs.Stats().Blocks, ix.Resident(0))
			checkInvariants(t, ix)
		})
	}
}

func TestReplicaStateReset(t *testing.T) {
	toks := randTokens(rand.New(rand.NewPCG(33, 34)), 64)
	ix := New(Config{})
	a := NewReplicaState(ix, 1, testModel)
	c := NewReplicaState(ix, 2, testModel)
	ev := stored([]uint64{1, 2, 3, 4}, 0, toks, "GPU")
	a.Apply(&ev)
	// Engine hashes are per engine: replica 2 uses different ones for the
	// same tokens and still matches the same keys.
	ev2 := stored([]uint64{9, 8, 7, 6}, 0, toks, "CPU")
	c.Apply(&ev2)
	keys := AppendBlockKeys(nil, RootKey(testModel, "", ""), toks, 16)
	require.Equal(t, []Match{m(1, 4, 0, 0), m(2, 0, 4, 0)}, norm(ix.Match(keys, nil)))
	require.Equal(t, 16, a.BlockSize())

	a.Reset()
	require.Equal(t, []Match{m(2, 0, 4, 0)}, norm(ix.Match(keys, nil)))
	require.Equal(t, ReplicaStats{StoredBlocks: 4, Resets: 1}, a.Stats())
	require.Equal(t, 0, ix.Resident(1))
	// After a reset the old hashes are unknown parents.
	ev3 := stored([]uint64{5}, 4, toks[:16], "GPU")
	a.Apply(&ev3)
	require.Equal(t, uint64(1), a.Stats().UnknownParent)
	checkInvariants(t, ix)
}

func TestReplicaStateLargeReset(t *testing.T) {
	// More blocks than one Remove chunk, on two tiers.
	const n = 3*removeChunk + 5
	toks := randTokens(rand.New(rand.NewPCG(35, 36)), n*16)
	hashes := make([]uint64, n)
	for i := range hashes {
		hashes[i] = uint64(i + 1)
	}
	ix := New(Config{})
	rs := NewReplicaState(ix, 0, testModel)
	for _, medium := range []string{"GPU", "CPU"} {
		ev := stored(hashes, 0, toks, medium)
		rs.Apply(&ev)
	}
	require.Equal(t, n, ix.Resident(0))
	require.Equal(t, n, ix.ResidentTier(0, TierCPU))
	rs.Reset()
	require.Equal(t, 0, ix.Resident(0))
	require.Equal(t, 0, ix.Stats().Keys)
	checkInvariants(t, ix)
}

func TestMediumTier(t *testing.T) {
	for medium, want := range map[string]Tier{
		"": TierGPU, "GPU": TierGPU, "CPU": TierCPU, "CPU_PINNED": TierCPU,
		"DISK": TierStorage, "STORAGE": TierStorage, "FS": TierStorage, "OBJ": TierStorage,
		"EXTERNAL": TierStorage, "NVME?": TierStorage,
	} {
		require.Equal(t, want, MediumTier(medium), medium)
	}
}

// FuzzApply feeds arbitrary event shapes; Apply must never panic and the
// index must stay consistent.
func FuzzApply(f *testing.F) {
	f.Add(uint8(1), uint8(2), uint64(0), 16, uint16(32), "GPU", uint8(0))
	f.Add(uint8(1), uint8(4), uint64(7), 1<<62, uint16(0), "CPU", uint8(1))
	f.Add(uint8(2), uint8(1), uint64(3), 0, uint16(0), "DISK", uint8(0))
	f.Add(uint8(3), uint8(0), uint64(0), -1, uint16(5), "", uint8(2))
	f.Fuzz(func(t *testing.T, kind, nHashes uint8, parent uint64, bs int, nToks uint16, medium string, group uint8) {
		ix := New(Config{MaxReplicaBlocks: 64})
		rs := NewReplicaState(ix, 3, testModel)
		for step := uint64(0); step < 3; step++ {
			ev := kvevents.Event{
				Kind: kvevents.Kind(kind % 5), ParentHash: parent, HasParent: parent != 0,
				TokenIDs: make([]uint32, nToks%2048), BlockSize: bs, Medium: medium, GroupIdx: int(group % 3),
			}
			for i := uint64(0); i < uint64(nHashes%64); i++ {
				ev.BlockHashes = append(ev.BlockHashes, parent+step*64+i+1)
			}
			rs.Apply(&ev)
		}
		// Several engine hashes may name one key (same tokens), never the reverse.
		require.LessOrEqual(t, ix.Resident(3), rs.Stats().Blocks)
		checkInvariants(t, ix)
	})
}

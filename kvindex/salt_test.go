package kvindex

import (
	"bytes"
	"math/rand/v2"
	"testing"

	"github.com/omnious/provider-node/engines/kvevents"
	"github.com/stretchr/testify/require"
	"github.com/vmihailenco/msgpack/v5"
)

// vllmStored is a vLLM 0.32 BlockStored of len(hashes) blocks of 16 tokens
// with the given extra_keys, decoded from the wire as the EPP receives it.
func vllmStored(t *testing.T, hashes []uint64, toks []uint32, extra []any) kvevents.Batch {
	t.Helper()
	ev := map[string]any{
		"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": nil, "token_ids": toks,
		"block_size": 16, "lora_id": nil, "medium": "GPU", "lora_name": nil, "extra_keys": extra,
		"group_idx": 0, "kv_cache_spec_kind": "full_attention",
	}
	raw, err := msgpack.Marshal([]any{1.0, []any{ev}, 0})
	require.NoError(t, err)
	var b kvevents.Batch
	require.NoError(t, kvevents.DecodeBatch(raw, &b))
	return b
}

// TestReplicaSaltedBlocks: blocks vLLM stored for a request with a
// cache_salt match the same prompt only under that salt, and blocks whose
// hashes mix in multimodal keys match no prompt, nor does anything stored
// after them (also after a snapshot hand-over).
func TestReplicaSaltedBlocks(t *testing.T) {
	toks := randTokens(rand.New(rand.NewPCG(51, 52)), 4*16)
	img := []any{[]any{"img-5c1d", 3}}
	tests := []struct {
		name  string
		extra []any
		// want maps a request's salt to the GPU blocks it matches.
		want map[string]int
	}{
		{"unsalted", nil, map[string]int{"": 4, "tenant-a": 0, "tenant-b": 0}},
		{"salted", []any{[]any{"tenant-a"}, nil, nil, nil}, map[string]int{"": 0, "tenant-a": 4, "tenant-b": 0}},
		{"multimodal from the third block", []any{[]any{"tenant-a"}, nil, img, nil}, map[string]int{"": 0, "tenant-a": 2, "tenant-b": 0}},
		{"multimodal on the first block", []any{img, nil, nil, nil}, map[string]int{"": 0, "tenant-a": 0}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ix := New(Config{})
			rs := NewReplicaState(ix, 0, testModel)
			b := vllmStored(t, []uint64{901, 902, 903, 904}, toks, tc.extra)
			rs.ApplyBatch(&b)
			// A later event chained from the last block extends only what matched.
			rs.ApplyBatch(&kvevents.Batch{Events: []kvevents.Event{stored([]uint64{905}, 904, toks[:16], "GPU")}})
			require.Equal(t, 5, ix.Resident(0))
			checkInvariants(t, ix)

			var buf bytes.Buffer
			sw := NewSnapshotWriter(&buf, testHeader)
			require.NoError(t, sw.AddReplica(ReplicaTag{Name: "a:1"}, rs))
			require.NoError(t, sw.Close())
			snap, err := LoadSnapshot(&buf, LoadOptions{Want: testHeader})
			require.NoError(t, err)

			prompt := append(append([]uint32(nil), toks...), toks[:16]...)
			for salt, n := range tc.want {
				keys := AppendBlockKeys(nil, RootKey(testModel, "", salt), prompt, 16)
				want := []Match{}
				if n > 0 {
					if n == 4 {
						n = 5 // the chained block extends a whole match
					}
					want = []Match{m(0, n, 0, 0)}
				}
				require.Equal(t, want, norm(ix.Match(keys, nil)), "salt %q", salt)
				r := snap.Replicas[0].State.r
				for i := range want {
					want[i].Replica = r
				}
				require.Equal(t, want, norm(snap.Index.Match(keys, nil)), "salt %q after a snapshot", salt)
			}
		})
	}
}

package kvevents

import (
	"bytes"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vmihailenco/msgpack/v5"
)

// storedMap is a vLLM 0.32 BlockStored as a tagged map with three blocks of
// two tokens; extra is the extra_keys value (omitted when absent).
func storedMap(lora any, extra any, withExtra bool, more map[string]any) map[string]any {
	m := map[string]any{
		"type": "BlockStored", "block_hashes": []uint64{11, 12, 13}, "parent_block_hash": nil,
		"token_ids": []uint32{1, 2, 3, 4, 5, 6}, "block_size": 2, "lora_id": nil, "medium": "GPU",
		"lora_name": lora, "group_idx": 0, "kv_cache_spec_kind": "full_attention",
	}
	if withExtra {
		m["extra_keys"] = extra
	}
	for k, v := range more {
		m[k] = v
	}
	return m
}

// encodeBatch encodes events (maps or arrays) as an EventBatch; map keys
// are sorted, so extra_keys precedes lora_name as it may on the wire.
func encodeBatch(t *testing.T, events ...any) []byte {
	t.Helper()
	var buf bytes.Buffer
	enc := msgpack.NewEncoder(&buf)
	enc.SetSortMapKeys(true)
	require.NoError(t, enc.Encode([]any{1.0, events, 0}))
	return buf.Bytes()
}

// TestDecodeExtraKeys decodes the shapes vLLM 0.32's to_event_extra_keys
// publishes: per block nil or a tuple of the bare LoRA name,
// (mm_identifier, offset) pairs, the bare cache_salt (first block of a
// request) and a bare prompt-embeds digest.
func TestDecodeExtraKeys(t *testing.T) {
	long := strings.Repeat("s", MaxSaltLen+1)
	digest := bytes.Repeat([]byte{0xab}, 32)
	tests := []struct {
		name   string
		event  any
		salt   string
		lora   string
		opaque int
	}{
		{name: "absent", event: storedMap(nil, nil, false, nil)},
		{name: "nil", event: storedMap(nil, nil, true, nil)},
		{name: "all blocks nil", event: storedMap(nil, []any{nil, nil, nil}, true, nil)},
		{name: "salt on first block", event: storedMap(nil, []any{[]any{"tenant-a"}, nil, nil}, true, nil), salt: "tenant-a"},
		{name: "lora and salt", event: storedMap("ad", []any{[]any{"ad", "tenant-a"}, []any{"ad"}, []any{"ad"}}, true, nil),
			salt: "tenant-a", lora: "ad"},
		{name: "lora only", event: storedMap("ad", []any{[]any{"ad"}, []any{"ad"}, []any{"ad"}}, true, nil), lora: "ad"},
		{name: "lora name differs from extra key", event: storedMap("ad", []any{[]any{"other"}, []any{"other"}, []any{"other"}}, true, nil),
			lora: "ad", opaque: 3},
		{name: "multimodal on second block", event: storedMap(nil, []any{[]any{"s"}, []any{[]any{"img-7f3a", 1}}, nil}, true, nil),
			salt: "s", opaque: 2},
		{name: "multimodal and salt on first block", event: storedMap(nil, []any{[]any{[]any{"img-7f3a", 0}, "s"}, []any{[]any{"img-7f3a", -2}}, nil}, true, nil),
			salt: "s", opaque: 3},
		{name: "prompt embeds on last block", event: storedMap(nil, []any{nil, nil, []any{digest}}, true, nil), opaque: 1},
		{name: "salt past the first block", event: storedMap(nil, []any{nil, []any{"s"}, nil}, true, nil), opaque: 2},
		{name: "two salts", event: storedMap(nil, []any{[]any{"s", "t"}, nil, nil}, true, nil), salt: "s", opaque: 3},
		{name: "empty salt", event: storedMap(nil, []any{[]any{""}, nil, nil}, true, nil), opaque: 3},
		{name: "salt over the cap", event: storedMap(nil, []any{[]any{long}, nil, nil}, true, nil), opaque: 3},
		{name: "salt at the cap", event: storedMap(nil, []any{[]any{long[1:]}, nil, nil}, true, nil), salt: long[1:]},
		{name: "fewer entries than blocks", event: storedMap(nil, []any{[]any{"s"}}, true, nil), salt: "s", opaque: 3},
		{name: "sglang salt over the cap", event: storedMap(nil, nil, false, map[string]any{"cache_salt": long}), opaque: 3},
		{name: "sglang salt agrees with extra keys", event: storedMap(nil, []any{[]any{"s"}, nil, nil}, true, map[string]any{"cache_salt": "s"}), salt: "s"},
		{name: "sglang salt disagrees with extra keys", event: storedMap(nil, []any{[]any{"t"}, nil, nil}, true, map[string]any{"cache_salt": "s"}),
			salt: "s", opaque: 3},
		{name: "positional", event: []any{"BlockStored", []uint64{11, 12, 13}, nil, []uint32{1, 2, 3, 4, 5, 6}, 2, nil, "GPU", nil,
			[]any{[]any{"tenant-a"}, nil, []any{[]any{"img", 0}}}, 0, "full_attention", nil}, salt: "tenant-a", opaque: 1},
		{name: "positional lora", event: []any{"BlockStored", []uint64{11, 12, 13}, nil, []uint32{1, 2, 3, 4, 5, 6}, 2, nil, "GPU", "ad",
			[]any{[]any{"ad", "tenant-a"}, []any{"ad"}, []any{"ad"}}, 0, "full_attention", nil}, salt: "tenant-a", lora: "ad"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var b Batch
			require.NoError(t, DecodeBatch(encodeBatch(t, tc.event), &b))
			require.Len(t, b.Events, 1)
			ev := b.Events[0]
			require.Equal(t, KindBlockStored, ev.Kind)
			require.Equal(t, []uint64{11, 12, 13}, ev.BlockHashes)
			require.Equal(t, tc.salt, ev.CacheSalt)
			require.Equal(t, tc.lora, ev.LoraName)
			require.Equal(t, tc.opaque, ev.Opaque)

			// The codec writes the same salt, adapter and opacity back.
			for _, f := range []Format{FormatMap, FormatArray} {
				out, err := AppendBatch(nil, &b, f, HashUint64)
				require.NoError(t, err)
				var b2 Batch
				require.NoError(t, DecodeBatch(out, &b2))
				requireBatchEqual(t, &b, &b2)
			}
		})
	}
}

// TestDecodeExtraKeysMalformed: extra_keys that are not a list of tuples,
// or nest past maxSkipDepth, are refused rather than half-applied.
func TestDecodeExtraKeysMalformed(t *testing.T) {
	var deep any = 1
	for i := 0; i < maxSkipDepth+2; i++ {
		deep = []any{deep}
	}
	for name, extra := range map[string]any{
		"entry not a tuple": []any{"s", nil, nil},
		"not a list":        "s",
		"too deep":          []any{[]any{deep}, nil, nil},
	} {
		t.Run(name, func(t *testing.T) {
			var b Batch
			err := DecodeBatch(encodeBatch(t, storedMap(nil, extra, true, nil)), &b)
			require.ErrorIs(t, err, ErrMalformed)
		})
	}
}

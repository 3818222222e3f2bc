package kvevents

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vmihailenco/msgpack/v5"
)

// unhex turns "93 cb 41" plus quoted strings ("\"GPU\"") into bytes, so the
// vectors below read like the contract document.
func unhex(t testing.TB, s string) []byte {
	t.Helper()
	var out []byte
	for len(s) > 0 {
		s = strings.TrimLeft(s, " \n\t")
		if s == "" {
			break
		}
		if s[0] == '"' {
			end := strings.IndexByte(s[1:], '"')
			require.GreaterOrEqual(t, end, 0)
			out = append(out, s[1:1+end]...)
			s = s[end+2:]
			continue
		}
		b, err := hex.DecodeString(s[:2])
		require.NoError(t, err)
		out = append(out, b...)
		s = s[2:]
	}
	return out
}

// contractBatch is the engine-contracts.md section 2 example.
func contractBatch() *Batch {
	return &Batch{
		TS: 1795941479.25,
		Events: []Event{{
			Kind:        KindBlockRemoved,
			BlockHashes: []uint64{2143150318157136355},
			Medium:      "GPU",
		}},
		HasDPRank: true,
	}
}

const (
	contractMapPayload = `93 cb 41 da c2 f9 19 d0 00 00 91 84
		a4 "type" ac "BlockRemoved"
		ac "block_hashes" 91 cf 1d bd ff dc 06 05 81 e3
		a6 "medium" a3 "GPU"
		a9 "group_idx" 00
		00`
	contractArrayPayload = `93 cb 41 da c2 f9 19 d0 00 00 91
		96 ac "BlockRemoved" 91 cf 1d bd ff dc 06 05 81 e3 a3 "GPU" 00 c0 c0
		00`
)

func TestContractVectors(t *testing.T) {
	tests := []struct {
		name    string
		format  Format
		payload string
	}{
		{"map", FormatMap, contractMapPayload},
		{"legacy array", FormatArray, contractArrayPayload},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			want := unhex(t, tt.payload)
			got, err := AppendBatch(nil, contractBatch(), tt.format, HashUint64)
			require.NoError(t, err)
			require.Equal(t, hex.EncodeToString(want), hex.EncodeToString(got))

			var b Batch
			require.NoError(t, DecodeBatch(want, &b))
			requireBatchEqual(t, contractBatch(), &b)

			frames := MessageFrames([]byte("kv-events"), 2, want)
			require.Equal(t, unhex(t, "6b 76 2d 65 76 65 6e 74 73"), frames[0])
			require.Equal(t, unhex(t, "00 00 00 00 00 00 00 02"), frames[1])
			topic, seq, payload, err := ParseMessage(frames)
			require.NoError(t, err)
			require.Equal(t, "kv-events", string(topic))
			require.Equal(t, uint64(2), seq)
			require.Equal(t, want, payload)
		})
	}
}

// requireBatchEqual compares batches ignoring nil-versus-empty slices.
func requireBatchEqual(t *testing.T, want, got *Batch) {
	t.Helper()
	require.Equal(t, math.Float64bits(want.TS), math.Float64bits(got.TS), "ts %v != %v", want.TS, got.TS)
	require.Equal(t, want.DPRank, got.DPRank)
	require.Equal(t, want.HasDPRank, got.HasDPRank)
	require.Equal(t, want.Unknown, got.Unknown)
	require.Len(t, got.Events, len(want.Events))
	for i := range want.Events {
		w, g := want.Events[i], got.Events[i]
		require.Equal(t, w.Kind, g.Kind, "event %d", i)
		require.Equal(t, len(w.BlockHashes), len(g.BlockHashes), "event %d", i)
		for j := range w.BlockHashes {
			require.Equal(t, w.BlockHashes[j], g.BlockHashes[j], "event %d hash %d", i, j)
		}
		require.Equal(t, len(w.TokenIDs), len(g.TokenIDs), "event %d", i)
		for j := range w.TokenIDs {
			require.Equal(t, w.TokenIDs[j], g.TokenIDs[j], "event %d token %d", i, j)
		}
		w.BlockHashes, g.BlockHashes, w.TokenIDs, g.TokenIDs = nil, nil, nil, nil
		require.Equal(t, w, g, "event %d", i)
	}
}

func sampleEvents() []Event {
	return []Event{
		{
			Kind:        KindBlockStored,
			BlockHashes: []uint64{0xfedcba9876543210, 0x0123456789abcdef},
			ParentHash:  0x8000000000000001, HasParent: true,
			TokenIDs:  []uint32{1, 127, 128, 255, 256, 65535, 65536, 151643, 0, 7, 8, 9, 10, 11, 12, 13},
			BlockSize: 8,
			LoraName:  "sql-adapter",
			CacheSalt: "salty",
			Medium:    "GPU",
			GroupIdx:  1,
			SpecKind:  "sliding_window",
		},
		{
			Kind:        KindBlockStored,
			BlockHashes: []uint64{5},
			TokenIDs:    []uint32{1, 2, 3, 4},
			BlockSize:   4,
		},
		{Kind: KindBlockRemoved, BlockHashes: []uint64{0xfedcba9876543210, 42}, Medium: "CPU_PINNED", GroupIdx: 2},
		{Kind: KindAllBlocksCleared},
	}
}

// expectAfter returns what a round trip through format f preserves.
func expectAfter(f Format, evs []Event) []Event {
	out := make([]Event, len(evs))
	for i, ev := range evs {
		ev.SessionID = "" // encoded, never decoded
		switch f {
		case FormatArraySGLang:
			ev.LoraName, ev.GroupIdx, ev.SpecKind = "", 0, ""
		case FormatMapSGLang:
			ev.GroupIdx, ev.SpecKind = 0, ""
		default:
			if ev.HasParent {
				ev.CacheSalt = "" // vLLM sends it on a request's first block only
			}
		}
		out[i] = ev
	}
	return out
}

func TestRoundTrip(t *testing.T) {
	formats := []Format{FormatArray, FormatMap, FormatArraySGLang, FormatMapSGLang}
	hashes := []HashEncoding{HashUint64, HashInt64, HashBytes}
	for _, f := range formats {
		for _, h := range hashes {
			for k := range sampleEvents() {
				ev := sampleEvents()[k]
				name := ev.Kind.String() + "/" + []string{"array", "map", "sglang-array", "sglang"}[f] + "/" + []string{"uint64", "int64", "bytes"}[h]
				t.Run(name, func(t *testing.T) {
					in := &Batch{TS: 12.5, Events: []Event{ev}, DPRank: 3, HasDPRank: k%2 == 0}
					payload, err := AppendBatch(nil, in, f, h)
					require.NoError(t, err)

					// An independent decoder must accept the bytes whole.
					var generic []any
					require.NoError(t, msgpack.Unmarshal(payload, &generic))
					require.Len(t, generic, 3)

					var out Batch
					require.NoError(t, DecodeBatch(payload, &out))
					want := &Batch{TS: 12.5, Events: expectAfter(f, in.Events), DPRank: in.DPRank, HasDPRank: in.HasDPRank}
					if !want.HasDPRank {
						want.DPRank = 0
					}
					requireBatchEqual(t, want, &out)
				})
			}
		}
	}
}

func TestEncodeHashForms(t *testing.T) {
	const v = uint64(0xfedcba9876543210)
	tests := []struct {
		name string
		h    HashEncoding
		want []byte
	}{
		{"uint64", HashUint64, unhex(t, "cf fe dc ba 98 76 54 32 10")},
		{"int64 negative", HashInt64, unhex(t, "d3 fe dc ba 98 76 54 32 10")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, appendHash(nil, v, tt.h))
		})
	}
	t.Run("bytes", func(t *testing.T) {
		got := appendHash(nil, v, HashBytes)
		require.Len(t, got, 34)
		require.Equal(t, []byte{0xc4, 32}, got[:2])
		require.Equal(t, v, binary.BigEndian.Uint64(got[26:]))
		require.Equal(t, got, appendHash(nil, v, HashBytes), "prefix must be deterministic")
		require.NotEqual(t, got[2:26], appendHash(nil, v+1, HashBytes)[2:26])
	})
	t.Run("small values stay compact like msgspec", func(t *testing.T) {
		require.Equal(t, []byte{0x05}, appendHash(nil, 5, HashUint64))
		require.Equal(t, []byte{0xff}, appendHash(nil, ^uint64(0), HashInt64))
	})
}

func TestEncodeSGLangLayout(t *testing.T) {
	b := &Batch{TS: 1, Events: []Event{
		{Kind: KindBlockStored, BlockHashes: []uint64{1}, TokenIDs: []uint32{2}, BlockSize: 1, Medium: "GPU", CacheSalt: "s"},
		{Kind: KindBlockRemoved, BlockHashes: []uint64{1}, Medium: "GPU"},
	}, HasDPRank: true}
	got, err := AppendBatch(nil, b, FormatArraySGLang, HashInt64)
	require.NoError(t, err)
	want := unhex(t, `93 cb 3f f0 00 00 00 00 00 00 92
		98 ab "BlockStored" 91 01 c0 91 02 01 c0 a3 "GPU" 81 aa "cache_salt" a1 "s"
		93 ac "BlockRemoved" 91 01 a3 "GPU"
		00`)
	require.Equal(t, hex.EncodeToString(want), hex.EncodeToString(got))
}

func TestEncodeErrors(t *testing.T) {
	_, err := AppendBatch(nil, &Batch{Events: []Event{{}}}, FormatArray, HashUint64)
	require.ErrorContains(t, err, "unknown event kind")
	_, err = AppendBatch(nil, &Batch{}, Format(9), HashUint64)
	require.ErrorContains(t, err, "unknown format")
	_, err = AppendBatch(nil, &Batch{}, FormatMap, HashEncoding(9))
	require.ErrorContains(t, err, "unknown hash encoding")
}

// enc builds test payloads with an independent msgpack encoder.
func enc(t testing.TB, v any, compact bool) []byte {
	t.Helper()
	var buf bytes.Buffer
	e := msgpack.NewEncoder(&buf)
	e.UseCompactInts(compact)
	require.NoError(t, e.Encode(v))
	return buf.Bytes()
}

func TestDecodeVariants(t *testing.T) {
	digest32 := append(bytes.Repeat([]byte{0xaa}, 24), 0, 0, 0, 0, 0, 0, 0x01, 0x02)
	digest16 := append(bytes.Repeat([]byte{0xbb}, 8), 0xfe, 0xdc, 0xba, 0x98, 0x76, 0x54, 0x32, 0x10)
	type ev = map[string]any
	tests := []struct {
		name    string
		payload []byte
		want    Batch
	}{
		{
			name: "negative int64 hashes and int64 parent",
			payload: enc(t, []any{1.0, []any{
				[]any{"BlockStored", []any{int64(-2), int64(-81985529216486896)}, int64(-3), []any{1, 2}, 1, nil, "GPU"},
			}, 0}, false),
			want: Batch{TS: 1, HasDPRank: true, Events: []Event{{Kind: KindBlockStored,
				BlockHashes: []uint64{0xfffffffffffffffe, 0xfedcba9876543210}, ParentHash: 0xfffffffffffffffd, HasParent: true,
				TokenIDs: []uint32{1, 2}, BlockSize: 1, Medium: "GPU"}}},
		},
		{
			name: "every int width for hashes",
			payload: enc(t, []any{1.0, []any{
				[]any{"BlockRemoved", []any{uint8(5), uint8(200), uint16(60000), uint32(4000000000), uint64(1) << 63,
					int8(-1), int8(-100), int16(-30000), int32(-2000000000)}, nil},
			}, nil}, true),
			want: Batch{TS: 1, Events: []Event{{Kind: KindBlockRemoved, BlockHashes: []uint64{5, 200, 60000, 4000000000, 1 << 63,
				^uint64(0), uint64(1<<64 - 100), uint64(1<<64 - 30000), uint64(1<<64 - 2000000000)}}}},
		},
		{
			name: "bin hashes of 32 and 16 bytes and a str hash",
			payload: enc(t, []any{2.5, []any{
				[]any{"BlockStored", []any{digest32, digest16}, digest16, []any{9}, 1, nil, nil, nil},
				[]any{"BlockRemoved", []any{"xxxxxxxx" + "\x00\x00\x00\x00\x00\x00\x00\x07"}, "CPU"},
			}, 1}, true),
			want: Batch{TS: 2.5, DPRank: 1, HasDPRank: true, Events: []Event{
				{Kind: KindBlockStored, BlockHashes: []uint64{0x0102, 0xfedcba9876543210}, ParentHash: 0xfedcba9876543210, HasParent: true, TokenIDs: []uint32{9}, BlockSize: 1},
				{Kind: KindBlockRemoved, BlockHashes: []uint64{7}, Medium: "CPU"},
			}},
		},
		{
			name: "parent 0 from the llm-d simulator, 9 slots",
			payload: enc(t, []any{1.0, []any{
				[]any{"BlockStored", []any{uint64(11)}, 0, []any{1}, 1, nil, "GPU", nil, nil},
			}, 0}, true),
			want: Batch{TS: 1, HasDPRank: true, Events: []Event{{Kind: KindBlockStored, BlockHashes: []uint64{11}, TokenIDs: []uint32{1}, BlockSize: 1, Medium: "GPU"}}},
		},
		{
			name: "old vLLM: 2-slot batch, 6-slot BlockStored, 2-slot BlockRemoved",
			payload: enc(t, []any{1.0, []any{
				[]any{"BlockStored", []any{uint64(11)}, uint64(10), []any{1}, 1, nil},
				[]any{"BlockRemoved", []any{uint64(11)}},
			}}, true),
			want: Batch{TS: 1, Events: []Event{
				{Kind: KindBlockStored, BlockHashes: []uint64{11}, ParentHash: 10, HasParent: true, TokenIDs: []uint32{1}, BlockSize: 1},
				{Kind: KindBlockRemoved, BlockHashes: []uint64{11}},
			}},
		},
		{
			name: "map batch with map events in any key order, unknown keys and an unknown event type",
			payload: enc(t, map[string]any{
				"data_parallel_rank": 4,
				"ts":                 3.0,
				"future":             []any{1, map[string]any{"x": nil}},
				"events": []any{
					ev{"block_hashes": []any{uint64(1) << 62}, "type": "BlockStored", "parent_block_hash": nil,
						"token_ids": []any{5, 6}, "block_size": 2, "lora_id": 7, "medium": "GPU", "lora_name": "lora-a",
						"extra_keys": []any{[]any{"lora-a", []any{"mm", 3}}}, "group_idx": 3, "kv_cache_spec_kind": "full_attention",
						"kv_cache_spec_sliding_window": nil, "locality": "local", "ownership": "owned", "session_id": "s1", "brand_new": map[string]any{"a": 1}},
					ev{"type": "BlockMigrated", "block_hashes": []any{1}, "destination": "CPU"},
					ev{"type": "AllBlocksCleared"},
				},
			}, true),
			want: Batch{TS: 3, DPRank: 4, HasDPRank: true, Unknown: 1, Events: []Event{
				{Kind: KindBlockStored, BlockHashes: []uint64{1 << 62}, TokenIDs: []uint32{5, 6}, BlockSize: 2, Medium: "GPU",
					LoraName: "lora-a", GroupIdx: 3, SpecKind: "full_attention", Opaque: 1},
				{Kind: KindAllBlocksCleared},
			}},
		},
		{
			name: "mixed encodings in one batch and an unknown array event",
			payload: enc(t, []any{float32(0.5), []any{
				[]any{"BlockMigrated", []any{1}, "x", map[string]any{"deep": []any{[]any{}}}},
				ev{"type": "BlockRemoved", "block_hashes": []any{3}, "medium": nil},
				[]any{"BlockRemoved", []any{4}, "GPU", 1, nil, nil, "future slot"},
			}, 0}, true),
			want: Batch{TS: 0.5, HasDPRank: true, Unknown: 1, Events: []Event{
				{Kind: KindBlockRemoved, BlockHashes: []uint64{3}},
				{Kind: KindBlockRemoved, BlockHashes: []uint64{4}, Medium: "GPU", GroupIdx: 1},
			}},
		},
		{
			name: "SGLang legacy BlockStored with cache_salt slot",
			payload: enc(t, []any{1.0, []any{
				[]any{"BlockStored", []any{int64(-1)}, nil, []any{1, 2, 3}, 3, nil, "GPU", map[string]any{"cache_salt": "abc"}},
			}, 2}, true),
			want: Batch{TS: 1, DPRank: 2, HasDPRank: true, Events: []Event{{Kind: KindBlockStored, BlockHashes: []uint64{^uint64(0)},
				TokenIDs: []uint32{1, 2, 3}, BlockSize: 3, Medium: "GPU", CacheSalt: "abc"}}},
		},
		{
			name: "event map without a type is unknown",
			payload: enc(t, []any{1.0, []any{
				ev{"block_hashes": []any{1}},
			}, nil}, true),
			want: Batch{TS: 1, Unknown: 1},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b Batch
			require.NoError(t, DecodeBatch(tt.payload, &b))
			requireBatchEqual(t, &tt.want, &b)
		})
	}
}

func TestDecodeErrors(t *testing.T) {
	valid, err := AppendBatch(nil, &Batch{TS: 1, Events: sampleEvents(), HasDPRank: true}, FormatMap, HashBytes)
	require.NoError(t, err)
	tests := []struct {
		name    string
		payload []byte
		msg     string
	}{
		{"empty", nil, "truncated"},
		{"not a batch", unhex(t, "c3"), "want array"},
		{"batch too short", unhex(t, "91 cb 00 00 00 00 00 00 00 00"), "want at least 2"},
		{"ts is a string", unhex(t, `93 a1 "x" 90 c0`), "want integer"},
		{"huge events array", unhex(t, "93 00 dd ff ff ff ff"), "exceeds"},
		{"huge map", unhex(t, "df 7f ff ff ff"), "exceeds"},
		{"huge bin hash", unhex(t, `93 00 91 92 ac "BlockRemoved" 91 c6 7f ff ff ff`), "truncated"},
		{"short digest", unhex(t, `93 00 91 92 ac "BlockRemoved" 91 c4 04 01 02 03 04 c0`), "shorter than 8"},
		{"hash is a bool", unhex(t, `93 00 91 92 ac "BlockRemoved" 91 c3 c0`), "want integer"},
		{"event is an int", unhex(t, "93 00 91 05 c0"), "want array"},
		{"empty event", unhex(t, "93 00 91 90 c0"), "empty event"},
		{"tag is an int", unhex(t, "93 00 91 91 05 c0"), "want string"},
		{"BlockStored too short", unhex(t, `93 00 91 92 ab "BlockStored" 90 c0`), "at least 5"},
		{"negative token", unhex(t, `93 00 91 95 ab "BlockStored" 90 c0 91 ff 01 c0`), "out of range"},
		{"token above uint32", unhex(t, `93 00 91 95 ab "BlockStored" 90 c0 91 cf 00 00 00 01 00 00 00 00 01 c0`), "out of range"},
		{"block_size huge", unhex(t, `93 00 91 95 ab "BlockStored" 90 c0 90 cf 00 00 00 01 00 00 00 00 c0`), "out of range"},
		{"map key is an int", unhex(t, "93 00 91 81 01 02 c0"), "want string"},
		{"map batch without events", unhex(t, `81 a2 "ts" 00`), "no events"},
		{"trailing bytes", append(bytes.Clone(valid), 0), "trailing"},
		{"reserved code", unhex(t, `93 00 91 92 a1 "X" c1 c0`), "unexpected msgpack code 0xc1"},
		{"deep nesting in an unknown slot", append(unhex(t, `93 00 91 92 a1 "X"`), bytes.Repeat([]byte{0x91}, 200)...), "nesting"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b Batch
			err := DecodeBatch(tt.payload, &b)
			require.Error(t, err)
			require.True(t, errors.Is(err, ErrMalformed), "%v", err)
			require.ErrorContains(t, err, tt.msg)
			require.ErrorContains(t, err, "cannot decode batch")
		})
	}
	t.Run("every truncation of a valid batch", func(t *testing.T) {
		var b Batch
		for i := 0; i < len(valid); i++ {
			require.Error(t, DecodeBatch(valid[:i], &b), "prefix %d", i)
		}
		require.NoError(t, DecodeBatch(valid, &b))
	})
}

func TestDecodeReusesBatch(t *testing.T) {
	payload, err := AppendBatch(nil, &Batch{TS: 1, Events: sampleEvents(), HasDPRank: true}, FormatArray, HashUint64)
	require.NoError(t, err)
	var b Batch
	require.NoError(t, DecodeBatch(payload, &b))
	allocs := testing.AllocsPerRun(100, func() {
		if err := DecodeBatch(payload, &b); err != nil {
			panic(err)
		}
	})
	require.Zero(t, allocs)
	requireBatchEqual(t, &Batch{TS: 1, Events: expectAfter(FormatArray, sampleEvents()), HasDPRank: true}, &b)

	// A smaller batch after a larger one must not leak old events or fields.
	small, err := AppendBatch(nil, &Batch{Events: []Event{{Kind: KindAllBlocksCleared}}}, FormatMap, HashUint64)
	require.NoError(t, err)
	require.NoError(t, DecodeBatch(small, &b))
	requireBatchEqual(t, &Batch{Events: []Event{{Kind: KindAllBlocksCleared}}}, &b)
}

func FuzzDecodeBatch(f *testing.F) {
	for _, fm := range []Format{FormatArray, FormatMap, FormatArraySGLang, FormatMapSGLang} {
		for _, h := range []HashEncoding{HashUint64, HashInt64, HashBytes} {
			p, err := AppendBatch(nil, &Batch{TS: 1, Events: sampleEvents(), HasDPRank: true}, fm, h)
			if err != nil {
				f.Fatal(err)
			}
			f.Add(p)
		}
	}
	for _, fm := range []Format{FormatArray, FormatMap} {
		opaque := Event{Kind: KindBlockStored, BlockHashes: []uint64{1, 2, 3}, TokenIDs: []uint32{1, 2, 3}, BlockSize: 1,
			LoraName: "ad", CacheSalt: "tenant", Opaque: 2}
		p, err := AppendBatch(nil, &Batch{Events: []Event{opaque}}, fm, HashUint64)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(p)
	}
	f.Add(unhex(f, contractMapPayload))
	f.Add(unhex(f, contractArrayPayload))
	f.Add(unhex(f, "93 00 dd ff ff ff ff"))
	f.Add([]byte{})
	// A batch decoded into before, as a subscriber reuses its own.
	used, err := AppendBatch(nil, &Batch{TS: 2, Events: sampleEvents(), HasDPRank: true, DPRank: 3}, FormatMap, HashBytes)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var b, reused Batch
		require.NoError(t, DecodeBatch(used, &reused))
		errReused := DecodeBatch(data, &reused)
		if err := DecodeBatch(data, &b); err != nil {
			require.ErrorIs(t, err, ErrMalformed)
			require.Error(t, errReused)
			return
		}
		// Decoding into a batch used before gives what a new one gets.
		require.NoError(t, errReused)
		requireBatchEqual(t, &b, &reused)
		// Whatever decodes must re-encode and decode to the same batch.
		out, err := AppendBatch(nil, &b, FormatMap, HashUint64)
		require.NoError(t, err)
		var b2 Batch
		require.NoError(t, DecodeBatch(out, &b2))
		b.Unknown = 0
		for i := range b.Events {
			if ev := &b.Events[i]; len(ev.BlockHashes) == 0 || ev.HasParent {
				ev.CacheSalt = "" // vLLM carries it in a root event's first block
			}
		}
		requireBatchEqual(t, &b, &b2)
	})
}

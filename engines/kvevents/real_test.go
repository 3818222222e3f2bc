package kvevents

import (
	"encoding/hex"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/omnious/provider-node/internal/testutil/hexframes"
)

// TestDecodeRealVLLM032 decodes batches a running vLLM 0.32.0 published
// (e2e/vllm, TestSimulatorFidelity with E2E_VLLM_SAVE): tagged maps with
// uint64 hashes, and fields the simulator does not send (lora_name nil,
// extra_keys, group_idx, kv_cache_spec_kind) read or skipped.
func TestDecodeRealVLLM032(t *testing.T) {
	lines := hexframes.Read(t, "testdata/vllm-0.32.0.hex")
	require.Len(t, lines, 2)
	var b Batch
	require.NoError(t, DecodeBatch(lines[0][0], &b))
	require.Zero(t, b.Unknown)
	require.True(t, b.HasDPRank)
	require.Zero(t, b.DPRank)
	require.Len(t, b.Events, 2)
	require.Equal(t, KindAllBlocksCleared, b.Events[0].Kind)
	st := b.Events[1]
	require.Equal(t, KindBlockStored, st.Kind)
	require.Len(t, st.BlockHashes, 10)
	require.Equal(t, uint64(7182389228981244103), st.BlockHashes[0])
	require.False(t, st.HasParent)
	require.Equal(t, 32, st.BlockSize)
	require.Len(t, st.TokenIDs, 320)
	require.Equal(t, []uint32{37056, 21164, 24201}, st.TokenIDs[:3])
	require.Equal(t, "GPU", st.Medium)
	require.Empty(t, st.LoraName)
	require.Zero(t, st.GroupIdx)
	require.Equal(t, "full_attention", st.SpecKind)
	require.True(t, st.FullAttention())

	require.NoError(t, DecodeBatch(lines[1][0], &b))
	require.Len(t, b.Events, 2)
	rm := b.Events[0]
	require.Equal(t, KindBlockRemoved, rm.Kind)
	require.Equal(t, []uint64{7388968032571948320}, rm.BlockHashes)
	require.Equal(t, "GPU", rm.Medium)
	st = b.Events[1]
	require.Equal(t, KindBlockStored, st.Kind)
	require.True(t, st.HasParent)
	require.Equal(t, uint64(1467480733394529798), st.ParentHash)
	require.Len(t, st.BlockHashes, 6)
}

// TestDecodeRealSGLang0523 decodes messages SGLang 0.5.23's own
// ZmqEventPublisher sent (e2e/vllm/sglang_capture.py): topic, sequence and
// tagged-map events with signed int64 hashes, cache_salt and session_id.
func TestDecodeRealSGLang0523(t *testing.T) {
	msgs := hexframes.Read(t, "testdata/sglang-0.5.23.frames")
	require.Len(t, msgs, 3)
	var batches []Batch
	for i, frames := range msgs {
		topic, seq, payload, err := ParseMessage(frames)
		require.NoError(t, err)
		require.Equal(t, "kv", string(topic))
		require.Equal(t, uint64(i), seq)
		var b Batch
		require.NoError(t, DecodeBatch(payload, &b))
		require.Zero(t, b.Unknown)
		batches = append(batches, b)
	}
	neg202 := int64(-202)
	require.Len(t, batches[0].Events, 2)
	a, c := batches[0].Events[0], batches[0].Events[1]
	require.Equal(t, KindBlockStored, a.Kind)
	require.Equal(t, []uint64{101, uint64(neg202)}, a.BlockHashes)
	require.False(t, a.HasParent)
	require.Equal(t, []uint32{1, 2, 3, 4, 5, 6, 7, 8}, a.TokenIDs)
	require.Equal(t, 4, a.BlockSize)
	require.Equal(t, "GPU", a.Medium)
	require.True(t, c.HasParent)
	require.Equal(t, uint64(neg202), c.ParentHash)
	require.Equal(t, "salt-a", c.CacheSalt)
	require.Empty(t, c.Medium)
	require.Equal(t, KindBlockRemoved, batches[1].Events[0].Kind)
	require.Equal(t, []uint64{303}, batches[1].Events[0].BlockHashes)
	require.Equal(t, KindAllBlocksCleared, batches[2].Events[0].Kind)
}

// TestEncodeSGLang0523 encodes the batches sglang_capture.py published with
// FormatMapSGLang and HashInt64: every frame equals SGLang 0.5.23's byte for
// byte (engines/sim's TestSGLangShape checks the same through the
// simulator's configuration and replay socket).
func TestEncodeSGLang0523(t *testing.T) {
	msgs := hexframes.Read(t, "testdata/sglang-0.5.23.frames")
	neg202 := int64(-202)
	batches := [][]Event{
		{
			{Kind: KindBlockStored, BlockHashes: []uint64{101, uint64(neg202)},
				TokenIDs: []uint32{1, 2, 3, 4, 5, 6, 7, 8}, BlockSize: 4, Medium: "GPU"},
			{Kind: KindBlockStored, BlockHashes: []uint64{303}, ParentHash: uint64(neg202), HasParent: true,
				TokenIDs: []uint32{9, 10, 11, 12}, BlockSize: 4, CacheSalt: "salt-a", SessionID: "s1"},
		},
		{{Kind: KindBlockRemoved, BlockHashes: []uint64{303}, Medium: "GPU"}},
		{{Kind: KindAllBlocksCleared}},
	}
	require.Len(t, msgs, len(batches))
	for i, evs := range batches {
		payload, err := AppendBatch(nil, &Batch{TS: 1765000000.5, Events: evs, HasDPRank: true}, FormatMapSGLang, HashInt64)
		require.NoError(t, err)
		got := MessageFrames([]byte("kv"), uint64(i), payload)
		require.Len(t, got, len(msgs[i]))
		for j := range got {
			require.Equal(t, hex.EncodeToString(msgs[i][j]), hex.EncodeToString(got[j]), "message %d frame %d", i, j)
		}
	}
	// lora_name, set only with an adapter, comes last as in BlockStored's
	// declaration.
	b, err := AppendBatch(nil, &Batch{Events: []Event{{Kind: KindBlockStored, BlockHashes: []uint64{1},
		TokenIDs: []uint32{2}, BlockSize: 1, LoraName: "ad", SessionID: "s"}}}, FormatMapSGLang, HashInt64)
	require.NoError(t, err)
	require.True(t, strings.HasSuffix(string(b), "\xaasession_id\xa1s\xa9lora_name\xa2ad\xc0"), "%q", b)
}

// TestDecodeSGLangArrays decodes the positional layouts of SGLang 0.4.8 to
// 0.5.16 (msgspec array_like with omit_defaults, read from their
// kv_events modules): trailing unset fields and the unset dp_rank are
// left out, so BlockStored may end at lora_id, BlockRemoved at the hashes
// and the batch after the events.
func TestDecodeSGLangArrays(t *testing.T) {
	tests := []struct {
		name, payload string
		medium        string
		hasDPRank     bool
	}{
		{"0.4.8 no dp_rank", `92 cb 3f f0 00 00 00 00 00 00 92
			96 ab "BlockStored" 91 fb c0 92 01 02 02 c0
			92 ac "BlockRemoved" 91 fb`, "", false},
		{"0.5.10 medium", `93 cb 3f f0 00 00 00 00 00 00 92
			97 ab "BlockStored" 91 fb c0 92 01 02 02 c0 a3 "GPU"
			93 ac "BlockRemoved" 91 fb a3 "GPU" 00`, "GPU", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b Batch
			require.NoError(t, DecodeBatch(unhex(t, tt.payload), &b))
			require.Zero(t, b.Unknown)
			require.Equal(t, tt.hasDPRank, b.HasDPRank)
			require.Len(t, b.Events, 2)
			st, rm := b.Events[0], b.Events[1]
			require.Equal(t, KindBlockStored, st.Kind)
			require.Equal(t, []uint64{uint64(neg(5))}, st.BlockHashes)
			require.False(t, st.HasParent)
			require.Equal(t, []uint32{1, 2}, st.TokenIDs)
			require.Equal(t, 2, st.BlockSize)
			require.Equal(t, tt.medium, st.Medium)
			require.Equal(t, KindBlockRemoved, rm.Kind)
			require.Equal(t, []uint64{uint64(neg(5))}, rm.BlockHashes)
			require.Equal(t, tt.medium, rm.Medium)
		})
	}
}

func neg(v int64) int64 { return -v }

package kvevents

import (
	"encoding/hex"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// readHexLines reads a testdata file of hex-encoded values, one a line;
// a line may hold several, separated by spaces (a message's frames).
func readHexLines(t *testing.T, name string) [][][]byte {
	t.Helper()
	b, err := os.ReadFile("testdata/" + name)
	require.NoError(t, err)
	var out [][][]byte
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var frames [][]byte
		for _, f := range strings.Fields(line) {
			v, err := hex.DecodeString(f)
			require.NoError(t, err)
			frames = append(frames, v)
		}
		out = append(out, frames)
	}
	return out
}

// TestDecodeRealVLLM032 decodes batches a running vLLM 0.32.0 published
// (e2e/vllm, TestSimulatorFidelity with E2E_VLLM_SAVE): tagged maps with
// uint64 hashes, and fields the simulator does not send (lora_name nil,
// extra_keys, group_idx, kv_cache_spec_kind) read or skipped.
func TestDecodeRealVLLM032(t *testing.T) {
	lines := readHexLines(t, "vllm-0.32.0.hex")
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
	msgs := readHexLines(t, "sglang-0.5.23.frames")
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

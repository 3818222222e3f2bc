package kvindex

import (
	"encoding/binary"
	"hash/maphash"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// refKeys is the chain definition written the slow, obvious way.
func refKeys(parent Key, tokens []uint32, bs int) []Key {
	var out []Key
	for i := 0; i+bs <= len(tokens); i += bs {
		var b []byte
		for _, t := range tokens[i : i+bs] {
			b = binary.NativeEndian.AppendUint32(b, t)
		}
		x := uint64(parent)*0x9e3779b97f4a7c15 ^ maphash.Bytes(contentSeed, b)
		x = (x ^ x>>33) * 0xff51afd7ed558ccd
		x = (x ^ x>>33) * 0xc4ceb9fe1a85ec53
		parent = Key(x ^ x>>33)
		out = append(out, parent)
	}
	return out
}

func randTokens(rng *rand.Rand, n int) []uint32 {
	t := make([]uint32, n)
	for i := range t {
		t[i] = rng.Uint32()
	}
	return t
}

func TestAppendBlockKeys(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	root := RootKey("m", "", "")
	for _, tc := range []struct {
		name      string
		tokens    int
		blockSize int
		want      int
	}{
		{"block 16 exact", 64, 16, 4},
		{"trailing partial ignored", 70, 16, 4},
		{"shorter than a block", 15, 16, 0},
		{"block 1", 5, 1, 5},
		{"block 2", 9, 2, 4},
		{"block 5 (odd)", 10, 5, 2},
		{"block 6", 12, 6, 2},
		{"block 7 (odd)", 21, 7, 3},
		{"block 14", 28, 14, 2},
		{"block 128", 256, 128, 2},
		{"block 129 (odd)", 2*129 + 3, 129, 2},
		{"hybrid block 832", 3 * 832, 832, 3},
		{"zero block size", 64, 0, 0},
		{"negative block size", 64, -16, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			toks := randTokens(rng, tc.tokens)
			got := AppendBlockKeys(nil, root, toks, tc.blockSize)
			require.Len(t, got, tc.want)
			if tc.blockSize > 0 {
				require.Equal(t, refKeys(root, toks, tc.blockSize), got)
			}
		})
	}
}

func TestAppendBlockKeysChains(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	toks := randTokens(rng, 64)
	root := RootKey("m", "", "")
	all := AppendBlockKeys(nil, root, toks, 16)
	// Keying the tail from the last key of the head gives the same chain.
	head := AppendBlockKeys(nil, root, toks[:32], 16)
	tail := AppendBlockKeys(head, head[1], toks[32:], 16)
	require.Equal(t, all, tail)
	// A block's key depends on everything before it.
	other := append([]uint32{toks[0] + 1}, toks[1:]...)
	diff := AppendBlockKeys(nil, root, other, 16)
	for i := range all {
		require.NotEqual(t, all[i], diff[i], "block %d", i)
	}
	// dst is appended to, not overwritten.
	pre := []Key{7}
	require.Equal(t, append([]Key{7}, all...), AppendBlockKeys(pre, root, toks, 16))
}

func TestRootKey(t *testing.T) {
	base := RootKey("llama", "", "")
	require.NotZero(t, base)
	require.Equal(t, base, RootKey("llama", "", ""))
	variants := map[string]Key{
		"model":        RootKey("qwen", "", ""),
		"lora":         RootKey("llama", "sql", ""),
		"salt":         RootKey("llama", "", "s1"),
		"lora vs salt": RootKey("llama", "", "sql"),
		"shifted":      RootKey("llam", "a", ""),
	}
	seen := map[Key]string{base: "base"}
	for name, k := range variants {
		prev, dup := seen[k]
		require.False(t, dup, "%s collides with %s", name, prev)
		seen[k] = name
	}
}

func TestKeysDoNotAllocate(t *testing.T) {
	toks := randTokens(rand.New(rand.NewPCG(5, 6)), 4096)
	dst := make([]Key, 0, 4096)
	for _, bs := range []int{16, 832} {
		allocs := testing.AllocsPerRun(20, func() {
			dst = AppendBlockKeys(dst[:0], 1, toks, bs)
		})
		require.Zero(t, allocs, "block size %d", bs)
	}
	require.Zero(t, testing.AllocsPerRun(20, func() { _ = RootKey("m", "l", "s") }))
}

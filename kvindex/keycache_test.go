package kvindex

import (
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// promptMaker builds prompts that share prefixes the way traffic does: a
// prompt is a recent prompt cut at a random point (not a block or segment
// boundary) followed by fresh tokens, so shared runs start, end and diverge
// anywhere.
type promptMaker struct {
	rng    *rand.Rand
	recent [][]uint32
}

func (p *promptMaker) next(maxLen int) []uint32 {
	var out []uint32
	if len(p.recent) > 0 && p.rng.IntN(4) > 0 {
		prev := p.recent[p.rng.IntN(len(p.recent))]
		out = append(out, prev[:p.rng.IntN(len(prev)+1)]...)
	}
	for n := p.rng.IntN(maxLen + 1); len(out) < n; {
		out = append(out, p.rng.Uint32N(8)) // small alphabet: equal blocks recur
	}
	if len(p.recent) < 16 {
		p.recent = append(p.recent, out)
	} else {
		p.recent[p.rng.IntN(len(p.recent))] = out
	}
	return out
}

func TestKeyCacheMatchesUncached(t *testing.T) {
	roots := []Key{RootKey("m", "", ""), RootKey("m", "lora", ""), RootKey("n", "", "salt")}
	for _, tc := range []struct {
		name      string
		blockSize int
		tokens    int // cache capacity
		maxLen    int
	}{
		{"block 16", 16, 1 << 16, 3000},
		{"block 16, evicting", 16, 600, 3000},
		{"block 1", 1, 4096, 700},
		{"block 5 (odd)", 5, 1 << 14, 2000},
		{"block 832", 832, 1 << 14, 6000},
		{"one segment", 16, 1, 1000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := NewKeyCache(tc.tokens, tc.blockSize)
			require.NoError(t, err)
			p := &promptMaker{rng: rand.New(rand.NewPCG(7, uint64(tc.blockSize)))}
			var dst []Key
			for i := range 2000 {
				toks := p.next(tc.maxLen)
				root := roots[p.rng.IntN(len(roots))]
				want := AppendBlockKeys(nil, root, toks, tc.blockSize)
				pre := Key(p.rng.Uint64N(3))
				dst = c.AppendBlockKeys(append(dst[:0], pre), root, toks)
				require.Equal(t, append([]Key{pre}, want...), dst, "prompt %d (%d tokens)", i, len(toks))
			}
		})
	}
}

// TestKeyCacheServesAndVerifies shows that a repeated prompt's keys come
// from the cache, that a cached segment is used only for the tokens it was
// recorded with, and that prompts under one root keep entries of their own.
func TestKeyCacheServesAndVerifies(t *testing.T) {
	c, err := NewKeyCache(1<<16, 16)
	require.NoError(t, err)
	rng := rand.New(rand.NewPCG(8, 9))
	toks := randTokens(rng, 3000) // 187 blocks: segments of 64, 64 and 59
	root := RootKey("m", "", "")
	want := AppendBlockKeys(nil, root, toks, 16)
	require.Equal(t, want, c.AppendBlockKeys(nil, root, toks))
	require.Equal(t, 3, c.segs.Len())

	// Served: keys planted in the first and the last segment come back.
	first, ok := c.segs.Peek(want[0])
	require.True(t, ok)
	require.Len(t, first.keys, 64)
	last, ok := c.segs.Peek(want[128])
	require.True(t, ok)
	require.Len(t, last.keys, 59)
	first.keys[3], last.keys[58] = 12345, 6789
	got := c.AppendBlockKeys(nil, root, toks)
	require.Equal(t, Key(12345), got[3])
	require.Equal(t, Key(6789), got[186])
	first.keys[3], last.keys[58] = want[3], want[186]

	// Verified: a prompt differing in block 5 reuses blocks 0-4 only.
	other := append([]uint32(nil), toks...)
	other[5*16+7]++
	require.Equal(t, AppendBlockKeys(nil, root, other, 16), c.AppendBlockKeys(nil, root, other))
	// ...and the original prompt is still keyed right, and still cached.
	require.Equal(t, want, c.AppendBlockKeys(nil, root, toks))
	first.keys[3] = 12345
	require.Equal(t, Key(12345), c.AppendBlockKeys(nil, root, toks)[3])
	first.keys[3] = want[3]

	// A prompt with another first block under the same root has an entry
	// of its own and leaves the first prompt's in place.
	fresh := randTokens(rng, 3000)
	require.Equal(t, AppendBlockKeys(nil, root, fresh, 16), c.AppendBlockKeys(nil, root, fresh))
	_, ok = c.segs.Peek(want[0])
	require.True(t, ok)
}

func TestKeyCacheWarmDoesNotAllocate(t *testing.T) {
	c, err := NewKeyCache(1<<16, 16)
	require.NoError(t, err)
	toks := randTokens(rand.New(rand.NewPCG(10, 11)), 8192)
	dst := c.AppendBlockKeys(make([]Key, 0, 512), 1, toks)
	require.Zero(t, testing.AllocsPerRun(20, func() { dst = c.AppendBlockKeys(dst[:0], 1, toks) }))
	// Churn: evicted segments' buffers serve new ones.
	small, err := NewKeyCache(4*256, 16)
	require.NoError(t, err)
	p := &promptMaker{rng: rand.New(rand.NewPCG(12, 13))}
	prompts := make([][]uint32, 64)
	for i := range prompts {
		prompts[i] = p.next(2000)
	}
	for _, pr := range prompts {
		dst = small.AppendBlockKeys(dst[:0], 1, pr)
	}
	i := 0
	allocs := testing.AllocsPerRun(50, func() {
		dst = small.AppendBlockKeys(dst[:0], 1, prompts[i%len(prompts)])
		i++
	})
	// simplelru allocates a list element per new entry; the segments do not.
	require.LessOrEqual(t, allocs, 8.0)
}

func TestKeyCacheConcurrent(t *testing.T) {
	c, err := NewKeyCache(2048, 16)
	require.NoError(t, err)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := &promptMaker{rng: rand.New(rand.NewPCG(14, uint64(g%2)))} // pairs share prompts
			var dst []Key
			for range 300 {
				toks := p.next(2000)
				dst = c.AppendBlockKeys(dst[:0], 1, toks)
				if want := AppendBlockKeys(nil, 1, toks, 16); !slices.Equal(want, dst) {
					t.Errorf("cached keys differ for a %d-token prompt", len(toks))
					return
				}
			}
		}()
	}
	wg.Wait()
}

func TestNewKeyCacheRejectsBadBlockSize(t *testing.T) {
	for _, bs := range []int{0, -16} {
		_, err := NewKeyCache(1024, bs)
		require.Error(t, err)
	}
}

// TestKeyCacheDivergence changes one token of a cached 3000-token prompt
// (segments of 64, 64 and 59 blocks at block size 16) at the first, a
// middle and the last token of a segment, and in the partial last block:
// the cache serves the blocks before the change and keys the rest anew,
// and keeps serving both prompts right.
func TestKeyCacheDivergence(t *testing.T) {
	rng := rand.New(rand.NewPCG(15, 16))
	toks := randTokens(rng, 3000)
	root := RootKey("m", "", "")
	for _, tc := range []struct {
		name string
		at   int // token changed
	}{
		{"first token", 0},
		{"first block of segment 0", 7},
		{"last token of segment 0", 64*16 - 1},
		{"first token of segment 1", 64 * 16},
		{"middle of segment 1", 64*16 + 500},
		{"last full block", 186*16 + 3},
		{"partial block", 2999},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := NewKeyCache(1<<16, 16)
			require.NoError(t, err)
			require.Equal(t, AppendBlockKeys(nil, root, toks, 16), c.AppendBlockKeys(nil, root, toks))
			other := slices.Clone(toks)
			other[tc.at] ^= 1 << 20
			require.Equal(t, AppendBlockKeys(nil, root, other, 16), c.AppendBlockKeys(nil, root, other))
			// Both prompts are cached now; each still keys as uncached.
			require.Equal(t, AppendBlockKeys(nil, root, toks, 16), c.AppendBlockKeys(nil, root, toks))
			require.Equal(t, AppendBlockKeys(nil, root, other, 16), c.AppendBlockKeys(nil, root, other))
		})
	}
}

// FuzzKeyCacheMatchesUncached keys prompts made from the input (a block
// size, then runs that reuse an earlier prompt's prefix or add tokens from
// a small alphabet, so equal blocks and segments recur) with one KeyCache
// and compares each answer with AppendBlockKeys.
func FuzzKeyCacheMatchesUncached(f *testing.F) {
	f.Add([]byte{3, 0, 200, 1, 40, 7, 2, 30, 9})
	f.Add([]byte{0, 5, 255, 255, 3, 1, 2, 3, 4, 5, 0, 100})
	f.Add([]byte{15, 255, 255, 255, 255, 0, 1, 255, 2, 128})
	f.Fuzz(func(t *testing.T, in []byte) {
		if len(in) < 2 {
			return
		}
		bs := 1 + int(in[0]%16)
		c, err := NewKeyCache(1+int(in[1])*64, bs)
		require.NoError(t, err)
		var prompts [][]uint32
		var cur []uint32
		for i := 2; i+1 < len(in); i += 2 {
			op, arg := in[i], int(in[i+1])
			switch {
			case op < 64 && len(prompts) > 0: // a prefix of an earlier prompt
				p := prompts[int(op)%len(prompts)]
				cur = append(cur[:0:0], p[:min(len(p), arg*8)]...)
			case op < 192: // fresh tokens
				for j := range arg * 4 {
					cur = append(cur, uint32((j*int(op))%5))
				}
			default: // key cur, then start over from it
				prompts = append(prompts, cur)
				want := AppendBlockKeys(nil, Key(op), cur, bs)
				require.Equal(t, want, c.AppendBlockKeys(nil, Key(op), cur))
				cur = slices.Clone(cur)
				if len(cur) > 0 {
					cur[arg%len(cur)] ^= uint32(op)
				}
			}
		}
		require.Equal(t, AppendBlockKeys(nil, 1, cur, bs), c.AppendBlockKeys(nil, 1, cur))
	})
}

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

package kvindex

import (
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/omnious/provider-node/internal/cputime"
)

// runs is a CachedPrefix over toks cut at ends, as a tokenizer's cache
// hands one out.
type runs struct {
	ids   [][]uint32
	memos []*atomic.Value
	n     int
}

func newRuns(toks []uint32, ends ...int) *runs {
	return (&runs{}).extend(toks, ends...)
}

func (r *runs) Len() int { return r.n }

func (r *runs) AppendRuns(ids [][]uint32, memos []*atomic.Value) ([][]uint32, []*atomic.Value) {
	return append(ids, r.ids...), append(memos, r.memos...)
}

// extend is a prefix that continues r with runs of toks ending at ends,
// sharing r's memos (a later turn of a conversation).
func (r *runs) extend(toks []uint32, ends ...int) *runs {
	x := &runs{ids: slices.Clone(r.ids), memos: slices.Clone(r.memos), n: r.n}
	for _, e := range ends {
		x.ids = append(x.ids, toks[x.n:e])
		x.memos = append(x.memos, new(atomic.Value))
		x.n = e
	}
	return x
}

// upTo is r's leading runs that end at or before n tokens, sharing their
// memos (an earlier turn).
func (r *runs) upTo(n int) *runs {
	x := &runs{}
	for i, ids := range r.ids {
		if x.n+len(ids) > n {
			break
		}
		x.ids, x.memos, x.n = append(x.ids, ids), append(x.memos, r.memos[i]), x.n+len(ids)
	}
	return x
}

// TestAppendPrefixKeysRoots keys prompts through prefixes whose memos are
// shared between roots, block sizes and prompts: the keys are always
// AppendBlockKeys's, a memo is read only under the root and block size
// that filled it, and a filled memo is what a later prompt gets.
func TestAppendPrefixKeysRoots(t *testing.T) {
	rng := rand.New(rand.NewPCG(21, 22))
	toks := randTokens(rng, 2000)
	rootA, rootB := RootKey("m", "", ""), RootKey("m", "lora", "")
	type call struct {
		bs     int
		root   Key
		tokens int // the prompt is toks[:tokens]
		prefix int // index into prefixes
	}
	base := newRuns(toks, 100, 700, 1303)
	prefixes := []*runs{
		base,
		base.extend(toks, 1600, 1601, 1602, 1990),  // a later turn: shares base's memos
		newRuns(toks, 3, 6, 9, 12, 15, 18, 21, 24), // runs shorter than a block
		newRuns(toks, 500, 2000),                   // the whole prompt, no tail
	}
	for _, tc := range []struct {
		name  string
		calls []call
	}{
		{"one root, repeated", []call{{16, rootA, 2000, 0}, {16, rootA, 2000, 0}, {16, rootA, 1400, 0}}},
		{"roots alternate", []call{{16, rootA, 2000, 0}, {16, rootB, 2000, 0}, {16, rootA, 2000, 0}, {16, rootB, 1500, 0}}},
		{"block sizes alternate", []call{{16, rootA, 2000, 0}, {5, rootA, 2000, 0}, {832, rootA, 2000, 0}, {5, rootA, 2000, 0}, {16, rootA, 2000, 0}}},
		{"a later turn", []call{{16, rootA, 1400, 0}, {16, rootA, 2000, 1}, {16, rootB, 2000, 1}, {16, rootA, 2000, 1}}},
		{"short runs", []call{{16, rootA, 30, 2}, {16, rootA, 30, 2}, {1, rootA, 30, 2}, {16, rootA, 30, 2}}},
		{"no tail", []call{{16, rootA, 2000, 3}, {16, rootA, 2000, 3}, {5, rootA, 2000, 3}, {16, rootB, 2000, 3}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, p := range prefixes {
				for _, m := range p.memos {
					*m = atomic.Value{}
				}
			}
			caches := map[int]*KeyCache{}
			for i, c := range tc.calls {
				kc := caches[c.bs]
				if kc == nil {
					var err error
					kc, err = NewKeyCache(1<<16, c.bs)
					require.NoError(t, err)
					caches[c.bs] = kc
				}
				want := AppendBlockKeys([]Key{7}, c.root, toks[:c.tokens], c.bs)
				p := prefixes[c.prefix]
				got := kc.AppendPrefixKeys([]Key{7}, c.root, p, toks[p.Len():c.tokens])
				require.Equal(t, want, got, "call %d", i)
			}
		})
	}
}

// TestAppendPrefixKeysServesMemo shows that a filled memo is what the keys
// come from, under its own root and block size only: one planted with
// wrong keys is served as planted, and ignored under another root.
func TestAppendPrefixKeysServesMemo(t *testing.T) {
	rng := rand.New(rand.NewPCG(23, 24))
	toks := randTokens(rng, 100)
	root, other := RootKey("m", "", ""), RootKey("n", "", "")
	kc, err := NewKeyCache(1<<16, 16)
	require.NoError(t, err)
	p := newRuns(toks, 40, 100) // blocks 0-1 end in the first run, 2-5 in the second
	want := AppendBlockKeys(nil, root, toks, 16)
	require.Equal(t, want, kc.AppendPrefixKeys(nil, root, p, nil))
	r, ok := p.memos[0].Load().(*prefixRun)
	require.True(t, ok, "the first prompt fills the memo")
	require.Equal(t, want[:2], r.keys)

	planted := []Key{101, 102}
	p.memos[0].Store(&prefixRun{root: root, blockSize: 16, keys: planted})
	got := kc.AppendPrefixKeys(nil, root, p, nil)
	require.Equal(t, planted, got[:2], "a memo under the prompt's root and block size is served")
	require.Equal(t, AppendBlockKeys(nil, other, toks, 16), kc.AppendPrefixKeys(nil, other, p, nil), "another root never reads it")
	kc5, err := NewKeyCache(1<<16, 5)
	require.NoError(t, err)
	require.Equal(t, AppendBlockKeys(nil, root, toks, 5), kc5.AppendPrefixKeys(nil, root, p, nil), "another block size never reads it")
}

// TestAppendPrefixKeysConcurrent shares prefixes between goroutines keying
// under two roots (run with -race).
func TestAppendPrefixKeysConcurrent(t *testing.T) {
	rng := rand.New(rand.NewPCG(25, 26))
	toks := randTokens(rng, 4000)
	roots := []Key{RootKey("m", "", ""), RootKey("m", "", "salt")}
	kc, err := NewKeyCache(1<<16, 16)
	require.NoError(t, err)
	p := newRuns(toks, 1000, 2000, 3000, 3999)
	want := [][]Key{AppendBlockKeys(nil, roots[0], toks, 16), AppendBlockKeys(nil, roots[1], toks, 16)}
	var wg sync.WaitGroup
	errs := make(chan string, 4)
	for g := range 4 {
		wg.Go(func() {
			var dst []Key
			for i := range 200 {
				r := (g + i) % 2
				dst = kc.AppendPrefixKeys(dst[:0], roots[r], p, toks[p.Len():])
				if len(dst) != len(want[r]) || dst[len(dst)-1] != want[r][len(dst)-1] || dst[0] != want[r][0] {
					errs <- "keys differ"
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Fatal(e)
	}
}

// FuzzAppendPrefixKeys keys prompts made of the fuzzer's tokens through
// prefixes with the fuzzer's run ends (the runs that fit the prompt, then
// its other tokens as the tail), under two roots and two block sizes
// sharing the prefixes' memos, in turn: every answer is AppendBlockKeys's.
func FuzzAppendPrefixKeys(f *testing.F) {
	f.Add([]byte("abcdefghijklmnopqrstuvwxyz0123456789abcdefghijklmnopqrstuvwxyz"), []byte{10, 20, 3, 40}, uint8(4), uint8(7))
	f.Add(make([]byte, 300), []byte{255, 1, 1, 64}, uint8(16), uint8(1))
	f.Add([]byte{1, 2, 3}, []byte{}, uint8(0), uint8(0))
	f.Fuzz(func(t *testing.T, data, cuts []byte, bsA, bsB uint8) {
		toks := make([]uint32, len(data))
		for i, b := range data {
			toks[i] = uint32(b % 5) // small alphabet: equal blocks recur
		}
		var ends []int
		end := 0
		for _, c := range cuts {
			if end += int(c%64) + 1; end > len(toks) {
				break
			}
			ends = append(ends, end)
		}
		all := newRuns(toks, ends...)
		roots := []Key{RootKey("m", "", ""), RootKey("m", "", "s")}
		var caches []*KeyCache
		for _, bs := range []uint8{bsA, bsB} {
			kc, err := NewKeyCache(256, int(bs%20)+1)
			require.NoError(t, err)
			caches = append(caches, kc)
		}
		for i := range 8 {
			kc, root := caches[i%2], roots[(i/2)%2]
			n := len(toks) - i*len(toks)/16 // shorter and shorter prompts
			want := AppendBlockKeys(nil, root, toks[:n], kc.blockSize)
			p := all.upTo(n)
			require.Equal(t, want, kc.AppendPrefixKeys(nil, root, p, toks[p.Len():n]), "call %d", i)
		}
	})
}

// BenchmarkPrefixKeys keys a 50k-token prompt (a 200 KB chat) at block
// size 16 that a tokenizer's cache holds in runs of about 1,365 tokens
// (its 4 KiB cuts) but its last 100 tokens: through the key cache, which
// compares the cached tokens (keycache), and through the runs' memos
// (memo). Both are warm: the same prompt again.
func BenchmarkPrefixKeys(b *testing.B) {
	rng := rand.New(rand.NewPCG(27, 28))
	const n, run = 50_000, 1365
	toks := randTokens(rng, n)
	var ends []int
	for e := run; e < n-100; e += run {
		ends = append(ends, e)
	}
	root := RootKey("m", "", "")
	for _, memo := range []bool{false, true} {
		name := "keycache"
		if memo {
			name = "memo"
		}
		b.Run(name, func(b *testing.B) {
			kc, err := NewKeyCache(1<<20, 16)
			require.NoError(b, err)
			p := newRuns(toks, ends...)
			keys := make([]Key, 0, n/16)
			b.ReportAllocs()
			start, ops := cputime.Clock(), 0
			for b.Loop() {
				if memo {
					keys = kc.AppendPrefixKeys(keys[:0], root, p, toks[p.Len():])
				} else {
					keys = kc.AppendBlockKeys(keys[:0], root, toks)
				}
				ops++
			}
			cputime.Report(b, start, ops)
			sinkKeys = keys
		})
	}
}

// BenchmarkPrefixKeysCold is BenchmarkPrefixKeys' memo case as the EPP
// meets it: each run's ids in an allocation of its own, as the tokenizer's
// cache entries hold them, and the CPU's caches evicted before every call
// (64 MiB written, outside the timer), as other processes leave them
// between two requests.
func BenchmarkPrefixKeysCold(b *testing.B) {
	rng := rand.New(rand.NewPCG(27, 28))
	const n, run = 50_000, 1365
	toks := randTokens(rng, n)
	var ends []int
	for e := run; e < n-100; e += run {
		ends = append(ends, e)
	}
	root := RootKey("m", "", "")
	kc, err := NewKeyCache(1<<20, 16)
	require.NoError(b, err)
	p := newRuns(toks, ends...)
	for i := range p.ids {
		p.ids[i] = slices.Clone(p.ids[i])
	}
	keys := kc.AppendPrefixKeys(make([]Key, 0, n/16), root, p, toks[p.Len():]) // fills the memos
	evict := make([]byte, 64<<20)
	b.ReportAllocs()
	for b.Loop() {
		b.StopTimer()
		for i := 0; i < len(evict); i += 64 {
			evict[i]++
		}
		b.StartTimer()
		keys = kc.AppendPrefixKeys(keys[:0], root, p, toks[p.Len():])
	}
	sinkKeys = keys
}

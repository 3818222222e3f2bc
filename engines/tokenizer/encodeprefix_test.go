package tokenizer

import (
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
)

// checkPrefix encodes text after pre through pc, with EncodeTail when
// tail is set and EncodePrefix otherwise, and checks their contract: the
// ids are the tokenizer's own, the Prefix's entries hold the first Len()
// of them (which EncodeTail leaves out of dst), and its runs hold those
// ids in order, each with a memo of its own. It returns the Prefix's
// length.
func checkPrefix(t *testing.T, tok Tokenizer, pc *PrefixCache, pre []uint32, text string, tail bool) int {
	t.Helper()
	encode := pc.EncodePrefix
	if tail {
		encode = pc.EncodeTail
	}
	got, p := encode(append([]uint32(nil), pre...), text)
	want := tok.Encode(append([]uint32(nil), pre...), text)
	require.Equal(t, append([]uint32{}, pre...), append([]uint32{}, got[:len(pre)]...), "dst's ids are kept")
	var held []uint32
	if p.e != nil {
		held = p.e.appendTo(nil)
	}
	require.Len(t, held, p.Len())
	ids := got[len(pre):]
	if tail {
		ids = append(append([]uint32{}, held...), ids...)
	}
	require.Equal(t, append([]uint32{}, want[len(pre):]...), append([]uint32{}, ids...), "%q", text)
	require.Equal(t, append([]uint32{}, ids[:p.Len()]...), append([]uint32{}, held...), "the prefix's ids are the text's first ones: %q", text)
	runs, memos := p.AppendRuns(nil, nil)
	require.Len(t, memos, len(runs))
	seen := map[*atomic.Value]bool{}
	var joined []uint32
	for i, r := range runs {
		require.False(t, seen[memos[i]], "run %d shares a memo", i)
		seen[memos[i]] = true
		require.NotEmpty(t, r, "run %d", i)
		joined = append(joined, r...)
	}
	require.Equal(t, append([]uint32{}, held...), append([]uint32{}, joined...), "the runs hold the prefix's ids")
	return p.Len()
}

// TestEncodePrefixIDs replays conversations, documents sharing a head,
// and random texts through caches small enough to evict, with ids already
// in dst, through EncodePrefix and EncodeTail in turn: the Prefix always
// holds exactly the text's first ids, EncodeTail appends exactly the
// others, and a repeated text comes back almost wholly held.
func TestEncodePrefixIDs(t *testing.T) {
	tok := NewStandIn()
	for _, tc := range []struct {
		name string
		cfg  PrefixCacheConfig
	}{
		{"defaults", PrefixCacheConfig{}},
		{"cut every 64 bytes", PrefixCacheConfig{CutEvery: 64}},
		{"evicting", PrefixCacheConfig{MaxEntries: 8, CutsPerText: 2, CutEvery: 32}},
		{"small MaxBytes", PrefixCacheConfig{MaxBytes: 4 << 10, CutEvery: 16}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pc := NewPrefixCache(tok, tc.cfg)
			rng := rand.New(rand.NewPCG(11, 12))
			randText := func(n int) string {
				var b strings.Builder
				for range n {
					b.WriteString(standInAlphabet[rng.IntN(len(standInAlphabet))])
				}
				return b.String()
			}
			var recent []string
			repeatHeld := 0
			for i := range 600 {
				var text string
				switch {
				case len(recent) > 0 && i%3 == 0: // a recent text, cut and continued
					prev := recent[rng.IntN(len(recent))]
					text = prev[:rng.IntN(len(prev)+1)] + randText(rng.IntN(40))
				case len(recent) > 0 && i%3 == 1: // a recent text again
					text = recent[rng.IntN(len(recent))]
				default:
					text = "<|im_start|>system\n" + randText(rng.IntN(400)) + "<|im_end|>"
				}
				pre := make([]uint32, rng.IntN(3))
				n := checkPrefix(t, tok, pc, pre, text, i%2 == 1)
				if i%3 == 1 && len(text) > 200 && n > 0 {
					repeatHeld++
				}
				recent = append(recent, text)
				if len(recent) > 12 {
					recent = recent[1:]
				}
			}
			require.Positive(t, repeatHeld, "repeated long texts come back held")
		})
	}
}

// FuzzEncodePrefix encodes a, b and their concatenations in turn through
// one cache cutting every 16 bytes, each with EncodePrefix then
// EncodeTail: each call's Prefix holds the text's first ids, and
// EncodeTail appends exactly the others (checkPrefix).
func FuzzEncodePrefix(f *testing.F) {
	f.Add("<|im_start|>system\nyou are a helper<|im_end|>", "<|im_start|>user\nhello there, how are you<|im_end|>")
	f.Add("a long document without added tokens, cut inside the text", "and its continuation")
	f.Add("", "<|endoftext|>")
	tok := NewStandIn()
	f.Fuzz(func(t *testing.T, a, b string) {
		pc := NewPrefixCache(tok, PrefixCacheConfig{CutEvery: 16, MaxEntries: 16})
		for _, text := range []string{a, b, a + b, a + b, b + a, a, a + b + a} {
			checkPrefix(t, tok, pc, nil, text, false)
			checkPrefix(t, tok, pc, nil, text, true)
		}
	})
}

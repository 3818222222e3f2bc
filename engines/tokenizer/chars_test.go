package tokenizer

import (
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
)

// bytesStart is BPE on word w started from its bytes, the reference's way.
func bytesStart(t *HF, w string) []uint32 {
	var dst []uint32
	for i := 0; i < len(w); i++ {
		dst = append(dst, t.byteIDs[w[i]])
	}
	return t.merge(dst, 0, 0)
}

// charStarted is BPE on w started from its characters, or nil when some
// character must start from bytes.
func charStarted(t *HF, w string) []uint32 {
	dst, none, ok := t.appendChars(nil, w)
	if !ok {
		return nil
	}
	return t.merge(dst, 0, none)
}

// startRunes are the characters words are drawn from: all below
// tableRunes but surrogates, and a few above.
func startRunes() []rune {
	var out []rune
	for r := rune(0x20); r < tableRunes+0x100; r++ {
		if r < 0xD800 || r > 0xDFFF {
			out = append(out, r)
		}
	}
	return out
}

// TestCharStartMatchesBytes is the differential test of chars.go: on
// random words of characters that start from their own tokens (and ASCII),
// with and without a leading space or punctuation as the pre-tokenizers
// leave them, starting from characters gives the ids of starting from
// bytes.
func TestCharStartMatchesBytes(t *testing.T) {
	for _, fam := range vsHFFamilies {
		t.Run(fam, func(t *testing.T) {
			tok := loadFamily(t, fam)
			runes := startRunes()
			n, cjk := 0, 0
			for r := rune(utf8.RuneSelf); r < tableRunes; r++ {
				if charKind(tok.charTok[r].e) != charBytes && charCtx(tok.charTok[r].e) == 0 {
					n++
					if r >= 0x4E00 && r <= 0x9FA5 {
						cjk++
					}
				}
			}
			t.Logf("%d characters start from their tokens in any context, %d of them CJK; %d contexts", n, cjk, len(tok.charCtxs))
			rng := rand.New(rand.NewPCG(7, uint64(len(fam))))
			han := func() rune { return rune(0x4E00 + rng.IntN(0x9FA5-0x4E00+1)) }
			for i := 0; i < 50_000; i++ {
				var sb strings.Builder
				if rng.IntN(3) > 0 {
					sb.WriteByte(" .'(\n"[rng.IntN(5)])
				}
				script := rng.IntN(3)
				for k := 1 + rng.IntN(12); k > 0; k-- {
					if rng.IntN(8) == 0 {
						sb.WriteByte(' ')
					}
					switch script {
					case 0:
						sb.WriteRune(han())
					case 1:
						sb.WriteRune(runes[rng.IntN(len(runes))])
					default:
						// Neighbours of one random character: same script.
						base := runes[rng.IntN(len(runes))]
						sb.WriteRune(min(base+rune(rng.IntN(64)), tableRunes-1))
					}
				}
				w := sb.String()
				got := charStarted(tok, w)
				if got == nil {
					continue
				}
				require.Equal(t, bytesStart(tok, w), got, "%q", w)
			}
		})
	}
}

// checkNoMerge fails unless every pair appendChars marks as having no
// merge has none in the merge table; it returns how many were marked.
func checkNoMerge(t *testing.T, tok *HF, w string) int {
	ids, none, ok := tok.appendChars(nil, w)
	if !ok {
		if none != 0 {
			t.Fatalf("%q: marks on invalid UTF-8", w)
		}
		return 0
	}
	marked := 0
	for i := 0; i+1 < len(ids) && i < 64; i++ {
		if none&(1<<i) != 0 {
			if _, has := tok.merges.get(uint64(ids[i])<<32 | uint64(ids[i+1])); has {
				t.Fatalf("%q: pair %d (%d, %d) has a merge", w, i, ids[i], ids[i+1])
			}
			marked++
		}
	}
	if none>>max(len(ids)-1, 0) != 0 {
		t.Fatalf("%q: bits past the last pair", w)
	}
	return marked
}

// TestStartNoMerge checks the pairs appendChars tells mergeLinear not to
// look up: on the corpus documents' words of every family, on random words
// of any characters, and on trained vocabularies, none of them has a
// merge; and the check must skip some pairs of the mixed-script text.
func TestStartNoMerge(t *testing.T) {
	runes := startRunes()
	for _, fam := range vsHFFamilies {
		t.Run(fam, func(t *testing.T) {
			tok := loadFamily(t, fam)
			marked := 0
			for _, script := range corpusScripts {
				tok.split.preTokenize(goldenCorpus(t, fam)[script].Text, func(w string) {
					marked += checkNoMerge(t, tok, w)
				})
			}
			require.Greater(t, marked, 1000)
			rng := rand.New(rand.NewPCG(3, uint64(len(fam))))
			for i := 0; i < 2_000; i++ {
				var sb strings.Builder
				for k := 1 + rng.IntN(70); k > 0; k-- {
					sb.WriteRune(runes[rng.IntN(len(runes))])
				}
				checkNoMerge(t, tok, sb.String())
			}
		})
	}
	chars := []rune("прожмнабв中文的缓存😀éèa ,")
	for seed := uint64(1); seed <= 5; seed++ {
		tok := trained(t, seed)
		rng := rand.New(rand.NewPCG(seed, 2))
		for i := 0; i < 2000; i++ {
			var sb strings.Builder
			for k := 1 + rng.IntN(10); k > 0; k-- {
				sb.WriteRune(chars[rng.IntN(len(chars))])
			}
			checkNoMerge(t, tok, sb.String())
		}
	}
}

// trained is a byte-level BPE tokenizer trained on random text of a few
// characters of several scripts: merges are the most frequent pairs (with
// seeded noise, so each seed orders them differently), unconstrained by
// character boundaries, as real vocabularies' are, so partial characters
// merge with spaces and neighbours at all ranks.
func trained(tb testing.TB, seed uint64) *HF {
	rng := rand.New(rand.NewPCG(seed, 99))
	chars := []string{"п", "р", "о", "ж", "中", "文", "的", "缓", "存", "😀", "é", " ", " ", "a", "b", ","}
	words := make([][]string, 400)
	for i := range words {
		var w string
		for k := 1 + rng.IntN(8); k > 0; k-- {
			w += chars[rng.IntN(len(chars))]
		}
		for j := 0; j < len(w); j++ {
			words[i] = append(words[i], w[j:j+1])
		}
	}
	vocab := map[string]int{}
	for b := 0; b < 256; b++ {
		vocab[byteLevelEncode(string([]byte{byte(b)}))] = b
	}
	var merges [][2]string
	for len(merges) < 120 {
		// A pair drawn in proportion to its count: unlike the most
		// frequent one, often a pair across characters before the
		// pairs inside them.
		var pairs [][2]string
		for _, w := range words {
			for j := 0; j+1 < len(w); j++ {
				pairs = append(pairs, [2]string{w[j], w[j+1]})
			}
		}
		if len(pairs) == 0 {
			break
		}
		best := pairs[rng.IntN(len(pairs))]
		if _, dup := vocab[byteLevelEncode(best[0]+best[1])]; dup {
			continue // the same token made by another pair: the reference keeps both, the vocab one
		}
		merges = append(merges, [2]string{byteLevelEncode(best[0]), byteLevelEncode(best[1])})
		vocab[byteLevelEncode(best[0]+best[1])] = len(vocab)
		for i, w := range words {
			var out []string
			for j := 0; j < len(w); j++ {
				if j+1 < len(w) && w[j] == best[0] && w[j+1] == best[1] {
					out = append(out, w[j]+w[j+1])
					j++
				} else {
					out = append(out, w[j])
				}
			}
			words[i] = out
		}
	}
	tok, err := Parse("trained", syntheticJSON(tb, func(m map[string]any) {
		m["model"] = map[string]any{"type": "BPE", "vocab": vocab, "merges": merges}
	}), nil)
	require.NoError(tb, err)
	return tok
}

// TestCharStartTrained runs the differential test on trained vocabularies,
// whole strings as one word (so spaces sit inside words too).
func TestCharStartTrained(t *testing.T) {
	chars := []rune("прожмнабв中文的缓存😀éèa ,")
	started := 0
	for seed := uint64(1); seed <= 20; seed++ {
		tok := trained(t, seed)
		rng := rand.New(rand.NewPCG(seed, 1))
		for i := 0; i < 2000; i++ {
			var sb strings.Builder
			for k := 1 + rng.IntN(10); k > 0; k-- {
				sb.WriteRune(chars[rng.IntN(len(chars))])
			}
			w := sb.String()
			require.Equal(t, bytesStart(tok, w), charStarted(tok, w), "seed %d: %q", seed, w)
		}
		for _, r := range chars {
			if r >= utf8.RuneSelf && charCtx(tok.charTok[r].e) == 0 {
				started++
			}
		}
	}
	// The test must exercise both: characters that start from their
	// tokens anywhere, and characters that start from bytes in some
	// contexts.
	require.Greater(t, started, 20)
	require.Less(t, started, 20*14)
}

// FuzzCharStart checks on arbitrary text that encoding it as one word, and
// every word the pre-tokenizers cut from it, gives the same started from
// characters as from bytes, on trained vocabularies.
func FuzzCharStart(f *testing.F) {
	for _, s := range []string{"缓存的 中文", " привет мир", "жож 😀é,ab", "中\u00a0文 п", "𠀀𠀁𪚥 a\u0301", " ,中,"} {
		f.Add(s)
	}
	var toks []*HF
	for seed := uint64(1); seed <= 4; seed++ {
		toks = append(toks, trained(f, seed))
	}
	f.Fuzz(func(t *testing.T, s string) {
		if !utf8.ValidString(s) || len(s) > 256 {
			return
		}
		for _, tok := range toks {
			require.Equal(t, bytesStart(tok, s), charStarted(tok, s), "%q", s)
			tok.split.preTokenize(s, func(w string) {
				require.Equal(t, bytesStart(tok, w), charStarted(tok, w), "%q", w)
			})
		}
	})
}

// BenchmarkBuildCharStart is what starting words from characters adds to
// loading a tokenizer (BenchmarkParse is the whole load).
func BenchmarkBuildCharStart(b *testing.B) {
	for _, fam := range vsHFFamilies {
		tok := loadFamily(b, fam)
		b.Run(fam, func(b *testing.B) {
			fresh := *tok
			b.ReportAllocs()
			for b.Loop() {
				fresh.charTok, fresh.charCtxs = nil, nil
				fresh.buildCharStart()
			}
		})
	}
}

// BenchmarkParse is loading a tokenizer from its files' contents.
func BenchmarkParse(b *testing.B) {
	for _, fam := range vsHFFamilies {
		tj, err := os.ReadFile(filepath.Join(modelDir(fam), "tokenizer.json"))
		require.NoError(b, err)
		cfg, err := os.ReadFile(filepath.Join(modelDir(fam), "tokenizer_config.json"))
		require.NoError(b, err)
		b.Run(fam, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_, err := Parse(fam, tj, cfg)
				require.NoError(b, err)
			}
		})
	}
}

// FuzzDecodeRune checks decodeRune against utf8.DecodeRuneInString, and
// the class tables at reads against the classes computed from the unicode
// and norm tables, at every offset of arbitrary bytes.
func FuzzDecodeRune(f *testing.F) {
	for _, s := range []string{"a", "é中😀", "\xc2\x80\xdf\xbf\xe0\xa0\x80\xef\xbf\xbf", "\xc0\x80\xc1\xbf\xe0\x80\x80\xed\xa0\x80\xed\x9f\xbf\xee\x80\x80", "\xe4\xb8", "\xf0\x9f\x98", "\xff\xfe"} {
		f.Add(s)
	}
	initClasses()
	f.Fuzz(func(t *testing.T, s string) {
		for i := 0; i < len(s); i++ {
			r, w := decodeRune(s, i)
			wr, ww := utf8.DecodeRuneInString(s[i:])
			require.Equal(t, [2]int{int(wr), ww}, [2]int{int(r), w}, "%q at %d", s, i)
			c, cw := at(s, i)
			require.Equal(t, w, cw)
			want := uint16(0)
			if r != utf8.RuneError || w > 1 {
				want = slowClass(r)
			}
			require.Equal(t, want, c, "%q at %d: %U", s, i, r)
		}
	})
}

// TestDecodeRuneEdges is FuzzDecodeRune on the edges of every form: each
// lead byte followed by each continuation byte edge, at the string's end
// and not.
func TestDecodeRuneEdges(t *testing.T) {
	initClasses()
	edges := []byte{0x00, 0x7f, 0x80, 0x9f, 0xa0, 0xbf, 0xc0}
	for lead := 0; lead < 256; lead++ {
		for _, c1 := range edges {
			for _, c2 := range edges {
				for _, s := range []string{string([]byte{byte(lead)}), string([]byte{byte(lead), c1}), string([]byte{byte(lead), c1, c2}), string([]byte{byte(lead), c1, c2, 0x80})} {
					r, w := decodeRune(s, 0)
					wr, ww := utf8.DecodeRuneInString(s)
					require.Equal(t, [2]int{int(wr), ww}, [2]int{int(r), w}, "%q", s)
				}
			}
		}
	}
}

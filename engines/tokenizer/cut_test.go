package tokenizer

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
	"golang.org/x/text/unicode/norm"
)

// allCuts returns every cut nextCut gives in text, as offsets in text.
func allCuts(tok Restarting, text string) []int {
	var out []int
	pos := 0
	tok.splitAdded(text, func(seg string, id int32) {
		if id < 0 {
			for b := tok.nextCut(seg, 1); b >= 0; b = tok.nextCut(seg, b+1) {
				out = append(out, pos+b)
			}
		}
		pos += len(seg)
	})
	return out
}

// cutCorpus is what TestCutsRestart cuts: every golden text and chat
// prompt of a family, and each text joined to the next (a boundary between
// two kinds of text).
func cutCorpus(tb testing.TB, fam string) []string {
	var texts []string
	for _, v := range readJSONL[textVector](tb, filepath.Join("testdata", "golden", fam+".text.jsonl")) {
		texts = append(texts, v.Text)
	}
	n := len(texts)
	for i := 0; i+1 < n; i++ {
		texts = append(texts, texts[i]+texts[i+1])
	}
	return append(texts, chatPrompts(tb, fam)...)
}

// chatPrompts are a family's golden chat prompts, if it has a template.
func chatPrompts(tb testing.TB, fam string) []string {
	var texts []string
	for _, cf := range chatFamilies {
		if cf == fam {
			for _, v := range readJSONL[chatVector](tb, filepath.Join("testdata", "golden", fam+".chat.jsonl")) {
				texts = append(texts, v.Text)
			}
		}
	}
	return texts
}

// restarter is a tokenizer and the family whose corpus it is tested on
// (the stand-in: Qwen3's, whose chat template it follows).
type restarter struct {
	name, corpus string
	tok          Restarting
}

func restarters(tb testing.TB) []restarter {
	out := []restarter{{"standin", "qwen3", NewStandIn()}}
	for _, fam := range families {
		out = append(out, restarter{fam, fam, loadFamily(tb, fam)})
	}
	return out
}

// TestCutsRestart is the differential test of the cut points: on every
// text of the golden corpora, encoding in pieces split at all of its cuts
// gives the ids of encoding it whole (for the golden texts themselves,
// the reference tokenizer's ids), and at each cut b the ids are exactly
// those of text[:b] encoded alone followed by those of text[b:] encoded
// as a continuation, which is what the prefix cache relies on.
func TestCutsRestart(t *testing.T) {
	for _, r := range restarters(t) {
		t.Run(r.name, func(t *testing.T) {
			checked := 0
			for i, text := range cutCorpus(t, r.corpus) {
				want := r.tok.Encode(nil, text)
				mids := allCuts(r.tok, text)
				var ns []int
				got := r.tok.encode(nil, text, false, mids, func(end, n int) {
					for _, m := range mids {
						if m == end {
							ns = append(ns, n)
						}
					}
				})
				require.Equal(t, want, got, "text %d %q: pieces at all %d cuts", i, trunc(text), len(mids))
				require.Len(t, ns, len(mids), "text %d: every mid cut reported", i)
				// Each cut on its own: all of them for short texts, an even
				// sample of long ones (a check costs a whole encoding).
				step := max(1, len(mids)/16)
				for k := 0; k < len(mids); k += step {
					b, n := mids[k], ns[k]
					require.Equal(t, want[:n], r.tok.Encode(nil, text[:b]), "text %d cut at %d: prefix alone, %q|%q", i, b, trunc(text[max(0, b-40):b]), trunc(text[b:]))
					require.Equal(t, want[n:], r.tok.encode(nil, text[b:], true, nil, nil), "text %d cut at %d: continuation", i, b)
					checked++
				}
			}
			// The golden texts hold prose, code and CJK with spaces and
			// newlines: a family that yielded few cuts lost its rules.
			t.Logf("%d cuts checked one by one", checked)
			require.Greater(t, checked, 5000, "cuts checked")
		})
	}
}

// TestCutRules pins where each family cuts, and that no cut splits an added
// token whose bytes would straddle it.
func TestCutRules(t *testing.T) {
	qwen, llama2 := loadFamily(t, "qwen3"), loadFamily(t, "llama2")
	withSpaceToken, err := Parse("x", syntheticJSON(t, func(m map[string]any) {
		m["added_tokens"] = []map[string]any{{"id": 300, "content": "a b", "special": true}, {"id": 301, "content": "x\nY", "special": false, "normalized": true}}
	}), nil)
	require.NoError(t, err)
	tests := []struct {
		name string
		tok  Restarting
		text string
		want []int
	}{
		{"space after a word", qwen, "hello world again", []int{5, 11}},
		{"space after punctuation and digits", qwen, "(a) 12 x", []int{3, 6}},
		{"no cut after a space", qwen, "a  b", []int{1}},
		{"newline then visible ASCII but /", qwen, "a\nb\n(c\n/d", []int{2, 4}},
		{"no cut before a space, tab or newline after a newline", qwen, "a\n b\n\tc\n\nd", []int{9}},
		{"NFC: not before a rune that may compose", qwen, "a\ne\u0301 b\nee", []int{8}},
		{"none around non-ASCII", qwen, "東京 é ok", nil},
		{"stand-in alike", NewStandIn(), "hello world\nnext", []int{5, 12}},
		{"llama2: a space after any other byte", llama2, "a b  c\nd é f", []int{1, 3, 8, 11}},
		{"llama2: not after a written ▁, which normalizes to one", llama2, "a\u2581 b ▁x y", []int{6, 11}},
		{"added token bytes are never cut apart", withSpaceToken, "qa bq a x\nYz", []int{5}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, allCuts(tc.tok, tc.text))
			pc := NewPrefixCache(tc.tok, PrefixCacheConfig{CutEvery: 1})
			want := tc.tok.Encode(nil, tc.text)
			for range 2 {
				require.Equal(t, want, pc.Encode(nil, tc.text))
			}
		})
	}
	// Without those added tokens the same text is cut inside both.
	require.Equal(t, []int{2, 5, 7, 10}, allCuts(synthetic(t), "qa bq a x\nYz"))
}

// TestNFCCutAssumptions checks, on every rune, what the cut rules assume of
// NFC: ASCII is never part of a canonical decomposition but at its start
// (so never the second half of a composition), and no decomposition
// starts with a space or a newline. With these, NFC of a text cut between
// two ASCII bytes is NFC of each side, and a space or a newline before the
// cut stays where it is.
func TestNFCCutAssumptions(t *testing.T) {
	composed := 0
	for r := rune(0); r <= unicode.MaxRune; r++ {
		if !utf8.ValidRune(r) {
			continue
		}
		d := norm.NFD.String(string(r))
		first, w := utf8.DecodeRuneInString(d)
		for _, x := range d[w:] {
			require.GreaterOrEqual(t, x, rune(utf8.RuneSelf), "U+%04X decomposes to %q: ASCII after its start", r, d)
		}
		if first < utf8.RuneSelf && d != string(r) {
			composed++
			require.NotContains(t, " \n", string(first), "U+%04X decomposes from %q", r, first)
		}
	}
	require.Greater(t, composed, 100, "letters with diacritics compose from ASCII")
	for _, s := range []string{"e\u0301", "<\u0338", "a\n\u0301", "x \u0301", "a\ne\u0301"} {
		for i := 1; i < len(s); i++ {
			if s[i-1] < utf8.RuneSelf && s[i] < utf8.RuneSelf {
				require.Equal(t, norm.NFC.String(s), norm.NFC.String(s[:i])+norm.NFC.String(s[i:]), "%q at %d", s, i)
			}
		}
	}
}

// TestCutsWithoutSplit: a SentencePiece vocabulary with a token that has
// "▁" after another character can merge across any space, so it has no cut
// inside text.
func TestCutsWithoutSplit(t *testing.T) {
	llama2 := loadFamily(t, "llama2")
	require.True(t, llama2.spmSplit)
	cp := *llama2
	cp.spmSplit = false
	require.Empty(t, allCuts(&cp, "a b c"))
	require.NotEmpty(t, allCuts(llama2, "a b c"))
}

func ExamplePrefixCache() {
	tok := NewStandIn()
	pc := NewPrefixCache(tok, PrefixCacheConfig{CutEvery: 64})
	doc := strings.Repeat("The shared document, line after line.\n", 40)
	pc.Encode(nil, "<|im_start|>user\n"+doc+"First question?<|im_end|>")
	ids := pc.Encode(nil, "<|im_start|>user\n"+doc+"Second question?<|im_end|>")
	st := pc.Stats()
	fmt.Println(st.Hits, st.ReusedIDs > uint64(len(ids))*9/10)
	// Output: 1 true
}

// editDocs are the texts FuzzPrefixCacheEdit edits: a family's corpus
// joined into documents of about 2 KiB, and its chat prompts (added tokens
// between the edits).
func editDocs(tb testing.TB, corpus string) []string {
	var docs []string
	var b strings.Builder
	for _, v := range readJSONL[textVector](tb, filepath.Join("testdata", "golden", corpus+".text.jsonl")) {
		b.WriteString(v.Text)
		if b.Len() >= 2<<10 {
			docs = append(docs, b.String())
			b.Reset()
		}
	}
	return append(docs, chatPrompts(tb, corpus)...)
}

// editTarget is a tokenizer, a prefix cache over it that caches nearly
// every cut (every 16 bytes) and the documents whose edits are checked.
type editTarget struct {
	name string
	tok  Restarting
	pc   *PrefixCache
	docs []string
}

func newEditTarget(tb testing.TB, name, corpus string, tok Restarting) editTarget {
	return editTarget{name, tok, NewPrefixCache(tok, PrefixCacheConfig{CutEvery: 16, MaxEntries: 1 << 14}), editDocs(tb, corpus)}
}

// checkEdit puts a document through the cache, then the document with
// del bytes at pos replaced by ins, which the cache holds prefixes of
// that end right before, at and after the edit; then both again, now
// cached. Each must equal encoding from scratch.
func (tg editTarget) checkEdit(t *testing.T, doc, pos, del int, ins string) {
	base := tg.docs[doc%len(tg.docs)]
	p := pos % (len(base) + 1)
	edited := base[:p] + ins + base[min(len(base), p+del):]
	for _, text := range []string{base, edited, edited, base} {
		require.Equal(t, tg.tok.Encode(nil, text), tg.pc.Encode(nil, text), "%s: %q at %d (del %d) of %q", tg.name, ins, p, del, trunc(base))
	}
}

// editInserts are what the random edits insert: the bytes the cut rules
// look at, what NFC composes, added tokens, and text of each kind.
var editInserts = []string{" ", "\n", "/", "x", "\u0301", "'s", " 123", "<|im_end|>", "\n\n  ", "é", "東", ".\n/", "", "\xff",
	"\r\n", "\t", "\u00a0", "x y", "q\nZ", "<|a|>", "'re", "ſ", "A\u030a", "\u212b", "▁", "▁ "}

// TestPrefixCacheRandomEdits is FuzzPrefixCacheEdit's check on the real
// vocabularies (the stand-in and every family), with 300 edits each drawn
// from a fixed seed: random positions, deletions and inserts.
func TestPrefixCacheRandomEdits(t *testing.T) {
	for _, r := range restarters(t) {
		t.Run(r.name, func(t *testing.T) {
			tg := newEditTarget(t, r.name, r.corpus, r.tok)
			rng := rand.New(rand.NewPCG(11, uint64(len(r.name))))
			for range 300 {
				ins := editInserts[rng.IntN(len(editInserts))]
				if rng.IntN(4) == 0 {
					ins += string(rune(rng.IntN(0x3100)))
				}
				tg.checkEdit(t, rng.IntN(len(tg.docs)), rng.IntN(4<<10), rng.IntN(4), ins)
			}
		})
	}
}

// FuzzPrefixCacheEdit edits cached texts at random: a tokenizer and one of
// its corpus documents are picked, and checkEdit replaces del bytes at pos
// with ins. The caches live as long as the fuzzing process, so earlier
// inputs' prefixes are there too. The tokenizers are the stand-in and
// synthetic vocabularies with each family's exact split pattern (Qwen's
// with NFC), added tokens holding a space and a newline, and a
// SentencePiece-style one with byte fallback. What a cut must not change
// is where the pre-tokenizer splits words, which does not depend on the
// vocabulary; a word split in two shows in the ids when a merge would
// have joined its halves, so every pair of ASCII bytes merges. These load
// in milliseconds, where the real vocabularies take seconds in every
// fuzzing process (TestPrefixCacheRandomEdits edits with those).
func FuzzPrefixCacheEdit(f *testing.F) {
	var targets []editTarget
	targets = append(targets, newEditTarget(f, "standin", "qwen3", NewStandIn()))
	for _, sy := range syntheticFamilies(f) {
		targets = append(targets, newEditTarget(f, sy.name, sy.corpus, sy.tok))
	}
	for i, ins := range editInserts {
		f.Add(uint8(i), uint16(i*7), uint16(100+i*37), uint8(i%3), ins)
	}
	f.Fuzz(func(t *testing.T, which uint8, doc, pos uint16, del uint8, ins string) {
		targets[int(which)%len(targets)].checkEdit(t, int(doc), int(pos), int(del), ins)
	})
}

type syntheticFamily struct {
	name, corpus string
	tok          *HF
}

// syntheticFamilies are byte-level vocabularies with each family's split
// pattern and normalizer, and a SentencePiece-style one.
func syntheticFamilies(tb testing.TB) []syntheticFamily {
	split := func(pats ...string) []map[string]any {
		var steps []map[string]any
		for _, p := range pats {
			steps = append(steps, map[string]any{"type": "Split", "pattern": map[string]string{"Regex": p}, "behavior": "Isolated", "invert": false})
		}
		return append(steps, map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false})
	}
	added := []map[string]any{
		{"id": 20000, "content": "<|im_end|>", "special": true},
		{"id": 20001, "content": "x y", "special": true},
		{"id": 20002, "content": "q\nZ", "special": false, "normalized": true},
	}
	// Every pair of ASCII bytes merges, at ranks in a shuffled order, so
	// that splitting a word in two mostly changes its ids.
	vocab := map[string]int{}
	for b := 0; b < 256; b++ {
		vocab[byteLevelEncode(string([]byte{byte(b)}))] = b
	}
	var merges [][2]string
	for a := 0; a < 128; a++ {
		for b := 0; b < 128; b++ {
			l, r := byteLevelEncode(string([]byte{byte(a)})), byteLevelEncode(string([]byte{byte(b)}))
			merges = append(merges, [2]string{l, r})
			vocab[l+r] = len(vocab)
		}
	}
	rand.New(rand.NewPCG(5, 6)).Shuffle(len(merges), func(i, j int) { merges[i], merges[j] = merges[j], merges[i] })
	byteLevel := func(nfc bool, steps []map[string]any) *HF {
		tok, err := Parse("synthetic", syntheticJSON(tb, func(m map[string]any) {
			m["pre_tokenizer"].(map[string]any)["pretokenizers"] = steps
			m["added_tokens"] = added
			m["model"] = map[string]any{"type": "BPE", "vocab": vocab, "merges": merges}
			if nfc {
				m["normalizer"] = map[string]any{"type": "NFC"}
			}
		}), nil)
		require.NoError(tb, err)
		return tok
	}
	spm, err := Parse("synthetic-spm", syntheticSPMJSON(tb), nil)
	require.NoError(tb, err)
	require.True(tb, spm.spmSplit)
	return []syntheticFamily{
		{"qwen-split", "qwen3", byteLevel(true, split(patQwen))},
		{"llama3-split", "llama3_1", byteLevel(false, split(patLlama3))},
		{"o200k-split", "gptoss", byteLevel(false, split(patO200k))},
		{"deepseek-split", "deepseek_v3", byteLevel(false, split(patDSDigits, patDSCJK, patDSMain))},
		{"spm", "llama2", spm},
	}
}

// syntheticSPMJSON is a small SentencePiece-style tokenizer.json: byte
// fallback, "▁", the lowercase letters, and merges of every pair of them,
// of "▁" before each and of "▁▁" in a shuffled order (none with "▁" after
// another character); added tokens as the byte-level ones have.
func syntheticSPMJSON(tb testing.TB) []byte {
	vocab := map[string]int{"<unk>": 0}
	for b := 0; b < 256; b++ {
		vocab[fmt.Sprintf("<0x%02X>", b)] = len(vocab)
	}
	vocab["▁"] = len(vocab)
	for c := 'a'; c <= 'z'; c++ {
		vocab[string(c)] = len(vocab)
	}
	merges := [][2]string{{"▁", "▁"}}
	for a := 'a'; a <= 'z'; a++ {
		merges = append(merges, [2]string{"▁", string(a)})
		for b := 'a'; b <= 'z'; b++ {
			merges = append(merges, [2]string{string(a), string(b)})
		}
	}
	rand.New(rand.NewPCG(7, 8)).Shuffle(len(merges), func(i, j int) { merges[i], merges[j] = merges[j], merges[i] })
	for _, m := range merges {
		vocab[m[0]+m[1]] = len(vocab)
	}
	m := map[string]any{
		"added_tokens": []map[string]any{{"id": 1000, "content": "<|im_end|>", "special": true}, {"id": 1001, "content": "x y", "special": true}},
		"normalizer": map[string]any{"type": "Sequence", "normalizers": []map[string]any{
			{"type": "Prepend", "prepend": "▁"},
			{"type": "Replace", "pattern": map[string]string{"String": " "}, "content": "▁"},
		}},
		"pre_tokenizer": nil,
		"model":         map[string]any{"type": "BPE", "vocab": vocab, "merges": merges, "byte_fallback": true, "unk_token": "<unk>", "fuse_unk": true},
	}
	b, err := json.Marshal(m)
	require.NoError(tb, err)
	return b
}

// TestPrefixCacheSharedDocument sends requests that share one long
// document and differ after it (one message: a document, then a
// question): every result equals encoding from scratch, and every request
// after the first reuses most of the document.
func TestPrefixCacheSharedDocument(t *testing.T) {
	for _, r := range restarters(t) {
		t.Run(r.name, func(t *testing.T) {
			vecs := readJSONL[textVector](t, filepath.Join("testdata", "golden", r.corpus+".text.jsonl"))
			var doc strings.Builder
			var questions []string
			for _, v := range vecs {
				if v.Cat == "english" || v.Cat == "code" || v.Cat == "long" || v.Cat == "mixed" {
					doc.WriteString(v.Text + "\n")
				} else if len(questions) < 40 {
					questions = append(questions, v.Text)
				}
			}
			require.Greater(t, doc.Len(), 16<<10)
			docIDs := len(r.tok.Encode(nil, doc.String()))
			pc := NewPrefixCache(r.tok, PrefixCacheConfig{})
			for i, q := range questions {
				text := "<|im_start|>user\n" + doc.String() + "\nQuestion: " + q + "<|im_end|>\n<|im_start|>assistant\n"
				before := pc.Stats()
				require.Equal(t, r.tok.Encode(nil, text), pc.Encode(nil, text), "question %d", i)
				if i > 0 {
					after := pc.Stats()
					require.Equal(t, before.Hits+1, after.Hits, "question %d", i)
					require.Greater(t, after.ReusedIDs-before.ReusedIDs, uint64(docIDs*3/4), "question %d reuses the document", i)
				}
			}
		})
	}
}

package tokenizer

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/cespare/xxhash/v2"
	"github.com/stretchr/testify/require"
)

// byteLevelEncode is GPT-2's byte-to-rune alphabet (the inverse of
// byteLevelDecode), used to build synthetic vocabularies.
func byteLevelEncode(s string) string {
	inv := make(map[byte]rune, 256)
	for r, b := range byteLevelDecode {
		inv[b] = r
	}
	var sb strings.Builder
	for i := 0; i < len(s); i++ {
		sb.WriteRune(inv[s[i]])
	}
	return sb.String()
}

// syntheticJSON is a small byte-level BPE tokenizer.json: the 256 bytes,
// merges h+e, l+l, he+ll, hell+o, Ġ+w, and added tokens <|a|>, <|ab|>.
func syntheticJSON(t testing.TB, mutate func(m map[string]any)) []byte {
	vocab := map[string]int{}
	for b := 0; b < 256; b++ {
		vocab[byteLevelEncode(string([]byte{byte(b)}))] = b
	}
	merges := [][2]string{{"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}, {"Ġ", "w"}}
	for _, m := range merges {
		vocab[m[0]+m[1]] = len(vocab)
	}
	m := map[string]any{
		"added_tokens": []map[string]any{
			{"id": 300, "content": "<|a|>", "special": true},
			{"id": 301, "content": "<|ab|>", "special": true},
		},
		"normalizer": nil,
		"pre_tokenizer": map[string]any{"type": "Sequence", "pretokenizers": []map[string]any{
			{"type": "Split", "pattern": map[string]string{"Regex": patQwen}, "behavior": "Isolated", "invert": false},
			{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false},
		}},
		"model": map[string]any{"type": "BPE", "vocab": vocab, "merges": merges},
	}
	if mutate != nil {
		mutate(m)
	}
	b, err := json.Marshal(m)
	require.NoError(t, err)
	return b
}

func synthetic(t testing.TB) *HF {
	tok, err := Parse("synthetic", syntheticJSON(t, nil), []byte(`{"bos_token":{"content":"<|a|>"},"eos_token":"<|ab|>","chat_template":"{{ bos_token }}x"}`))
	require.NoError(t, err)
	return tok
}

func TestSyntheticEncode(t *testing.T) {
	tok := synthetic(t)
	he, ll, hell, hello, gw := uint32(256), uint32(257), uint32(258), uint32(259), uint32(260)
	tests := []struct {
		in   string
		want []uint32
	}{
		{"", nil},
		{"hello", []uint32{hello}},
		{"hell", []uint32{hell}},
		{"helo", []uint32{he, 'l', 'o'}},
		{"llhe", []uint32{ll, he}},
		{" w", []uint32{gw}},
		{"<|ab|>hello<|a|>", []uint32{301, hello, 300}},
		{"<|a", []uint32{'<', '|', 'a'}},
		{"hello world", []uint32{hello, gw, 'o', 'r', 'l', 'd'}},
	}
	for _, tc := range tests {
		require.Equal(t, tc.want, tok.Encode(nil, tc.in), "%q", tc.in)
	}
	withSpecial, err := tok.EncodeWithSpecialTokens(nil, "hello")
	require.NoError(t, err)
	require.Equal(t, tok.Encode(nil, "hello"), withSpecial) // no post-processor: nothing added
	roberta, err := Parse("x", syntheticJSON(t, func(m map[string]any) { m["post_processor"] = map[string]any{"type": "RobertaProcessing"} }), nil)
	require.NoError(t, err)
	_, err = roberta.EncodeWithSpecialTokens(nil, "hello")
	require.ErrorContains(t, err, "RobertaProcessing")
	require.Equal(t, "<|a|>", tok.BOSToken())
	require.Equal(t, "<|ab|>", tok.EOSToken())
	id, ok := tok.AddedTokenID("<|ab|>")
	require.True(t, ok)
	require.Equal(t, uint32(301), id)
	ct, err := tok.NewChatTemplate()
	require.NoError(t, err)
	out, err := ct.Render(ChatInput{})
	require.NoError(t, err)
	require.Equal(t, "<|a|>x", out)
}

func TestParseErrors(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(m map[string]any)
		config string
	}{
		{"model type", func(m map[string]any) { m["model"].(map[string]any)["type"] = "WordPiece" }, ""},
		{"byte fallback", func(m map[string]any) { m["model"].(map[string]any)["byte_fallback"] = true }, ""},
		{"normalizer", func(m map[string]any) { m["normalizer"] = map[string]any{"type": "Lowercase"} }, ""},
		{"pattern", func(m map[string]any) {
			m["pre_tokenizer"].(map[string]any)["pretokenizers"].([]map[string]any)[0]["pattern"] = map[string]string{"Regex": `\w+`}
		}, ""},
		{"no byte level", func(m map[string]any) { m["pre_tokenizer"] = map[string]any{"type": "Whitespace"} }, ""},
		{"merge of unknown token", func(m map[string]any) { m["model"].(map[string]any)["merges"] = []string{"q zz"} }, ""},
		{"lstrip", func(m map[string]any) {
			m["added_tokens"] = []map[string]any{{"id": 300, "content": "<x>", "lstrip": true}}
		}, ""},
		{"bad config", nil, `{"chat_template": 5}`},
		{"vocab too large for the pair table", func(m map[string]any) {
			m["model"].(map[string]any)["vocab"].(map[string]int)["zz"] = maxPairID
		}, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse("x", syntheticJSON(t, tc.mutate), []byte(tc.config))
			require.Error(t, err)
		})
	}
	_, err := Parse("x", []byte(`{`), nil)
	require.Error(t, err)
}

func TestLoad(t *testing.T) {
	_, err := Load("x", t.TempDir())
	require.ErrorContains(t, err, "tokenizer.json")
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "tokenizer.json"), syntheticJSON(t, nil), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "chat_template.jinja"), []byte("T"), 0o644))
	tok, err := Load("x", dir)
	require.NoError(t, err)
	require.Equal(t, "T", tok.ChatTemplate())
	require.Equal(t, "x", tok.Name())
}

// FuzzEncode checks on arbitrary input that every pre-tokenizer splits
// losslessly, that encoding never panics, and that the prefix cache always
// returns what plain encoding returns (caching a prefix at every cut).
func FuzzEncode(f *testing.F) {
	for _, s := range []string{"hello world", "<|a|>x<|ab|>  \n\n y", "I'M 東京 😀 123456", "\xff\xfe<|a", "A\u0301B ǅ 'ſ", "   \r\n\t x"} {
		f.Add(s)
	}
	tok := synthetic(f)
	pc := NewPrefixCache(tok, PrefixCacheConfig{MaxEntries: 64, CutEvery: 1})
	f.Fuzz(func(t *testing.T, s string) {
		for _, k := range []splitKind{splitQwen, splitLlama3, splitO200k, splitDeepSeek} {
			var sb strings.Builder
			k.preTokenize(s, func(w string) {
				require.NotEmpty(t, w)
				sb.WriteString(w)
			})
			require.Equal(t, s, sb.String(), "kind %d", k)
		}
		want := tok.Encode(nil, s)
		if utf8.ValidString(s) {
			require.Equal(t, want, pc.Encode(nil, s))
			require.Equal(t, want, pc.Encode(nil, s)) // now cached
			more := s + "<|a|>hello"
			require.Equal(t, tok.Encode(nil, more), pc.Encode(nil, more))
		}
	})
}

// TestIgnoreMergesWholeWords checks ignore_merges on the vocab's own
// tokens, as words: every token encodes as itself, whether BPE builds it
// (one in eight, checked) or it is kept for wholeWord (all of them,
// checked, and each passes the filter).
func TestIgnoreMergesWholeWords(t *testing.T) {
	n := 0
	for _, fam := range vsHFFamilies {
		tok := loadFamily(t, fam)
		if !tok.ignoreMerges {
			continue
		}
		n++
		fresh := *tok
		fresh.cache = newWordCache()
		kept := 0
		tok.vocabTab.each(func(b []byte, id uint32) {
			w := string(b)
			kept++
			require.True(t, tok.vocabFilter.mayHave(xxhash.Sum64String(w)), "%s: %q", fam, w)
			require.Equal(t, []uint32{id}, fresh.encodeWord(nil, w), "%s: %q", fam, w)
		})
		raw, err := os.ReadFile(filepath.Join(modelDir(fam), "tokenizer.json"))
		require.NoError(t, err)
		var f struct {
			Model struct {
				Vocab map[string]uint32 `json:"vocab"`
			} `json:"model"`
		}
		require.NoError(t, json.Unmarshal(raw, &f))
		i := 0
		for s, id := range f.Model.Vocab {
			w, ok := fromByteLevel(s)
			require.True(t, ok, "%s: %q", fam, s)
			if i++; i%8 != 0 {
				continue
			}
			require.Equal(t, []uint32{id}, fresh.encodeWord(nil, w), "%s: %q", fam, w)
		}
		require.Greater(t, i, 100_000)
		t.Logf("%s: %d of %d tokens kept for ignore_merges", fam, kept, i)
	}
	require.Equal(t, 2, n, "families with ignore_merges: llama3_1, gptoss")
}

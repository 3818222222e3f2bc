package tokenizer

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// deepSeekNested is DeepSeek V3's pre-tokenizer as tokenizer.json
// writes it, three Isolated splits in sequence: the reference
// deepSeekSplit is checked against.
func deepSeekNested(s string, emit func(string)) {
	digits := func(s string, i int) int {
		if c, _ := at(s, i); c&cN != 0 {
			return run(s, i, cN, 3)
		}
		return -1
	}
	cjk := func(s string, i int) int {
		j := i
		for j < len(s) {
			r, w := decodeRune(s, j)
			if !isDeepSeekCJK(r) {
				break
			}
			j += w
		}
		if j == i {
			return -1
		}
		return j
	}
	splitIsolated(s, digits, func(p string) {
		splitIsolated(p, cjk, func(q string) {
			splitIsolated(q, matchDeepSeekMain, emit)
		})
	})
}

func words(split func(string, func(string)), s string) []string {
	var out []string
	split(s, func(w string) { out = append(out, w) })
	return out
}

// TestDeepSeekSplit checks the one-pass split on cases of each cut, and
// against the nested splits on every golden text.
func TestDeepSeekSplit(t *testing.T) {
	initClasses()
	for _, tc := range []struct {
		in   string
		want []string
	}{
		{"", nil},
		{"1234567", []string{"123", "456", "7"}},
		{"abc12中文x", []string{"abc", "12", "中文", "x"}},
		{"中・文 ゛か", []string{"中", "・", "文", " ", "゛", "か"}},
		{" 東京123ab", []string{" ", "東京", "123", "ab"}},
		{"٣٣٨٢ ab", []string{"٣٣٨", "٢", " ab"}},
		{"\xff1\xfe中", []string{"\xff", "1", "\xfe", "中"}},
		{"(hello) world!\n\n", []string{"(hello", ")", " world", "!\n\n"}},
	} {
		require.Equal(t, tc.want, words(deepSeekSplit, tc.in), "%q", tc.in)
		require.Equal(t, words(deepSeekNested, tc.in), words(deepSeekSplit, tc.in), "%q", tc.in)
	}
	for _, file := range []string{"deepseek_v3.text.jsonl", "deepseek_v3.corpus.jsonl"} {
		for _, v := range readJSONL[textVector](t, "testdata/golden/"+file) {
			require.Equal(t, words(deepSeekNested, v.Text), words(deepSeekSplit, v.Text), "%.80q", v.Text)
		}
	}
}

// FuzzSplitDeepSeek compares the one-pass split with the nested splits
// on arbitrary bytes.
func FuzzSplitDeepSeek(f *testing.F) {
	for _, s := range []string{"abc123中文", "٣٣٨٢ 1", "ゝゞ・゠ー12", "\xff\xe4\xb8", strings.Repeat("9", 10)} {
		f.Add(s)
	}
	initClasses()
	f.Fuzz(func(t *testing.T, s string) {
		require.Equal(t, words(deepSeekNested, s), words(deepSeekSplit, s), "%q", s)
	})
}

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

// o200kWordRef and matchO200kRef are the o200k pattern's word
// alternatives matched one by one: the reference o200kWords and
// matchO200k are checked against.
// o200kWordRef matches U* L+ (upperFirst=false) or U+ L* (upperFirst=true) from
// j, then an optional contraction.
func o200kWordRef(s string, j int, upperFirst bool) int {
	if !upperFirst {
		// U* greedy, then L+ with backtracking: the match ends after the
		// last L rune that a backed-off U* can leave to L+.
		u := j
		lastL := -1 // end of the last rune within the U run that is also L
		for u < len(s) {
			c, w := at(s, u)
			if c&cUpper == 0 {
				break
			}
			if c&cLower != 0 {
				lastL = u + w
			}
			u += w
		}
		var end int
		if u < len(s) {
			if c, _ := at(s, u); c&cLower != 0 {
				end = run(s, u, cLower, 0)
			} else if lastL >= 0 {
				end = lastL
			} else {
				return -1
			}
		} else if lastL >= 0 {
			end = lastL
		} else {
			return -1
		}
		if e := contraction(s, end); e >= 0 {
			return e
		}
		return end
	}
	u := run(s, j, cUpper, 0)
	if u == j {
		return -1
	}
	end := run(s, u, cLower, 0)
	if e := contraction(s, end); e >= 0 {
		return e
	}
	return end
}

func matchO200kRef(s string, i int) int {
	c, w := at(s, i)
	prefix := c&(cCRLF|cL|cN) == 0 && i+w < len(s)
	for _, upperFirst := range [2]bool{false, true} {
		if prefix {
			if e := o200kWordRef(s, i+w, upperFirst); e >= 0 {
				return e
			}
		}
		if e := o200kWordRef(s, i, upperFirst); e >= 0 {
			return e
		}
	}
	if c&cN != 0 {
		return run(s, i, cN, 3)
	}
	if e := punctAlt(s, i, notSpaceLetterNumber, true); e >= 0 {
		return e
	}
	return spaceAlts(s, i)
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

// TestO200kWords checks the o200k matcher against the alternatives
// matched one by one at every position of every gpt-oss golden text and
// on cases of each alternative.
func TestO200kWords(t *testing.T) {
	initClasses()
	texts := []string{"Hello", " HELLO", "ǅungla", "HELLOworld's", "a\u0301B", " \u0301\u0301", "ΛΑΡΚ̕ΥΧ", ".ʰʰa", "'s", "Ab'LL", "x\n"}
	for _, file := range []string{"gptoss.text.jsonl", "gptoss.corpus.jsonl"} {
		for _, v := range readJSONL[textVector](t, "testdata/golden/"+file) {
			texts = append(texts, v.Text)
		}
	}
	for _, s := range texts {
		for i := 0; i < len(s); i++ {
			require.Equal(t, matchO200kRef(s, i), matchO200k(s, i), "%.80q at %d", s, i)
		}
	}
}

// FuzzO200kWords compares the o200k matcher with the alternatives
// matched one by one at every position of arbitrary bytes.
func FuzzO200kWords(f *testing.F) {
	for _, s := range []string{"Hello WORLD's", "ǅ\u0301ab", "ʰʰ'LL", "\xff\xc5\xbf"} {
		f.Add(s)
	}
	initClasses()
	f.Fuzz(func(t *testing.T, s string) {
		for i := 0; i < len(s); i++ {
			require.Equal(t, matchO200kRef(s, i), matchO200k(s, i), "%q at %d", s, i)
		}
	})
}

package tokenizer

import (
	"math/rand/v2"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
	"golang.org/x/text/unicode/norm"
)

// TestNFCInert checks every character nfcInert accepts: it is in NFC
// alone, of combining class 0, and combines with nothing before it (NFC
// composes a character only with a later one that does), so any string of
// them is in NFC.
func TestNFCInert(t *testing.T) {
	n := 0
	for r := rune(0); r <= utf8.MaxRune; r++ {
		if !utf8.ValidRune(r) || !inertRune(r) {
			continue
		}
		n++
		s := string(r)
		p := norm.NFC.PropertiesString(s)
		require.True(t, norm.NFC.IsNormalString(s), "%U", r)
		require.Zero(t, p.CCC(), "%U", r)
		require.True(t, p.BoundaryBefore(), "%U", r)
	}
	require.Greater(t, n, 100_000)
	tests := []struct {
		s     string
		inert bool
	}{
		{"", true},
		{"plain ASCII, café", true},
		{"中文文档，全角：ＡＢＣ", true},
		{"e\u0301", false}, // a combining mark
		{"か\u3099", false}, // kana and its combining voicing mark
		{"\ufa10", false},  // a CJK compatibility ideograph (decomposes)
		{"\xff", false},    // invalid UTF-8
		{"한국어", true},
		{"가\u11a8", false}, // a syllable and a conjoining jamo, which compose
		{"\u302a", false},  // an ideographic tone mark
	}
	for _, tc := range tests {
		require.Equal(t, tc.inert, nfcInert(tc.s), "%q", tc.s)
		if tc.inert {
			require.True(t, norm.NFC.IsNormalString(tc.s), "%q", tc.s)
		}
	}
}

// FuzzToNFC checks toNFC against the normalizer on arbitrary bytes,
// invalid UTF-8 included: it must normalize exactly as norm.NFC.String.
func FuzzToNFC(f *testing.F) {
	for _, s := range []string{"", "plain", "e\u0301 café", "か\u3099ひ", "가\u11a8", "\ufa10\u302a", "\xffe\u0301\xc3", "ṍͪ あ̋ τ̖ Α\u0313\u0301", "a\u0327\u0301\u0323", "\u0301leading"} {
		f.Add(s)
	}
	initClasses()
	f.Fuzz(func(t *testing.T, s string) {
		require.Equal(t, norm.NFC.String(s), toNFC(s), "%q", s)
	})
}

// TestToNFC is FuzzToNFC on the mixed-script corpus document, which is
// not in NFC, and on random strings of the characters around it.
func TestToNFC(t *testing.T) {
	initClasses()
	doc := goldenCorpus(t, "qwen3")["mixedscript"].Text
	require.False(t, norm.NFC.IsNormalString(doc))
	require.Equal(t, norm.NFC.String(doc), toNFC(doc))
	runes := []rune(doc)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 20_000; i++ {
		b := make([]rune, 1+rng.IntN(12))
		for k := range b {
			if rng.IntN(4) == 0 {
				b[k] = rune(0x300 + rng.IntN(0x70)) // combining diacritics
			} else {
				b[k] = runes[rng.IntN(len(runes))]
			}
		}
		s := string(b)
		require.Equal(t, norm.NFC.String(s), toNFC(s), "%q", s)
	}
}

package tokenizer

import (
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
	require.Greater(t, n, 20_000)
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

package tokenizer

import (
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// A character is NFC-inert when it is in NFC alone, of combining class 0,
// and combines with nothing before it (norm's BoundaryBefore): NFC starts
// a new segment at it whatever precedes, so a string cut before it
// normalizes as its two parts do, and a string of inert characters is in
// NFC. Most text is made of them (ASCII, Latin-1, Greek, Cyrillic, CJK,
// kana but its voicing marks, Hangul syllables); the class tables hold the
// bit (cNFC) so the check is one lookup a character, where the
// normalizer's quick check walks its trie. TestNFCInert checks the bit
// of every character against the normalizer's properties; FuzzToNFC
// checks toNFC against the normalizer on arbitrary bytes.

// inertRune reports whether r is NFC-inert, computed from the normalizer.
func inertRune(r rune) bool {
	if !utf8.ValidRune(r) {
		return false
	}
	var buf [utf8.UTFMax]byte
	s := buf[:utf8.EncodeRune(buf[:], r)]
	p := norm.NFC.Properties(s)
	return p.CCC() == 0 && p.BoundaryBefore() && norm.NFC.IsNormal(s)
}

// invalidAt reports whether the character at s[i:i+w] is an invalid
// byte (at reads one as a character of width 1 and no class).
func invalidAt(s string, i, w int) bool { return w == 1 && s[i] >= utf8.RuneSelf }

// nfcInert reports whether s is made only of NFC-inert characters.
func nfcInert(s string) bool {
	for i := 0; i < len(s); {
		c, w := at(s, i)
		if c&cNFC == 0 {
			return false
		}
		i += w
	}
	return true
}

// toNFC returns s in NFC. Only the stretches of characters that are not
// inert, with the inert character before them (which they may combine
// with), go through the normalizer; s is returned as is when all of them
// are already in NFC.
func toNFC(s string) string {
	var out []byte
	done := 0      // s[:done] is in out, when out is not nil
	lastInert := 0 // start of the last inert character before i
	for i := 0; i < len(s); {
		c, w := at(s, i)
		if c&cNFC != 0 {
			lastInert = i
			i += w
			continue
		}
		bad := invalidAt(s, i, w)
		j := i + w
		for j < len(s) {
			c, w := at(s, j)
			if c&cNFC != 0 {
				break
			}
			bad = bad || invalidAt(s, j, w)
			j += w
		}
		if bad {
			// The normalizer reads an invalid byte by what follows it (a
			// lead byte near the end of its input is a rune cut short, not
			// one bad byte), so the rest of s goes through it whole, from
			// the inert character before (FuzzToNFC).
			out = append(out, s[done:lastInert]...)
			return string(norm.NFC.AppendString(out, s[lastInert:]))
		}
		if region := s[lastInert:j]; !norm.NFC.IsNormalString(region) {
			if out == nil {
				out = make([]byte, 0, len(s)+len(s)/8)
			}
			out = append(out, s[done:lastInert]...)
			out = norm.NFC.AppendString(out, region)
			done = j
		}
		i = j
	}
	if out == nil {
		return s
	}
	return string(append(out, s[done:]...))
}

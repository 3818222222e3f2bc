package tokenizer

import "unicode/utf8"

// nfcInert reports whether s is made only of characters that are NFC
// whatever surrounds them: code points below U+0300 (no combining mark) and
// the blocks of CJK, kana (but its two combining voicing marks), CJK
// punctuation (but its six combining tone marks), Hangul syllables and
// full-width forms. Such
// a string is in NFC, and checking this is cheaper than the normalizer's
// per-character lookups (most of a Chinese document's cost in Qwen3, which
// normalizes to NFC). TestNFCInert checks every such character against the
// normalizer's own properties.
func nfcInert(s string) bool {
	for i := 0; i < len(s); {
		if s[i] < utf8.RuneSelf {
			i++
			continue
		}
		r, n := utf8.DecodeRuneInString(s[i:])
		if !inertRune(r) {
			return false
		}
		i += n
	}
	return true
}

func inertRune(r rune) bool {
	switch {
	case r < 0x300:
		return r != utf8.RuneError
	case r >= 0x4E00 && r <= 0x9FFF, r >= 0x3400 && r <= 0x4DBF: // CJK unified, extension A
		return true
	case r >= 0x3000 && r <= 0x3029, r >= 0x3030 && r <= 0x303F: // CJK symbols and punctuation
		return true
	case r >= 0x3041 && r <= 0x3096, r >= 0x309B && r <= 0x30FF: // kana
		return true
	case r >= 0xFF01 && r <= 0xFF9D, r >= 0xFFA0 && r <= 0xFFEF: // full- and half-width forms
		return true
	case r >= 0xAC00 && r <= 0xD7A3: // Hangul syllables (only a conjoining jamo, not inert, joins one)
		return true
	}
	return false
}

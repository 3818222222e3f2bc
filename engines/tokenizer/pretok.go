package tokenizer

import (
	"sync"
	"unicode"
	"unicode/utf8"
)

// The split regexes of the supported families use lookahead (\s+(?!\S)) and
// backtracking that Go's regexp cannot express, so each is written out by
// hand below. Every matcher returns the end of the match that the reference
// (Oniguruma, leftmost-first alternation) finds at position i, or -1.

// splitKind names a hand-written pre-tokenizer.
type splitKind uint8

const (
	splitQwen     splitKind = iota + 1 // cl100k-style, single digits (Qwen2.5/Qwen3)
	splitLlama3                        // cl100k-style, digits in groups of 1-3 (Llama 3.x)
	splitO200k                         // o200k (GPT-OSS)
	splitDeepSeek                      // DeepSeek V3: digits, CJK runs, then its main regex
)

// Split patterns exactly as they appear in tokenizer.json.
const (
	patQwen   = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	patLlama3 = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	patO200k  = `[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	// DeepSeek V3 splits three times in sequence.
	patDSDigits = `\p{N}{1,3}`
	patDSCJK    = "[一-龥぀-ゟ゠-ヿ]+"
	patDSMain   = "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"
)

// Rune class bits, precomputed for ASCII and computed for the rest.
const (
	cL     uint16 = 1 << iota // \p{L}
	cN                        // \p{N}
	cS                        // \s (White_Space)
	cCRLF                     // \r or \n
	cM                        // \p{M}
	cP                        // \p{P}
	cSym                      // \p{S}
	cUpper                    // [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]
	cLower                    // [\p{Ll}\p{Lm}\p{Lo}\p{M}]
	cNFC                      // NFC-inert (nfc.go)
)

var asciiClass = func() (t [128]uint16) {
	for r := rune(0); r < 128; r++ {
		t[r] = slowClass(r)
	}
	return t
}()

// bmpClass caches the classes of planes 0-2 (BMP, emoji, CJK extensions);
// built on first load (a few milliseconds) rather than at package init.
const tableRunes = 0x30000

var (
	bmpOnce  sync.Once
	bmpClass *[tableRunes]uint16
)

func initClasses() {
	bmpOnce.Do(func() {
		t := new([tableRunes]uint16)
		for r := rune(0); r < tableRunes; r++ {
			t[r] = slowClass(r)
		}
		bmpClass = t
	})
}

func slowClass(r rune) uint16 {
	var c uint16
	if unicode.IsLetter(r) {
		c |= cL
	}
	if unicode.IsNumber(r) {
		c |= cN
	}
	if unicode.IsSpace(r) {
		c |= cS
	}
	if r == '\r' || r == '\n' {
		c |= cCRLF
	}
	if unicode.IsMark(r) {
		c |= cM
	}
	if unicode.IsPunct(r) {
		c |= cP
	}
	if unicode.IsSymbol(r) {
		c |= cSym
	}
	if unicode.In(r, unicode.Lu, unicode.Lt, unicode.Lm, unicode.Lo, unicode.M) {
		c |= cUpper
	}
	if unicode.In(r, unicode.Ll, unicode.Lm, unicode.Lo, unicode.M) {
		c |= cLower
	}
	if inertRune(r) {
		c |= cNFC
	}
	return c
}

// at decodes the rune at byte offset i and returns its class and width.
// Invalid UTF-8 decodes as one byte of no class (it never reaches the
// reference, which only takes valid strings).
func at(s string, i int) (uint16, int) {
	b := s[i]
	if b < utf8.RuneSelf {
		return asciiClass[b], 1
	}
	r, w := decodeRune(s, i)
	if r == utf8.RuneError && w == 1 {
		return 0, 1
	}
	if r < tableRunes && bmpClass != nil {
		return bmpClass[r], w
	}
	return slowClass(r), w
}

// decodeRune is utf8.DecodeRuneInString(s[i:]), with the two- and
// three-byte forms (every script but emoji and the rarest CJK) decoded
// inline; FuzzDecodeRune compares the two on arbitrary bytes.
func decodeRune(s string, i int) (rune, int) {
	b := s[i]
	switch {
	case b < utf8.RuneSelf:
		return rune(b), 1
	case b >= 0xC2 && b < 0xE0 && i+1 < len(s):
		if c := s[i+1]; c&0xC0 == 0x80 {
			return rune(b&0x1F)<<6 | rune(c&0x3F), 2
		}
	case b >= 0xE0 && b < 0xF0 && i+2 < len(s):
		c1, c2 := s[i+1], s[i+2]
		if c1&0xC0 == 0x80 && c2&0xC0 == 0x80 {
			r := rune(b&0x0F)<<12 | rune(c1&0x3F)<<6 | rune(c2&0x3F)
			if r >= 0x800 && (r < 0xD800 || r > 0xDFFF) {
				return r, 3
			}
		}
	}
	return utf8.DecodeRuneInString(s[i:])
}

// contraction matches (?i:'s|'t|'re|'ve|'m|'ll|'d) at i.
func contraction(s string, i int) int {
	if i >= len(s) || s[i] != '\'' {
		return -1
	}
	j := i + 1
	if j >= len(s) {
		return -1
	}
	switch s[j] | 0x20 {
	case 's', 't', 'm', 'd':
		return j + 1
	case 'r', 'v':
		if j+1 < len(s) && s[j+1]|0x20 == 'e' {
			return j + 2
		}
	case 'l':
		if j+1 < len(s) && s[j+1]|0x20 == 'l' {
			return j + 2
		}
	}
	// Unicode case folding: U+017F (long s) folds to 's'.
	if j+1 < len(s) && s[j] == 0xC5 && s[j+1] == 0xBF {
		return j + 2
	}
	return -1
}

// run returns the end of the longest run from i of runes having any bit of
// want, never past limit runes when limit > 0.
func run(s string, i int, want uint16, limit int) int {
	n := 0
	for i < len(s) && (limit <= 0 || n < limit) {
		c, w := at(s, i)
		if c&want == 0 {
			break
		}
		i += w
		n++
	}
	return i
}

// spaceAlts matches \s*[\r\n]+|\s+(?!\S)|\s+ at i.
func spaceAlts(s string, i int) int {
	lastNL := -1
	j := i
	lastStart := i
	for j < len(s) {
		c, w := at(s, j)
		if c&cS == 0 {
			break
		}
		if c&cCRLF != 0 {
			lastNL = j + w
		}
		lastStart = j
		j += w
	}
	if j == i {
		return -1
	}
	if lastNL >= 0 {
		return lastNL
	}
	if j == len(s) {
		return j
	}
	if lastStart > i {
		return lastStart // leave the last space to the following word
	}
	return j
}

// punctAlt matches ` ?X+[\r\n]*` (with tailSlash, ` ?X+[\r\n/]*`), where X
// is a rune of the class accepted by isX.
func punctAlt(s string, i int, isX func(uint16) bool, tailSlash bool) int {
	j := i
	if s[j] == ' ' && j+1 < len(s) {
		if c, _ := at(s, j+1); isX(c) {
			j++
		}
	}
	k := j
	for k < len(s) {
		c, w := at(s, k)
		if !isX(c) {
			break
		}
		k += w
	}
	if k == j {
		return -1
	}
	for k < len(s) && (s[k] == '\r' || s[k] == '\n' || (tailSlash && s[k] == '/')) {
		k++
	}
	return k
}

func notSpaceLetterNumber(c uint16) bool { return c&(cS|cL|cN) == 0 }

func punctOrSymbol(c uint16) bool { return c&(cP|cSym) != 0 }

// matchCL100k is the Qwen / Llama 3 pattern; digitGroup is 1 or 3.
func matchCL100k(s string, i int, digitGroup int) int {
	if e := contraction(s, i); e >= 0 {
		return e
	}
	c, w := at(s, i)
	// [^\r\n\p{L}\p{N}]?\p{L}+
	if c&cL != 0 {
		return run(s, i, cL, 0)
	}
	if c&(cCRLF|cL|cN) == 0 && i+w < len(s) {
		if c2, _ := at(s, i+w); c2&cL != 0 {
			return run(s, i+w, cL, 0)
		}
	}
	if c&cN != 0 {
		return run(s, i, cN, digitGroup)
	}
	if e := punctAlt(s, i, notSpaceLetterNumber, false); e >= 0 {
		return e
	}
	return spaceAlts(s, i)
}

// o200kWords matches from j both word alternatives of the o200k pattern,
// U*L+ and U+L* (U and L its two letter classes, which share Lm, Lo and
// M), each with an optional contraction after it, in one scan of the U
// run; -1 for one that does not match. TestO200kWords and FuzzO200kWords
// compare it with the two alternatives matched one by one.
func o200kWords(s string, j int) (int, int) {
	// U* greedy, then L+ with backtracking: the first alternative ends
	// after the L run that follows the U run, or else after the last L
	// rune that a backed-off U* can leave to L+.
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
	low := run(s, u, cLower, 0)
	e1, e2 := -1, -1
	switch {
	case low > u:
		e1 = low
	case lastL >= 0:
		e1 = lastL
	}
	if u > j {
		e2 = low
	}
	return withContraction(s, e1), withContraction(s, e2)
}

// withContraction extends a match ending at e by a contraction there.
func withContraction(s string, e int) int {
	if e < 0 {
		return e
	}
	if c := contraction(s, e); c >= 0 {
		return c
	}
	return e
}

// matchO200k tries the alternatives in the pattern's order: the first
// word alternative with its optional prefix character, then without it,
// then the second the same way.
func matchO200k(s string, i int) int {
	c, w := at(s, i)
	if c&(cCRLF|cL|cN) == 0 && i+w < len(s) {
		p1, p2 := o200kWords(s, i+w)
		if p1 >= 0 {
			return p1
		}
		e1, e2 := o200kWords(s, i)
		switch {
		case e1 >= 0:
			return e1
		case p2 >= 0:
			return p2
		case e2 >= 0:
			return e2
		}
	} else {
		e1, e2 := o200kWords(s, i)
		if e1 >= 0 {
			return e1
		}
		if e2 >= 0 {
			return e2
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

func isASCIIPunct(b byte) bool {
	switch {
	case b >= '!' && b <= '/', b >= ':' && b <= '@', b >= '[' && b <= '`', b >= '{' && b <= '~':
		return true
	}
	return false
}

func isASCIILetter(b byte) bool { return (b|0x20) >= 'a' && (b|0x20) <= 'z' }

func matchDeepSeekMain(s string, i int) int {
	// [ASCII punct][A-Za-z]+
	if isASCIIPunct(s[i]) && i+1 < len(s) && isASCIILetter(s[i+1]) {
		j := i + 1
		for j < len(s) && isASCIILetter(s[j]) {
			j++
		}
		return j
	}
	// [^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+
	c, w := at(s, i)
	if c&(cCRLF|cL|cP|cSym) == 0 && i+w < len(s) {
		if c2, _ := at(s, i+w); c2&(cL|cM) != 0 {
			return run(s, i+w, cL|cM, 0)
		}
	}
	if c&(cL|cM) != 0 {
		return run(s, i, cL|cM, 0)
	}
	if e := punctAlt(s, i, punctOrSymbol, false); e >= 0 {
		return e
	}
	return spaceAlts(s, i)
}

func isDeepSeekCJK(r rune) bool {
	return (r >= 0x4E00 && r <= 0x9FA5) || (r >= 0x3040 && r <= 0x309F) || (r >= 0x30A0 && r <= 0x30FF)
}

// runeAt is at with the rune decoded: the rune at byte offset i, its
// class and width (invalid UTF-8: utf8.RuneError, no class, one byte).
func runeAt(s string, i int) (rune, uint16, int) {
	b := s[i]
	if b < utf8.RuneSelf {
		return rune(b), asciiClass[b], 1
	}
	r, w := decodeRune(s, i)
	if r == utf8.RuneError && w == 1 {
		return r, 0, 1
	}
	if r < tableRunes && bmpClass != nil {
		return r, bmpClass[r], w
	}
	return r, slowClass(r), w
}

// deepSeekSplit is DeepSeek V3's three splits, \p{N}{1,3}, then CJK
// runs, then its main regex, each Isolated, in one pass over s: the first
// two only cut around digit groups and CJK runs, so the main regex sees
// the stretches between those and each CJK run, and a digit group, where
// it matches nothing, is a word. FuzzSplitDeepSeek compares it with the
// three splits in sequence.
func deepSeekSplit(s string, emit func(string)) {
	gap := 0 // start of the stretch of neither digits nor CJK
	for i := 0; i < len(s); {
		r, c, w := runeAt(s, i)
		switch {
		case c&cN != 0:
			if gap < i {
				splitIsolated(s[gap:i], matchDeepSeekMain, emit)
			}
			j := i + w
			for n := 1; n < 3 && j < len(s); n++ {
				_, c, w := runeAt(s, j)
				if c&cN == 0 {
					break
				}
				j += w
			}
			emit(s[i:j])
			i, gap = j, j
		case isDeepSeekCJK(r):
			if gap < i {
				splitIsolated(s[gap:i], matchDeepSeekMain, emit)
			}
			j := i + w
			for j < len(s) {
				r, w := decodeRune(s, j)
				if !isDeepSeekCJK(r) {
					break
				}
				j += w
			}
			splitIsolated(s[i:j], matchDeepSeekMain, emit)
			i, gap = j, j
		default:
			i += w
		}
	}
	if gap < len(s) {
		splitIsolated(s[gap:], matchDeepSeekMain, emit)
	}
}

// splitIsolated calls emit for every match of m in s and for every gap
// between matches, in order (the Split pre-tokenizer's Isolated behavior).
func splitIsolated(s string, m func(string, int) int, emit func(string)) {
	gap := 0
	i := 0
	for i < len(s) {
		e := m(s, i)
		if e <= i {
			_, w := at(s, i)
			i += w
			continue
		}
		if gap < i {
			emit(s[gap:i])
		}
		emit(s[i:e])
		i, gap = e, e
	}
	if gap < len(s) {
		emit(s[gap:])
	}
}

// preTokenize splits s into words with the family's pre-tokenizer.
func (k splitKind) preTokenize(s string, emit func(string)) {
	switch k {
	case splitQwen:
		splitIsolated(s, func(s string, i int) int { return matchCL100k(s, i, 1) }, emit)
	case splitLlama3:
		splitIsolated(s, func(s string, i int) int { return matchCL100k(s, i, 3) }, emit)
	case splitO200k:
		splitIsolated(s, matchO200k, emit)
	case splitDeepSeek:
		deepSeekSplit(s, emit)
	}
}

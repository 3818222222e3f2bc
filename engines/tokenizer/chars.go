package tokenizer

import (
	"math"
	"unicode/utf8"
)

// Byte-level BPE starts a word from its bytes: a CJK character is three
// symbols and two merges before it meets its neighbours. Most characters
// always end as the same tokens whatever surrounds them, so a word can
// start from each character's own tokens instead, which skips those merges.
//
// Starting a character from its own tokens gives exactly the ids of
// starting it from its bytes when no merge across a character boundary can
// take a part of it (a token holding some but not all of its bytes) before
// its own merges finish. While a character c is unfinished one of its own
// merges is always available, of rank at most maxRank(c), the highest rank
// its own merges use, and BPE always applies the lowest-ranked available
// merge. So a boundary merge involving one of c's parts can only run first
// if its rank is below maxRank(c), or if the part survives c's own merges.
// A character starts from its tokens when every part touching one of its
// edges (a part holding its first byte, with a merge that has it on the
// right; a part holding its last byte, with a merge that has it on the left
// of a token starting a character) has no such merge; when the only such
// merge is with the token " " on the left (common: " " joins the lead byte
// of many scripts), it starts from its tokens except after a space byte.
// Merges between whole characters are then the same from either start and
// merges inside different characters touch different symbols, so each
// character of a word is started either way on its own.
// TestCharStartMatchesBytes and FuzzCharStart keep the two starts equal.

// charTok entries: a token id; charMulti|offset<<3|count for a character
// of several tokens (in charMultiIDs); charFromBytes. charAfterSpace marks
// a character that must start from bytes after a space byte: the only merge
// that can take its first part early is with the token " ".
const (
	charFromBytes  uint32 = math.MaxUint32
	charMulti      uint32 = 1 << 31
	charAfterSpace uint32 = 1 << 30
	charIDMask            = charAfterSpace - 1
)

// charThreats are, per token, the lowest rank of a merge that has it on
// the right (with any token but " ", and with " "), and of one that has it
// on the left before a token that starts a character.
type charThreats struct {
	right, rightSpace, left []uint32
}

// buildCharStart fills charTok for every non-ASCII rune below tableRunes.
func (t *HF) buildCharStart() {
	maxID := uint32(0)
	first := map[uint32]byte{}
	for s, id := range t.vocab {
		maxID = max(maxID, id)
		first[id] = s[0]
	}
	th := charThreats{make([]uint32, maxID+1), make([]uint32, maxID+1), make([]uint32, maxID+1)}
	for i := range th.right {
		th.right[i], th.rightSpace[i], th.left[i] = math.MaxUint32, math.MaxUint32, math.MaxUint32
	}
	space := t.byteIDs[' ']
	t.merges.each(func(key, v uint64) {
		l, r, rank := uint32(key>>32), uint32(key), uint32(v>>32)
		if l > maxID || r > maxID {
			return
		}
		if l == space {
			th.rightSpace[r] = min(th.rightSpace[r], rank)
		} else {
			th.right[r] = min(th.right[r], rank)
		}
		if f, ok := first[r]; ok && utf8.RuneStart(f) {
			th.left[l] = min(th.left[l], rank)
		}
	})
	t.charTok = make([]uint32, tableRunes)
	var buf [utf8.UTFMax]byte
	for r := rune(0); r < tableRunes; r++ {
		if r < utf8.RuneSelf || (r >= 0xD800 && r <= 0xDFFF) {
			t.charTok[r] = charFromBytes
			continue
		}
		b := buf[:utf8.EncodeRune(buf[:], r)]
		ids, flag, ok := t.charStart(b, &th)
		switch {
		case !ok:
			t.charTok[r] = charFromBytes
		case len(ids) == 1 && ids[0] <= charIDMask:
			t.charTok[r] = ids[0] | flag
		default:
			t.charTok[r] = charMulti | flag | uint32(len(t.charMultiIDs))<<3 | uint32(len(ids))
			t.charMultiIDs = append(t.charMultiIDs, ids...)
		}
	}
}

// charStart runs BPE on the bytes of one character and reports its tokens,
// whether words may start from them (see the comment at the top), and
// charAfterSpace if not after a space byte.
func (t *HF) charStart(b []byte, th *charThreats) (ids []uint32, flag uint32, ok bool) {
	type part struct {
		id       uint32
		from, to int
	}
	var store [utf8.UTFMax]part
	parts := store[:len(b)]
	for i, c := range b {
		parts[i] = part{t.byteIDs[c], i, i + 1}
	}
	// The lowest rank of a boundary merge that any edge part has had,
	// with a token other than " ", and with " ".
	var seen []part
	maxRank := uint32(0)
	for {
		seen = append(seen, parts...)
		best, bestRank, bestID := -1, uint32(0), uint32(0)
		for i := 0; i+1 < len(parts); i++ {
			v, ok := t.merges.get(uint64(parts[i].id)<<32 | uint64(parts[i+1].id))
			if !ok {
				continue
			}
			if r := uint32(v >> 32); best < 0 || r < bestRank {
				best, bestRank, bestID = i, r, uint32(v)
			}
		}
		if best < 0 {
			break
		}
		maxRank = max(maxRank, bestRank)
		parts[best] = part{bestID, parts[best].from, parts[best+1].to}
		parts = append(parts[:best+1], parts[best+2:]...)
	}
	final := func(p part) bool {
		for _, q := range parts {
			if q == p {
				return true
			}
		}
		return false
	}
	for _, p := range seen {
		// A part that survives must never merge across a boundary; one
		// that the character's own merges take must not before them.
		limit := maxRank
		if final(p) {
			limit = math.MaxUint32
		}
		threat := func(rank uint32) bool { return rank != math.MaxUint32 && (rank < limit || limit == math.MaxUint32) }
		if p.from == 0 && p.to < len(b) {
			if threat(th.right[p.id]) {
				return nil, 0, false
			}
			if threat(th.rightSpace[p.id]) {
				flag = charAfterSpace
			}
		}
		if p.to == len(b) && p.from > 0 && threat(th.left[p.id]) {
			return nil, 0, false
		}
	}
	ids = make([]uint32, len(parts))
	for i, p := range parts {
		ids[i] = p.id
	}
	return ids, flag, true
}

// appendChars appends the start symbols of word w: each character's own
// tokens where that is exact, its bytes otherwise. It reports false
// (leaving dst[:start] to the caller) on invalid UTF-8.
func (t *HF) appendChars(dst []uint32, w string) ([]uint32, bool) {
	for i := 0; i < len(w); {
		c := w[i]
		if c < utf8.RuneSelf {
			dst = append(dst, t.byteIDs[c])
			i++
			continue
		}
		r, n := utf8.DecodeRuneInString(w[i:])
		if r == utf8.RuneError && n == 1 {
			return dst, false
		}
		v := charFromBytes
		if r < tableRunes {
			v = t.charTok[r]
		}
		switch {
		case v == charFromBytes || (v&charAfterSpace != 0 && i > 0 && w[i-1] == ' '):
			for j := i; j < i+n; j++ {
				dst = append(dst, t.byteIDs[w[j]])
			}
		case v&charMulti != 0:
			off := (v & charIDMask) >> 3
			dst = append(dst, t.charMultiIDs[off:off+v&7]...)
		default:
			dst = append(dst, v&charIDMask)
		}
		i += n
	}
	return dst, true
}

package tokenizer

import (
	"unicode/utf8"
	"unsafe"
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
// if its rank is below maxRank(c); once c is finished its parts are the same
// from either start.
// Such threats are a part holding c's first byte with a token X on its
// left, or a part holding c's last byte with a token Y on its right; X ends
// with the byte before c and Y starts with the byte after it, so c starts
// from its tokens unless the bytes around it in the word are among those
// its threats end or start with (commonly " " before the lead byte of many
// scripts). Merges between whole characters are then the same from either
// start and merges inside different characters touch different symbols,
// so each character of a word is started either way on its own.
// TestCharStartMatchesBytes, TestCharStartTrained and FuzzCharStart keep
// the two starts equal.

// charTok entries, one per character so that a character costs one
// read: charKind says how it starts, from one token (its id in bits 0-20),
// two (the second in bits 21-41), three or four (the first two so, the
// others in the entry's more: bits 0-20 and 21-41, how many in bits
// 42-44) or its bytes; charCtx indexes charCtxs (0: starts
// from its tokens anywhere); charNoRight and charNoLeft say that the first
// of its tokens is the right of no merge and the last the left of none.
// Token ids are below 1<<charIDBits (pairTableFits).
const (
	charIDBits  = 21
	charIDMask  = 1<<charIDBits - 1
	charOne     = 0
	charTwo     = 1
	charMany    = 2
	charBytes   = 3
	charKindAt  = 2 * charIDBits
	charCtxAt   = charKindAt + 2
	charCtxMask = 1<<18 - 1
	charNoLeft  = uint64(1) << 62
	charNoRight = uint64(1) << 63
)

// charEntry is a character's charTok entry (e, more) and its partner
// signatures (sig) in half a cache line, so that a character of up to
// four tokens, which is every one, is one read. sig's high half has
// bit partnerBit(l) set for the left token l of every merge
// whose right is the character's first token, the low half bit
// partnerBit(r) for the right token r of every merge whose left is its
// last token. A pair of two characters started from their tokens, where
// the left one's low half lacks the right one's first token's bit or the
// right one's high half the left one's last token's bit, has no merge
// (TestStartNoMerge).
type charEntry struct{ e, sig, more, _ uint64 }

// partnerBit is a token's bit in a partner signature half.
func partnerBit(id uint32) uint64 { return 1 << (id * 0x9E3779B1 >> 27) }

// charKind is how a charTok entry's character starts: charOne, charTwo,
// charMany or charBytes.
func charKind(e uint64) uint64 { return e >> charKindAt & 3 }

// charCtx is the index in charCtxs of a charTok entry.
func charCtx(e uint64) uint64 { return e >> charCtxAt & charCtxMask }

// byteSet is a set of byte values.
type byteSet [4]uint64

func (s *byteSet) add(b byte)      { s[b>>6] |= 1 << (b & 63) }
func (s *byteSet) has(b byte) bool { return s[b>>6]&(1<<(b&63)) != 0 }

// charContext holds the bytes that, just before or just after a
// character, make it start from its bytes.
type charContext struct{ before, after byteSet }

// byteRank is a boundary merge of a part: the byte its other token ends
// (on the left) or starts (on the right) with, and its rank.
type byteRank struct {
	b    byte
	rank uint32
}

// buildCharStart fills charTok and charCtx for every rune below
// tableRunes.
func (t *HF) buildCharStart() {
	maxID := uint32(0)
	for _, id := range t.vocab {
		maxID = max(maxID, id)
	}
	first, last := make([]byte, maxID+1), make([]byte, maxID+1)
	partial := make([]bool, maxID+1)
	for s, id := range t.vocab {
		first[id], last[id], partial[id] = s[0], s[len(s)-1], !utf8.ValidString(s)
	}
	// Boundary merges of partial tokens: with a token on their left (the
	// partial then starts with a character's first byte), and with a
	// token starting a character on their right.
	withLeft, withRight := map[uint32][]byteRank{}, map[uint32][]byteRank{}
	isLeft, isRight := make([]bool, maxID+1), make([]bool, maxID+1)
	sigL, sigR := make([]uint64, maxID+1), make([]uint64, maxID+1)
	t.merges.each(func(key, v uint64) {
		l, r, rank := uint32(key>>32), uint32(key), uint32(v>>32)
		if l > maxID || r > maxID {
			return
		}
		isLeft[l], isRight[r] = true, true
		sigR[l] |= partnerBit(r)
		sigL[r] |= partnerBit(l) << 32
		if partial[r] && utf8.RuneStart(first[r]) {
			withLeft[r] = append(withLeft[r], byteRank{last[l], rank})
		}
		if partial[l] && utf8.RuneStart(first[r]) {
			withRight[l] = append(withRight[l], byteRank{first[r], rank})
		}
	})
	for b, id := range t.byteIDs {
		if !isLeft[id] {
			t.byteNo[b] |= charNoLeft
		}
		if !isRight[id] {
			t.byteNo[b] |= charNoRight
		}
	}
	t.charTok = unsafe.Slice((*charEntry)(unsafe.Pointer(unsafe.SliceData(hugeUint64s(4*tableRunes)))), tableRunes)
	t.charCtxs = []charContext{{}} // 0: none
	interned := map[charContext]uint64{{}: 0}
	var buf [utf8.UTFMax]byte
	var ids []uint32
	var seen []charPart
	for r := rune(0); r < tableRunes; r++ {
		if r < utf8.RuneSelf || (r >= 0xD800 && r <= 0xDFFF) {
			t.charTok[r] = charEntry{e: charBytes << charKindAt, sig: ^uint64(0)}
			continue
		}
		b := buf[:utf8.EncodeRune(buf[:], r)]
		var ctx charContext
		ids, seen = t.charStart(ids[:0], seen[:0], b, withLeft, withRight, &ctx)
		k, ok := interned[ctx]
		if !ok {
			k = uint64(len(t.charCtxs))
			interned[ctx] = k
			t.charCtxs = append(t.charCtxs, ctx)
		}
		e, more := k<<charCtxAt|uint64(ids[0]), uint64(0)
		switch {
		case len(ids) == 1:
			e |= charOne << charKindAt
		case len(ids) == 2:
			e |= charTwo<<charKindAt | uint64(ids[1])<<charIDBits
		default: // at most four, one a byte
			e |= charMany<<charKindAt | uint64(ids[1])<<charIDBits
			more = uint64(len(ids)-2) << (2 * charIDBits)
			for j, id := range ids[2:] {
				more |= uint64(id) << (j * charIDBits)
			}
		}
		if !isRight[ids[0]] {
			e |= charNoRight
		}
		if !isLeft[ids[len(ids)-1]] {
			e |= charNoLeft
		}
		sig := sigL[ids[0]] | sigR[ids[len(ids)-1]]
		if k > charCtxMask {
			e, sig, more = charBytes<<charKindAt, ^uint64(0), 0 // beyond the table's fields: exact from bytes
		}
		t.charTok[r] = charEntry{e: e, sig: sig, more: more}
	}
}

// charPart is a token holding bytes [from, to) of a character.
type charPart struct {
	id       uint32
	from, to int
}

// charStart runs BPE on the bytes b of one character, appends its tokens
// to ids and sets in ctx the bytes around it that make it start from bytes
// instead (see the comment at the top); seen is scratch space.
func (t *HF) charStart(ids []uint32, seen []charPart, b []byte, withLeft, withRight map[uint32][]byteRank, ctx *charContext) ([]uint32, []charPart) {
	var store [utf8.UTFMax]charPart
	parts := store[:len(b)]
	for i, c := range b {
		parts[i] = charPart{t.byteIDs[c], i, i + 1}
	}
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
		parts[best] = charPart{bestID, parts[best].from, parts[best+1].to}
		parts = append(parts[:best+1], parts[best+2:]...)
	}
	for _, p := range seen {
		// A boundary merge ranked above all of c's own merges runs only
		// once c is finished, from either start; a part that survives c's
		// own merges is in both starts then.
		threat := func(rank uint32) bool { return rank < maxRank }
		if p.from == 0 && p.to < len(b) {
			for _, m := range withLeft[p.id] {
				if threat(m.rank) {
					ctx.before.add(m.b)
				}
			}
		}
		if p.to == len(b) && p.from > 0 {
			for _, m := range withRight[p.id] {
				if threat(m.rank) {
					ctx.after.add(m.b)
				}
			}
		}
	}
	for _, p := range parts {
		ids = append(ids, p.id)
	}
	return ids, seen
}

// appendChars appends the start symbols of word w: each character's own
// tokens where that is exact, its bytes otherwise. It reports false
// (leaving dst[:start] to the caller) on invalid UTF-8. Bit i of none is
// set when symbols i and i+1 of the word (i < 64) are known to have no
// merge, which saves mergeLinear a pair-table lookup: the tokens of one
// character started from its tokens (its own BPE left them apart), or a
// left symbol that is no merge's left, or a right one no merge's right
// (TestStartNoMerge).
func (t *HF) appendChars(dst []uint32, w string) (out []uint32, none uint64, ok bool) {
	n := 0          // symbols appended
	prevNoL := true // the last symbol is no merge's left (none before the first)
	// prevLast is the last symbol, prevSig the partner signature of its
	// character when that started from its tokens, all ones otherwise.
	prevSig, prevLast := ^uint64(0), uint32(0)
	// edge marks pair n-1, n when the symbol before is no merge's left or
	// the next (flags of its character) no merge's right, or the
	// signatures rule out a merge of the two.
	edge := func(flags, sig uint64, first uint32) {
		if n > 0 && n <= 64 && (prevNoL || flags&charNoRight != 0 ||
			prevSig&partnerBit(first) == 0 || sig&(partnerBit(prevLast)<<32) == 0) {
			none |= 1 << (n - 1)
		}
	}
	for i := 0; i < len(w); {
		c := w[i]
		if c < utf8.RuneSelf {
			f, id := t.byteNo[c], t.byteIDs[c]
			edge(f, ^uint64(0), id)
			dst = append(dst, id)
			n++
			prevNoL = f&charNoLeft != 0
			prevSig, prevLast = ^uint64(0), id
			i++
			continue
		}
		r, k := decodeRune(w, i)
		if r == utf8.RuneError && k == 1 {
			return dst, 0, false
		}
		ce := charEntry{e: charBytes << charKindAt, sig: ^uint64(0)}
		if r < tableRunes {
			ce = t.charTok[r]
			if x := charCtx(ce.e); x != 0 {
				ctx := &t.charCtxs[x]
				if (i > 0 && ctx.before.has(w[i-1])) || (i+k < len(w) && ctx.after.has(w[i+k])) {
					ce = charEntry{e: charBytes << charKindAt, sig: ^uint64(0)}
				}
			}
		}
		e := ce.e
		first := uint32(e & charIDMask)
		switch charKind(e) {
		case charOne:
			edge(e, ce.sig, first)
			dst = append(dst, first)
			prevLast = first
			n++
		case charTwo:
			edge(e, ce.sig, first)
			prevLast = uint32(e >> charIDBits & charIDMask)
			dst = append(dst, first, prevLast)
			if n < 64 {
				none |= 1 << n
			}
			n += 2
		case charMany:
			edge(e, ce.sig, first)
			m := 2 + int(ce.more>>(2*charIDBits))
			dst = append(dst, first, uint32(e>>charIDBits&charIDMask), uint32(ce.more&charIDMask))
			prevLast = dst[len(dst)-1]
			if m == 4 {
				prevLast = uint32(ce.more >> charIDBits & charIDMask)
				dst = append(dst, prevLast)
			}
			for j := n; j < n+m-1 && j < 64; j++ {
				none |= 1 << j
			}
			n += m
		default:
			edge(t.byteNo[w[i]], ^uint64(0), t.byteIDs[w[i]])
			for j := i; j < i+k; j++ {
				dst = append(dst, t.byteIDs[w[j]])
			}
			n += k
			e, prevLast = t.byteNo[w[i+k-1]], t.byteIDs[w[i+k-1]]
		}
		prevNoL = e&charNoLeft != 0
		prevSig = ce.sig
		i += k
	}
	return dst, none, true
}

package tokenizer

import (
	"math/bits"
	"strings"
	"unicode/utf8"
)

// maxLinearWord is the number of symbols up to which BPE finds each merge
// by scanning the word's pairs; longer words (long letter runs) use a heap.
const maxLinearWord = 64

// maxCachedWord bounds the words kept in the per-tokenizer word cache.
const maxCachedWord = 64

func (t *HF) encodeWord(dst []uint32, w string) []uint32 {
	if len(w) == 1 {
		return append(dst, t.byteIDs[w[0]])
	}
	cacheable := len(w) <= maxCachedWord
	var h uint64
	if cacheable {
		h = cacheHash(w)
		if ids, ok := t.cache.get(h, w); ok {
			return append(dst, ids...)
		}
	}
	start := len(dst)
	dst, none := t.startSymbols(dst, w)
	// A word whose start pairs all have no merge (appendChars) is its
	// start symbols: no BPE, and nothing worth a cache entry, which would
	// cost more than starting it again. Words of other scripts often are
	// (half of the mixed-script corpus's distinct words).
	if n := len(dst) - start; n <= maxLinearWord && none == 1<<(n-1)-1 {
		return t.wholeWord(dst, start, w, h, cacheable)
	}
	dst = t.merge(dst, start, none)
	dst = t.wholeWord(dst, start, w, h, cacheable)
	if cacheable {
		t.cache.put(h, w, dst[start:])
	}
	return dst
}

// buildWholeWords keeps for ignore_merges (wholeWord) the tokens that
// BPE does not build whole from their own bytes, which are the only
// words it changes: BPE of any other token's bytes is that token. There
// are none in gpt-oss's vocabulary and 588 of 128,000 in Llama 3.1's, so
// the lookup of a word BPE leaves in pieces is a filter that stays in
// cache, or nothing, where the whole vocab's was a cache miss. It runs
// the same BPE encodeWord does, once a token (0.1-0.5 s for those two
// vocabularies on a loaded 2-core machine), after the merges and the
// characters' entries are built.
func (t *HF) buildWholeWords() {
	whole := map[string]uint32{}
	var dst []uint32
	for tok, id := range t.vocab {
		if len(tok) < 2 {
			continue
		}
		var none uint64
		dst, none = t.startSymbols(dst[:0], tok)
		if dst = t.merge(dst, 0, none); len(dst) != 1 || dst[0] != id {
			whole[tok] = id
		}
	}
	keys := make([]string, 0, len(whole))
	for k := range whole {
		keys = append(keys, k)
		t.maxTokenLen = max(t.maxTokenLen, len(k))
	}
	t.vocabFilter = newHashFilter(keys)
	t.vocabTab = newVocabTable(whole)
}

// wholeWord applies ignore_merges to the BPE of w in dst[start:]: it
// takes a word found in the vocab whole. BPE that ends in one token has
// built the vocab's token of the word's bytes, so only a word BPE leaves
// in pieces is looked up, and only if the filter of the tokens BPE does
// not build whole may hold it (buildWholeWords;
// TestIgnoreMergesWholeWords). h is w's cacheHash when hashed.
func (t *HF) wholeWord(dst []uint32, start int, w string, h uint64, hashed bool) []uint32 {
	if !t.ignoreMerges || len(dst)-start <= 1 || len(w) > t.maxTokenLen {
		return dst
	}
	if !hashed {
		h = cacheHash(w)
	}
	if !t.vocabFilter.mayHave(h) {
		return dst
	}
	if id, ok := t.vocabTab.get(w, h); ok {
		dst = append(dst[:start], id)
	}
	return dst
}

// hashFilter is a one-hash Bloom filter over xxhash values: no false
// negatives, about one false positive in ten at eight bits a key.
type hashFilter struct {
	bits  []uint64
	shift uint8
}

func newHashFilter(keys []string) hashFilter {
	n := 64
	for n < 8*len(keys) {
		n *= 2
	}
	f := hashFilter{bits: make([]uint64, n/64), shift: uint8(64 - bits.TrailingZeros(uint(n)))}
	for _, k := range keys {
		i := cacheHash(k) >> f.shift
		f.bits[i/64] |= 1 << (i % 64)
	}
	return f
}

func (f *hashFilter) mayHave(h uint64) bool {
	if f.bits == nil {
		return true
	}
	i := h >> f.shift
	return f.bits[i/64]&(1<<(i%64)) != 0
}

// startSymbols appends the symbols BPE starts word w from: its
// characters' own tokens where that is exact (chars.go), else its bytes;
// and the pairs of them known to have no merge (appendChars).
func (t *HF) startSymbols(dst []uint32, w string) ([]uint32, uint64) {
	start := len(dst)
	if t.charTok != nil {
		if out, none, ok := t.appendChars(dst, w); ok {
			return out, none
		}
	}
	dst = dst[:start]
	for i := 0; i < len(w); i++ {
		dst = append(dst, t.byteIDs[w[i]])
	}
	return dst, 0
}

// encodeSPM encodes a normalized segment, which SentencePiece-style BPE
// treats as one word; when the vocab allows (spmSplit), it is cut before
// each "▁" run, which no merge can cross, so pieces can be cached.
func (t *HF) encodeSPM(dst []uint32, seg string) []uint32 {
	if !t.spmSplit {
		return t.encodeSPMWord(dst, seg)
	}
	const space = "▁"
	start := 0
	for start < len(seg) {
		// Skip the "▁" run at start, then cut before the next one.
		i := start
		for strings.HasPrefix(seg[i:], space) {
			i += len(space)
		}
		j := strings.Index(seg[i:], space)
		end := len(seg)
		if j >= 0 {
			end = i + j
		}
		dst = t.cachedSPMWord(dst, seg[start:end])
		start = end
	}
	return dst
}

func (t *HF) cachedSPMWord(dst []uint32, w string) []uint32 {
	if len(w) > maxCachedWord {
		return t.encodeSPMWord(dst, w)
	}
	h := cacheHash(w)
	if ids, ok := t.cache.get(h, w); ok {
		return append(dst, ids...)
	}
	start := len(dst)
	dst = t.encodeSPMWord(dst, w)
	t.cache.put(h, w, dst[start:])
	return dst
}

// encodeSPMWord is SentencePiece-style BPE: symbols are characters, a
// character missing from the vocab falls back to its <0xXX> byte tokens
// (or the unknown token, consecutive ones fused), then merges apply.
func (t *HF) encodeSPMWord(dst []uint32, w string) []uint32 {
	start := len(dst)
	lastUnk := false
	for i := 0; i < len(w); {
		_, n := utf8.DecodeRuneInString(w[i:])
		if id, ok := t.vocab[w[i:i+n]]; ok {
			dst = append(dst, id)
			lastUnk = false
			i += n
			continue
		}
		fallback := t.byteFallback
		for j := i; j < i+n && fallback; j++ {
			fallback = t.hasByteToken[w[j]]
		}
		switch {
		case fallback:
			for j := i; j < i+n; j++ {
				dst = append(dst, t.byteToken[w[j]])
			}
			lastUnk = false
		case t.hasUnk && !(t.fuseUnk && lastUnk):
			dst = append(dst, t.unk)
			lastUnk = true
		}
		i += n
	}
	return t.merge(dst, start, 0)
}

// merge applies the BPE merges to the symbols dst[start:]; bit i of none
// says that symbols i and i+1 have no merge.
func (t *HF) merge(dst []uint32, start int, none uint64) []uint32 {
	if len(dst)-start <= maxLinearWord {
		return t.mergeLinear(dst, start, none)
	}
	return t.mergeHeap(dst, start)
}

// mergeLinear applies the lowest-ranked merge, leftmost first, until none
// applies, in place. The merge of each adjacent pair is looked up once and
// kept; a merge looks up only the two pairs it changes. Pairs in none
// are not looked up.
func (t *HF) mergeLinear(dst []uint32, start int, none uint64) []uint32 {
	ids := dst[start:]
	if len(ids) < 2 {
		return dst
	}
	// pair[i] is the merge of ids[i], ids[i+1] (rank<<32 | merged id
	// with its end flags, both from the pair's slot) or noMerge.
	var store [maxLinearWord]uint64
	pair := store[:len(ids)-1]
	at := func(i int) uint64 { return t.merges.lookup(uint64(ids[i])<<32 | uint64(ids[i+1])) }
	for i := range pair {
		if none&(1<<i) != 0 {
			pair[i] = noMerge
		} else {
			pair[i] = at(i)
		}
	}
	for len(pair) > 0 {
		best, v := 0, pair[0]
		for i, p := range pair[1:] {
			if p < v { // the lowest rank, leftmost
				best, v = i+1, p
			}
		}
		if v == noMerge {
			break
		}
		m := uint32(v)
		ids[best] = m & mergedIDMask
		copy(ids[best+1:], ids[best+2:])
		ids = ids[:len(ids)-1]
		copy(pair[best:], pair[best+1:])
		pair = pair[:len(pair)-1]
		// The merged token's end flags spare the lookups of pairs it
		// cannot be in (pairTable.markEnds).
		if best > 0 {
			pair[best-1] = noMerge
			if m&mergedNoRight == 0 {
				pair[best-1] = at(best - 1)
			}
		}
		if best < len(pair) {
			pair[best] = noMerge
			if m&mergedNoLeft == 0 {
				pair[best] = at(best)
			}
		}
	}
	return dst[:start+len(ids)]
}

type symbol struct {
	id         uint32
	prev, next int32
	gone       bool
}

type mergeItem struct {
	rank uint32
	pos  int32
	id   uint32
}

func itemLess(a, b mergeItem) bool {
	return a.rank < b.rank || (a.rank == b.rank && a.pos < b.pos)
}

type mergeHeap []mergeItem

func (h *mergeHeap) push(x mergeItem) {
	*h = append(*h, x)
	s := *h
	i := len(s) - 1
	for i > 0 {
		p := (i - 1) / 2
		if !itemLess(s[i], s[p]) {
			break
		}
		s[i], s[p] = s[p], s[i]
		i = p
	}
}

func (h *mergeHeap) pop() mergeItem {
	s := *h
	top := s[0]
	n := len(s) - 1
	s[0] = s[n]
	s = s[:n]
	i := 0
	for {
		l, m := 2*i+1, i
		if l < n && itemLess(s[l], s[m]) {
			m = l
		}
		if l+1 < n && itemLess(s[l+1], s[m]) {
			m = l + 1
		}
		if m == i {
			break
		}
		s[i], s[m] = s[m], s[i]
		i = m
	}
	*h = s
	return top
}

// mergeHeap is the same merge order as mergeLinear (lowest rank, then
// leftmost position) in O(n log n), as the reference implements it.
func (t *HF) mergeHeap(dst []uint32, start int) []uint32 {
	in := dst[start:]
	syms := make([]symbol, len(in))
	for i, id := range in {
		syms[i] = symbol{id: id, prev: int32(i - 1), next: int32(i + 1)}
	}
	syms[len(syms)-1].next = -1
	h := make(mergeHeap, 0, len(syms))
	pushPair := func(i int32) {
		if i < 0 || syms[i].next < 0 {
			return
		}
		if v, ok := t.merges.get(uint64(syms[i].id)<<32 | uint64(syms[syms[i].next].id)); ok {
			h.push(mergeItem{rank: uint32(v >> 32), pos: i, id: uint32(v)})
		}
	}
	for i := range syms {
		pushPair(int32(i))
	}
	for len(h) > 0 {
		it := h.pop()
		s := &syms[it.pos]
		if s.gone || s.next < 0 {
			continue
		}
		v, ok := t.merges.get(uint64(s.id)<<32 | uint64(syms[s.next].id))
		if !ok || uint32(v) != it.id || uint32(v>>32) != it.rank {
			continue // stale: a neighbor merged since this pair was queued
		}
		nx := s.next
		s.id = it.id
		s.next = syms[nx].next
		syms[nx].gone = true
		if s.next >= 0 {
			syms[s.next].prev = it.pos
		}
		pushPair(s.prev)
		pushPair(it.pos)
	}
	dst = dst[:start]
	for i := int32(0); i >= 0; i = syms[i].next {
		dst = append(dst, syms[i].id)
	}
	return dst
}

package tokenizer

import (
	"fmt"
	"math/bits"
)

// pairTable maps a pair of token ids (left<<32 | right) to its merge
// (rank<<32 | merged id). BPE looks a pair up for every adjacent pair of
// symbols and every merge, at random places in a table of up to 450,000
// merges, so a lookup is mostly cache misses: open addressing with linear
// probing, at most three quarters full, finds a pair in the cache line of
// its home slot. A slot is two words, left<<43 | right<<22 | rank and
// the merged id with its end flags, so a lookup that finds a merge reads
// one cache line: most pairs looked up in text of many scripts do merge,
// and a merged id read from a table by rank was a second miss for each
// (4 MiB for Qwen3's 151,387 merges, 16 MiB for gpt-oss's 446,189).
// Slots and filter are one allocation in huge pages (hugeUint64s).
// TestPairTable keeps it equal to a map.
//
// Most pairs looked up have no merge (two CJK characters that are not a
// word), so a one-hash Bloom filter of eight bits a merge (128-512 KiB,
// about one false positive in nine) answers them first: it is small
// enough to stay in cache across a document while the table is not.
//
// A merged id carries mergedNoLeft and mergedNoRight (markEnds): its
// token is the left, or the right, of no merge, so BPE need not look up
// the pairs a merge makes with it (TestPairTableEnds).
type pairTable struct {
	slots  []uint64 // slot i: slots[2i] pair and rank, slots[2i+1] merged id | end flags
	filter []uint64
	mask   uint64 // slot count - 1
	shift  uint8
	fshift uint8
}

// Field widths of a slot: token ids below maxPairID, ranks below
// maxPairRank (pairTableFits checks a vocabulary against them).
const (
	pairIDBits   = 21
	pairRankBits = 64 - 2*pairIDBits
	maxPairID    = 1<<pairIDBits - 1 // the all-ones id is the empty slot's
	maxPairRank  = 1<<pairRankBits - 1
	pairRankMask = uint64(maxPairRank)
)

// End flags of a merged id; ids are below maxPairID.
const (
	mergedNoLeft  uint32 = 1 << 31
	mergedNoRight uint32 = 1 << 30
	mergedIDMask         = mergedNoRight - 1
)

// noPair marks an empty slot: no pair has it, as no token id is
// maxPairID.
const noPair = ^uint64(0)

// pairTableFits reports why a vocabulary of ids up to maxID with n merges
// does not fit a pairTable, or nil.
func pairTableFits(maxID uint32, n int) error {
	if maxID >= maxPairID || n >= maxPairRank {
		return fmt.Errorf("vocabulary of %d ids and %d merges is too large (at most %d and %d)", maxID+1, n, maxPairID, maxPairRank-1)
	}
	return nil
}

func newPairTable(n int) pairTable {
	size := 16
	for size < n+n/3+1 {
		size *= 2
	}
	fbits := 64
	for fbits < 8*n {
		fbits *= 2
	}
	// One allocation in huge pages (hugeUint64s): slots, filter.
	sw, fw := 2*size, fbits/64
	words := hugeUint64s(sw + fw)
	p := pairTable{
		slots: words[:sw:sw], mask: uint64(size - 1), shift: uint8(64 - bits.TrailingZeros(uint(size))),
		filter: words[sw : sw+fw : sw+fw], fshift: uint8(64 - bits.TrailingZeros(uint(fbits))),
	}
	for i := 0; i < sw; i += 2 {
		p.slots[i] = noPair
	}
	return p
}

func (p *pairTable) home(k uint64) uint64 { return (k * 0x9E3779B97F4A7C15) >> p.shift }

// bit is the filter bit of k: another multiplier than home's, so a
// pair's bit and slot are independent.
func (p *pairTable) bit(k uint64) (uint64, uint64) {
	i := (k * 0xC2B2AE3D27D4EB4F) >> p.fshift
	return i / 64, 1 << (i % 64)
}

// slotKey is the pair part of a slot for key, and false for ids a slot
// cannot hold (no merge has them).
func slotKey(key uint64) (uint64, bool) {
	l, r := key>>32, key&0xFFFFFFFF
	if l >= maxPairID || r >= maxPairID {
		return 0, false
	}
	return l<<(pairIDBits+pairRankBits) | r<<pairRankBits, true
}

// find returns the index in slots of pair key's first word, and false
// when the pair has no merge.
func (p *pairTable) find(key uint64) (uint64, bool) {
	k, ok := slotKey(key)
	if !ok {
		return 0, false
	}
	if w, b := p.bit(k); p.filter[w]&b == 0 {
		return 0, false
	}
	for i := p.home(k); ; i = (i + 1) & p.mask {
		s := p.slots[2*i]
		if s&^pairRankMask == k {
			return 2 * i, true
		}
		if s == noPair {
			return 0, false
		}
	}
}

// get returns the merge of pair key.
func (p *pairTable) get(key uint64) (uint64, bool) {
	i, ok := p.find(key)
	if !ok {
		return 0, false
	}
	return (p.slots[i]&pairRankMask)<<32 | p.slots[i+1]&uint64(mergedIDMask), true
}

// noMerge is lookup's answer for a pair without a merge: above every
// merge's, as ranks are below maxPairRank.
const noMerge = ^uint64(0)

// lookup returns the merge of pair key as rank<<32 | the merged id with
// its end flags, or noMerge.
func (p *pairTable) lookup(key uint64) uint64 {
	i, ok := p.find(key)
	if !ok {
		return noMerge
	}
	return (p.slots[i]&pairRankMask)<<32 | p.slots[i+1]
}

// putNew stores the merge of pair key unless the pair has one: the
// reference keeps the first (lowest-ranked) merge of a pair. Ranks are
// distinct and below maxPairRank, ids below maxPairID (pairTableFits);
// markEnds runs after the last.
func (p *pairTable) putNew(key, val uint64) {
	k, ok := slotKey(key)
	rank := val >> 32
	if !ok || rank >= maxPairRank {
		panic(fmt.Sprintf("pairTable: pair %#x or rank %d out of range", key, rank))
	}
	for i := p.home(k); ; i = (i + 1) & p.mask {
		s := p.slots[2*i]
		if s != noPair && s&^pairRankMask == k {
			return
		}
		if s == noPair {
			p.slots[2*i], p.slots[2*i+1] = k|rank, uint64(uint32(val))
			w, b := p.bit(k)
			p.filter[w] |= b
			return
		}
	}
}

// each calls f for every pair and its merge.
func (p *pairTable) each(f func(key, val uint64)) {
	const idMask = 1<<pairIDBits - 1
	for i := 0; i < len(p.slots); i += 2 {
		if s := p.slots[i]; s != noPair {
			l, r, rank := s>>(pairIDBits+pairRankBits), s>>pairRankBits&idMask, s&pairRankMask
			f(l<<32|r, rank<<32|p.slots[i+1]&uint64(mergedIDMask))
		}
	}
}

// markEnds sets the end flags of every merged id, once all merges are in.
func (p *pairTable) markEnds() {
	const idMask = 1<<pairIDBits - 1
	isLeft, isRight := make([]bool, maxPairID), make([]bool, maxPairID)
	for i := 0; i < len(p.slots); i += 2 {
		if s := p.slots[i]; s != noPair {
			isLeft[s>>(pairIDBits+pairRankBits)] = true
			isRight[s>>pairRankBits&idMask] = true
		}
	}
	for i := 0; i < len(p.slots); i += 2 {
		if p.slots[i] == noPair {
			continue
		}
		id := uint32(p.slots[i+1]) & mergedIDMask
		m := id
		if !isLeft[id] {
			m |= mergedNoLeft
		}
		if !isRight[id] {
			m |= mergedNoRight
		}
		p.slots[i+1] = uint64(m)
	}
}

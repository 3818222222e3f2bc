package tokenizer

import (
	"fmt"
	"math/bits"
	"unsafe"
)

// pairTable maps a pair of token ids (left<<32 | right) to its merge
// (rank<<32 | merged id). BPE looks a pair up for every adjacent pair of
// symbols and every merge, at random places in a table of up to 450,000
// merges, so a lookup is mostly cache misses: open addressing with linear
// probing, at most three quarters full, finds a pair in the cache line of
// its home slot. A slot is one word, left<<43 | right<<22 | rank, so the
// table is a quarter of the size of one holding the pair and its merge
// (2 MiB for Qwen3's 151,387 merges), which keeps more of it in the
// caches that another process's work between two prompts leaves; the
// merged id is read from ids by rank, only for a pair that has a merge.
// Slots, filter and ids are one allocation in huge pages (hugeUint64s).
// TestPairTable keeps it equal to a map.
//
// Most pairs looked up have no merge (two CJK characters that are not a
// word), so a one-hash Bloom filter of eight bits a merge (128-512 KiB,
// about one false positive in nine) answers them first: it is small
// enough to stay in cache across a document while the table is not.
//
// A merged id in ids carries mergedNoLeft and mergedNoRight (markEnds):
// its token is the left, or the right, of no merge, so BPE need not look
// up the pairs a merge makes with it (TestPairTableEnds).
type pairTable struct {
	slots  []uint64
	ids    []uint32 // rank -> merged id | end flags
	filter []uint64
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

// End flags of a merged id in ids; ids are below maxPairID.
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
	// One allocation in huge pages (hugeUint64s): slots, filter, ids.
	sw, fw := size, fbits/64
	words := hugeUint64s(sw + fw + (n+1)/2)
	p := pairTable{
		slots: words[:sw:sw], shift: uint8(64 - bits.TrailingZeros(uint(size))),
		filter: words[sw : sw+fw : sw+fw], fshift: uint8(64 - bits.TrailingZeros(uint(fbits))),
	}
	if n > 0 {
		p.ids = unsafe.Slice((*uint32)(unsafe.Pointer(&words[sw+fw])), n)
	}
	for i := range p.slots {
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

// get returns the merge of pair key.
func (p *pairTable) get(key uint64) (uint64, bool) {
	rank, ok := p.rank(key)
	if !ok {
		return 0, false
	}
	return uint64(rank)<<32 | uint64(p.ids[rank]&mergedIDMask), true
}

// noRank is no merge's rank (ranks are below maxPairRank).
const noRank = ^uint32(0)

// rank returns the rank of the merge of pair key; ids holds its id.
func (p *pairTable) rank(key uint64) (uint32, bool) {
	k, ok := slotKey(key)
	if !ok {
		return 0, false
	}
	if w, b := p.bit(k); p.filter[w]&b == 0 {
		return 0, false
	}
	mask := uint64(len(p.slots) - 1)
	for i := p.home(k); ; i = (i + 1) & mask {
		s := p.slots[i]
		if s&^pairRankMask == k {
			return uint32(s & pairRankMask), true
		}
		if s == noPair {
			return 0, false
		}
	}
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
	mask := uint64(len(p.slots) - 1)
	for i := p.home(k); ; i = (i + 1) & mask {
		s := p.slots[i]
		if s != noPair && s&^pairRankMask == k {
			return
		}
		if s == noPair {
			p.slots[i] = k | rank
			w, b := p.bit(k)
			p.filter[w] |= b
			if int(rank) >= len(p.ids) {
				p.ids = append(p.ids, make([]uint32, int(rank)+1-len(p.ids))...)
			}
			p.ids[rank] = uint32(val)
			return
		}
	}
}

// each calls f for every pair and its merge.
func (p *pairTable) each(f func(key, val uint64)) {
	const idMask = 1<<pairIDBits - 1
	for _, s := range p.slots {
		if s != noPair {
			l, r, rank := s>>(pairIDBits+pairRankBits), s>>pairRankBits&idMask, s&pairRankMask
			f(l<<32|r, rank<<32|uint64(p.ids[rank]&mergedIDMask))
		}
	}
}

// markEnds sets the end flags of every merged id, once all merges are in.
func (p *pairTable) markEnds() {
	const idMask = 1<<pairIDBits - 1
	isLeft, isRight := make([]bool, maxPairID), make([]bool, maxPairID)
	for _, s := range p.slots {
		if s != noPair {
			isLeft[s>>(pairIDBits+pairRankBits)] = true
			isRight[s>>pairRankBits&idMask] = true
		}
	}
	for i, m := range p.ids {
		id := m & mergedIDMask
		m = id
		if !isLeft[id] {
			m |= mergedNoLeft
		}
		if !isRight[id] {
			m |= mergedNoRight
		}
		p.ids[i] = m
	}
}

package tokenizer

import "math/bits"

// pairTable maps a pair of token ids (left<<32 | right) to its merge
// (rank<<32 | merged id). BPE looks a pair up for every adjacent pair of
// symbols and every merge, at random places in a table of up to 200,000
// merges, so a lookup is mostly cache misses: open addressing with linear
// probing at most half full finds a pair in the first slot it reads,
// one cache line, where a Go map reads a control word and then a slot.
// TestPairTable keeps it equal to a map.
type pairTable struct {
	slots []pairSlot
	shift uint8
}

type pairSlot struct{ key, val uint64 }

// noPair marks an empty slot; no pair has it, as no token id is 2^32-1.
const noPair = ^uint64(0)

func newPairTable(n int) pairTable {
	size := 16
	for size < 2*n {
		size *= 2
	}
	p := pairTable{slots: make([]pairSlot, size), shift: uint8(64 - bits.TrailingZeros(uint(size)))}
	for i := range p.slots {
		p.slots[i].key = noPair
	}
	return p
}

func (p *pairTable) home(key uint64) uint64 { return (key * 0x9E3779B97F4A7C15) >> p.shift }

// get returns the merge of pair key.
func (p *pairTable) get(key uint64) (uint64, bool) {
	mask := uint64(len(p.slots) - 1)
	for i := p.home(key); ; i = (i + 1) & mask {
		s := &p.slots[i]
		if s.key == key {
			return s.val, true
		}
		if s.key == noPair {
			return 0, false
		}
	}
}

// putNew stores the merge of pair key unless the pair has one: the
// reference keeps the first (lowest-ranked) merge of a pair.
func (p *pairTable) putNew(key, val uint64) {
	mask := uint64(len(p.slots) - 1)
	for i := p.home(key); ; i = (i + 1) & mask {
		s := &p.slots[i]
		if s.key == key {
			return
		}
		if s.key == noPair {
			*s = pairSlot{key, val}
			return
		}
	}
}

// each calls f for every pair and its merge.
func (p *pairTable) each(f func(key, val uint64)) {
	for _, s := range p.slots {
		if s.key != noPair {
			f(s.key, s.val)
		}
	}
}

package scheduler

import (
	"math/bits"

	"github.com/omnious/provider-node/kvindex"
)

// specTable is one generation of speculative credits: an open-addressing
// table from block key to the replicas credited with it. Block keys are
// already uniformly spread 64-bit hashes and never 0, so a key's own bits
// (through one multiplication) place it and 0 marks a free slot; a decision
// reads and writes a few dozen keys, and a general map would hash each of
// them again. Keys are never deleted: a generation is dropped whole.
type specTable struct {
	slots []specSlot
	shift uint8 // 64 - log2(len(slots))
	n     int
}

type specSlot struct {
	key kvindex.Key
	val specVal
}

// newSpecTable returns a table that holds hint keys before it grows.
func newSpecTable(hint int) *specTable {
	size := 16
	for size < 2*hint {
		size *= 2
	}
	return &specTable{slots: make([]specSlot, size), shift: uint8(64 - bits.TrailingZeros(uint(size)))}
}

func (t *specTable) home(k kvindex.Key) int { return int((uint64(k) * 0x9E3779B97F4A7C15) >> t.shift) }

// get returns k's credits, nil when it has none.
func (t *specTable) get(k kvindex.Key) *specVal {
	mask := len(t.slots) - 1
	for i := t.home(k); ; i = (i + 1) & mask {
		s := &t.slots[i]
		switch s.key {
		case k:
			return &s.val
		case 0:
			return nil
		}
	}
}

// insert adds k, which must be absent, with empty credits and returns
// them. The table stays at most half full.
func (t *specTable) insert(k kvindex.Key) *specVal {
	if 2*(t.n+1) > len(t.slots) {
		t.grow()
	}
	t.n++
	mask := len(t.slots) - 1
	i := t.home(k)
	for t.slots[i].key != 0 {
		i = (i + 1) & mask
	}
	t.slots[i].key = k
	return &t.slots[i].val
}

func (t *specTable) grow() {
	old := t.slots
	t.slots = make([]specSlot, 2*len(old))
	t.shift--
	mask := len(t.slots) - 1
	for _, s := range old {
		if s.key == 0 {
			continue
		}
		i := t.home(s.key)
		for t.slots[i].key != 0 {
			i = (i + 1) & mask
		}
		t.slots[i] = s
	}
}

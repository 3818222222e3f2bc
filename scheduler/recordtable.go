package scheduler

import (
	"fmt"
	"math/bits"
)

// recordTable is the routing memory's bounded LRU from a prefix key (a
// block key or a chained chunk hash) to its record, with golang-lru's
// simplelru semantics: get moves a key to the front, add updates a key in
// place and moves it to the front, or adds it and drops the least recently
// used key beyond max. It is written here because a precise decision reads
// every record along the prompt (32 for 8k tokens), and simplelru's map
// lookup, list node and value copy per record were an eighth of
// BenchmarkSchedule64. Here a record is one pointer-free node in a slice,
// linked into the LRU list by index, and found by linear probing on the
// key's own bits: keys are already uniformly spread 64-bit hashes.
type recordTable struct {
	max   int
	nodes []recordNode // up to max; a full table reuses its oldest node
	// slots hold 1 + a node's index, 0 when free, at most half full.
	slots []int32
	shift uint8 // 64 - log2(len(slots))
	// head is the most recently used node, tail the least; -1 when empty.
	head, tail int32
}

type recordNode struct {
	key        uint64
	val        specVal
	prev, next int32 // toward head and toward tail, -1 at the ends
}

func newRecordTable(max int) (*recordTable, error) {
	if max < 1 {
		return nil, fmt.Errorf("record table: size %d is not positive", max)
	}
	t := &recordTable{max: max, head: -1, tail: -1}
	t.resize(16)
	return t, nil
}

func (t *recordTable) home(k uint64) int { return int((k * 0x9E3779B97F4A7C15) >> t.shift) }

// find returns the slot holding k, or the free slot where the probe for k
// ended, and k's node (-1 when absent).
func (t *recordTable) find(k uint64) (slot int, node int32) {
	mask := len(t.slots) - 1
	for i := t.home(k); ; i = (i + 1) & mask {
		s := t.slots[i]
		if s == 0 {
			return i, -1
		}
		if t.nodes[s-1].key == k {
			return i, s - 1
		}
	}
}

// get returns k's record (nil when absent, valid until the next add) and
// moves k to the front.
func (t *recordTable) get(k uint64) *specVal {
	_, n := t.find(k)
	if n < 0 {
		return nil
	}
	t.toFront(n)
	return &t.nodes[n].val
}

// add sets k's record and moves k to the front; a new key beyond max
// takes the place of the least recently used one.
func (t *recordTable) add(k uint64, v specVal) {
	slot, n := t.find(k)
	if n >= 0 {
		t.nodes[n].val = v
		t.toFront(n)
		return
	}
	if len(t.nodes) < t.max {
		if 2*(len(t.nodes)+1) > len(t.slots) {
			t.resize(2 * len(t.slots))
			slot, _ = t.find(k)
		}
		t.nodes = append(t.nodes, recordNode{prev: -1, next: -1})
		n = int32(len(t.nodes) - 1)
	} else {
		n = t.tail
		old, _ := t.find(t.nodes[n].key)
		t.deleteSlot(old)
		t.unlink(n)
		slot, _ = t.find(k)
	}
	t.nodes[n].key, t.nodes[n].val = k, v
	t.slots[slot] = n + 1
	t.pushFront(n)
}

// len is how many keys the table holds.
func (t *recordTable) len() int { return len(t.nodes) }

// deleteSlot frees slot i, moving later keys of its probe run back so
// that every key stays reachable from its home (backward-shift deletion).
func (t *recordTable) deleteSlot(i int) {
	mask := len(t.slots) - 1
	for j := (i + 1) & mask; t.slots[j] != 0; j = (j + 1) & mask {
		h := t.home(t.nodes[t.slots[j]-1].key)
		// The key at j may fill i unless its home lies in (i, j].
		if (j-h)&mask >= (j-i)&mask {
			t.slots[i] = t.slots[j]
			i = j
		}
	}
	t.slots[i] = 0
}

// resize rebuilds the slots at size (a power of two) from the nodes.
func (t *recordTable) resize(size int) {
	t.slots = make([]int32, size)
	t.shift = uint8(64 - bits.TrailingZeros(uint(size)))
	for n := range t.nodes {
		slot, _ := t.find(t.nodes[n].key)
		t.slots[slot] = int32(n + 1)
	}
}

func (t *recordTable) toFront(n int32) {
	if t.head == n {
		return
	}
	t.unlink(n)
	t.pushFront(n)
}

func (t *recordTable) unlink(n int32) {
	nd := &t.nodes[n]
	if nd.prev >= 0 {
		t.nodes[nd.prev].next = nd.next
	} else {
		t.head = nd.next
	}
	if nd.next >= 0 {
		t.nodes[nd.next].prev = nd.prev
	} else {
		t.tail = nd.prev
	}
	nd.prev, nd.next = -1, -1
}

func (t *recordTable) pushFront(n int32) {
	nd := &t.nodes[n]
	nd.prev, nd.next = -1, t.head
	if t.head >= 0 {
		t.nodes[t.head].prev = n
	} else {
		t.tail = n
	}
	t.head = n
}

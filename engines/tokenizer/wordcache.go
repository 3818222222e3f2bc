package tokenizer

import (
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/cespare/xxhash/v2"
)

// wordCache maps a pre-tokenized word to its ids. It is direct-mapped and
// lock-free for readers: a slot holds the last word that hashed to it, so
// memory is bounded and a collision only costs a recomputation.
//
// An entry is one allocation without pointers, which the garbage
// collector never scans: a header word (ids<<8 | word length), the ids,
// then the word's bytes. The slots start at minCacheSlots and double,
// up to maxCacheSlots, whenever the words stored reach half of them, so a
// tokenizer that has seen few words holds few slots and a cold cache costs
// no more than its words. TestWordCache keeps it a map within those rules.
type wordCache struct {
	tab  atomic.Pointer[cacheTable]
	grow sync.Mutex // held by the one goroutine growing the table
}

type cacheTable struct {
	slots []atomic.Pointer[uint32]
	n     atomic.Int32 // puts since the table was made
}

const (
	minCacheSlots = 1 << 12
	maxCacheSlots = 1 << 16
)

func newWordCache() *wordCache {
	c := &wordCache{}
	c.tab.Store(&cacheTable{slots: make([]atomic.Pointer[uint32], minCacheSlots)})
	return c
}

// entryWords is the length in uint32s of an entry of n ids and a word of
// nw bytes.
func entryWords(n, nw int) int { return 1 + n + (nw+3)/4 }

func (c *wordCache) get(h uint64, w string) ([]uint32, bool) {
	tab := c.tab.Load()
	p := tab.slots[h&uint64(len(tab.slots)-1)].Load()
	if p == nil {
		return nil, false
	}
	hdr := *p
	n, nw := int(hdr>>8), int(hdr&0xff)
	if nw != len(w) {
		return nil, false
	}
	e := unsafe.Slice(p, entryWords(n, nw))
	if unsafe.String((*byte)(unsafe.Pointer(&e[1+n])), nw) != w {
		return nil, false
	}
	return e[1 : 1+n : 1+n], true
}

// put stores the ids of w (at most maxCachedWord bytes, so at most as many
// ids, as every token has a byte).
func (c *wordCache) put(h uint64, w string, ids []uint32) {
	if len(w) > maxCachedWord || len(ids) > maxCachedWord || len(w) == 0 {
		return
	}
	e := make([]uint32, entryWords(len(ids), len(w)))
	e[0] = uint32(len(ids))<<8 | uint32(len(w))
	copy(e[1:], ids)
	copy(unsafe.Slice((*byte)(unsafe.Pointer(&e[1+len(ids)])), len(w)), w)
	tab := c.tab.Load()
	tab.slots[h&uint64(len(tab.slots)-1)].Store(&e[0])
	if n := int(tab.n.Add(1)); n >= len(tab.slots)/2 && len(tab.slots) < maxCacheSlots && c.grow.TryLock() {
		c.growFrom(tab)
		c.grow.Unlock()
	}
}

// growFrom replaces tab by a table twice its size holding its entries.
// A put into tab while it is copied may be lost, which costs a
// recomputation only.
func (c *wordCache) growFrom(tab *cacheTable) {
	if c.tab.Load() != tab {
		return
	}
	next := &cacheTable{slots: make([]atomic.Pointer[uint32], 2*len(tab.slots))}
	mask := uint64(len(next.slots) - 1)
	kept := int32(0)
	for i := range tab.slots {
		p := tab.slots[i].Load()
		if p == nil {
			continue
		}
		hdr := *p
		n, nw := int(hdr>>8), int(hdr&0xff)
		e := unsafe.Slice(p, entryWords(n, nw))
		w := unsafe.String((*byte)(unsafe.Pointer(&e[1+n])), nw)
		next.slots[cacheHash(w)&mask].Store(p)
		kept++
	}
	next.n.Store(kept)
	c.tab.Store(next)
}

// cacheHash is the hash the cache is indexed by (its low bits), and the
// vocab filter (its high bits).
func cacheHash(w string) uint64 { return xxhash.Sum64String(w) }

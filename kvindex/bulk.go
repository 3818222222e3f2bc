package kvindex

// The index's write path for LoadSnapshot. A snapshot is loaded into a
// fresh index no one else sees yet, one replica after another, and only
// stored into (the budget's evictions drop whole entries). So when a
// replica stores a key, its residency there, if it has one, is the key's
// last: it was appended by this replica's own earlier store and no other
// replica has come since. Store must search the key's residencies for
// the replica, which costs as many comparisons as replicas hold the key
// (every replica holds a shared system prompt's blocks); here it is one
// comparison, and appending needs no walk along the key's chunks either.
// The result is the index Store builds from the same calls
// (TestBulkStoreEqualsStore, TestSnapshotLoadAtScale).

// bulkStore is the state of one snapshot's loading writer.
type bulkStore struct {
	// tails maps an entry with overflow chunks to its last chunk. It is
	// cleared when an eviction may have freed entries or chunks.
	tails     map[int32]int32
	evictions uint64
	// sink keeps the loads of prefetchSlots.
	sink uint32
	// search: a removal, or a replica's stores resumed after another's
	// (LoadSnapshot makes neither), broke the rule, so later stores
	// search as Store does. cur is the replica storing now, seen a bit
	// for every replica that has stored.
	search bool
	cur    Replica
	seen   [1 << 16 / 64]uint64
}

// follows reports whether r may store under the rule: it is the replica
// storing now, or one that has not stored yet.
func (bs *bulkStore) follows(r Replica) bool {
	if r == bs.cur && bs.seen[r/64]&(1<<(r%64)) != 0 {
		return true
	}
	if bs.seen[r/64]&(1<<(r%64)) != 0 {
		return false
	}
	bs.seen[r/64] |= 1 << (r % 64)
	bs.cur = r
	return true
}

// prefetchGroup is how many keys' hash-table slots are read ahead at once:
// the reads are independent, so the CPU has them in flight together
// instead of missing the cache once per key in turn
// (BenchmarkSnapshotLoad).
const prefetchGroup = 16

// writeBulk applies w, stores written replica after replica into a fresh
// index, as Write would, and empties it. After a removal, or once a
// replica stores again after another one did (LoadSnapshot makes
// neither), it stores as Store does (TestBulkStoreAfterRemove).
func (ix *Index) writeBulk(w *Writes, bs *bulkStore) {
	if len(w.ops) == 0 {
		return
	}
	ix.lockToStore(len(w.keys))
	from := 0
	for _, op := range w.ops {
		keys := w.keys[from:op.end]
		from = op.end
		if op.remove {
			ix.removeLocked(op.r, op.t, keys)
			bs.search = true
			continue
		}
		if bs.search = bs.search || !bs.follows(op.r); bs.search {
			ix.storeLocked(op.r, op.t, keys)
			continue
		}
		ix.storeBulkLocked(op.r, op.t, keys, bs)
	}
	ix.mu.Unlock()
	w.Reset()
}

// storeBulkLocked is storeLocked under the rule above.
func (ix *Index) storeBulkLocked(r Replica, t Tier, keys []Key, bs *bulkStore) {
	if t >= NumTiers || len(keys) == 0 {
		return
	}
	if bs.tails == nil {
		bs.tails = make(map[int32]int32)
	}
	if ix.evictions != bs.evictions {
		clear(bs.tails)
		bs.evictions = ix.evictions
	}
	bit := uint8(1) << t
	if int(r) >= len(ix.counts) {
		ix.counts = append(ix.counts, make([]replicaCount, int(r)+1-len(ix.counts))...)
	}
	cnt := &ix.counts[r]
	prev := int32(-1)
	for g := 0; g < len(keys); g += prefetchGroup {
		group := keys[g:min(g+prefetchGroup, len(keys))]
		ix.prefetchSlots(group, bs)
		for _, k := range group {
			if k == 0 {
				continue
			}
			idx := int32(-1)
			if prev >= 0 {
				idx = ix.lookupAfter(k, prev)
			} else {
				idx = ix.lookup(k)
			}
			if idx < 0 {
				idx = ix.insertLocked(k)
				e := ix.entries.at(idx)
				e.res[0], e.n = residency(r)<<8|residency(bit), 1
				ix.changedLocked(idx, e)
				cnt.blocks++
				cnt.byTier[t]++
				ix.residencies++
				prev = idx
				continue
			}
			prev = idx
			ix.moveToTailLocked(idx)
			e := ix.entries.at(idx)
			e.ref &^= refBit
			last := ix.lastRes(idx, e, bs)
			switch {
			case last.replica() != r:
				ix.appendBulkLocked(idx, e, residency(r)<<8|residency(bit), bs)
				cnt.blocks++
				cnt.byTier[t]++
				ix.residencies++
			case last.mask()&bit == 0:
				ix.changedLocked(idx, e)
				v := *last | residency(bit)
				if e.more >= 0 {
					ix.chunks.at(e.more).sig ^= resSig(*last) ^ resSig(v)
				}
				*last = v
				cnt.byTier[t]++
			}
		}
	}
	ix.evictLocked()
}

// prefetchSlots reads the home slot of every key of group.
func (ix *Index) prefetchSlots(group []Key, bs *bulkStore) {
	var acc uint32
	for _, k := range group {
		acc += ix.slots[ix.home(tagOf(k))].tag
	}
	bs.sink += acc
}

// lastChunk returns the last overflow chunk of entry idx, which has one.
func (ix *Index) lastChunk(idx int32, e *entry, bs *bulkStore) int32 {
	if ci, ok := bs.tails[idx]; ok {
		return ci
	}
	ci := e.more
	for c := ix.chunks.at(ci); c.next >= 0; c = ix.chunks.at(ci) {
		ci = c.next
	}
	bs.tails[idx] = ci
	return ci
}

// lastRes returns the last residency of entry idx (e.n > 0).
func (ix *Index) lastRes(idx int32, e *entry, bs *bulkStore) *residency {
	pos := int32(e.n) - 1
	if pos < inlineRes {
		return &e.res[pos]
	}
	return &ix.chunks.at(ix.lastChunk(idx, e, bs)).res[(pos-inlineRes)%chunkRes]
}

// appendBulkLocked is appendResLocked with the last chunk from bs.
func (ix *Index) appendBulkLocked(idx int32, e *entry, v residency, bs *bulkStore) {
	pos, last := int32(e.n), int32(-1)
	if pos > inlineRes {
		last = ix.lastChunk(idx, e, bs)
	}
	ix.appendResLocked(idx, e, v, last)
	switch {
	case pos == inlineRes:
		bs.tails[idx] = e.more
	case pos > inlineRes && (pos-inlineRes)%chunkRes == 0:
		bs.tails[idx] = ix.chunks.at(last).next
	}
}

// Package kvindex owns the router's KV-block index: which replica holds which
// prompt prefix in its KV cache, block by block and tier by tier. It is a pure
// in-memory structure (no network or files, no goroutines, no metric
// registry; Stats is a plain struct the application exports) answering "how
// many leading blocks of this prompt does each replica hold" in
// microseconds. Snapshots (snapshot.go) stream replica states to and from
// the caller's io.Writer and io.Reader, for a starting sibling EPP.
//
// Keys are the router's own (see AppendBlockKeys); ReplicaState translates one
// replica's engine events (engine hashes) into Store and Remove calls.
//
// Concurrency rules:
//   - Index is safe for concurrent use. One sync.RWMutex guards it: Store,
//     Remove and ClearReplica take the write lock; Match, Resident and Stats
//     take the read lock, so lookups run in parallel with each other.
//     Unexported Index methods run with the lock held; those ending in
//     Locked mutate and need the write lock.
//   - A lookup must not serialise readers, so Match does not reorder the LRU
//     list. It only sets bits of a per-entry word with an atomic OR (skipped
//     when already set): a reference bit, and a bit recording that the
//     entry holds the same residencies as the slab entry before it, which
//     lets later walks along a chain skip comparing them (writers clear it
//     on any change to either entry). The writer, when it must evict, gives
//     a referenced entry at the head of the list a second chance: it clears
//     the reference bit and moves the entry to the tail. This is CLOCK-style
//     approximate LRU: stores are ordered exactly, matches promote lazily.
//   - ReplicaState is not safe for concurrent use: one goroutine applies the
//     events of one replica (events of one replica are ordered anyway).
package kvindex

import (
	"errors"
	"math/bits"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/omnious/provider-node/internal/opt"
)

// Replica is a replica's small integer id, assigned by the caller.
type Replica uint16

// Tier is a storage medium of the engine's KV cache. A block held on several
// tiers of one replica counts at its best (lowest) tier.
type Tier uint8

const (
	// TierGPU is device memory: a hit costs nothing.
	TierGPU Tier = iota
	// TierCPU is host memory (vLLM "CPU", SGLang "CPU_PINNED"): a hit costs a copy.
	TierCPU
	// TierStorage is anything slower: "DISK", "STORAGE", "FS", "OBJ",
	// "EXTERNAL" and unknown media.
	TierStorage
	// NumTiers is the number of tiers; ByTier arrays are indexed by Tier.
	NumTiers = 3
)

// Config configures an Index. The zero value is usable; WithDefaults fills
// every zero field, and Validate refuses a negative one.
type Config struct {
	// MemoryBudget bounds Stats.Bytes, the exact accounting of the index's
	// live structures. Above it the least recently touched keys are evicted.
	// Default 256 MiB (about 4 million keys).
	MemoryBudget int64
	// MaxReplicaBlocks bounds the engine-hash map of one ReplicaState. A
	// replica whose map grows past it has lost removal events; its state is
	// dropped (see ReplicaStats.Overflows). Default 4,194,304.
	MaxReplicaBlocks int
}

// Defaults of Config.
const (
	DefaultMemoryBudget     = 256 << 20
	DefaultMaxReplicaBlocks = 1 << 22
)

// WithDefaults returns c with every unset field at its default.
func (c Config) WithDefaults() Config {
	opt.Zero(&c.MemoryBudget, DefaultMemoryBudget)
	opt.Zero(&c.MaxReplicaBlocks, DefaultMaxReplicaBlocks)
	return c
}

// Validate refuses a negative field of a defaulted config, named as the
// EPP's YAML names it (index.memory_budget).
func (c Config) Validate() error {
	return errors.Join(opt.DefaultNonNegative("index.memory_budget", c.MemoryBudget, DefaultMemoryBudget),
		opt.DefaultNonNegative("MaxReplicaBlocks", c.MaxReplicaBlocks, DefaultMaxReplicaBlocks))
}

// Match is one replica's result for a lookup.
type Match struct {
	Replica Replica
	// Blocks is the number of consecutive leading blocks the replica holds on
	// any tier.
	Blocks int
	// ByTier splits Blocks by the best tier each block is held on; the caller
	// weights them (a CPU hit is worth less than a GPU hit).
	ByTier [NumTiers]int
	// pos is where the replica sat in the previous block's residency list:
	// consecutive blocks of a chain usually list replicas in the same order,
	// so it is checked first.
	pos int32
	// tier is the replica's best tier on the last key examined.
	tier uint8
	// seen is the replica's tier mask in the key being examined, while a
	// change of residencies is resolved through matchState.ids.
	seen uint8
}

// Stats is a snapshot of the index's counters.
type Stats struct {
	// Keys is the number of distinct blocks indexed.
	Keys int
	// Residencies is the number of (block, replica) pairs.
	Residencies int
	// Bytes is the exact accounting of live structures, compared against
	// Config.MemoryBudget: 8 bytes per hash-table slot, 48 per key, 40 per
	// overflow chunk (one per 7 residencies beyond a key's first 5) and 16
	// per replica id up to the highest seen.
	Bytes int64
	// AllocatedBytes is what the structures hold including free slab slots
	// and free lists (freed memory is reused, never returned).
	AllocatedBytes int64
	// Evictions counts keys dropped to stay within MemoryBudget.
	Evictions uint64
	// Lookups counts Match calls.
	Lookups uint64
}

const (
	// inlineRes residencies live in the entry itself: most blocks are held by
	// a few replicas. More spill into chunks of chunkRes.
	inlineRes = 5
	chunkRes  = 7
	// minSlots is the initial hash-table size.
	minSlots = 1024
)

// residency packs a replica and its tier bitmask: replica<<8 | mask. The mask
// is never 0 for a live residency, so 0 means empty.
type residency uint32

func (v residency) replica() Replica { return Replica(v >> 8) }
func (v residency) mask() uint8      { return uint8(v) }

// entry is one key. It is 48 bytes; with its share of the table and two
// residencies per key that is about 32 bytes per residency.
type entry struct {
	key Key // 0 when the slot is free
	// prev and next link the LRU list (head = least recently touched).
	prev, next int32
	// more is the first overflow chunk, -1 if none.
	more int32
	n    uint32 // residencies
	// ref holds refBit, set (atomically, under the read lock) by Match,
	// see package comment; and sameBit: Match found this entry to hold the
	// same residencies as the slab entry before it, which stays true
	// until either changes (changedLocked clears it).
	ref uint32
	res [inlineRes]residency
}

// Bits of entry.ref.
const (
	refBit  = 1
	sameBit = 2
)

type chunk struct {
	res  [chunkRes]residency
	next int32
	// sig, kept in a key's first chunk only, is the XOR of resSig over all
	// the key's residencies. Blocks of a long shared prefix are held by the
	// same, often many, replicas; equal signatures let Match step over
	// them in O(1) instead of comparing every residency.
	sig uint64
}

// resSig spreads a residency over 64 bits (SplitMix64's finaliser, a
// bijection), so that the XOR of a set's signatures differs between sets
// except with probability about 2^-64; a false match would only credit a
// prefix run to the wrong replicas, never corrupt the index.
func resSig(v residency) uint64 {
	z := uint64(v) * 0x9e3779b97f4a7c15
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return z ^ z>>31
}

type replicaCount struct {
	blocks int32
	byTier [NumTiers]int32
}

// Sizes used by Stats.Bytes.
const (
	entryBytes = int64(unsafe.Sizeof(entry{}))
	chunkBytes = int64(unsafe.Sizeof(chunk{}))
	slotBytes  = int64(unsafe.Sizeof(slot{}))
	countBytes = int64(unsafe.Sizeof(replicaCount{}))
)

// Index is the KV-block index. The LRU is written here rather than taken from
// hashicorp/golang-lru: measured with 1M uint64 keys and an 8-byte value, that
// package costs 118 heap bytes per key (a map entry plus a pointer-rich list
// node, all scanned by the GC) before any residency is stored, against the
// 64 B per residency target; and it reorders on every Get, which would put
// the write lock on the lookup path. Here a key is one 48-byte pointer-free
// slab entry plus 8-byte open-addressing slots at load 0.31-0.625, linked into
// the LRU list by int32 indices: 65 heap bytes per key in BenchmarkIndexMemory.
type Index struct {
	cfg Config

	mu sync.RWMutex
	// slots is a linear-probing hash table indexed by Fibonacci hashing,
	// kept at load <= 5/8: linear probing's miss cost climbs steeply beyond.
	slots []slot
	// next is the table to grow into, allocated by Store outside the lock.
	next  []slot
	shift uint8 // 32 - log2(len(slots))

	entries slab[entry]
	chunks  slab[chunk]
	// head and tail of the LRU list, -1 when empty.
	head, tail int32

	counts      []replicaCount
	keys        int
	residencies int
	liveChunks  int
	evictions   uint64
	lookups     atomic.Uint64
	// idPool holds replica-id tables for Match (see resolveByID).
	idPool sync.Pool
}

// New returns an empty index. It panics on a config Validate refuses
// (a negative field): callers validate their config first, as the EPP's
// Validate does.
func New(cfg Config) *Index {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		panic("kvindex.New: " + err.Error())
	}
	ix := &Index{cfg: cfg, head: -1, tail: -1}
	ix.resetTableLocked(minSlots)
	return ix
}

// Store records that replica r holds keys on tier t and marks them recently
// used. Storing a block already held on another tier adds the tier. Key 0 and
// tiers >= NumTiers are ignored. It may evict to stay within the budget.
func (ix *Index) Store(r Replica, t Tier, keys []Key) {
	if t >= NumTiers || len(keys) == 0 {
		return
	}
	ix.lockToStore(len(keys))
	defer ix.mu.Unlock()
	ix.storeLocked(r, t, keys)
}

// lockToStore takes the write lock for storing n keys. When they may grow
// the hash table, the next table is allocated and faulted in without the
// lock first, so that lookups wait only for the rehash (page faults for
// tens of MB take ~100 ms on some VMs).
func (ix *Index) lockToStore(n int) {
	ix.mu.Lock()
	if n := ix.growTargetLocked(n); n > 0 {
		ix.mu.Unlock()
		next := newTable(n)
		ix.mu.Lock()
		if ix.next == nil && len(ix.slots)*2 == n {
			ix.next = next
		}
	}
}

func (ix *Index) storeLocked(r Replica, t Tier, keys []Key) {
	if t >= NumTiers || len(keys) == 0 {
		return
	}
	bit := uint8(1) << t
	if int(r) >= len(ix.counts) {
		ix.counts = append(ix.counts, make([]replicaCount, int(r)+1-len(ix.counts))...)
	}
	cnt := &ix.counts[r]
	for _, k := range keys {
		if k == 0 {
			continue
		}
		idx := ix.lookup(k)
		if idx < 0 {
			idx = ix.insertLocked(k)
		} else {
			ix.moveToTailLocked(idx)
		}
		e := ix.entries.at(idx)
		e.ref &^= refBit
		pos, mask, last := ix.findResLast(e, r)
		switch {
		case pos < 0:
			ix.appendResLocked(idx, e, residency(r)<<8|residency(bit), last)
			cnt.blocks++
			cnt.byTier[t]++
			ix.residencies++
		case mask&bit == 0:
			ix.setResLocked(idx, e, pos, residency(r)<<8|residency(mask|bit))
			cnt.byTier[t]++
		}
	}
	ix.evictLocked()
}

// Remove records that replica r no longer holds keys on tier t. A key no
// replica holds any more is dropped.
func (ix *Index) Remove(r Replica, t Tier, keys []Key) {
	if t >= NumTiers || len(keys) == 0 {
		return
	}
	ix.mu.Lock()
	defer ix.mu.Unlock()
	ix.removeLocked(r, t, keys)
}

func (ix *Index) removeLocked(r Replica, t Tier, keys []Key) {
	if t >= NumTiers || int(r) >= len(ix.counts) {
		return
	}
	bit := uint8(1) << t
	for _, k := range keys {
		if k == 0 {
			continue
		}
		idx := ix.lookup(k)
		if idx < 0 {
			continue
		}
		e := ix.entries.at(idx)
		pos, mask := ix.findRes(e, r)
		if pos < 0 || mask&bit == 0 {
			continue
		}
		if mask == bit {
			ix.removeResLocked(idx, e, pos)
		} else {
			ix.setResLocked(idx, e, pos, residency(r)<<8|residency(mask&^bit))
			ix.counts[r].byTier[t]--
		}
	}
}

// Writes is a list of Store and Remove calls, of one replica or several,
// that Index.Write applies in order under as few holds of the write lock
// as it can: one writer applying many replicas' events collects them here
// (ReplicaState.ApplyBatchTo) instead of taking the lock per event, and
// computes their keys outside it. The zero value is empty and ready.
type Writes struct {
	ops  []writeOp
	keys []Key
}

// writeOp is one Store or Remove; its keys end at Writes.keys[end].
type writeOp struct {
	end    int
	r      Replica
	t      Tier
	remove bool
}

func (w *Writes) add(r Replica, t Tier, remove bool, keys []Key) {
	if t >= NumTiers || len(keys) == 0 {
		return
	}
	w.keys = append(w.keys, keys...)
	w.ops = append(w.ops, writeOp{end: len(w.keys), r: r, t: t, remove: remove})
}

// Len returns the number of keys the pending calls carry.
func (w *Writes) Len() int { return len(w.keys) }

// Reset empties w, keeping its memory.
func (w *Writes) Reset() { w.ops, w.keys = w.ops[:0], w.keys[:0] }

// writeHold bounds the keys one hold of the write lock applies in Write,
// so that lookups wait at most for about this many key updates (tens of
// microseconds) while a large Writes is applied.
const writeHold = 1024

// Write applies w's calls in order, as Store and Remove would one by one,
// and empties w. The lock is released between calls every writeHold keys;
// a reader may then see some of w applied and not the rest, as it could
// between separate calls.
func (ix *Index) Write(w *Writes) {
	if len(w.ops) == 0 {
		return
	}
	stores := 0
	from := 0
	for _, op := range w.ops {
		if !op.remove {
			stores += op.end - from
		}
		from = op.end
	}
	ix.lockToStore(stores)
	held, from := 0, 0
	for i, op := range w.ops {
		keys := w.keys[from:op.end]
		from = op.end
		if op.remove {
			ix.removeLocked(op.r, op.t, keys)
		} else {
			ix.storeLocked(op.r, op.t, keys)
		}
		if held += len(keys); held >= writeHold && i+1 < len(w.ops) {
			ix.mu.Unlock()
			ix.mu.Lock()
			held = 0
		}
	}
	ix.mu.Unlock()
	w.Reset()
}

// ClearReplica drops every residency of replica r (engine restart, replica
// left the pool). It is one pass over every key under the write lock
// (milliseconds per million keys), meant for rare events; ReplicaState drops a
// replica by its own block list instead.
func (ix *Index) ClearReplica(r Replica) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	if int(r) >= len(ix.counts) || ix.counts[r].blocks == 0 {
		return
	}
	for i := int32(0); i < ix.entries.used && ix.counts[r].blocks > 0; i++ {
		e := ix.entries.at(i)
		if e.key == 0 {
			continue
		}
		if pos, _ := ix.findRes(e, r); pos >= 0 {
			ix.removeResLocked(i, e, pos)
		}
	}
	ix.counts[r] = replicaCount{}
}

// Match returns, for each replica holding keys[0], the length of its longest
// consecutive run of keys from the start, split by tier. The walk stops at the
// first key no remaining replica holds. Results are appended to out[:0] in no
// particular order; it does not allocate when out has capacity for every
// replica holding keys[0].
func (ix *Index) Match(keys []Key, out []Match) []Match {
	st := matchState{out: out[:0]}
	if len(keys) == 0 {
		return st.out
	}
	ix.lookups.Add(1)
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	ix.matchFirst(&st, keys[0])
	pages := ix.entries.pages
	// idx and run are st.idx and st.run, kept in registers on the fast
	// path and written back for the slow one.
	idx, run := st.idx, 0
	for i := 1; i < len(keys) && !st.done; {
		// The common case, inline, through a page of entries at a time:
		// the next key is in the entry after the previous one (see
		// lookupAfter) and that entry has the same residencies, which an
		// earlier walk may have recorded in its sameBit. Entries past
		// the slab's end are zero, and no key is 0.
		if p := int(idx+1) >> pageShift; p < len(pages) {
			// The rest of the page beside as many keys, so that the loop
			// has one counter and no bounds checks.
			j := int(idx+1) & pageMask
			es := pages[p][j:min(pageSize, j+len(keys)-i)]
			ks := keys[i : i+len(es)]
			t := 0
			for {
				// Entries already marked, in a loop small enough for
				// registers; a free or unused entry has ref 0. Two at a
				// time first: ref holds only refBit and sameBit, so the
				// AND of two is refBit|sameBit when both are.
				for ; t+1 < len(es) && t+1 < len(ks); t += 2 {
					if es[t].key != ks[t] {
						break
					}
					if es[t+1].key != ks[t+1] {
						break
					}
					if atomic.LoadUint32(&es[t].ref)&atomic.LoadUint32(&es[t+1].ref) != refBit|sameBit {
						break
					}
				}
				for ; t < len(es) && t < len(ks); t++ {
					if es[t].key != ks[t] {
						break
					}
					if atomic.LoadUint32(&es[t].ref) != refBit|sameBit {
						break
					}
				}
				if t == len(es) || !ix.extends(&es[t], ks[t], &st) {
					break
				}
				t++
			}
			i, j, run = i+t, j+t, run+t
			idx = int32(p)<<pageShift + int32(j) - 1
			if j == pageSize || i == len(keys) {
				continue
			}
		}
		st.idx, st.run = idx, run
		ix.matchNext(&st, keys[i])
		idx, run = st.idx, st.run
		i++
	}
	st.run = run
	ix.releaseIDs(&st)
	return st.finish()
}

// extends reports whether e, the entry after the last one examined, holds
// k with the same residencies, and marks it (see Match).
func (ix *Index) extends(e *entry, k Key, st *matchState) bool {
	if e.key != k || k == 0 {
		return false
	}
	ref := atomic.LoadUint32(&e.ref)
	if ref&sameBit == 0 && !ix.sameRes(e, st) {
		return false
	}
	if ref != refBit|sameBit {
		atomic.OrUint32(&e.ref, refBit|sameBit)
	}
	return true
}

// matchState is one walk of Match. out[:active] are the replicas still
// extending their run.
type matchState struct {
	out    []Match
	active int
	// idx is the entry of the last key examined, and n, res and sig its
	// residency count, inline residencies and set signature (n >
	// inlineRes), copied so that comparing the next entry with it reads
	// the next entry only.
	idx int32
	n   uint32
	res [inlineRes]residency
	sig uint64
	// run counts keys since idx whose residency lists equal its: every
	// active replica extends over them at the tier it had there, so they
	// are credited in one step. Chains stored by the same replicas in the
	// same order (the common case) cost one comparison per key this way.
	run  int
	done bool
	// ids maps a replica id to 1 + its index in out (0: none), built on
	// the first change of residencies too large to resolve by scanning
	// (see matchNext); nil until then.
	ids *[]int32
}

// scanLimit bounds active replicas times residencies for resolving a change
// of residencies by scanning; above it matchNext goes through ids, which
// costs a pass over both lists instead of one over the entry per replica.
const scanLimit = 64

func (ix *Index) matchFirst(st *matchState, k Key) {
	idx := ix.lookup(k)
	if idx < 0 {
		st.done = true
		return
	}
	e := ix.entries.at(idx)
	touch(e)
	out := st.out
	// The residencies in order: the inline ones, then chunk by chunk.
	n, p, res, ci := int32(e.n), int32(0), e.res[:min(e.n, inlineRes)], e.more
	for {
		for _, v := range res {
			// Filled in place: a Match built on the stack and copied is
			// written in small stores and read back in wide ones, which
			// the CPU cannot forward, a stall per replica.
			out = append(out, Match{})
			m := &out[len(out)-1]
			t := uint8(bits.TrailingZeros8(v.mask()))
			m.Replica, m.Blocks, m.pos, m.tier = v.replica(), 1, p, t
			m.ByTier[t] = 1
			p++
		}
		if ci < 0 || p >= n {
			break
		}
		c := ix.chunks.at(ci)
		res, ci = c.res[:min(n-p, chunkRes)], c.next
	}
	st.out, st.active = out, len(out)
	ix.setPrev(st, idx, e)
}

func (ix *Index) setPrev(st *matchState, idx int32, e *entry) {
	st.idx, st.n, st.res = idx, e.n, e.res
	if e.more >= 0 {
		st.sig = ix.chunks.at(e.more).sig
	}
}

func (ix *Index) matchNext(st *matchState, k Key) {
	idx := ix.lookupAfter(k, st.idx)
	if idx < 0 {
		st.done = true
		return
	}
	e := ix.entries.at(idx)
	touch(e)
	if ix.sameRes(e, st) {
		st.idx = idx
		st.run++
		return
	}
	st.credit()
	ix.setPrev(st, idx, e)
	// Once built, ids must follow every reordering of out: keep using it.
	if st.ids != nil || st.active*int(e.n) > scanLimit {
		ix.resolveByID(st, e)
		return
	}
	n := int32(e.n)
	out, active := st.out, st.active
	for j := 0; j < active; {
		m := &out[j]
		var mask uint8
		// Fast path: the replica sits where it sat in the previous key.
		if p := m.pos; p < inlineRes && p < n && e.res[p].replica() == m.Replica {
			mask = e.res[p].mask()
		} else {
			mask = ix.maskAt(e, m)
		}
		if mask == 0 {
			active--
			out[j], out[active] = out[active], out[j]
			continue
		}
		m.tier = uint8(bits.TrailingZeros8(mask))
		m.Blocks++
		m.ByTier[m.tier]++
		j++
	}
	st.active = active
	st.done = active == 0
}

// resolveByID is matchNext's step for a large change of residencies: one
// pass over e marks the active replicas it holds, found through st.ids, and
// one pass over them extends those and drops the others.
func (ix *Index) resolveByID(st *matchState, e *entry) {
	out, active := st.out, st.active
	if st.ids == nil {
		st.ids = ix.getIDs()
		ids := *st.ids
		for j := range out[:active] {
			ids[out[j].Replica] = int32(j + 1)
		}
	}
	ids := *st.ids
	// e's residencies in order, as in matchFirst.
	n, p, res, ci := int32(e.n), int32(0), e.res[:min(e.n, inlineRes)], e.more
	for {
		for _, v := range res {
			if j := int(ids[v.replica()]) - 1; j >= 0 && j < active {
				out[j].seen, out[j].pos = v.mask(), p
			}
			p++
		}
		if ci < 0 || p >= n {
			break
		}
		c := ix.chunks.at(ci)
		res, ci = c.res[:min(n-p, chunkRes)], c.next
	}
	// The replicas e holds to the front, the others after: scanning from
	// both ends swaps only those out of place, not every one dropped (a
	// shared prefix that ends drops most of them at once).
	lo, hi := 0, active
	for lo < hi {
		if out[lo].seen != 0 {
			lo++
			continue
		}
		if hi--; out[hi].seen != 0 {
			out[lo], out[hi] = out[hi], out[lo]
			ids[out[lo].Replica], ids[out[hi].Replica] = int32(lo+1), int32(hi+1)
			lo++
		}
	}
	for j := range out[:lo] {
		m := &out[j]
		m.tier = uint8(bits.TrailingZeros8(m.seen))
		m.seen = 0
		m.Blocks++
		m.ByTier[m.tier]++
	}
	st.active = lo
	st.done = lo == 0
}

// getIDs returns a zeroed replica-id table for every replica id the index
// has seen; releaseIDs zeroes the entries a walk set and pools it again.
func (ix *Index) getIDs() *[]int32 {
	if p, ok := ix.idPool.Get().(*[]int32); ok && len(*p) >= len(ix.counts) {
		return p
	}
	ids := make([]int32, len(ix.counts))
	return &ids
}

func (ix *Index) releaseIDs(st *matchState) {
	if st.ids == nil {
		return
	}
	ids := *st.ids
	for _, m := range st.out {
		ids[m.Replica] = 0
	}
	ix.idPool.Put(st.ids)
	st.ids = nil
}

func (st *matchState) finish() []Match {
	st.credit()
	return st.out
}

// credit applies the pending run to the active replicas.
func (st *matchState) credit() {
	if st.run == 0 {
		return
	}
	for j := range st.out[:st.active] {
		m := &st.out[j]
		m.Blocks += st.run
		m.ByTier[m.tier] += st.run
	}
	st.run = 0
}

// sameRes reports whether e holds the same residencies as the entry st
// last recorded: for up to inlineRes, listed in the same order (compared
// with XOR/OR rather than array equality, which the compiler turns into a
// memequal call); beyond, as the same set, by signature.
func (ix *Index) sameRes(e *entry, st *matchState) bool {
	if e.n != st.n {
		return false
	}
	if e.more >= 0 {
		return ix.chunks.at(e.more).sig == st.sig
	}
	return (e.res[0]^st.res[0])|(e.res[1]^st.res[1])|(e.res[2]^st.res[2])|
		(e.res[3]^st.res[3])|(e.res[4]^st.res[4]) == 0
}

// Resident returns how many blocks replica r holds on any tier.
func (ix *Index) Resident(r Replica) int {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	if int(r) >= len(ix.counts) {
		return 0
	}
	return int(ix.counts[r].blocks)
}

// Stats returns a snapshot of the counters.
func (ix *Index) Stats() Stats {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	return Stats{
		Keys:        ix.keys,
		Residencies: ix.residencies,
		Bytes:       ix.accountedBytes(),
		AllocatedBytes: int64(len(ix.slots)+len(ix.next))*slotBytes +
			ix.entries.allocatedBytes(entryBytes) + ix.chunks.allocatedBytes(chunkBytes) +
			int64(cap(ix.counts))*countBytes,
		Evictions: ix.evictions,
		Lookups:   ix.lookups.Load(),
	}
}

func (ix *Index) accountedBytes() int64 {
	return int64(len(ix.slots))*slotBytes + int64(ix.keys)*entryBytes +
		int64(ix.liveChunks)*chunkBytes + int64(len(ix.counts))*countBytes
}

// touch marks e as used by a lookup. Loading first keeps hot entries' cache
// lines shared between readers.
func touch(e *entry) {
	if atomic.LoadUint32(&e.ref)&refBit == 0 {
		atomic.OrUint32(&e.ref, refBit)
	}
}

// changedLocked records that entry idx's residencies changed: whatever
// Match learned about it and its successor being equal no longer holds.
func (ix *Index) changedLocked(idx int32, e *entry) {
	e.ref &^= sameBit
	if next := idx + 1; next < ix.entries.used {
		ix.entries.at(next).ref &^= sameBit
	}
}

// maskAt returns m's replica's tier mask in e (0 if absent), checking the
// position it had in the previous entry first.
func (ix *Index) maskAt(e *entry, m *Match) uint8 {
	if m.pos < int32(e.n) {
		if v := *ix.resPtr(e, m.pos); v.replica() == m.Replica {
			return v.mask()
		}
	}
	pos, mask := ix.findRes(e, m.Replica)
	if pos >= 0 {
		m.pos = pos
	}
	return mask
}

// evictLocked drops least recently touched keys until the budget holds.
// Every entry gets at most one second chance per pass, so it terminates.
func (ix *Index) evictLocked() {
	for ix.head >= 0 && ix.accountedBytes() > ix.cfg.MemoryBudget {
		idx := ix.head
		e := ix.entries.at(idx)
		if e.ref&refBit != 0 {
			e.ref &^= refBit
			ix.moveToTailLocked(idx)
			continue
		}
		for e.n > 0 {
			ix.removeResLocked(idx, e, int32(e.n)-1)
		}
		ix.evictions++
	}
}

// --- residencies ---

// resPtr returns the residency at position pos < e.n.
func (ix *Index) resPtr(e *entry, pos int32) *residency {
	if pos < inlineRes {
		return &e.res[pos]
	}
	pos -= inlineRes
	c := ix.chunks.at(e.more)
	for pos >= chunkRes {
		c = ix.chunks.at(c.next)
		pos -= chunkRes
	}
	return &c.res[pos]
}

// findRes returns r's position and tier mask in e, or -1.
func (ix *Index) findRes(e *entry, r Replica) (int32, uint8) {
	n := int32(e.n)
	for p := int32(0); p < min(n, inlineRes); p++ {
		if v := e.res[p]; v.replica() == r {
			return p, v.mask()
		}
	}
	p := int32(inlineRes)
	for ci := e.more; ci >= 0 && p < n; {
		c := ix.chunks.at(ci)
		for _, v := range c.res {
			if p >= n {
				break
			}
			if v.replica() == r {
				return p, v.mask()
			}
			p++
		}
		ci = c.next
	}
	return -1, 0
}

// findResLast is findRes that also returns e's last chunk (-1 if it has
// none) when r is not found: the search has just walked to it, so
// appendResLocked need not walk the chain again (BenchmarkStoreShared).
func (ix *Index) findResLast(e *entry, r Replica) (int32, uint8, int32) {
	n := int32(e.n)
	for p := int32(0); p < min(n, inlineRes); p++ {
		if v := e.res[p]; v.replica() == r {
			return p, v.mask(), -1
		}
	}
	p, last := int32(inlineRes), int32(-1)
	for ci := e.more; ci >= 0 && p < n; {
		c := ix.chunks.at(ci)
		for _, v := range c.res[:min(n-p, chunkRes)] {
			if v.replica() == r {
				return p, v.mask(), -1
			}
			p++
		}
		last, ci = ci, c.next
	}
	return -1, 0, last
}

// appendResLocked appends v to e's residencies. last is e's last chunk
// if the caller knows it (findResLast), else -1.
func (ix *Index) appendResLocked(idx int32, e *entry, v residency, last int32) {
	ix.changedLocked(idx, e)
	pos := int32(e.n)
	if pos > inlineRes && last < 0 {
		for last = e.more; ix.chunks.at(last).next >= 0; {
			last = ix.chunks.at(last).next
		}
	}
	switch {
	case pos < inlineRes:
		e.res[pos] = v
	case (pos-inlineRes)%chunkRes == 0:
		ci := ix.chunks.alloc()
		c := ix.chunks.at(ci)
		c.next, c.res[0] = -1, v
		ix.liveChunks++
		if pos == inlineRes {
			e.more = ci
		} else {
			ix.chunks.at(last).next = ci
		}
	default:
		ix.chunks.at(last).res[(pos-inlineRes)%chunkRes] = v
	}
	e.n++
	switch {
	case pos == inlineRes: // first chunk: sign the whole set
		sig := resSig(v)
		for _, w := range e.res {
			sig ^= resSig(w)
		}
		ix.chunks.at(e.more).sig = sig
	case pos > inlineRes:
		ix.chunks.at(e.more).sig ^= resSig(v)
	}
}

// setResLocked replaces the residency at pos (a tier mask change), keeping
// the signature.
func (ix *Index) setResLocked(idx int32, e *entry, pos int32, v residency) {
	ix.changedLocked(idx, e)
	p := ix.resPtr(e, pos)
	if e.more >= 0 {
		ix.chunks.at(e.more).sig ^= resSig(*p) ^ resSig(v)
	}
	*p = v
}

// removeResLocked removes the residency at pos (moving the last one into its
// place), updates the replica's counts and drops the entry when it is empty.
func (ix *Index) removeResLocked(idx int32, e *entry, pos int32) {
	ix.changedLocked(idx, e)
	v := *ix.resPtr(e, pos)
	cnt := &ix.counts[v.replica()]
	cnt.blocks--
	for m := v.mask(); m != 0; m &= m - 1 {
		cnt.byTier[bits.TrailingZeros8(m)]--
	}
	if e.more >= 0 {
		ix.chunks.at(e.more).sig ^= resSig(v)
	}
	last := int32(e.n) - 1
	lp := ix.resPtr(e, last)
	*ix.resPtr(e, pos) = *lp
	*lp = 0
	e.n--
	ix.residencies--
	if last >= inlineRes && (last-inlineRes)%chunkRes == 0 {
		// The last chunk is now empty: unlink and free it.
		ix.liveChunks--
		if last == inlineRes {
			ix.chunks.release(e.more)
			e.more = -1
		} else {
			prev := ix.chunks.at(e.more)
			for ix.chunks.at(prev.next).next >= 0 {
				prev = ix.chunks.at(prev.next)
			}
			ix.chunks.release(prev.next)
			prev.next = -1
		}
	}
	if e.n == 0 {
		ix.dropEntryLocked(idx, e)
	}
}

// --- entries, LRU list and hash table ---

func (ix *Index) insertLocked(k Key) int32 {
	if (ix.keys+1)*8 > len(ix.slots)*5 {
		ix.growLocked()
	}
	idx := ix.entries.alloc()
	e := ix.entries.at(idx)
	e.key, e.more, e.prev, e.next = k, -1, ix.tail, -1
	if ix.tail >= 0 {
		ix.entries.at(ix.tail).next = idx
	} else {
		ix.head = idx
	}
	ix.tail = idx
	ix.placeLocked(slot{tag: tagOf(k), idx: idx + 1})
	ix.keys++
	return idx
}

func (ix *Index) dropEntryLocked(idx int32, e *entry) {
	ix.unlinkLocked(idx, e)
	ix.deleteSlotLocked(e.key, idx)
	*e = entry{}
	ix.entries.release(idx)
	ix.keys--
}

func (ix *Index) unlinkLocked(idx int32, e *entry) {
	if e.prev >= 0 {
		ix.entries.at(e.prev).next = e.next
	} else {
		ix.head = e.next
	}
	if e.next >= 0 {
		ix.entries.at(e.next).prev = e.prev
	} else {
		ix.tail = e.prev
	}
	e.prev, e.next = -1, -1
}

func (ix *Index) moveToTailLocked(idx int32) {
	if idx == ix.tail {
		return
	}
	e := ix.entries.at(idx)
	ix.unlinkLocked(idx, e)
	e.prev = ix.tail
	ix.entries.at(ix.tail).next = idx
	ix.tail = idx
}

// slot is one hash-table cell: the top 32 bits of the key's Fibonacci hash
// and the entry index+1 (0 = empty). Keeping the hash bits in the table lets
// probes skip foreign entries and lets growth and deletion find home slots
// without reading entries, which would be a cache miss per key.
type slot struct {
	tag uint32
	idx int32
}

func tagOf(k Key) uint32 { return uint32((uint64(k) * 0x9E3779B97F4A7C15) >> 32) }

// home is the slot a tag hashes to: its top log2(len(slots)) bits.
func (ix *Index) home(tag uint32) int { return int(tag >> ix.shift) }

// lookupAfter is lookup for the key that follows entry prev in a chain.
// Store allocates the new keys of a chain one after the other, so the
// entry after prev is tried first: a hit there costs one read of memory
// the walk is about to need anyway, instead of a probe of the table. The
// key comparison makes it exact (free entries hold key 0, which no lookup
// asks for).
func (ix *Index) lookupAfter(k Key, prev int32) int32 {
	if next := prev + 1; next < ix.entries.used && k != 0 && ix.entries.at(next).key == k {
		return next
	}
	return ix.lookup(k)
}

// lookup returns k's entry index or -1.
func (ix *Index) lookup(k Key) int32 {
	mask := len(ix.slots) - 1
	tag := tagOf(k)
	for h := ix.home(tag); ; h = (h + 1) & mask {
		s := ix.slots[h]
		if s.idx == 0 {
			return -1
		}
		if s.tag == tag && ix.entries.at(s.idx-1).key == k {
			return s.idx - 1
		}
	}
}

func (ix *Index) placeLocked(s slot) {
	mask := len(ix.slots) - 1
	h := ix.home(s.tag)
	for ix.slots[h].idx != 0 {
		h = (h + 1) & mask
	}
	ix.slots[h] = s
}

// deleteSlotLocked removes entry idx with backward-shift deletion, which
// keeps linear probing free of tombstones.
func (ix *Index) deleteSlotLocked(k Key, idx int32) {
	mask := len(ix.slots) - 1
	i := ix.home(tagOf(k))
	for ix.slots[i].idx != idx+1 {
		i = (i + 1) & mask
	}
	for j := (i + 1) & mask; ix.slots[j].idx != 0; j = (j + 1) & mask {
		h := ix.home(ix.slots[j].tag)
		// The slot at j may fill the hole at i unless its home lies
		// cyclically in (i, j].
		var stays bool
		if i <= j {
			stays = i < h && h <= j
		} else {
			stays = i < h || h <= j
		}
		if !stays {
			ix.slots[i] = ix.slots[j]
			i = j
		}
	}
	ix.slots[i] = slot{}
}

func (ix *Index) resetTableLocked(n int) {
	if len(ix.next) == n {
		ix.slots = ix.next
	} else {
		ix.slots = newTable(n)
	}
	ix.next = nil
	ix.shift = uint8(32 - bits.TrailingZeros(uint(n)))
}

// growTargetLocked returns the next table size if storing n more keys may
// grow the table and it is not prepared yet, else 0.
func (ix *Index) growTargetLocked(n int) int {
	if ix.next != nil || (ix.keys+n)*8 <= len(ix.slots)*5 {
		return 0
	}
	return 2 * len(ix.slots)
}

// newTable allocates a table and writes one slot per 4 KiB page so that the
// page faults happen here rather than under the lock.
func newTable(n int) []slot {
	t := make([]slot, n)
	for i := 0; i < n; i += 4096 / int(slotBytes) {
		t[i] = slot{}
	}
	return t
}

// growLocked doubles the table under the write lock, a pause (about 10 ms
// for 2M keys once Store has prepared ix.next) that happens log2(keys) times
// as the index fills. Old slots are read in order and, since a slot's home
// doubles, written nearly in order, without touching entries.
func (ix *Index) growLocked() {
	old := ix.slots
	ix.resetTableLocked(2 * len(old))
	for _, s := range old {
		if s.idx != 0 {
			ix.placeLocked(s)
		}
	}
}

// --- slab ---

const (
	pageShift = 10
	pageSize  = 1 << pageShift
	pageMask  = pageSize - 1
)

// slab is a paged array addressed by int32: pages never move, so growth
// copies no entries and pointers into it stay valid; freed slots are reused.
type slab[T any] struct {
	pages []*[pageSize]T
	used  int32 // slots ever handed out
	free  []int32
}

func (s *slab[T]) at(i int32) *T { return &s.pages[i>>pageShift][i&pageMask] }

func (s *slab[T]) alloc() int32 {
	if n := len(s.free); n > 0 {
		i := s.free[n-1]
		s.free = s.free[:n-1]
		return i
	}
	if int(s.used) == len(s.pages)<<pageShift {
		s.pages = append(s.pages, new([pageSize]T))
	}
	s.used++
	return s.used - 1
}

func (s *slab[T]) release(i int32) {
	var zero T
	*s.at(i) = zero
	s.free = append(s.free, i)
}

func (s *slab[T]) allocatedBytes(elem int64) int64 {
	return int64(len(s.pages))*pageSize*elem + int64(cap(s.free))*4 + int64(cap(s.pages))*8
}

package kvindex

import "github.com/omnious/provider-node/engines/kvevents"

// ReplicaStats counts what a ReplicaState did with its events.
type ReplicaStats struct {
	// StoredBlocks and RemovedBlocks count blocks applied to the index.
	StoredBlocks  uint64
	RemovedBlocks uint64
	// UnknownParent counts BlockStored events whose parent hash was not
	// known (events lost, or the stream started mid-way); their blocks that
	// were not already known are skipped (SkippedBlocks), never guessed. A
	// rising count is a resync signal for the caller.
	UnknownParent uint64
	SkippedBlocks uint64
	// UnknownRemoved counts BlockRemoved hashes not known on that tier.
	UnknownRemoved uint64
	// IgnoredBlocks counts blocks of KV groups that do not feed prefix
	// matching: non-full-attention groups and secondary full-attention groups.
	IgnoredBlocks uint64
	// Malformed counts events with an unknown kind or token count that is not
	// len(BlockHashes)*BlockSize.
	Malformed uint64
	// Clears counts AllBlocksCleared events, Resets calls to Reset.
	Clears uint64
	Resets uint64
	// Overflows counts times the engine-hash map exceeded
	// Config.MaxReplicaBlocks (removals were lost) and the state was dropped.
	Overflows uint64
	// SizeChanges counts BlockStored events whose block size differed from
	// the blocks held, which dropped them (an engine does not change its
	// block size without a restart).
	SizeChanges uint64
	// Blocks is the number of engine blocks currently tracked.
	Blocks int
}

// engineBlock is what an engine hash resolves to on this replica, and what
// a snapshot needs to rebuild it elsewhere: its tokens and its parent.
type engineBlock struct {
	key Key
	// parent is the engine hash of the block before, if hasParent; a root
	// block's adapter and salt, when not empty, are in ReplicaState.roots.
	parent uint64
	// tok is the block's slot in ReplicaState.tokens.
	tok       int32
	tiers     uint8 // bitmask of Tier
	hasParent bool
	// opaque blocks are keyed by opaqueKey: their engine hash mixes in
	// what no request maps to (kvevents.Event.Opaque). Their tokens cannot
	// rebuild them, so a snapshot leaves them and their descendants out.
	opaque bool
}

// rootSpec is what a root block's key mixes in besides the model.
type rootSpec struct{ lora, salt string }

// tokenStore keeps the token ids of a replica's blocks, stride ids per
// block, in pages that never move (growth copies nothing); freed slots are
// reused.
type tokenStore struct {
	stride  int
	perPage int32 // blocks per page
	pages   [][]uint32
	used    int32
	free    []int32
}

// tokPageTokens is about how many token ids one page holds (64 KiB).
const tokPageTokens = 16384

func newTokenStore(stride int) tokenStore {
	return tokenStore{stride: stride, perPage: int32(max(1, tokPageTokens/max(stride, 1)))}
}

func (t *tokenStore) put(toks []uint32) int32 {
	var i int32
	if n := len(t.free); n > 0 {
		i, t.free = t.free[n-1], t.free[:n-1]
	} else {
		if t.used == int32(len(t.pages))*t.perPage {
			t.pages = append(t.pages, make([]uint32, int(t.perPage)*t.stride))
		}
		i = t.used
		t.used++
	}
	copy(t.at(i), toks)
	return i
}

func (t *tokenStore) at(i int32) []uint32 {
	off := int(i%t.perPage) * t.stride
	return t.pages[i/t.perPage][off : off+t.stride : off+t.stride]
}

func (t *tokenStore) release(i int32) { t.free = append(t.free, i) }

// removeChunk bounds how many keys one Remove call carries when a whole
// replica is dropped, so lookups are not held off for long.
const removeChunk = 4096

// ReplicaState applies the decoded KV events of one engine event stream (one
// engine process and DP rank) to the index as replica r. It keeps the
// engine-hash -> key map needed to chain BlockStored parents and resolve
// BlockRemoved; the map holds only blocks the engine reports resident and is
// bounded by Config.MaxReplicaBlocks.
//
// Only one KV group feeds the index: the first full-attention group seen
// since the last reset. Hybrid models emit the same block hashes for several
// groups, and every full-attention group covers the same tokens, so one is
// enough and keying the map by hash alone stays unambiguous.
//
// Each block keeps its token ids (4 bytes per token, 64 per block of 16)
// and its parent's engine hash, so that a snapshot (SnapshotWriter) can
// hand the replica to an EPP whose keys are seeded differently: keys never
// leave the process, tokens do.
//
// It assumes it is the only writer of replica r in the index, and that one
// key has one engine hash: two engine hashes for the same tokens (possible
// only if the engine's hashing changed without a Reset) share one residency,
// so removing either removes it. It is not safe for concurrent use.
type ReplicaState struct {
	ix    *Index
	r     Replica
	model string
	max   int

	blocks    map[uint64]engineBlock
	tokens    tokenStore
	roots     map[uint64]rootSpec // root blocks with an adapter or a salt
	group     int
	hasGroup  bool
	blockSize int

	// rootLora, rootSalt and root cache the last root key: most events of a
	// replica share model, adapter and salt.
	rootLora, rootSalt string
	root               Key

	keys  []Key // scratch
	stats ReplicaStats
	// w collects the index writes instead of applying them, during
	// ApplyBatchTo.
	w *Writes
}

// NewReplicaState returns the state of replica r serving model.
func NewReplicaState(ix *Index, r Replica, model string) *ReplicaState {
	return &ReplicaState{
		ix: ix, r: r, model: model, max: ix.cfg.MaxReplicaBlocks,
		blocks: make(map[uint64]engineBlock),
		root:   RootKey(model, "", ""),
	}
}

// Replica returns the replica id the state writes under.
func (s *ReplicaState) Replica() Replica { return s.r }

// Model returns the model the state's keys are rooted in.
func (s *ReplicaState) Model() string { return s.model }

// MediumTier maps an engine medium to a tier: "" and "GPU" are GPU; "CPU" and
// "CPU_PINNED" are CPU; everything else ("DISK", "STORAGE", "FS", "OBJ",
// "EXTERNAL", unknown) is TierStorage, the cheapest assumption for a medium
// we do not know.
func MediumTier(medium string) Tier {
	switch medium {
	case "", "GPU":
		return TierGPU
	case "CPU", "CPU_PINNED":
		return TierCPU
	}
	return TierStorage
}

// ApplyBatch applies every event of b in order.
func (s *ReplicaState) ApplyBatch(b *kvevents.Batch) {
	for i := range b.Events {
		s.Apply(&b.Events[i])
	}
}

// ApplyBatchTo is ApplyBatch with the index writes appended to w instead of
// applied: the state is updated now, the index when the caller passes w to
// Index.Write, which it must do before this replica's next call that
// writes the index directly (Apply, ApplyBatch, Reset). Writes of several
// replicas may share one w: each replica's own stay in order
// (TestApplyBatchToInterleaved).
func (s *ReplicaState) ApplyBatchTo(w *Writes, b *kvevents.Batch) {
	s.w = w
	defer func() { s.w = nil }()
	s.ApplyBatch(b)
}

// store and remove write the index, or append to s.w during ApplyBatchTo.
func (s *ReplicaState) store(t Tier, keys []Key) {
	if s.w != nil {
		s.w.add(s.r, t, false, keys)
		return
	}
	s.ix.Store(s.r, t, keys)
}

func (s *ReplicaState) remove(t Tier, keys []Key) {
	if s.w != nil {
		s.w.add(s.r, t, true, keys)
		return
	}
	s.ix.Remove(s.r, t, keys)
}

// Apply applies one event.
func (s *ReplicaState) Apply(ev *kvevents.Event) {
	switch ev.Kind {
	case kvevents.KindBlockStored:
		s.stored(ev)
	case kvevents.KindBlockRemoved:
		s.removed(ev)
	case kvevents.KindAllBlocksCleared:
		s.stats.Clears++
		s.drop()
	default:
		s.stats.Malformed++
	}
}

// Reset drops everything the replica holds (engine restart, sequence reset,
// event loss).
func (s *ReplicaState) Reset() {
	s.stats.Resets++
	s.drop()
}

// Stats returns the counters.
func (s *ReplicaState) Stats() ReplicaStats {
	st := s.stats
	st.Blocks = len(s.blocks)
	return st
}

// BlockSize returns the block size of the last indexed BlockStored (0 before
// any): prompts must be keyed with it to match this replica.
func (s *ReplicaState) BlockSize() int { return s.blockSize }

func (s *ReplicaState) stored(ev *kvevents.Event) {
	n := len(ev.BlockHashes)
	if !ev.FullAttention() || (s.hasGroup && ev.GroupIdx != s.group) {
		s.stats.IgnoredBlocks += uint64(n)
		return
	}
	bs := ev.BlockSize
	// Division, not n*bs: a hostile block size must not overflow into a match.
	if n == 0 || bs <= 0 || len(ev.TokenIDs)%bs != 0 || len(ev.TokenIDs)/bs != n {
		s.stats.Malformed++
		return
	}
	if len(s.blocks) > 0 && bs != s.tokens.stride {
		s.stats.SizeChanges++
		s.drop()
	}
	if len(s.blocks) == 0 && s.tokens.stride != bs {
		s.tokens = newTokenStore(bs)
	}
	if !s.hasGroup {
		s.group, s.hasGroup = ev.GroupIdx, true
	}
	s.blockSize = bs
	tier := MediumTier(ev.Medium)
	bit := uint8(1) << tier

	var parent Key
	known := true
	if ev.HasParent {
		p, ok := s.blocks[ev.ParentHash]
		parent, known = p.key, ok
	} else {
		parent = s.rootKey(ev.LoraName, ev.CacheSalt)
	}
	s.keys = s.keys[:0]
	unknownParent := false
	opaque := n - min(max(ev.Opaque, 0), n) // first block no request can match
	for i, h := range ev.BlockHashes {
		// A hash already known keeps its key: engines re-report cache hits
		// with no parent, and offloads store the same block on another tier.
		if b, ok := s.blocks[h]; ok {
			if b.tiers&bit == 0 {
				b.tiers |= bit
				s.blocks[h] = b
			}
			parent, known = b.key, true
			s.keys = append(s.keys, b.key)
			continue
		}
		if !known {
			unknownParent = true
			s.stats.SkippedBlocks++
			continue
		}
		toks := ev.TokenIDs[i*bs : (i+1)*bs]
		if i >= opaque {
			s.keys = append(s.keys, opaqueKey(h))
		} else {
			s.keys = AppendBlockKeys(s.keys, parent, toks, bs)
		}
		parent = s.keys[len(s.keys)-1]
		nb := engineBlock{key: parent, tiers: bit, tok: s.tokens.put(toks), parent: ev.ParentHash, hasParent: ev.HasParent,
			opaque: i >= opaque}
		if i > 0 {
			nb.parent, nb.hasParent = ev.BlockHashes[i-1], true
		} else if !ev.HasParent && (ev.LoraName != "" || ev.CacheSalt != "") {
			if s.roots == nil {
				s.roots = make(map[uint64]rootSpec)
			}
			s.roots[h] = rootSpec{ev.LoraName, ev.CacheSalt}
		}
		s.blocks[h] = nb
	}
	if unknownParent {
		s.stats.UnknownParent++
	}
	s.store(tier, s.keys)
	s.stats.StoredBlocks += uint64(len(s.keys))
	if len(s.blocks) > s.max {
		s.stats.Overflows++
		s.drop()
	}
}

func (s *ReplicaState) removed(ev *kvevents.Event) {
	if !s.hasGroup || ev.GroupIdx != s.group {
		s.stats.IgnoredBlocks += uint64(len(ev.BlockHashes))
		return
	}
	tier := MediumTier(ev.Medium)
	bit := uint8(1) << tier
	s.keys = s.keys[:0]
	for _, h := range ev.BlockHashes {
		b, ok := s.blocks[h]
		if !ok || b.tiers&bit == 0 {
			s.stats.UnknownRemoved++
			continue
		}
		if b.tiers &^= bit; b.tiers == 0 {
			s.forget(h, b)
		} else {
			s.blocks[h] = b
		}
		s.keys = append(s.keys, b.key)
	}
	s.remove(tier, s.keys)
	s.stats.RemovedBlocks += uint64(len(s.keys))
}

func (s *ReplicaState) rootKey(lora, salt string) Key {
	if lora != s.rootLora || salt != s.rootSalt {
		s.rootLora, s.rootSalt = lora, salt
		s.root = RootKey(s.model, lora, salt)
	}
	return s.root
}

// forget deletes block h from the map; the caller updates the index.
func (s *ReplicaState) forget(h uint64, b engineBlock) {
	delete(s.blocks, h)
	s.tokens.release(b.tok)
	if !b.hasParent && s.roots != nil {
		delete(s.roots, h)
	}
}

// drop removes all of the replica's blocks from the index and forgets the
// map, releasing its memory, and the chosen KV group.
func (s *ReplicaState) drop() {
	for t := Tier(0); t < NumTiers; t++ {
		bit := uint8(1) << t
		s.keys = s.keys[:0]
		for _, b := range s.blocks {
			if b.tiers&bit == 0 {
				continue
			}
			if s.keys = append(s.keys, b.key); len(s.keys) == removeChunk {
				s.remove(t, s.keys)
				s.keys = s.keys[:0]
			}
		}
		s.remove(t, s.keys)
	}
	s.blocks = make(map[uint64]engineBlock)
	s.tokens = tokenStore{}
	s.roots = nil
	s.keys = nil
	s.hasGroup = false
}

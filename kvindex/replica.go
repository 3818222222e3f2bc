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
	// Blocks is the number of engine blocks currently tracked.
	Blocks int
}

// engineBlock is what an engine hash resolves to on this replica.
type engineBlock struct {
	key   Key
	tiers uint8 // bitmask of Tier
}

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
	group     int
	hasGroup  bool
	blockSize int

	// rootLora, rootSalt and root cache the last root key: most events of a
	// replica share model, adapter and salt.
	rootLora, rootSalt string
	root               Key

	keys  []Key // scratch
	stats ReplicaStats
}

// NewReplicaState returns the state of replica r serving model.
func NewReplicaState(ix *Index, r Replica, model string) *ReplicaState {
	return &ReplicaState{
		ix: ix, r: r, model: model, max: ix.cfg.MaxReplicaBlocks,
		blocks: make(map[uint64]engineBlock),
		root:   RootKey(model, "", ""),
	}
}

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
		s.keys = AppendBlockKeys(s.keys, parent, ev.TokenIDs[i*bs:(i+1)*bs], bs)
		parent = s.keys[len(s.keys)-1]
		s.blocks[h] = engineBlock{key: parent, tiers: bit}
	}
	if unknownParent {
		s.stats.UnknownParent++
	}
	s.ix.Store(s.r, tier, s.keys)
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
			delete(s.blocks, h)
		} else {
			s.blocks[h] = b
		}
		s.keys = append(s.keys, b.key)
	}
	s.ix.Remove(s.r, tier, s.keys)
	s.stats.RemovedBlocks += uint64(len(s.keys))
}

func (s *ReplicaState) rootKey(lora, salt string) Key {
	if lora != s.rootLora || salt != s.rootSalt {
		s.rootLora, s.rootSalt = lora, salt
		s.root = RootKey(s.model, lora, salt)
	}
	return s.root
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
				s.ix.Remove(s.r, t, s.keys)
				s.keys = s.keys[:0]
			}
		}
		s.ix.Remove(s.r, t, s.keys)
	}
	s.blocks = make(map[uint64]engineBlock)
	s.keys = nil
	s.hasGroup = false
}

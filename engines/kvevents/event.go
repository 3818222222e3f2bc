// Package kvevents owns the KV-cache event wire format that vLLM and SGLang
// publish over ZMQ: the three-frame message (topic, big-endian sequence
// number, msgpack batch), the event encodings (legacy positional arrays and
// tagged maps), the block-hash representations, and the replay protocol.
//
// The simulator encodes with these definitions and publishes through
// Publisher; the EPP decodes with them through Subscriber, which tracks each
// replica's sequence, replays the engine's buffer when it first connects (or
// resumes from a Position a sibling EPP handed over, if the buffer proves
// the engine run continues), fills gaps by replay and reports unrecoverable
// loss as a reset. Both sides are pinned to the same byte vectors.
package kvevents

// Kind says which engine event an Event holds.
type Kind uint8

const (
	// KindBlockStored is vLLM's BlockStored: one or more newly full blocks.
	KindBlockStored Kind = iota + 1
	// KindBlockRemoved is vLLM's BlockRemoved: blocks evicted from a medium.
	KindBlockRemoved
	// KindAllBlocksCleared is vLLM's AllBlocksCleared: the engine dropped its cache.
	KindAllBlocksCleared
)

// String returns the engine's class name for the kind, as it appears on the wire.
func (k Kind) String() string {
	switch k {
	case KindBlockStored:
		return "BlockStored"
	case KindBlockRemoved:
		return "BlockRemoved"
	case KindAllBlocksCleared:
		return "AllBlocksCleared"
	}
	return "Unknown"
}

// Event is one KV-cache event. It is a single concrete struct rather than an
// interface per kind so that a decoded batch reuses its slices and costs no
// allocation per event on the ingestion hot path. Fields that do not apply to
// Kind are zero.
type Event struct {
	Kind Kind

	// BlockHashes are the engine's own block hashes, normalised to a uint64
	// bit pattern (see HashEncoding). They are not the router's keys.
	BlockHashes []uint64
	// ParentHash is the engine hash of the block before BlockHashes[0];
	// HasParent is false at the root (nil on the wire, or 0 from simulators
	// that use 0 for "no parent").
	ParentHash uint64
	HasParent  bool
	// TokenIDs covers exactly the newly full blocks, BlockSize tokens each.
	TokenIDs  []uint32
	BlockSize int
	// LoraName is the adapter the blocks belong to ("" for the base model).
	LoraName string
	// CacheSalt is the request's cache_salt when the engine reports it
	// (SGLang's cache_salt, or vLLM's first-block extra_keys entry).
	CacheSalt string
	// SessionID is the SGLang session that stored the blocks (attribution
	// only: the hashes do not depend on it). It is encoded, never decoded:
	// nothing downstream reads it, and a client-chosen string must not
	// reach the decoder's intern table.
	SessionID string
	// Opaque counts the trailing blocks of BlockHashes whose engine hashes
	// mix in extra keys a router cannot derive from a request (multimodal
	// inputs, prompt embeddings, an over-long salt). They, and every block
	// chained after them, must never match a text prompt
	// (TestDecodeExtraKeys, TestReplicaOpaqueBlocks).
	Opaque int
	// Medium is the storage tier: "GPU", "CPU", "CPU_PINNED", "DISK", ... ;
	// "" when the engine sent nil (treated as GPU).
	Medium string
	// GroupIdx is the KV-cache group for hybrid models (0 when absent).
	GroupIdx int
	// SpecKind is kv_cache_spec_kind ("" when absent, which means full attention).
	SpecKind string
}

// FullAttention reports whether the event's KV group can feed prefix matching.
func (e *Event) FullAttention() bool {
	return e.SpecKind == "" || e.SpecKind == "full_attention"
}

// Batch is one published EventBatch: [ts, events, dp_rank].
type Batch struct {
	TS     float64
	Events []Event
	// DPRank is the data-parallel rank; HasDPRank is false when it was nil.
	DPRank    int
	HasDPRank bool
	// Unknown counts events of a type this package does not know; they are
	// skipped so that a newer engine does not break ingestion.
	Unknown int

	// strs interns the few distinct strings (media, LoRA names, spec kinds)
	// so that decoding does not allocate one string per event.
	strs map[string]string
}

// Reset empties b for reuse, keeping its allocated event slice.
func (b *Batch) Reset() {
	for i := range b.Events {
		ev := &b.Events[i]
		hashes, toks := ev.BlockHashes[:0], ev.TokenIDs[:0]
		*ev = Event{BlockHashes: hashes, TokenIDs: toks}
	}
	b.Events = b.Events[:0]
	b.TS, b.DPRank, b.HasDPRank, b.Unknown = 0, 0, false, 0
}

// Format selects how events are encoded inside a batch.
type Format uint8

const (
	// FormatArray is vLLM's legacy positional encoding (up to 0.23): class
	// name first, then every field in declaration order, trailing nils kept.
	FormatArray Format = iota
	// FormatMap is the tagged-map encoding: "type" first, then the fields in
	// declaration order, nil optional fields omitted (vLLM 0.26+).
	FormatMap
	// FormatArraySGLang is SGLang's positional encoding (msgspec array_like,
	// 0.4.8 to 0.5.16): BlockStored is [tag, hashes, parent, token_ids,
	// block_size, lora_id, medium] plus an optional {"cache_salt": ...} slot
	// (no release checked sends it), BlockRemoved is [tag, hashes, medium].
	// 0.4.8 and 0.5.3 end BlockStored at lora_id and BlockRemoved at the
	// hashes, and omit an unset dp_rank; the decoder reads every length
	// (TestDecodeSGLangArrays).
	FormatArraySGLang
	// FormatMapSGLang is SGLang 0.5.23's tagged-map encoding (msgspec
	// tag=True, omit_defaults=True): "type" first, then BlockStored's
	// block_hashes, parent_block_hash, token_ids, block_size, lora_id (always
	// present, nil), then medium, cache_salt, session_id, lora_name only when
	// set; BlockRemoved is type, block_hashes, medium when set.
	// TestSGLangShape keeps it equal in shape to SGLang 0.5.23's capture.
	FormatMapSGLang
)

// HashEncoding selects how block hashes are represented on the wire.
type HashEncoding uint8

const (
	// HashUint64 is vLLM's default integer form: the last 8 digest bytes, big-endian, unsigned.
	HashUint64 HashEncoding = iota
	// HashInt64 is SGLang's form: the first 8 digest bytes as a signed int64.
	HashInt64
	// HashBytes is vLLM's binary form: the full digest; the key is its last 8 bytes.
	HashBytes
)

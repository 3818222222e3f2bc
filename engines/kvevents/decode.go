package kvevents

import (
	"encoding/binary"
	"fmt"
	"math"
)

// maxSkipDepth bounds the nesting of values that are skipped (extra_keys and
// unknown fields) so hostile input cannot exhaust the stack.
const maxSkipDepth = 64

// maxInterned bounds the per-Batch string cache; past it strings are copied.
const maxInterned = 1024

// MaxSaltLen bounds a cache_salt an engine reports (extra_keys, or SGLang's
// cache_salt): a client chooses the salt, and it reaches the index's maps.
// vLLM 0.32 refuses salts over 128 characters (at most 512 bytes of UTF-8),
// so a real one always fits. Blocks with a longer salt are left Opaque
// rather than truncated, since a truncated salt would alias another
// tenant's (TestDecodeExtraKeys).
const MaxSaltLen = 1024

// DecodeBatch resets b and fills it from one msgpack EventBatch, reusing b's
// slices. It accepts the positional and the tagged-map event encodings (even
// mixed in one batch), an array- or map-encoded batch, any integer width for
// hashes and 8+ byte bin/str digests (the key is the last 8 bytes, big-endian).
// Events of unknown type are skipped and counted in b.Unknown. After an
// error b holds a partial batch that must not be applied.
//
// The decoder reads the bytes directly instead of using msgpack.Decoder: it
// is several times faster and allocation-free (see BenchmarkDecodeEventBatch).
// Every length is checked against the remaining input before use, so bad
// input yields an error wrapping ErrMalformed, never a panic or a large
// allocation.
func DecodeBatch(data []byte, b *Batch) error {
	// Not Reset: each event is cleared as it is decoded into (events), so
	// clearing them first too cost a pass over the batch.
	b.Events = b.Events[:0]
	b.TS, b.DPRank, b.HasDPRank, b.Unknown = 0, 0, false, 0
	r := reader{b: data}
	if err := r.batch(b); err != nil {
		return fmt.Errorf("cannot decode batch: %w", err)
	}
	if r.off != len(r.b) {
		return fmt.Errorf("cannot decode batch: %d trailing bytes: %w", len(r.b)-r.off, ErrMalformed)
	}
	return nil
}

type reader struct {
	b   []byte
	off int
}

func (r *reader) errCode(what string) error {
	if r.off >= len(r.b) {
		return fmt.Errorf("%s: truncated at offset %d: %w", what, r.off, ErrMalformed)
	}
	return fmt.Errorf("%s: unexpected msgpack code 0x%02x at offset %d: %w", what, r.b[r.off], r.off, ErrMalformed)
}

func (r *reader) errTrunc(what string) error {
	return fmt.Errorf("%s: truncated at offset %d: %w", what, r.off, ErrMalformed)
}

// need reports whether n more bytes are available.
func (r *reader) need(n int) bool { return n >= 0 && len(r.b)-r.off >= n }

// nilNext consumes a nil if one is next.
func (r *reader) nilNext() bool {
	if r.off < len(r.b) && r.b[r.off] == 0xc0 {
		r.off++
		return true
	}
	return false
}

func (r *reader) peek() (byte, bool) {
	if r.off < len(r.b) {
		return r.b[r.off], true
	}
	return 0, false
}

// arrayLen reads an array header; n elements need at least n bytes.
func (r *reader) arrayLen(what string) (int, error) {
	c, ok := r.peek()
	if !ok {
		return 0, r.errTrunc(what)
	}
	var n int
	switch {
	case c&0xf0 == 0x90:
		n = int(c & 0x0f)
		r.off++
	case c == 0xdc:
		if !r.need(3) {
			return 0, r.errTrunc(what)
		}
		n = int(binary.BigEndian.Uint16(r.b[r.off+1:]))
		r.off += 3
	case c == 0xdd:
		if !r.need(5) {
			return 0, r.errTrunc(what)
		}
		n = int(binary.BigEndian.Uint32(r.b[r.off+1:]))
		r.off += 5
	default:
		return 0, r.errCode(what + ": want array")
	}
	if !r.need(n) {
		return 0, fmt.Errorf("%s: array of %d elements exceeds the %d remaining bytes: %w", what, n, len(r.b)-r.off, ErrMalformed)
	}
	return n, nil
}

// mapLen reads a map header; n pairs need at least 2n bytes.
func (r *reader) mapLen(what string) (int, error) {
	c, ok := r.peek()
	if !ok {
		return 0, r.errTrunc(what)
	}
	var n int
	switch {
	case c&0xf0 == 0x80:
		n = int(c & 0x0f)
		r.off++
	case c == 0xde:
		if !r.need(3) {
			return 0, r.errTrunc(what)
		}
		n = int(binary.BigEndian.Uint16(r.b[r.off+1:]))
		r.off += 3
	case c == 0xdf:
		if !r.need(5) {
			return 0, r.errTrunc(what)
		}
		n = int(binary.BigEndian.Uint32(r.b[r.off+1:]))
		r.off += 5
	default:
		return 0, r.errCode(what + ": want map")
	}
	if !r.need(2 * n) {
		return 0, fmt.Errorf("%s: map of %d pairs exceeds the %d remaining bytes: %w", what, n, len(r.b)-r.off, ErrMalformed)
	}
	return n, nil
}

// raw reads a str or bin value and returns its bytes (aliasing the input).
func (r *reader) raw(what string) ([]byte, error) {
	c, ok := r.peek()
	if !ok {
		return nil, r.errTrunc(what)
	}
	var n, h int
	switch {
	case c&0xe0 == 0xa0:
		n, h = int(c&0x1f), 1
	case c == 0xd9 || c == 0xc4:
		if !r.need(2) {
			return nil, r.errTrunc(what)
		}
		n, h = int(r.b[r.off+1]), 2
	case c == 0xda || c == 0xc5:
		if !r.need(3) {
			return nil, r.errTrunc(what)
		}
		n, h = int(binary.BigEndian.Uint16(r.b[r.off+1:])), 3
	case c == 0xdb || c == 0xc6:
		if !r.need(5) {
			return nil, r.errTrunc(what)
		}
		n, h = int(binary.BigEndian.Uint32(r.b[r.off+1:])), 5
	default:
		return nil, r.errCode(what + ": want string")
	}
	if !r.need(h + n) {
		return nil, r.errTrunc(what)
	}
	s := r.b[r.off+h : r.off+h+n]
	r.off += h + n
	return s, nil
}

// str is raw with an inlinable fast path for fixstr, the form of every map
// key and tag on the wire.
func (r *reader) str(what string) ([]byte, error) {
	if p := r.off; p < len(r.b) && r.b[p]&0xe0 == 0xa0 {
		if end := p + 1 + int(r.b[p]&0x1f); end <= len(r.b) {
			r.off = end
			return r.b[p+1 : end], nil
		}
	}
	return r.raw(what)
}

// bits64 reads any msgpack integer and returns its 64-bit two's-complement
// pattern; neg reports a negative signed value.
func (r *reader) bits64(what string) (v uint64, neg bool, err error) {
	c, ok := r.peek()
	if !ok {
		return 0, false, r.errTrunc(what)
	}
	if c < 0x80 {
		r.off++
		return uint64(c), false, nil
	}
	if c >= 0xe0 {
		r.off++
		return uint64(int64(int8(c))), true, nil
	}
	p := r.off + 1
	switch c {
	case 0xcc, 0xd0:
		if !r.need(2) {
			return 0, false, r.errTrunc(what)
		}
		r.off += 2
		if c == 0xd0 {
			x := int64(int8(r.b[p]))
			return uint64(x), x < 0, nil
		}
		return uint64(r.b[p]), false, nil
	case 0xcd, 0xd1:
		if !r.need(3) {
			return 0, false, r.errTrunc(what)
		}
		r.off += 3
		u := binary.BigEndian.Uint16(r.b[p:])
		if c == 0xd1 {
			x := int64(int16(u))
			return uint64(x), x < 0, nil
		}
		return uint64(u), false, nil
	case 0xce, 0xd2:
		if !r.need(5) {
			return 0, false, r.errTrunc(what)
		}
		r.off += 5
		u := binary.BigEndian.Uint32(r.b[p:])
		if c == 0xd2 {
			x := int64(int32(u))
			return uint64(x), x < 0, nil
		}
		return uint64(u), false, nil
	case 0xcf, 0xd3:
		if !r.need(9) {
			return 0, false, r.errTrunc(what)
		}
		r.off += 9
		u := binary.BigEndian.Uint64(r.b[p:])
		return u, c == 0xd3 && int64(u) < 0, nil
	}
	return 0, false, r.errCode(what + ": want integer")
}

// int reads an integer that must fit in an int32 (sizes, ranks, indices).
func (r *reader) int(what string) (int, error) {
	u, neg, err := r.bits64(what)
	if err != nil {
		return 0, err
	}
	x := int64(u)
	if (neg && x < math.MinInt32) || (!neg && u > math.MaxInt32) {
		return 0, fmt.Errorf("%s: integer %d out of range: %w", what, x, ErrMalformed)
	}
	return int(x), nil
}

// hash reads a block hash: any integer (bit pattern kept) or a digest of at
// least 8 bytes whose last 8 bytes, big-endian, are the key.
func (r *reader) hash(what string) (uint64, error) {
	if r.need(9) && (r.b[r.off] == 0xcf || r.b[r.off] == 0xd3) {
		v := binary.BigEndian.Uint64(r.b[r.off+1:])
		r.off += 9
		return v, nil
	}
	c, ok := r.peek()
	if !ok {
		return 0, r.errTrunc(what)
	}
	switch c {
	case 0xc4, 0xc5, 0xc6, 0xd9, 0xda, 0xdb:
	default:
		if c&0xe0 != 0xa0 {
			v, _, err := r.bits64(what)
			return v, err
		}
	}
	d, err := r.raw(what)
	if err != nil {
		return 0, err
	}
	if len(d) < 8 {
		return 0, fmt.Errorf("%s: %d-byte digest is shorter than 8 bytes: %w", what, len(d), ErrMalformed)
	}
	return binary.BigEndian.Uint64(d[len(d)-8:]), nil
}

func (r *reader) float(what string) (float64, error) {
	c, ok := r.peek()
	if !ok {
		return 0, r.errTrunc(what)
	}
	switch c {
	case 0xcb:
		if !r.need(9) {
			return 0, r.errTrunc(what)
		}
		f := math.Float64frombits(binary.BigEndian.Uint64(r.b[r.off+1:]))
		r.off += 9
		return f, nil
	case 0xca:
		if !r.need(5) {
			return 0, r.errTrunc(what)
		}
		f := math.Float32frombits(binary.BigEndian.Uint32(r.b[r.off+1:]))
		r.off += 5
		return float64(f), nil
	}
	u, neg, err := r.bits64(what)
	if err != nil {
		return 0, err
	}
	if neg {
		return float64(int64(u)), nil
	}
	return float64(u), nil
}

// skip steps over one value of any type.
func (r *reader) skip(what string, depth int) error {
	if depth > maxSkipDepth {
		return fmt.Errorf("%s: nesting deeper than %d: %w", what, maxSkipDepth, ErrMalformed)
	}
	c, ok := r.peek()
	if !ok {
		return r.errTrunc(what)
	}
	var n int // bytes to skip after the code, for fixed/sized types
	switch {
	case c < 0x80 || c >= 0xe0 || c == 0xc0 || c == 0xc2 || c == 0xc3:
		r.off++
		return nil
	case c&0xf0 == 0x90, c == 0xdc, c == 0xdd:
		cnt, err := r.arrayLen(what)
		if err != nil {
			return err
		}
		for i := 0; i < cnt; i++ {
			if err := r.skip(what, depth+1); err != nil {
				return err
			}
		}
		return nil
	case c&0xf0 == 0x80, c == 0xde, c == 0xdf:
		cnt, err := r.mapLen(what)
		if err != nil {
			return err
		}
		for i := 0; i < 2*cnt; i++ {
			if err := r.skip(what, depth+1); err != nil {
				return err
			}
		}
		return nil
	case c&0xe0 == 0xa0, c == 0xd9, c == 0xda, c == 0xdb, c == 0xc4, c == 0xc5, c == 0xc6:
		_, err := r.raw(what)
		return err
	case c == 0xcc || c == 0xd0:
		n = 1
	case c == 0xcd || c == 0xd1:
		n = 2
	case c == 0xce || c == 0xd2 || c == 0xca:
		n = 4
	case c == 0xcf || c == 0xd3 || c == 0xcb:
		n = 8
	case c == 0xd4:
		n = 2
	case c == 0xd5:
		n = 3
	case c == 0xd6:
		n = 5
	case c == 0xd7:
		n = 9
	case c == 0xd8:
		n = 17
	case c == 0xc7:
		if !r.need(2) {
			return r.errTrunc(what)
		}
		n = 2 + int(r.b[r.off+1])
	case c == 0xc8:
		if !r.need(3) {
			return r.errTrunc(what)
		}
		n = 3 + int(binary.BigEndian.Uint16(r.b[r.off+1:]))
	case c == 0xc9:
		if !r.need(5) {
			return r.errTrunc(what)
		}
		n = 5 + int(binary.BigEndian.Uint32(r.b[r.off+1:]))
	default: // 0xc1 is never used
		return r.errCode(what)
	}
	if !r.need(1 + n) {
		return r.errTrunc(what)
	}
	r.off += 1 + n
	return nil
}

// optStr reads a str or nil; strings are interned in b.
func (r *reader) optStr(b *Batch, what string) (string, error) {
	if r.nilNext() {
		return "", nil
	}
	s, err := r.str(what)
	if err != nil {
		return "", err
	}
	return b.intern(s), nil
}

func (r *reader) optInt(what string) (int, error) {
	if r.nilNext() {
		return 0, nil
	}
	return r.int(what)
}

func (r *reader) batch(b *Batch) error {
	c, ok := r.peek()
	if !ok {
		return r.errTrunc("batch")
	}
	if c&0xf0 == 0x80 || c == 0xde || c == 0xdf {
		return r.mapBatch(b)
	}
	n, err := r.arrayLen("batch")
	if err != nil {
		return err
	}
	if n < 2 {
		return fmt.Errorf("batch: %d slots, want at least 2: %w", n, ErrMalformed)
	}
	if b.TS, err = r.float("batch ts"); err != nil {
		return err
	}
	if err := r.events(b); err != nil {
		return err
	}
	if n >= 3 {
		if err := r.dpRank(b); err != nil {
			return err
		}
	}
	for i := 3; i < n; i++ {
		if err := r.skip("batch extra slot", 0); err != nil {
			return err
		}
	}
	return nil
}

func (r *reader) dpRank(b *Batch) error {
	if r.nilNext() {
		return nil
	}
	v, err := r.int("batch dp_rank")
	if err != nil {
		return err
	}
	b.DPRank, b.HasDPRank = v, true
	return nil
}

func (r *reader) mapBatch(b *Batch) error {
	n, err := r.mapLen("batch")
	if err != nil {
		return err
	}
	sawEvents := false
	for i := 0; i < n; i++ {
		k, err := r.str("batch key")
		if err != nil {
			return err
		}
		switch string(k) {
		case "ts":
			if b.TS, err = r.float("batch ts"); err != nil {
				return err
			}
		case "events":
			if sawEvents {
				return fmt.Errorf("batch: duplicate events key: %w", ErrMalformed)
			}
			sawEvents = true
			if err := r.events(b); err != nil {
				return err
			}
		case "data_parallel_rank", "attn_dp_rank", "dp_rank":
			if err := r.dpRank(b); err != nil {
				return err
			}
		default:
			if err := r.skip("batch field", 0); err != nil {
				return err
			}
		}
	}
	if !sawEvents {
		return fmt.Errorf("batch: no events key: %w", ErrMalformed)
	}
	return nil
}

func (r *reader) events(b *Batch) error {
	n, err := r.arrayLen("events")
	if err != nil {
		return err
	}
	for i := 0; i < n; i++ {
		// Grow by append rather than to n so a lying header cannot force a
		// large allocation: each kept event consumed real input bytes.
		if len(b.Events) < cap(b.Events) {
			b.Events = b.Events[:len(b.Events)+1]
		} else {
			b.Events = append(b.Events, Event{})
		}
		ev := &b.Events[len(b.Events)-1]
		*ev = Event{BlockHashes: ev.BlockHashes[:0], TokenIDs: ev.TokenIDs[:0]}
		c, ok := r.peek()
		if !ok {
			return r.errTrunc("event")
		}
		if c&0xf0 == 0x80 || c == 0xde || c == 0xdf {
			err = r.mapEvent(b, ev)
		} else {
			err = r.arrayEvent(b, ev)
		}
		if err != nil {
			b.Events = b.Events[:len(b.Events)-1]
			return fmt.Errorf("event %d: %w", i, err)
		}
		if ev.Kind == 0 {
			b.Unknown++
			b.Events = b.Events[:len(b.Events)-1]
		}
	}
	return nil
}

func kindOf(tag []byte) Kind {
	switch string(tag) {
	case tagBlockStored:
		return KindBlockStored
	case tagBlockRemoved:
		return KindBlockRemoved
	case tagAllBlocksCleared:
		return KindAllBlocksCleared
	}
	return 0
}

// arrayEvent decodes a positional event; it leaves ev.Kind zero for unknown tags.
func (r *reader) arrayEvent(b *Batch, ev *Event) error {
	n, err := r.arrayLen("event")
	if err != nil {
		return err
	}
	if n == 0 {
		return fmt.Errorf("empty event array: %w", ErrMalformed)
	}
	tag, err := r.str("event tag")
	if err != nil {
		return err
	}
	kind := kindOf(tag)
	i := 1
	switch kind {
	case KindBlockStored:
		if n < 5 {
			return fmt.Errorf("BlockStored: %d slots, want at least 5: %w", n, ErrMalformed)
		}
		if err := r.hashes(ev); err != nil {
			return err
		}
		if err := r.parent(ev); err != nil {
			return err
		}
		if err := r.tokens(ev); err != nil {
			return err
		}
		if ev.BlockSize, err = r.optInt("block_size"); err != nil {
			return err
		}
		for i = 5; i < n && i <= 10; i++ {
			switch i {
			case 6:
				ev.Medium, err = r.optStr(b, "medium")
			case 7:
				// vLLM: lora_name; SGLang: {"cache_salt": ...}.
				if c, _ := r.peek(); c&0xf0 == 0x80 || c == 0xde || c == 0xdf {
					err = r.sglangExtra(b, ev)
				} else {
					ev.LoraName, err = r.optStr(b, "lora_name")
				}
			case 8:
				err = r.extraKeys(b, ev)
			case 9:
				ev.GroupIdx, err = r.optInt("group_idx")
			case 10:
				ev.SpecKind, err = r.optStr(b, "kv_cache_spec_kind")
			default: // lora_id
				err = r.skip("BlockStored field", 0)
			}
			if err != nil {
				return err
			}
		}
	case KindBlockRemoved:
		if n < 2 {
			return fmt.Errorf("BlockRemoved: %d slots, want at least 2: %w", n, ErrMalformed)
		}
		if err := r.hashes(ev); err != nil {
			return err
		}
		i = 2
		if n > 2 {
			if ev.Medium, err = r.optStr(b, "medium"); err != nil {
				return err
			}
			i = 3
		}
		if n > 3 {
			if ev.GroupIdx, err = r.optInt("group_idx"); err != nil {
				return err
			}
			i = 4
		}
	}
	for ; i < n; i++ {
		if err := r.skip("event field", 0); err != nil {
			return err
		}
	}
	ev.Kind = kind
	return nil
}

func (r *reader) sglangExtra(b *Batch, ev *Event) error {
	n, err := r.mapLen("BlockStored extra")
	if err != nil {
		return err
	}
	for j := 0; j < n; j++ {
		k, err := r.str("BlockStored extra key")
		if err != nil {
			return err
		}
		if string(k) == "cache_salt" {
			if err := r.salt(b, ev); err != nil {
				return err
			}
			if ev.Opaque < 0 {
				ev.Opaque = len(ev.BlockHashes)
			}
			continue
		}
		if err := r.skip("BlockStored extra", 0); err != nil {
			return err
		}
	}
	return nil
}

// mapEvent decodes a tagged-map event in any key order; it leaves ev.Kind
// zero for unknown or missing types.
func (r *reader) mapEvent(b *Batch, ev *Event) error {
	n, err := r.mapLen("event")
	if err != nil {
		return err
	}
	var kind Kind
	extra := -1 // offset of extra_keys, read once lora_name and the hashes are known
	for j := 0; j < n; j++ {
		k, err := r.str("event key")
		if err != nil {
			return err
		}
		switch string(k) {
		case "type":
			var tag []byte
			if tag, err = r.str("event type"); err == nil {
				kind = kindOf(tag)
			}
		case "block_hashes":
			err = r.hashes(ev)
		case "parent_block_hash":
			err = r.parent(ev)
		case "token_ids":
			err = r.tokens(ev)
		case "block_size":
			ev.BlockSize, err = r.optInt("block_size")
		case "medium":
			ev.Medium, err = r.optStr(b, "medium")
		case "lora_name":
			ev.LoraName, err = r.optStr(b, "lora_name")
		case "group_idx":
			ev.GroupIdx, err = r.optInt("group_idx")
		case "kv_cache_spec_kind":
			ev.SpecKind, err = r.optStr(b, "kv_cache_spec_kind")
		case "cache_salt":
			err = r.salt(b, ev)
		case "extra_keys":
			extra = r.off
			err = r.skip("extra_keys", 0)
		default:
			err = r.skip("event field", 0)
		}
		if err != nil {
			return err
		}
	}
	if ev.Opaque < 0 { // an over-long cache_salt: no block is plain
		ev.Opaque = len(ev.BlockHashes)
	}
	if extra >= 0 && kind == KindBlockStored {
		x := reader{b: r.b, off: extra}
		if err := x.extraKeys(b, ev); err != nil {
			return err
		}
	}
	if kind != KindBlockStored {
		ev.CacheSalt, ev.Opaque = "", 0
	}
	ev.Kind = kind
	return nil
}

// salt reads SGLang's cache_salt; one over MaxSaltLen is not kept and sets
// ev.Opaque to -1, which the caller turns into every block once the hashes
// are known.
func (r *reader) salt(b *Batch, ev *Event) error {
	if r.nilNext() {
		return nil
	}
	s, err := r.str("cache_salt")
	if err != nil {
		return err
	}
	if len(s) > MaxSaltLen {
		ev.CacheSalt, ev.Opaque = "", -1
		return nil
	}
	ev.CacheSalt = b.intern(s)
	return nil
}

// extraKeys decodes vLLM's BlockStored extra_keys: one entry per block, nil
// or an array of the untagged keys the engine mixed into that block's hash,
// in the order LoRA name, (multimodal identifier, offset) pairs, cache_salt
// (only on a request's first block) and a prompt-embeds digest (bin). The
// salt goes to ev.CacheSalt. Blocks carrying a key the router cannot derive
// from a request (a multimodal pair, a digest, an unknown shape, a salt over
// MaxSaltLen) are counted in ev.Opaque with every block after them, since
// later hashes chain from theirs; so are all blocks when the entry count
// does not match the hashes. It needs ev.LoraName and ev.BlockHashes.
func (r *reader) extraKeys(b *Batch, ev *Event) error {
	if r.nilNext() {
		return nil
	}
	n, err := r.arrayLen("extra_keys")
	if err != nil {
		return err
	}
	first := n
	for i := 0; i < n; i++ {
		plain, err := r.blockKeys(b, ev, i)
		if err != nil {
			return err
		}
		if !plain && first == n {
			first = i
		}
	}
	switch {
	case n != len(ev.BlockHashes):
		ev.Opaque = len(ev.BlockHashes)
	case first < n:
		ev.Opaque = max(ev.Opaque, n-first)
	}
	return nil
}

// blockKeys reads block i's extra_keys entry and reports whether the block
// is plain text under ev's LoRA name and salt.
func (r *reader) blockKeys(b *Batch, ev *Event, i int) (bool, error) {
	if r.nilNext() {
		return true, nil
	}
	m, err := r.arrayLen("extra_keys entry")
	if err != nil {
		return false, err
	}
	plain, strs := true, 0
	for j := 0; j < m; j++ {
		if c, _ := r.peek(); !(c&0xe0 == 0xa0 || c == 0xd9 || c == 0xda || c == 0xdb) {
			plain = false // multimodal pair, prompt-embeds digest, or unknown
			if err := r.skip("extra_keys entry", 1); err != nil {
				return false, err
			}
			continue
		}
		s, err := r.raw("extra_keys entry")
		if err != nil {
			return false, err
		}
		strs++
		if ev.LoraName != "" && strs == 1 {
			plain = plain && string(s) == ev.LoraName
			continue
		}
		if i > 0 || len(s) == 0 || len(s) > MaxSaltLen || (ev.CacheSalt != "" && ev.CacheSalt != string(s)) {
			plain = false // a second salt, or one the index must not hold
			continue
		}
		ev.CacheSalt = b.intern(s)
	}
	return plain, nil
}

func (r *reader) hashes(ev *Event) error {
	if r.nilNext() {
		return nil
	}
	n, err := r.arrayLen("block_hashes")
	if err != nil {
		return err
	}
	hs := ev.BlockHashes[:0]
	if cap(hs) < n {
		hs = make([]uint64, 0, n)
	}
	for i := 0; i < n; i++ {
		h, err := r.hash("block_hashes")
		if err != nil {
			ev.BlockHashes = hs
			return err
		}
		hs = append(hs, h)
	}
	ev.BlockHashes = hs
	return nil
}

func (r *reader) parent(ev *Event) error {
	if r.nilNext() {
		ev.ParentHash, ev.HasParent = 0, false
		return nil
	}
	h, err := r.hash("parent_block_hash")
	if err != nil {
		return err
	}
	// Simulators use 0 for "no parent"; a real digest is never all zero.
	ev.ParentHash, ev.HasParent = h, h != 0
	return nil
}

func (r *reader) tokens(ev *Event) error {
	if r.nilNext() {
		return nil
	}
	n, err := r.arrayLen("token_ids")
	if err != nil {
		return err
	}
	ts := ev.TokenIDs[:0]
	if cap(ts) < n {
		ts = make([]uint32, 0, n)
	}
	buf, off := r.b, r.off
	for i := 0; i < n; i++ {
		// Fast path, on locals: token ids below 128 and the 16/32-bit forms.
		if off < len(buf) {
			c := buf[off]
			if c < 0x80 {
				off++
				ts = append(ts, uint32(c))
				continue
			}
			if c == 0xcd && off+3 <= len(buf) {
				ts = append(ts, uint32(buf[off+1])<<8|uint32(buf[off+2]))
				off += 3
				continue
			}
			if c == 0xce && off+5 <= len(buf) {
				ts = append(ts, binary.BigEndian.Uint32(buf[off+1:off+5]))
				off += 5
				continue
			}
		}
		r.off = off
		u, neg, err := r.bits64("token_ids")
		if err != nil {
			ev.TokenIDs = ts
			return err
		}
		if neg || u > math.MaxUint32 {
			ev.TokenIDs = ts
			return fmt.Errorf("token_ids: %d out of range: %w", int64(u), ErrMalformed)
		}
		ts = append(ts, uint32(u))
		off = r.off
	}
	r.off = off
	ev.TokenIDs = ts
	return nil
}

// intern returns s as a string without allocating for values seen before.
func (b *Batch) intern(s []byte) string {
	switch string(s) {
	case "":
		return ""
	case "GPU":
		return "GPU"
	case "CPU":
		return "CPU"
	case "CPU_PINNED":
		return "CPU_PINNED"
	case "DISK":
		return "DISK"
	case "STORAGE":
		return "STORAGE"
	case "full_attention":
		return "full_attention"
	case "sliding_window":
		return "sliding_window"
	}
	if v, ok := b.strs[string(s)]; ok {
		return v
	}
	v := string(s)
	if b.strs == nil {
		b.strs = make(map[string]string)
	}
	if len(b.strs) < maxInterned {
		b.strs[v] = v
	}
	return v
}

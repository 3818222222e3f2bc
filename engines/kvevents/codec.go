package kvevents

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// Wire names of the event classes and fields. They are the engines' Python
// identifiers, so they never change without a protocol change.
const (
	tagBlockStored      = "BlockStored"
	tagBlockRemoved     = "BlockRemoved"
	tagAllBlocksCleared = "AllBlocksCleared"
)

// ErrMalformed is wrapped by every decode error caused by the input bytes.
var ErrMalformed = errors.New("malformed msgpack")

// AppendBatch appends the msgpack encoding of b to dst, exactly as vLLM or
// SGLang would send it: [ts, events, dp_rank|nil] with the events in format f
// and block hashes in encoding h. It allocates only when dst must grow.
//
// FormatArray writes every BlockStored field up to
// kv_cache_spec_sliding_window (12 slots, the vLLM schema before locality was
// added) and BlockRemoved as [tag, hashes, medium, group_idx, locality,
// ownership] as pinned by the engine contract; unset optional slots are nil.
func AppendBatch(dst []byte, b *Batch, f Format, h HashEncoding) ([]byte, error) {
	if f > FormatMapSGLang {
		return dst, fmt.Errorf("cannot encode batch: unknown format %d", f)
	}
	if h > HashBytes {
		return dst, fmt.Errorf("cannot encode batch: unknown hash encoding %d", h)
	}
	dst = appendArrayLen(dst, 3)
	dst = appendFloat64(dst, b.TS)
	dst = appendArrayLen(dst, len(b.Events))
	for i := range b.Events {
		ev := &b.Events[i]
		var err error
		switch f {
		case FormatMap:
			dst, err = appendEventMap(dst, ev, h)
		case FormatMapSGLang:
			dst, err = appendEventMapSGLang(dst, ev, h)
		default:
			dst, err = appendEventArray(dst, ev, f, h)
		}
		if err != nil {
			return dst, fmt.Errorf("cannot encode batch: event %d: %w", i, err)
		}
	}
	if b.HasDPRank {
		dst = appendInt(dst, int64(b.DPRank))
	} else {
		dst = appendNil(dst)
	}
	return dst, nil
}

func appendEventArray(dst []byte, ev *Event, f Format, h HashEncoding) ([]byte, error) {
	switch ev.Kind {
	case KindBlockStored:
		n := 12
		if f == FormatArraySGLang {
			n = 7
			if ev.CacheSalt != "" {
				n = 8
			}
		}
		dst = appendArrayLen(dst, n)
		dst = appendStr(dst, tagBlockStored)
		dst = appendHashes(dst, ev.BlockHashes, h)
		dst = appendParent(dst, ev, h)
		dst = appendTokens(dst, ev.TokenIDs)
		dst = appendInt(dst, int64(ev.BlockSize))
		dst = appendNil(dst) // lora_id: deprecated, never set by the simulator
		dst = appendOptStr(dst, ev.Medium)
		if f == FormatArraySGLang {
			if ev.CacheSalt != "" {
				dst = appendMapLen(dst, 1)
				dst = appendStr(dst, "cache_salt")
				dst = appendStr(dst, ev.CacheSalt)
			}
			return dst, nil
		}
		dst = appendOptStr(dst, ev.LoraName)
		dst = appendExtraKeys(dst, ev)
		dst = appendInt(dst, int64(ev.GroupIdx))
		dst = appendOptStr(dst, ev.SpecKind)
		dst = appendNil(dst) // kv_cache_spec_sliding_window
	case KindBlockRemoved:
		if f == FormatArraySGLang {
			dst = appendArrayLen(dst, 3)
		} else {
			dst = appendArrayLen(dst, 6)
		}
		dst = appendStr(dst, tagBlockRemoved)
		dst = appendHashes(dst, ev.BlockHashes, h)
		dst = appendOptStr(dst, ev.Medium)
		if f != FormatArraySGLang {
			dst = appendInt(dst, int64(ev.GroupIdx))
			dst = appendNil(dst) // locality
			dst = appendNil(dst) // ownership
		}
	case KindAllBlocksCleared:
		dst = appendArrayLen(dst, 1)
		dst = appendStr(dst, tagAllBlocksCleared)
	default:
		return dst, fmt.Errorf("unknown event kind %d", ev.Kind)
	}
	return dst, nil
}

// opaqueExtraKey is the multimodal identifier the encoder writes for Opaque
// blocks: the decoder treats any (identifier, offset) pair as opaque.
const opaqueExtraKey = "opaque"

func hasExtraKeys(ev *Event) bool {
	return len(ev.BlockHashes) > 0 && (ev.LoraName != "" || rootSalt(ev) != "" || ev.Opaque > 0)
}

// rootSalt is the salt vLLM publishes for ev: only on a request's first
// block, so only in an event without a parent.
func rootSalt(ev *Event) string {
	if ev.HasParent {
		return ""
	}
	return ev.CacheSalt
}

// appendExtraKeys writes vLLM's untagged extra_keys for ev (see
// reader.extraKeys): per block the LoRA name, an (identifier, 0) pair for
// Opaque blocks, and the salt on the first block of a root event; nil when
// none applies.
func appendExtraKeys(dst []byte, ev *Event) []byte {
	if !hasExtraKeys(ev) {
		return appendNil(dst)
	}
	salt := rootSalt(ev)
	n := len(ev.BlockHashes)
	first := n - min(max(ev.Opaque, 0), n)
	dst = appendArrayLen(dst, n)
	for i := 0; i < n; i++ {
		k := 0
		if ev.LoraName != "" {
			k++
		}
		if i >= first {
			k++
		}
		if i == 0 && salt != "" {
			k++
		}
		if k == 0 {
			dst = appendNil(dst)
			continue
		}
		dst = appendArrayLen(dst, k)
		if ev.LoraName != "" {
			dst = appendStr(dst, ev.LoraName)
		}
		if i >= first {
			dst = appendArrayLen(dst, 2)
			dst = appendStr(dst, opaqueExtraKey)
			dst = appendInt(dst, 0)
		}
		if i == 0 && salt != "" {
			dst = appendStr(dst, salt)
		}
	}
	return dst
}

func appendEventMap(dst []byte, ev *Event, h HashEncoding) ([]byte, error) {
	switch ev.Kind {
	case KindBlockStored:
		n := 9
		if ev.SpecKind != "" {
			n++
		}
		if hasExtraKeys(ev) {
			n++
		}
		dst = appendStoredHead(dst, ev, h, n)
		dst = appendStr(dst, "medium")
		dst = appendOptStr(dst, ev.Medium)
		dst = appendStr(dst, "lora_name")
		dst = appendOptStr(dst, ev.LoraName)
		if hasExtraKeys(ev) {
			dst = appendStr(dst, "extra_keys")
			dst = appendExtraKeys(dst, ev)
		}
		dst = appendStr(dst, "group_idx")
		dst = appendInt(dst, int64(ev.GroupIdx))
		if ev.SpecKind != "" {
			dst = appendStr(dst, "kv_cache_spec_kind")
			dst = appendStr(dst, ev.SpecKind)
		}
	case KindBlockRemoved:
		dst = appendMapLen(dst, 4)
		dst = appendStr(dst, "type")
		dst = appendStr(dst, tagBlockRemoved)
		dst = appendStr(dst, "block_hashes")
		dst = appendHashes(dst, ev.BlockHashes, h)
		dst = appendStr(dst, "medium")
		dst = appendOptStr(dst, ev.Medium)
		dst = appendStr(dst, "group_idx")
		dst = appendInt(dst, int64(ev.GroupIdx))
	case KindAllBlocksCleared:
		dst = appendMapLen(dst, 1)
		dst = appendStr(dst, "type")
		dst = appendStr(dst, tagAllBlocksCleared)
	default:
		return dst, fmt.Errorf("unknown event kind %d", ev.Kind)
	}
	return dst, nil
}

// appendStoredHead opens a BlockStored map of n fields with the six both
// engines send first, in their order: type, block_hashes,
// parent_block_hash, token_ids, block_size, lora_id (nil: the simulator
// has no LoRA ids).
func appendStoredHead(dst []byte, ev *Event, h HashEncoding, n int) []byte {
	dst = appendMapLen(dst, n)
	dst = appendStr(dst, "type")
	dst = appendStr(dst, tagBlockStored)
	dst = appendStr(dst, "block_hashes")
	dst = appendHashes(dst, ev.BlockHashes, h)
	dst = appendStr(dst, "parent_block_hash")
	dst = appendParent(dst, ev, h)
	dst = appendStr(dst, "token_ids")
	dst = appendTokens(dst, ev.TokenIDs)
	dst = appendStr(dst, "block_size")
	dst = appendInt(dst, int64(ev.BlockSize))
	dst = appendStr(dst, "lora_id")
	return appendNil(dst)
}

// appendEventMapSGLang writes ev as SGLang 0.5.23's msgspec encoder does:
// required fields always (lora_id as nil: the simulator has no LoRA ids),
// optional ones only when set, in declaration order (TestSGLangShape).
func appendEventMapSGLang(dst []byte, ev *Event, h HashEncoding) ([]byte, error) {
	switch ev.Kind {
	case KindBlockStored:
		n := 6
		for _, s := range [...]string{ev.Medium, ev.CacheSalt, ev.SessionID, ev.LoraName} {
			if s != "" {
				n++
			}
		}
		dst = appendStoredHead(dst, ev, h, n)
		dst = appendOptField(dst, "medium", ev.Medium)
		dst = appendOptField(dst, "cache_salt", ev.CacheSalt)
		dst = appendOptField(dst, "session_id", ev.SessionID)
		dst = appendOptField(dst, "lora_name", ev.LoraName)
	case KindBlockRemoved:
		n := 2
		if ev.Medium != "" {
			n++
		}
		dst = appendMapLen(dst, n)
		dst = appendStr(dst, "type")
		dst = appendStr(dst, tagBlockRemoved)
		dst = appendStr(dst, "block_hashes")
		dst = appendHashes(dst, ev.BlockHashes, h)
		dst = appendOptField(dst, "medium", ev.Medium)
	case KindAllBlocksCleared:
		dst = appendMapLen(dst, 1)
		dst = appendStr(dst, "type")
		dst = appendStr(dst, tagAllBlocksCleared)
	default:
		return dst, fmt.Errorf("unknown event kind %d", ev.Kind)
	}
	return dst, nil
}

// appendOptField writes key and v, or nothing for "" (omit_defaults).
func appendOptField(dst []byte, key, v string) []byte {
	if v == "" {
		return dst
	}
	return appendStr(appendStr(dst, key), v)
}

func appendParent(dst []byte, ev *Event, h HashEncoding) []byte {
	if !ev.HasParent {
		return appendNil(dst)
	}
	return appendHash(dst, ev.ParentHash, h)
}

func appendHashes(dst []byte, hs []uint64, h HashEncoding) []byte {
	dst = appendArrayLen(dst, len(hs))
	for _, v := range hs {
		dst = appendHash(dst, v, h)
	}
	return dst
}

// appendHash writes one block hash. Integers use the smallest msgpack form,
// as msgspec does; HashBytes writes a 32-byte digest whose last 8 bytes are
// the key and whose first 24 bytes are derived from it, so the same key
// always yields the same bytes.
func appendHash(dst []byte, v uint64, h HashEncoding) []byte {
	switch h {
	case HashInt64:
		return appendInt(dst, int64(v))
	case HashBytes:
		dst = append(dst, 0xc4, 32)
		x := v
		for i := 0; i < 3; i++ {
			x = splitmix64(x)
			dst = binary.BigEndian.AppendUint64(dst, x)
		}
		return binary.BigEndian.AppendUint64(dst, v)
	default:
		return appendUint(dst, v)
	}
}

func splitmix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

func appendTokens(dst []byte, toks []uint32) []byte {
	dst = appendArrayLen(dst, len(toks))
	for _, t := range toks {
		dst = appendUint(dst, uint64(t))
	}
	return dst
}

func appendNil(dst []byte) []byte { return append(dst, 0xc0) }

func appendUint(dst []byte, v uint64) []byte {
	switch {
	case v < 0x80:
		return append(dst, byte(v))
	case v <= math.MaxUint8:
		return append(dst, 0xcc, byte(v))
	case v <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(dst, 0xcd), uint16(v))
	case v <= math.MaxUint32:
		return binary.BigEndian.AppendUint32(append(dst, 0xce), uint32(v))
	}
	return binary.BigEndian.AppendUint64(append(dst, 0xcf), v)
}

func appendInt(dst []byte, v int64) []byte {
	switch {
	case v >= 0:
		return appendUint(dst, uint64(v))
	case v >= -32:
		return append(dst, byte(v))
	case v >= math.MinInt8:
		return append(dst, 0xd0, byte(v))
	case v >= math.MinInt16:
		return binary.BigEndian.AppendUint16(append(dst, 0xd1), uint16(v))
	case v >= math.MinInt32:
		return binary.BigEndian.AppendUint32(append(dst, 0xd2), uint32(v))
	}
	return binary.BigEndian.AppendUint64(append(dst, 0xd3), uint64(v))
}

func appendFloat64(dst []byte, f float64) []byte {
	return binary.BigEndian.AppendUint64(append(dst, 0xcb), math.Float64bits(f))
}

func appendStr(dst []byte, s string) []byte {
	n := len(s)
	switch {
	case n < 32:
		dst = append(dst, 0xa0|byte(n))
	case n <= math.MaxUint8:
		dst = append(dst, 0xd9, byte(n))
	case n <= math.MaxUint16:
		dst = binary.BigEndian.AppendUint16(append(dst, 0xda), uint16(n))
	default:
		dst = binary.BigEndian.AppendUint32(append(dst, 0xdb), uint32(n))
	}
	return append(dst, s...)
}

// appendOptStr writes s, or nil for "" (the engines' None).
func appendOptStr(dst []byte, s string) []byte {
	if s == "" {
		return appendNil(dst)
	}
	return appendStr(dst, s)
}

func appendArrayLen(dst []byte, n int) []byte {
	switch {
	case n < 16:
		return append(dst, 0x90|byte(n))
	case n <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(dst, 0xdc), uint16(n))
	}
	return binary.BigEndian.AppendUint32(append(dst, 0xdd), uint32(n))
}

func appendMapLen(dst []byte, n int) []byte {
	switch {
	case n < 16:
		return append(dst, 0x80|byte(n))
	case n <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(dst, 0xde), uint16(n))
	}
	return binary.BigEndian.AppendUint32(append(dst, 0xdf), uint32(n))
}

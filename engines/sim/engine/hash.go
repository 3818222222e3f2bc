package engine

import (
	"crypto/sha256"
	"encoding/binary"
	"strconv"
)

// digest is a full sha256 block digest; the chain is carried on digests and
// only the wire value is truncated, as the real engines do.
type digest [sha256.Size]byte

// hasher computes the chained block hashes of one engine flavour.
type hasher struct {
	flavour string
	// noneHash is vLLM's NONE_HASH, the parent of block 0.
	noneHash digest
	buf      []byte
}

func newHasher(flavour string, seed int64) *hasher {
	h := &hasher{flavour: flavour}
	// vLLM derives NONE_HASH from PYTHONHASHSEED, a decimal string.
	h.noneHash = sha256.Sum256([]byte(strconv.FormatInt(seed, 10)))
	return h
}

// root returns the prior digest for block 0 and whether there is one.
//
// vLLM: NONE_HASH. SGLang hashes block 0 with no prior; when the request has a
// LoRA adapter or cache salt the simulator mixes them into a prior digest so
// that distinct namespaces never share blocks (SGLang keys its radix tree by
// these extra keys; its exact event hash for that case is unverified).
func (h *hasher) root(lora, salt string) (digest, bool) {
	if h.flavour == FlavourVLLM {
		return h.noneHash, true
	}
	if lora == "" && salt == "" {
		return digest{}, false
	}
	b := h.buf[:0]
	b = appendExtraKey(b, 'L', lora)
	b = appendExtraKey(b, 'S', salt)
	h.buf = b
	return sha256.Sum256(b), true
}

// block hashes one full block given its parent digest.
//
// vLLM hashes (parent, tokens, extra_keys) with pickle or CBOR; neither is
// portable, so the simulator uses a fixed byte layout with the same inputs:
// parent digest, token ids as uint32 little-endian, then the extra keys in
// vLLM's order (LoRA name on every block, cache_salt on block 0 only), each
// tagged and length-prefixed so that different keys never collide.
// SGLang hashes prior digest || tokens as uint32 little-endian.
func (h *hasher) block(parent digest, hasParent bool, tokens []uint32, index int, lora, salt string) digest {
	b := h.buf[:0]
	if hasParent {
		b = append(b, parent[:]...)
	}
	for _, t := range tokens {
		b = binary.LittleEndian.AppendUint32(b, t)
	}
	if h.flavour == FlavourVLLM {
		if lora != "" {
			b = appendExtraKey(b, 'L', lora)
		}
		if index == 0 && salt != "" {
			b = appendExtraKey(b, 'S', salt)
		}
	}
	h.buf = b
	return sha256.Sum256(b)
}

func appendExtraKey(b []byte, tag byte, v string) []byte {
	b = append(b, tag)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(v)))
	return append(b, v...)
}

// wire returns the hash an engine publishes for d as a uint64 bit pattern:
// vLLM's integer form is the last 8 bytes big-endian; SGLang's is the first 8
// bytes read as a signed int64 (big-endian), kept here as its bit pattern.
func (h *hasher) wire(d digest) uint64 {
	if h.flavour == FlavourSGLang {
		return binary.BigEndian.Uint64(d[:8])
	}
	return binary.BigEndian.Uint64(d[len(d)-8:])
}

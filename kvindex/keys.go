package kvindex

import (
	"encoding/binary"
	"math/bits"

	"github.com/cespare/xxhash/v2"
)

// Key identifies one full KV block by its content and everything before it:
// the chain of token blocks from the root. Keys are the router's own and do
// not depend on any engine's hash algorithm, seed or truncation, so a prompt
// can be keyed before any event arrives. Key 0 is never produced and means
// "no key".
type Key uint64

// RootKey is the parent of a prompt's first block. The model, LoRA adapter and
// cache salt are mixed in here so that identical tokens under a different
// model, adapter or salt never share a chain. Each name is length-prefixed so
// that ("ab", "c") and ("a", "bc") differ.
func RootKey(model, lora, cacheSalt string) Key {
	var d xxhash.Digest
	d.Reset()
	var n [8]byte
	for _, s := range [...]string{model, lora, cacheSalt} {
		binary.LittleEndian.PutUint64(n[:], uint64(len(s)))
		_, _ = d.Write(n[:])
		_, _ = d.WriteString(s)
	}
	return nonZero(d.Sum64())
}

// AppendBlockKeys appends to dst the keys of every full block of tokens,
// chained from parent: key_i = xxhash64(key_{i-1} as 8 little-endian bytes ||
// block i's tokens as little-endian uint32). A trailing partial block is not
// keyed because engines only cache full blocks. Keys depend on blockSize, so
// prompts must be keyed with the block size of the replicas they are matched
// against. It does not allocate beyond growing dst.
func AppendBlockKeys(dst []Key, parent Key, tokens []uint32, blockSize int) []Key {
	if blockSize <= 0 {
		return dst
	}
	for len(tokens) >= blockSize {
		parent = nonZero(chainSum(uint64(parent), tokens[:blockSize:blockSize]))
		dst = append(dst, parent)
		tokens = tokens[blockSize:]
	}
	return dst
}

// XXH64 constants (seed 0).
const (
	prime1 uint64 = 11400714785074694791
	prime2 uint64 = 14029467366897019727
	prime3 uint64 = 1609587929392839161
	prime4 uint64 = 9650029242287828579
	prime5 uint64 = 2870177450012600261
	// v1Init and v4Init are prime1+prime2 and -prime1 modulo 2^64.
	v1Init uint64 = 6983438078262162902
	v4Init uint64 = 7046029288634856825
)

// chainSum is xxhash.Sum64 of parent's 8 little-endian bytes followed by
// blk's tokens as little-endian uint32, computed on the fly: the 8-byte words
// XXH64 consumes are parent, then token pairs. It saves copying every token
// into a byte buffer (and needs no unsafe view of the slice), and being plain
// Go it lets the CPU overlap the parent-independent work of the next block
// with the current one. Tests pin it to the library's Sum64.
func chainSum(parent uint64, blk []uint32) uint64 {
	n := uint64(8 + 4*len(blk))
	var h uint64
	if len(blk) >= 6 { // at least one 32-byte stripe
		v1 := xxRound(v1Init, parent)
		v2 := xxRound(prime2, pair(blk[0], blk[1]))
		v3 := xxRound(0, pair(blk[2], blk[3]))
		v4 := xxRound(v4Init, pair(blk[4], blk[5]))
		blk = blk[6:]
		for ; len(blk) >= 8; blk = blk[8:] {
			v1 = xxRound(v1, pair(blk[0], blk[1]))
			v2 = xxRound(v2, pair(blk[2], blk[3]))
			v3 = xxRound(v3, pair(blk[4], blk[5]))
			v4 = xxRound(v4, pair(blk[6], blk[7]))
		}
		h = bits.RotateLeft64(v1, 1) + bits.RotateLeft64(v2, 7) +
			bits.RotateLeft64(v3, 12) + bits.RotateLeft64(v4, 18)
		h = xxMerge(h, v1)
		h = xxMerge(h, v2)
		h = xxMerge(h, v3)
		h = xxMerge(h, v4)
		h += n
	} else {
		h = prime5 + n
		h = xxTail(h, parent)
	}
	for ; len(blk) >= 2; blk = blk[2:] {
		h = xxTail(h, pair(blk[0], blk[1]))
	}
	if len(blk) == 1 {
		h ^= uint64(blk[0]) * prime1
		h = bits.RotateLeft64(h, 23)*prime2 + prime3
	}
	h ^= h >> 33
	h *= prime2
	h ^= h >> 29
	h *= prime3
	h ^= h >> 32
	return h
}

func pair(lo, hi uint32) uint64 { return uint64(lo) | uint64(hi)<<32 }

func xxRound(acc, input uint64) uint64 {
	acc += input * prime2
	acc = bits.RotateLeft64(acc, 31)
	return acc * prime1
}

func xxMerge(acc, val uint64) uint64 {
	acc ^= xxRound(0, val)
	return acc*prime1 + prime4
}

func xxTail(h, word uint64) uint64 {
	h ^= xxRound(0, word)
	return bits.RotateLeft64(h, 27)*prime1 + prime4
}

// nonZero keeps 0 free as the "no key" marker; a 2^-64 collision with key 1
// is accepted.
func nonZero(h uint64) Key {
	if h == 0 {
		return 1
	}
	return Key(h)
}

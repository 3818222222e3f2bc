package kvindex

import (
	"encoding/binary"
	"hash/maphash"
	"unsafe"

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
// chained from parent: key_i = chainMix(key_{i-1}, contentSum(block i)). A
// trailing partial block is not keyed because engines only cache full blocks.
// Keys depend on blockSize, so prompts must be keyed with the block size of
// the replicas they are matched against. It does not allocate beyond growing
// dst.
//
// Keys are process-local: contentSum is seeded once per process, so keys are
// never stored or sent anywhere (after a restart the index is rebuilt from
// engine events, or from a sibling's snapshot, which carries token ids and
// engine hashes, never keys), and a client cannot craft prompts whose
// blocks collide without knowing the seed.
func AppendBlockKeys(dst []Key, parent Key, tokens []uint32, blockSize int) []Key {
	if blockSize <= 0 {
		return dst
	}
	for len(tokens) >= blockSize {
		// blockKey, written out: it is too large to be inlined, and a
		// call per block costs more than the chain step.
		parent = nonZero(chainMix(uint64(parent), contentSum(tokens[:blockSize:blockSize])))
		dst = append(dst, parent)
		tokens = tokens[blockSize:]
	}
	return dst
}

// blockKey is the key of the block blk after parent.
func blockKey(parent Key, blk []uint32) Key {
	return nonZero(chainMix(uint64(parent), contentSum(blk)))
}

// contentSeed seeds the block content hash for the life of the process.
var contentSeed = maphash.MakeSeed()

// contentSum hashes one block's token ids, viewed in place as bytes in the
// machine's byte order. hash/maphash uses the CPU's AES instructions where
// it can, about three times faster than XXH64 on 64-byte blocks, and,
// unlike a chain hash, the sums of consecutive blocks are independent, so
// the CPU computes several at once; only chainMix is serial.
func contentSum(blk []uint32) uint64 {
	return maphash.Bytes(contentSeed, unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(blk))), 4*len(blk)))
}

// opaqueSeed separates opaqueKey from every chain a prompt can key.
var opaqueSeed = maphash.Bytes(contentSeed, []byte("opaque block"))

// opaqueKey keys a block whose engine hash mixes in keys a request cannot
// reproduce (multimodal inputs, prompt embeddings): derived from the engine
// hash under a process seed, so no prompt's chain from a RootKey reaches it
// and blocks stored after it chain from it unmatchable too
// (TestReplicaOpaqueBlocks).
func opaqueKey(engineHash uint64) Key {
	return nonZero(chainMix(opaqueSeed, engineHash))
}

// chainMix folds a block's content sum into its parent's key: the parent is
// multiplied by an odd constant (so swapping parent and content does not
// collide), then MurmurHash3's 64-bit finaliser avalanches the result. For a
// fixed content sum it is a bijection of the parent, so two different
// prefixes never share a key unless their 64-bit inputs collide.
func chainMix(parent, content uint64) uint64 {
	x := parent*0x9e3779b97f4a7c15 ^ content
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	x *= 0xc4ceb9fe1a85ec53
	x ^= x >> 33
	return x
}

// nonZero keeps 0 free as the "no key" marker; a 2^-64 collision with key 1
// is accepted.
func nonZero(h uint64) Key {
	if h == 0 {
		return 1
	}
	return Key(h)
}

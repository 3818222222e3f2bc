package kvindex

import (
	"bytes"
	"fmt"
	"sync"
	"unsafe"

	"github.com/hashicorp/golang-lru/v2/simplelru"
)

// segmentTokens is about how many tokens one KeyCache entry covers: enough
// that one LRU lookup and one memory comparison replace many block hashes
// (recording a segment costs about as much as hashing 16 blocks), few
// enough that the cache's capacity is not spent on padding.
const segmentTokens = 1024

// KeyCache computes the same keys as AppendBlockKeys for one block size,
// reusing the keys of recent prompts. A key chain is a pure function of a
// block's key and the tokens that follow it, so blocks whose tokens equal
// those recorded after the same key have the recorded keys: the cache
// compares tokens, never trusts a key for more than its own block, and its
// answer is the uncached one bit for bit. A prompt that shares a prefix
// with a recent one (a system prompt, earlier turns of a conversation)
// then costs one block hash, one LRU lookup and one memory comparison per
// segment instead of a hash per block.
//
// Entries are runs of up to about segmentTokens tokens of full blocks,
// keyed by the key of their first block, so different prompts under one
// model (one root) keep entries of their own. An evicted entry's buffers
// serve the next one. It is safe for concurrent use: one mutex, taken once
// to walk the cached run and once to record what had to be hashed, never
// while hashing more than one block.
type KeyCache struct {
	blockSize int
	segBlocks int

	mu   sync.Mutex
	segs *simplelru.LRU[Key, *keySegment]
	free []*keySegment
}

// keySegment is a run of full blocks: their tokens and keys (len(keys)
// blocks, at most segBlocks), keys[0] being the entry's own key.
type keySegment struct {
	tokens []uint32
	keys   []Key
}

// NewKeyCache returns a cache holding the keys of up to about tokens recent
// prompt tokens, for prompts keyed with blockSize.
func NewKeyCache(tokens, blockSize int) (*KeyCache, error) {
	if blockSize <= 0 {
		return nil, fmt.Errorf("key cache: block size %d is not positive", blockSize)
	}
	c := &KeyCache{blockSize: blockSize, segBlocks: max(1, segmentTokens/blockSize)}
	segs, err := simplelru.NewLRU[Key, *keySegment](max(1, tokens/(c.segBlocks*blockSize)), func(_ Key, s *keySegment) {
		c.free = append(c.free, s)
	})
	if err != nil {
		return nil, fmt.Errorf("key cache: %w", err)
	}
	c.segs = segs
	return c, nil
}

// AppendBlockKeys is AppendBlockKeys(dst, parent, tokens, c's block size).
func (c *KeyCache) AppendBlockKeys(dst []Key, parent Key, tokens []uint32) []Key {
	bs := c.blockSize
	c.mu.Lock()
	for len(tokens) >= bs {
		s, ok := c.segs.Get(blockKey(parent, tokens[:bs:bs]))
		if !ok {
			break
		}
		n := s.shared(tokens, bs)
		if n == 0 {
			break // a different first block with the same key
		}
		dst = append(dst, s.keys[:n]...)
		tokens, parent = tokens[n*bs:], s.keys[n-1]
		if n < len(s.keys) {
			break // diverged, or the prompt ends inside the segment
		}
	}
	c.mu.Unlock()
	if len(tokens) < bs {
		return dst
	}
	start := len(dst)
	dst = AppendBlockKeys(dst, parent, tokens, bs)
	c.record(tokens, dst[start:])
	return dst
}

// shared is how many leading blocks of tokens equal s's.
func (s *keySegment) shared(tokens []uint32, bs int) int {
	n := min(len(s.keys), len(tokens)/bs)
	if sameTokens(s.tokens[:n*bs], tokens[:n*bs]) {
		return n
	}
	for i := range n {
		if !sameTokens(s.tokens[i*bs:(i+1)*bs], tokens[i*bs:(i+1)*bs]) {
			return i
		}
	}
	return n
}

// sameTokens compares as bytes: bytes.Equal is vectorised, a loop over
// uint32s is not.
func sameTokens(a, b []uint32) bool {
	return bytes.Equal(tokenBytes(a), tokenBytes(b))
}

func tokenBytes(t []uint32) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(t))), 4*len(t))
}

// record stores keys, the keys of tokens' full blocks, as segments.
func (c *KeyCache) record(tokens []uint32, keys []Key) {
	bs := c.blockSize
	c.mu.Lock()
	defer c.mu.Unlock()
	for len(keys) > 0 {
		n := min(c.segBlocks, len(keys))
		s, ok := c.segs.Peek(keys[0])
		if !ok {
			if k := len(c.free); k > 0 {
				s, c.free = c.free[k-1], c.free[:k-1]
			} else {
				s = new(keySegment)
			}
		}
		// Readers hold the lock while they read a segment, so one can be
		// rewritten in place.
		s.tokens = append(s.tokens[:0], tokens[:n*bs]...)
		s.keys = append(s.keys[:0], keys[:n]...)
		c.segs.Add(keys[0], s)
		tokens, keys = tokens[n*bs:], keys[n:]
	}
}

package kvindex

import (
	"slices"
	"sync"
	"sync/atomic"
)

// CachedPrefix is the leading tokens of a prompt as a tokenizer's cache
// holds them (engines/tokenizer's Prefix): a chain of runs, each with a
// memo slot in which AppendPrefixKeys keeps the keys of the blocks that end
// inside the run, so that a cached prefix costs neither a token comparison
// nor a block hash. AppendRuns appends, first run first, each run's end in
// tokens from the prompt's start (ascending) and its memo. The runs' tokens
// must be the prompt's first ones: the memo is filled from the tokens the
// caller passes along.
type CachedPrefix interface {
	AppendRuns(ends []int, memos []*atomic.Value) ([]int, []*atomic.Value)
}

// prefixRun is a memo's content: the keys of the blocks ending inside one
// run, made under root with blockSize. A memo holds the keys of one root
// and block size, the first that filled it; another root or block size
// never reads them (TestAppendPrefixKeysRoots).
type prefixRun struct {
	root      Key
	blockSize int
	keys      []Key
}

// runScratch holds the runs of one AppendPrefixKeys call.
type runScratch struct {
	ends  []int
	memos []*atomic.Value
}

var runScratches = sync.Pool{New: func() any { return new(runScratch) }}

// AppendPrefixKeys is AppendBlockKeys(dst, root, tokens, c's block size)
// (FuzzAppendPrefixKeys) for a prompt whose leading tokens p holds: the
// blocks that end inside a run whose memo has keys for root and c's block
// size take them from there; the others are keyed through the cache, and
// a run's empty memo keeps them for the next prompt that shares it. A nil
// p is AppendBlockKeys.
func (c *KeyCache) AppendPrefixKeys(dst []Key, root Key, tokens []uint32, p CachedPrefix) []Key {
	if p == nil {
		return c.AppendBlockKeys(dst, root, tokens)
	}
	sc := runScratches.Get().(*runScratch)
	sc.ends, sc.memos = p.AppendRuns(sc.ends[:0], sc.memos[:0])
	bs := c.blockSize
	start := len(dst)
	parent, prev := root, 0
	for i, end := range sc.ends {
		if end < prev || end > len(tokens) {
			break // not a prefix of tokens: the rest is keyed below
		}
		b0, b1 := prev/bs, end/bs
		prev = end
		if b1 == b0 {
			continue // no block ends in this run
		}
		// Invariant: dst[start:] holds the keys of blocks [0, b0).
		m := sc.memos[i]
		if r, ok := m.Load().(*prefixRun); ok && r.root == root && r.blockSize == bs && len(r.keys) == b1-b0 {
			dst = append(dst, r.keys...)
		} else {
			k := len(dst)
			dst = c.AppendBlockKeys(dst, parent, tokens[b0*bs:b1*bs])
			if !ok {
				m.CompareAndSwap(nil, &prefixRun{root: root, blockSize: bs, keys: slices.Clone(dst[k:])})
			}
		}
		parent = dst[len(dst)-1]
	}
	clear(sc.memos) // the memos are the entries': let them go
	runScratches.Put(sc)
	return c.AppendBlockKeys(dst, parent, tokens[(len(dst)-start)*bs:])
}

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
// nor a block hash. Len is the number of tokens the runs hold. AppendRuns
// appends, first run first, each run's tokens (those after the previous
// run's) and its memo; the tokens are the cache's, read and never written
// or kept.
type CachedPrefix interface {
	Len() int
	AppendRuns(ids [][]uint32, memos []*atomic.Value) ([][]uint32, []*atomic.Value)
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

// runScratch holds the runs of one AppendPrefixKeys call and the tokens
// after its last full block.
type runScratch struct {
	ids   [][]uint32
	memos []*atomic.Value
	carry []uint32
}

var runScratches = sync.Pool{New: func() any { return new(runScratch) }}

// AppendPrefixKeys is AppendBlockKeys(dst, root, p's tokens followed by
// tail, c's block size) (FuzzAppendPrefixKeys): the prompt is p's tokens
// then tail, and no caller has to copy p's tokens into one slice. The
// blocks that end inside a run whose memo has keys for root and c's block
// size take them from there; the others are keyed through the cache, and
// a run's empty memo keeps them for the next prompt that shares it. A nil
// p is AppendBlockKeys of tail.
func (c *KeyCache) AppendPrefixKeys(dst []Key, root Key, p CachedPrefix, tail []uint32) []Key {
	if p == nil {
		return c.AppendBlockKeys(dst, root, tail)
	}
	sc := runScratches.Get().(*runScratch)
	sc.ids, sc.memos = p.AppendRuns(sc.ids[:0], sc.memos[:0])
	bs := c.blockSize
	parent, carry, pos := root, sc.carry[:0], 0
	// After a run served from its memo, the tokens after its last full
	// block are left where they are, in the run (held), and copied to
	// carry only when a later step reads them: a prefix served from
	// memos run after run never reads its tokens.
	var held []uint32
	lazy := false
	for i, ids := range sc.ids {
		// Invariant: dst holds the keys of the blocks [0, pos/bs) after
		// what it held, parent is the last of them (root for none), and
		// the pos%bs tokens after them are held when lazy, carry if not.
		end := pos + len(ids)
		b0, b1 := pos/bs, end/bs
		pos = end
		m := sc.memos[i]
		r, ok := (*prefixRun)(nil), false
		if b1 > b0 {
			r, ok = m.Load().(*prefixRun)
		}
		if ok && r.root == root && r.blockSize == bs && len(r.keys) == b1-b0 {
			dst = append(dst, r.keys...)
			parent = dst[len(dst)-1]
			held, lazy = ids[len(ids)-end%bs:], true
			continue
		}
		if lazy {
			carry, lazy = append(carry[:0], held...), false
		}
		if b1 == b0 {
			carry = append(carry, ids...) // no block ends in this run
			continue
		}
		k := len(dst)
		dst, parent, carry = c.appendJoined(dst, parent, carry, ids)
		if !ok {
			m.CompareAndSwap(nil, &prefixRun{root: root, blockSize: bs, keys: slices.Clone(dst[k:])})
		}
	}
	if lazy {
		carry = append(carry[:0], held...)
	}
	dst, _, carry = c.appendJoined(dst, parent, carry, tail)
	clear(sc.ids) // the tokens and memos are the entries': let them go
	clear(sc.memos)
	sc.carry = carry[:0]
	runScratches.Put(sc)
	return dst
}

// appendJoined appends the keys, after parent, of the full blocks of carry
// followed by ids, where carry holds fewer tokens than a block, and
// returns the last key (parent when none) and the tokens after the last
// full block, in carry's buffer. The block that joins carry to ids is
// hashed alone: a single block gains nothing from the key cache.
func (c *KeyCache) appendJoined(dst []Key, parent Key, carry, ids []uint32) ([]Key, Key, []uint32) {
	bs := c.blockSize
	if len(carry)+len(ids) < bs {
		return dst, parent, append(carry, ids...)
	}
	if len(carry) > 0 {
		need := bs - len(carry)
		carry = append(carry, ids[:need]...)
		dst = AppendBlockKeys(dst, parent, carry, bs)
		parent, ids = dst[len(dst)-1], ids[need:]
	}
	if full := len(ids) / bs * bs; full > 0 {
		dst = c.AppendBlockKeys(dst, parent, ids[:full])
		parent, ids = dst[len(dst)-1], ids[full:]
	}
	return dst, parent, append(carry[:0], ids...)
}

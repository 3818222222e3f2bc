package tokenizer

import (
	"fmt"
	"slices"
	"sync/atomic"

	"github.com/cespare/xxhash/v2"
	lru "github.com/hashicorp/golang-lru/v2"

	"github.com/omnious/provider-node/internal/opt"
)

// PrefixCacheConfig sizes a PrefixCache.
type PrefixCacheConfig struct {
	// MaxEntries bounds the cached prefixes. Default 4096.
	MaxEntries int
	// CutsPerText is how many of a text's last added (special) tokens
	// are cached as prefix ends; a conversation's next request usually
	// shares one of them. Default 16.
	CutsPerText int
	// CutEvery is the spacing, in bytes, of the prefixes cached inside
	// text between added tokens (one long message: a shared document, long
	// instructions): the first safe cut at or after every multiple of it
	// from the text's start. A request sharing a document re-tokenizes
	// about half of it past the document's last cached cut; each cut costs
	// an entry. Default 4096.
	CutEvery int
	// MaxBytes bounds the ids the cached prefixes hold (4 bytes an id):
	// the least recently used are dropped beyond it, and a text whose new
	// ids alone would take more than a sixteenth of it is not cached.
	// Entries hold only the ids after their parent's, so a parent dropped
	// from the cache lives on while a cached later prefix needs it, and
	// counts against MaxBytes until none does. What a caller stores in
	// an entry's memo (EncodePrefix) is not counted: the EPP's block keys,
	// 8 bytes a block of ids, add an eighth at block size 16. Default 64 MiB.
	MaxBytes int64
}

// PrefixCache is a Tokenizer that reuses the ids of the longest previously
// seen prefix, so a multi-turn conversation only tokenizes its new turns
// and requests that share a long document only the text after it.
// Prefixes are cut only where tokenization provably restarts: right after
// an added (special) token, and inside text at the points the tokenizer's
// family allows (cut.go), so its output always equals the underlying
// tokenizer's. Safe for concurrent use.
type PrefixCache struct {
	tok      Restarting
	cuts     int
	every    int
	maxBytes int64
	cache    *lru.Cache[uint64, *prefixEntry]
	bytes    atomic.Int64 // size of the entries alive: cached, or a cached entry's ancestor

	lookups, hits, reused atomic.Uint64
}

// PrefixCacheStats counts Encode calls, those that reused a prefix, and the
// ids reused.
type PrefixCacheStats struct {
	Lookups, Hits, ReusedIDs uint64
}

// Stats returns the counters since creation.
func (c *PrefixCache) Stats() PrefixCacheStats {
	return PrefixCacheStats{Lookups: c.lookups.Load(), Hits: c.hits.Load(), ReusedIDs: c.reused.Load()}
}

// prefixEntry is a cached prefix: its parent's ids followed by its own.
// Entries form chains, so a new turn stores only its new ids.
type prefixEntry struct {
	n      int          // byte length of the prefix
	parent *prefixEntry // nil for a prefix encoded from the start
	ids    []uint32     // ids after the parent's, its own allocation; never written after insertion
	total  int          // ids in the whole prefix
	refs   atomic.Int32 // the cache's and each child's
	// memo is what a caller derived from the prefix's ids (the block
	// keys kvindex.KeyCache.AppendPrefixKeys stores): set at most once,
	// by the caller, never read by the cache.
	memo atomic.Value
}

func (e *prefixEntry) size() int64 { return 4*int64(cap(e.ids)) + 96 }

// hold takes a reference to e. An entry nothing referred to any more is
// alive again (a request found it just before it was dropped): it counts
// again and takes its parent back.
func (c *PrefixCache) hold(e *prefixEntry) {
	for ; e != nil; e = e.parent {
		if e.refs.Add(1) != 1 {
			return
		}
		c.bytes.Add(e.size())
	}
}

// release drops a reference to e; with the last one e no longer counts and
// lets go of its parent.
func (c *PrefixCache) release(e *prefixEntry) {
	for ; e != nil; e = e.parent {
		if e.refs.Add(-1) != 0 {
			return
		}
		c.bytes.Add(-e.size())
	}
}

func (e *prefixEntry) appendTo(dst []uint32) []uint32 {
	if e.parent != nil {
		dst = e.parent.appendTo(dst)
	}
	return append(dst, e.ids...)
}

// Restarting is a Tokenizer whose tokenization restarts after every added
// (special) token and at the cut points it names inside the text between
// them: the ids of a text are those of its pieces, encoded alone, with the
// added tokens' ids between them. HF tokenizers and the stand-in are; the
// methods are unexported because the property has to be proven for each,
// not asserted by a caller.
type Restarting interface {
	Tokenizer
	// splitAdded calls emit for each piece of s in order, with the added
	// token's id, or -1 for text between added tokens.
	splitAdded(s string, emit func(seg string, id int32))
	// nextCut returns the first offset b >= from in seg, a text between
	// added tokens as splitAdded gives it, with 0 < b < len(seg), where
	// tokenization restarts (the ids of seg are those of seg[:b] then
	// those of seg[b:] as a continuation), or -1.
	nextCut(seg string, from int) int
	// encode is Encode of text, a continuation of a segment when cont
	// (text starts at a cut nextCut gave), cut there at the offsets mids
	// (ascending, each from nextCut): it calls cut(end, n) after each
	// added token and at each mid, with the end offset in text and
	// len(dst) at that point.
	encode(dst []uint32, text string, cont bool, mids []int, cut func(end, n int)) []uint32
}

// NewPrefixCache wraps tok with a prefix cache. Zero fields of cfg take
// the defaults; a negative one panics, the config being the caller's code,
// never a file.
func NewPrefixCache(tok Restarting, cfg PrefixCacheConfig) *PrefixCache {
	if cfg.MaxEntries < 0 || cfg.CutsPerText < 0 || cfg.MaxBytes < 0 || cfg.CutEvery < 0 {
		panic(fmt.Sprintf("tokenizer.NewPrefixCache: negative setting in %+v", cfg))
	}
	opt.Zero(&cfg.MaxEntries, 4096)
	opt.Zero(&cfg.CutsPerText, 16)
	opt.Zero(&cfg.MaxBytes, 64<<20)
	opt.Zero(&cfg.CutEvery, 4096)
	pc := &PrefixCache{tok: tok, cuts: cfg.CutsPerText, every: cfg.CutEvery, maxBytes: cfg.MaxBytes}
	c, err := lru.NewWithEvict(cfg.MaxEntries, func(_ uint64, e *prefixEntry) { pc.release(e) })
	if err != nil {
		panic(err) // unreachable: size is positive
	}
	pc.cache = c
	return pc
}

// Name returns the underlying tokenizer's name.
func (c *PrefixCache) Name() string { return c.tok.Name() }

type cutPoint struct {
	end  int
	hash uint64
	mid  bool // inside text, not after an added token
}

// Encode appends the ids of text, reusing a cached prefix when one matches.
func (c *PrefixCache) Encode(dst []uint32, text string) []uint32 {
	dst, _ = c.EncodePrefix(dst, text)
	return dst
}

// EncodePrefix is Encode that also returns the prefix of the ids it
// appended that cache entries hold: the one it reused followed by those
// it stored. The Prefix's ids are the first Prefix.Len() ids appended, bit
// for bit (TestEncodePrefixIDs, FuzzEncodePrefix).
func (c *PrefixCache) EncodePrefix(dst []uint32, text string) ([]uint32, Prefix) {
	return c.encodePrefix(dst, text, false)
}

// EncodeTail is EncodePrefix that appends only the ids after those the
// Prefix holds: the ids of text are the Prefix's followed by what it
// appended to dst (TestEncodePrefixIDs, FuzzEncodePrefix). The cached ids are
// not copied, so a long prompt whose start the cache holds costs the scan
// and hash of its text and the encoding of its uncached end.
func (c *PrefixCache) EncodeTail(dst []uint32, text string) ([]uint32, Prefix) {
	return c.encodePrefix(dst, text, true)
}

// encodePrefix is EncodePrefix, or EncodeTail when tail is set.
func (c *PrefixCache) encodePrefix(dst []uint32, text string, tail bool) ([]uint32, Prefix) {
	// Room for the ids at about 3 bytes a token (English runs near 4):
	// growing a 50k-id prompt by doubling allocated twice its size again.
	// No text, no ids: dst stays as it was (nil stays nil). EncodeTail
	// makes room once it knows what the cache holds.
	if len(text) > 0 && !tail {
		dst = slices.Grow(dst, len(text)/3+16)
	}
	// Hash every prefix that ends at a cut, in one pass: after each added
	// token, and inside text at the first cut at or after each multiple of
	// CutEvery. Those depend only on the text up to them, so a later text
	// with the same prefix has the same cuts there.
	var cuts []cutPoint
	d := xxhash.New()
	last, pos, nextAt := 0, 0, c.every
	mark := func(end int, mid bool) {
		_, _ = d.WriteString(text[last:end])
		last = end
		cuts = append(cuts, cutPoint{end: end, hash: d.Sum64(), mid: mid})
	}
	c.tok.splitAdded(text, func(seg string, id int32) {
		start := pos
		pos += len(seg)
		if id >= 0 {
			mark(pos, false)
			return
		}
		for nextAt < pos {
			k := c.tok.nextCut(seg, nextAt-start)
			if k < 0 {
				break
			}
			mark(start+k, true)
			nextAt = (start+k)/c.every*c.every + c.every
		}
	})
	var hit *prefixEntry
	from, skip, cont := 0, 0, false
	c.lookups.Add(1)
	for i := len(cuts) - 1; i >= 0; i-- {
		if e, ok := c.cache.Get(cuts[i].hash); ok && e.n == cuts[i].end {
			c.hits.Add(1)
			c.reused.Add(uint64(e.total))
			if !tail {
				dst = e.appendTo(dst)
			}
			hit, from, skip, cont = e, cuts[i].end, i+1, cuts[i].mid
			break
		}
	}
	if tail && len(text) > from {
		dst = slices.Grow(dst, (len(text)-from)/3+16)
	}
	newCuts := cuts[skip:]
	var mids []int // offsets in text[from:] of the new mid cuts
	added := 0
	for _, p := range newCuts {
		if p.mid {
			mids = append(mids, p.end-from)
		} else {
			added++
		}
	}
	start := len(dst)
	var ends []int // len(dst) at each new cut, in order
	dst = c.tok.encode(dst, text[from:], cont, mids, func(_, n int) { ends = append(ends, n) })
	if len(ends) != len(newCuts) || len(newCuts) == 0 {
		return dst, Prefix{hit} // a mismatch cannot happen: both are the same scan
	}
	if 4*int64(ends[len(ends)-1]-start) > c.maxBytes/16 {
		return dst, Prefix{hit} // one huge text would flush everything else
	}
	// Each cached cut stores a private copy (the caller owns dst) of the
	// ids since the previous one and points to it; the first one chains to
	// the prefix that was reused. Every mid cut is cached, and the last
	// CutsPerText after added tokens; what follows the last cut never is.
	parent, hitTotal := hit, 0
	if hit != nil {
		hitTotal = hit.total
	}
	base := 0
	skipAdded := added - c.cuts
	for i, p := range newCuts {
		if !p.mid && skipAdded > 0 {
			skipAdded--
			continue
		}
		n := ends[i] - start
		e := &prefixEntry{n: p.end, parent: parent, ids: slices.Clone(dst[start+base : start+n]), total: hitTotal + n}
		// Counted (and its parent held) before it is added, so that the
		// eviction callback can never take the count below zero.
		c.hold(e)
		if old, found, _ := c.cache.PeekOrAdd(p.hash, e); found {
			// Cached meanwhile (another request), or a hash collision,
			// which the byte length check on lookup tells apart. The
			// chain goes on from old only when its ids are e's, so that
			// the returned Prefix holds this text's ids.
			c.release(e)
			if old.n == e.n && old.parent == e.parent && slices.Equal(old.ids, e.ids) {
				e = old
			}
		}
		parent, base = e, n
	}
	for c.bytes.Load() > c.maxBytes && c.cache.Len() > 0 {
		c.cache.RemoveOldest()
	}
	if tail && base > 0 {
		// The ids the stored entries hold leave dst: what stays is what
		// follows the last cached cut, which the cache never stores.
		dst = append(dst[:start], dst[start+base:]...)
	}
	return dst, Prefix{parent}
}

// Prefix is the leading ids of an EncodePrefix call held by cache
// entries, as the chain of entries they are stored in: each entry holds
// the ids after its parent's. The zero Prefix holds none. A Prefix stays
// valid after its entries leave the cache (entries are never written
// after insertion), and keeps them from the collector: do not keep it
// past the request.
type Prefix struct{ e *prefixEntry }

// Len is the number of ids the prefix holds.
func (p Prefix) Len() int {
	if p.e == nil {
		return 0
	}
	return p.e.total
}

// AppendRuns appends, for each entry of the chain from the first, its ids
// (those after its parent's) to ids and its memo to memos. The ids are
// the entry's own, never written after insertion: read them, do not write
// or keep them. A memo is a slot for what the caller derives from the ids
// up to the entry's end: the cache never reads it, and a caller must
// store in it only what depends on nothing but those ids and a tag it
// stores alongside.
func (p Prefix) AppendRuns(ids [][]uint32, memos []*atomic.Value) ([][]uint32, []*atomic.Value) {
	if p.e == nil {
		return ids, memos
	}
	if p.e.parent != nil {
		ids, memos = Prefix{p.e.parent}.AppendRuns(ids, memos)
	}
	return append(ids, p.e.ids), append(memos, &p.e.memo)
}

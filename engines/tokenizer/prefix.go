package tokenizer

import (
	"slices"
	"sync/atomic"

	"github.com/cespare/xxhash/v2"
	lru "github.com/hashicorp/golang-lru/v2"
)

// PrefixCacheConfig sizes a PrefixCache.
type PrefixCacheConfig struct {
	// MaxEntries bounds the cached prefixes. Default 4096.
	MaxEntries int
	// CutsPerText is how many of a text's last safe points are cached; a
	// conversation's next request usually shares one of them. Default 16.
	CutsPerText int
	// MaxBytes bounds the ids the cached prefixes hold (4 bytes an id):
	// the least recently used are dropped beyond it, and a text whose new
	// ids alone would take more than a sixteenth of it is not cached.
	// Entries hold only the ids after their parent's, so a parent dropped
	// from the cache lives on while a cached later turn needs it. Default
	// 64 MiB.
	MaxBytes int64
}

// PrefixCache is a Tokenizer that reuses the ids of the longest previously
// seen prefix, so a multi-turn conversation only tokenizes its new turns.
// Prefixes are cut only right after an added (special) token, where
// tokenization provably restarts, so its output always equals the
// underlying tokenizer's. Safe for concurrent use.
type PrefixCache struct {
	tok      Restarting
	cuts     int
	maxBytes int64
	cache    *lru.Cache[uint64, *prefixEntry]
	bytes    atomic.Int64 // ids bytes of the cached entries

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
	ids    []uint32     // ids after the parent's; never written after insertion
	total  int          // ids in the whole prefix
}

func (e *prefixEntry) size() int64 { return 4*int64(len(e.ids)) + 64 }

func (e *prefixEntry) appendTo(dst []uint32) []uint32 {
	if e.parent != nil {
		dst = e.parent.appendTo(dst)
	}
	return append(dst, e.ids...)
}

// Restarting is a Tokenizer whose tokenization restarts after every added
// (special) token: the ids of a text are those of its pieces between added
// tokens, encoded alone, with the added tokens' ids between them. HF
// tokenizers and the stand-in are; the methods are unexported because the
// property has to be proven for each, not asserted by a caller.
type Restarting interface {
	Tokenizer
	// splitAdded calls emit for each piece of s in order, with the added
	// token's id, or -1 for text between added tokens.
	splitAdded(s string, emit func(seg string, id int32))
	// encode is Encode calling cut(end, n) after each added token: its
	// end offset in text and len(dst) at that point.
	encode(dst []uint32, text string, cut func(end, n int)) []uint32
}

// NewPrefixCache wraps tok with a prefix cache.
func NewPrefixCache(tok Restarting, cfg PrefixCacheConfig) *PrefixCache {
	if cfg.MaxEntries <= 0 {
		cfg.MaxEntries = 4096
	}
	if cfg.CutsPerText <= 0 {
		cfg.CutsPerText = 16
	}
	if cfg.MaxBytes <= 0 {
		cfg.MaxBytes = 64 << 20
	}
	pc := &PrefixCache{tok: tok, cuts: cfg.CutsPerText, maxBytes: cfg.MaxBytes}
	c, err := lru.NewWithEvict(cfg.MaxEntries, func(_ uint64, e *prefixEntry) { pc.bytes.Add(-e.size()) })
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
}

// Encode appends the ids of text, reusing a cached prefix when one matches.
func (c *PrefixCache) Encode(dst []uint32, text string) []uint32 {
	// Room for the ids at about 3 bytes a token (English runs near 4):
	// growing a 50k-id prompt by doubling allocated twice its size again.
	// No text, no ids: dst stays as it was (nil stays nil).
	if len(text) > 0 {
		dst = slices.Grow(dst, len(text)/3+16)
	}
	// Hash every prefix that ends at a safe point, in one pass.
	var cuts []cutPoint
	d := xxhash.New()
	last := 0
	pos := 0
	c.tok.splitAdded(text, func(seg string, id int32) {
		pos += len(seg)
		if id < 0 {
			return
		}
		_, _ = d.WriteString(text[last:pos])
		last = pos
		cuts = append(cuts, cutPoint{end: pos, hash: d.Sum64()})
	})
	var hit *prefixEntry
	from, skip := 0, 0
	c.lookups.Add(1)
	for i := len(cuts) - 1; i >= 0; i-- {
		if e, ok := c.cache.Get(cuts[i].hash); ok && e.n == cuts[i].end {
			c.hits.Add(1)
			c.reused.Add(uint64(e.total))
			dst = e.appendTo(dst)
			hit, from, skip = e, cuts[i].end, i+1
			break
		}
	}
	start := len(dst)
	var ends []int // len(dst) at each new cut, in order
	dst = c.tok.encode(dst, text[from:], func(_, n int) { ends = append(ends, n) })
	newCuts := cuts[skip:]
	if len(ends) != len(newCuts) || len(newCuts) == 0 {
		return dst // a mismatch cannot happen: both are the same added-token scan
	}
	lastCut := ends[len(ends)-1]
	if 4*int64(lastCut-start) > c.maxBytes/16 {
		return dst // one huge text would flush everything else
	}
	// Keep a private copy of the new ids up to the last cut (the caller owns
	// dst; what follows the last cut is never cached). Each cached cut
	// stores the ids since the previous one and points to it; the first one
	// chains to the prefix that was reused.
	own := append([]uint32(nil), dst[start:lastCut]...)
	parent, hitTotal := hit, 0
	if hit != nil {
		hitTotal = hit.total
	}
	base := 0
	for i := max(0, len(newCuts)-c.cuts); i < len(newCuts); i++ {
		n := ends[i] - start
		e := &prefixEntry{n: newCuts[i].end, parent: parent, ids: own[base:n:n], total: hitTotal + n}
		// Counted before it is added, so that the eviction callback can
		// never take the count below zero.
		c.bytes.Add(e.size())
		if old, found, _ := c.cache.PeekOrAdd(newCuts[i].hash, e); found {
			// Cached meanwhile (another request), or a hash collision,
			// which the byte length check on lookup tells apart.
			c.bytes.Add(-e.size())
			if old.n == e.n {
				e = old
			}
		}
		parent, base = e, n
	}
	for c.bytes.Load() > c.maxBytes && c.cache.Len() > 0 {
		c.cache.RemoveOldest()
	}
	return dst
}

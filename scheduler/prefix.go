package scheduler

import (
	"encoding/binary"
	"sync"
	"time"

	"github.com/cespare/xxhash/v2"
	lru "github.com/hashicorp/golang-lru/v2"

	"github.com/omnious/provider-node/kvindex"
)

// specStride: speculative credit records one block key in specStride (plus
// the prompt's last block). Keys chain, so a recorded key at block i proves
// the whole prefix up to i: recording every key would cost a map write per
// block per request for a precision the scheduler does not need.
const specStride = 16

// specSlots is how many replicas one speculative key remembers.
const specSlots = 4

// keyCacheTokens is how many recent prompt tokens the key cache holds the
// block keys of (about 6 MiB at block size 16: 4 bytes of token and half a
// byte of key per token, plus the LRU's bookkeeping): a prompt sharing a
// prefix with one of them is keyed by comparing tokens instead of hashing.
const keyCacheTokens = 1 << 20

// prefixHit is one replica's prefix match: blocks (precise) or bytes
// (approximate).
type prefixHit struct {
	r kvindex.Replica
	n int
}

// speculative credits a replica with the blocks of a request just routed to
// it, for ttl, so a burst of requests with one prefix does not scatter
// before the engine's KV events arrive. Two generations of maps rotate every
// ttl, so memory is bounded by two ttl windows of traffic without a sweep.
type speculative struct {
	ttl time.Duration

	mu        sync.Mutex
	cur, prev *specTable
	rotated   time.Time
}

type specVal struct {
	r   [specSlots]kvindex.Replica
	exp [specSlots]int64 // unix nanos; 0 = empty slot
}

func newSpeculative(ttl time.Duration) *speculative {
	return &speculative{ttl: ttl, cur: newSpecTable(0), prev: newSpecTable(0)}
}

// credit records that r holds keys until now+ttl.
func (sp *speculative) credit(r kvindex.Replica, keys []kvindex.Key, now time.Time) {
	if sp.ttl <= 0 || len(keys) == 0 {
		return
	}
	exp := now.Add(sp.ttl).UnixNano()
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if now.Sub(sp.rotated) >= sp.ttl {
		sp.prev, sp.cur = sp.cur, newSpecTable(sp.cur.n)
		sp.rotated = now
	}
	for i := specStride - 1; ; i += specStride {
		if i >= len(keys) {
			i = len(keys) - 1
		}
		k := keys[i]
		v := sp.cur.get(k)
		if v == nil {
			v = sp.cur.insert(k)
			if pv := sp.prev.get(k); pv != nil {
				*v = *pv
			}
		}
		v.put(r, exp)
		if i == len(keys)-1 {
			break
		}
	}
}

// slotOf is the slot holding r, -1 when none does.
func (v *specVal) slotOf(r kvindex.Replica) int {
	for i := range v.exp {
		if v.exp[i] != 0 && v.r[i] == r {
			return i
		}
	}
	return -1
}

// expOf is r's expiry in v, 0 when v does not hold r.
func (v *specVal) expOf(r kvindex.Replica) int64 {
	if i := v.slotOf(r); i >= 0 {
		return v.exp[i]
	}
	return 0
}

func (v *specVal) put(r kvindex.Replica, exp int64) {
	slot := v.slotOf(r)
	if slot < 0 {
		// Replace the slot that expires first (empty and expired slots first).
		slot = 0
		for i := range v.exp {
			if v.exp[i] < v.exp[slot] {
				slot = i
			}
		}
	}
	v.r[slot], v.exp[slot] = r, exp
}

// match appends to out, per replica, how many leading blocks of keys it is
// speculatively credited with.
func (sp *speculative) match(keys []kvindex.Key, now time.Time, out []prefixHit) []prefixHit {
	if sp.ttl <= 0 || len(keys) == 0 {
		return out
	}
	nowNs := now.UnixNano()
	base := len(out)
	sp.mu.Lock()
	defer sp.mu.Unlock()
	for i := specStride - 1; ; i += specStride {
		if i >= len(keys) {
			i = len(keys) - 1
		}
		var live, prevLive bool
		if v := sp.cur.get(keys[i]); v != nil {
			out, live = v.hits(out, base, nowNs, i+1)
		}
		if pv := sp.prev.get(keys[i]); pv != nil {
			out, prevLive = pv.hits(out, base, nowNs, i+1)
		}
		if !live && !prevLive || i == len(keys)-1 {
			break
		}
	}
	return out
}

// hits raises to n, in out[base:], the count of every replica v holds
// past nowNs, and reports whether there is one.
func (v *specVal) hits(out []prefixHit, base int, nowNs int64, n int) ([]prefixHit, bool) {
	live := false
	for j := range v.exp { // not range v.exp: that copies the array
		if v.exp[j] > nowNs {
			live = true
			out = addHit(out, base, v.r[j], n)
		}
	}
	return out, live
}

// addHit raises replica r's count to n in out[base:], appending it if new.
func addHit(out []prefixHit, base int, r kvindex.Replica, n int) []prefixHit {
	for k := base; k < len(out); k++ {
		if out[k].r == r {
			if n > out[k].n {
				out[k].n = n
			}
			return out
		}
	}
	return append(out, prefixHit{r: r, n: n})
}

// routes remembers which replicas each prefix was routed to: a bounded LRU
// from a chained prefix key (a text chunk's hash, or a block key) to up to
// specSlots replicas with their expiry. A key recorded for a replica implies
// the whole prefix up to it was routed there. A key keeps several replicas
// because a shared prefix that load sends to a second replica is then
// cached on both: remembering only the last one would forget the first, and
// the next request would miss a copy it could have used.
type routes struct {
	ttl time.Duration

	mu    sync.Mutex // one lock per match or record, not per key
	cache *recordTable
}

func newRoutes(maxNodes int, ttl time.Duration) (*routes, error) {
	c, err := newRecordTable(maxNodes)
	if err != nil {
		return nil, err
	}
	return &routes{ttl: ttl, cache: c}, nil
}

// match appends, per replica, units(i) for the longest run of leading keys
// keys[0..i] routed to it within the ttl. The records it reads are moved to
// the front of the LRU and appended to seen, for record.
func (rt *routes) match(keys []uint64, now time.Time, out []prefixHit, seen []specVal, units func(i int) int) ([]prefixHit, []specVal) {
	base := len(out)
	nowNs := now.UnixNano()
	rt.mu.Lock()
	defer rt.mu.Unlock()
	for i, k := range keys {
		v := rt.cache.get(k)
		if v == nil {
			break
		}
		// Copied in place: append(seen, *v) copies through a temporary
		// in overlapping stores the CPU cannot forward to its loads.
		seen = append(seen, specVal{})
		seen[len(seen)-1] = *v
		var live bool
		if out, live = v.hits(out, base, nowNs, units(i)); !live {
			break
		}
	}
	return out, seen
}

// record notes that keys were routed to r. seen holds the records match
// read for the leading keys, already moved to the front: one of them
// already good for most of the ttl is left as it is, so a hot prefix
// routed again and again costs no map operation beyond match's. Past
// seen, a fresh record is only moved to the front.
func (rt *routes) record(keys []uint64, seen []specVal, r kvindex.Replica, now time.Time) {
	exp := now.Add(rt.ttl).UnixNano()
	fresh := exp - int64(rt.ttl/8)
	i := 0
	for ; i < len(keys) && i < len(seen) && seen[i].expOf(r) >= fresh; i++ {
	}
	if i == len(keys) {
		return
	}
	rt.mu.Lock()
	defer rt.mu.Unlock()
	for _, k := range keys[i:] {
		if v := rt.cache.get(k); v != nil {
			if v.expOf(r) < fresh {
				v.put(r, exp)
			}
			continue
		}
		var v specVal
		v.put(r, exp)
		rt.cache.add(k, v)
	}
}

// approximate is the text-based prefix matcher used when a request has no
// tokens: the prompt is hashed in fixed-size chunks, each chained to the
// previous, and the chains' routes are remembered. A record stands for the
// whole prefix up to it, so past the first approxDense chunks only every
// approxStride-th (and the last) is recorded: a long prompt then costs a
// record per approxStride chunks, and max_nodes records cover as much text
// as a radix tree of that many nodes would, while short prefixes (system
// prompts, chat turns) keep the chunk's granularity.
type approximate struct {
	chunk int
	*routes
}

const (
	approxDense  = 16
	approxStride = 8
)

// approxRecorded reports whether chunk i of n is recorded.
func approxRecorded(i, n int) bool {
	return i < approxDense || (i+1)%approxStride == 0 || i == n-1
}

func newApproximate(chunk, maxNodes int, ttl time.Duration) (*approximate, error) {
	rt, err := newRoutes(maxNodes, ttl)
	if err != nil {
		return nil, err
	}
	return &approximate{chunk: chunk, routes: rt}, nil
}

// chunkHashes appends the chained hash of every chunk of text (the last one
// may be partial).
// chunkHashes appends the chained hash of every recorded chunk of text (the
// last one may be partial).
func (a *approximate) chunkHashes(dst []uint64, text []byte) []uint64 {
	var prev uint64
	var d xxhash.Digest
	var seed [8]byte
	chunks := (len(text) + a.chunk - 1) / a.chunk
	for i := 0; len(text) > 0; i++ {
		n := min(a.chunk, len(text))
		d.Reset()
		binary.LittleEndian.PutUint64(seed[:], prev)
		_, _ = d.Write(seed[:])
		_, _ = d.Write(text[:n])
		prev = d.Sum64()
		if approxRecorded(i, chunks) {
			dst = append(dst, prev)
		}
		text = text[n:]
	}
	return dst
}

// matchText appends, per replica, how many leading bytes of the prompt were
// routed to it within the ttl. textLen is the prompt length (the last chunk
// may be partial).
func (a *approximate) matchText(hashes []uint64, textLen int, now time.Time, out []prefixHit, seen []specVal) ([]prefixHit, []specVal) {
	return a.match(hashes, now, out, seen, func(k int) int { return min(approxChunks(k)*a.chunk, textLen) })
}

// approxChunks is how many chunks the k-th recorded hash covers.
func approxChunks(k int) int {
	if k < approxDense {
		return k + 1
	}
	return approxDense + (k-approxDense+1)*approxStride
}

// strideKeys appends the block keys the speculative credit and the recall
// record (every specStride-th and the last), as plain uint64s.
func strideKeys(dst []uint64, keys []kvindex.Key) []uint64 {
	for i := specStride - 1; len(keys) > 0; i += specStride {
		if i >= len(keys) {
			i = len(keys) - 1
		}
		dst = append(dst, uint64(keys[i]))
		if i == len(keys)-1 {
			break
		}
	}
	return dst
}

// strideBlocks is how many blocks the i-th stride key covers, of n.
func strideBlocks(i, n int) int { return min((i+1)*specStride, n) }

// sessions remembers the replica of each session key.
type sessions struct {
	ttl   time.Duration
	cache *lru.Cache[string, sessionVal]
}

type sessionVal struct {
	r  kvindex.Replica
	at int64
}

func newSessions(size int, ttl time.Duration) (*sessions, error) {
	c, err := lru.New[string, sessionVal](size)
	if err != nil {
		return nil, err
	}
	return &sessions{ttl: ttl, cache: c}, nil
}

func (s *sessions) get(key string, now time.Time) (kvindex.Replica, bool) {
	if key == "" {
		return 0, false
	}
	v, ok := s.cache.Peek(key)
	if !ok || now.UnixNano()-v.at > int64(s.ttl) {
		return 0, false
	}
	return v.r, true
}

func (s *sessions) set(key string, r kvindex.Replica, now time.Time) {
	if key != "" {
		s.cache.Add(key, sessionVal{r: r, at: now.UnixNano()})
	}
}

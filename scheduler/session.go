package scheduler

import (
	"container/list"
	"context"
	"net/http"
	"sync"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/omnious/provider-node/endpoint"
	"github.com/omnious/provider-node/kvindex"
)

// Session admission: flow control for chains of calls rather than calls.
// An agent session's history must stay in a replica's KV cache across its
// tool gaps; when more sessions are active than the fleet's KV cache can
// keep, every session's history is evicted in its gaps and re-prefilled on
// its next call, and all of them slow down. So a new session (a session
// key the table does not hold) is admitted only onto a replica r with
//
//	working set(r) + its prompt <= kv_fraction × KV capacity(r)
//
// the one with the most room, where a replica's working set is the sum of
// the history lengths (longest prompt plus output so far, at least the
// mean history calls ended with, as a young session will grow; less the
// shared prefix the replica held at the session's first call) of the
// active sessions whose calls went there last. The session is then bound to that
// replica (the agent policy's holder); when a call moves, its history's
// tokens move with it. Otherwise it waits in the session queue, first
// come first served, until sessions end (idle timeout) and leave room, or
// sessions.queue_ttl passes (429 session_queue_expired). Calls of
// admitted sessions never wait here. With nothing active a session is
// always admitted, and before the engines report their KV capacity
// nothing waits (TestSessionQueue, TestSessionPerReplica).
//
// Session keys come from a client header: they are hashed to 64 bits
// before they reach the map, the table holds at most
// sessions.max_sessions entries (a new session beyond it waits as when
// the cache is full) and the queue at most sessions.queue_capacity
// (TestSessionTableBound). Requests without a session key are not
// tracked.
type sessionTable struct {
	s       *Scheduler
	enabled bool

	mu      sync.Mutex
	byKey   map[uint64]*sessionEntry
	working int64                     // Σ entries' working tokens
	perRep  map[kvindex.Replica]int64 // the same per bound replica
	// expect is the mean history length sessions' calls have ended with
	// (an exponentially weighted mean; 0 before the first): a session
	// counts at least this much, as it will grow.
	expect    float64
	queue     list.List // of *sessionWaiter, oldest first
	lastSweep time.Time
}

// expectWeight is the weight of one ended call in sessionTable.expect.
const expectWeight = 0.02

type sessionEntry struct {
	tokens   int64 // the history's length: longest prompt + output seen
	shared   int64 // held by its replica at its first call: a shared prefix
	inflight int   // calls picked and not done
	started  bool  // a call was picked
	replica  kvindex.Replica
	bound    bool      // replica is set
	last     time.Time // the last call's arrival or end
	key      string    // the client's key, for the session memory
}

// work is what the session adds to its replica's working set, counting
// its history as at least expect tokens long.
func (e *sessionEntry) work(expect int64) int64 { return max(max(e.tokens, expect)-e.shared, 0) }

type sessionWaiter struct {
	key      uint64
	name     string // the client's key
	need     int64
	ch       chan struct{}
	admitted bool
}

// Session admission errors (429: the client should come back later).
var (
	ErrSessionQueueFull    = &Error{http.StatusTooManyRequests, "session_queue_full", "the fleet's KV cache is full of active sessions and the session queue is full"}
	ErrSessionQueueExpired = &Error{http.StatusTooManyRequests, "session_queue_expired", "the new session waited longer than the session queue TTL for room in the fleet's KV cache"}
)

// maxSessionsLimit bounds sessions.max_sessions and sessions.queue_capacity.
const maxSessionsLimit = 1 << 20

func newSessionTable(s *Scheduler) *sessionTable {
	return &sessionTable{s: s, enabled: s.cfg.sessionAdmission(), byKey: make(map[uint64]*sessionEntry),
		perRep: make(map[kvindex.Replica]int64)}
}

// sessionKey hashes a client's session key; 0 is no session.
func sessionKey(key string) uint64 {
	if key == "" {
		return 0
	}
	return xxhash.Sum64String(key) | 1
}

// promptTokens estimates a request's prompt in tokens: its tokens, else
// its text at 4 bytes a token.
func promptTokens(req *Request) int64 {
	if req.HasTokens() {
		return int64(req.TokenCount())
	}
	return int64(len(req.PromptText) / 4)
}

// budgets are kv_fraction of each replica's KV capacity in tokens, by
// replica id; empty while no engine reports its capacity.
func (t *sessionTable) budgets() map[kvindex.Replica]int64 {
	var out map[kvindex.Replica]int64
	for _, r := range t.s.snap.Load().all.reps {
		if g := r.signal(); g != nil {
			if c := g.sm.Signals.KVCapacityTokens(); c > 0 {
				if out == nil {
					out = make(map[kvindex.Replica]int64)
				}
				out[r.id] = int64(float64(c) * t.s.cfg.Sessions.KVFraction)
			}
		}
	}
	return out
}

// placeLocked returns the replica a new session needing need tokens may
// start on (the one with the most room; ok false when none has room),
// and whether one was chosen at all (none before capacities are known).
func (t *sessionTable) placeLocked(need int64, budgets map[kvindex.Replica]int64) (r kvindex.Replica, chosen, ok bool) {
	if len(t.byKey) >= t.s.cfg.Sessions.MaxSessions {
		return 0, false, false
	}
	if len(budgets) == 0 {
		return 0, false, true
	}
	t.recountLocked()
	best, room := kvindex.Replica(0), int64(-1<<62)
	for id, b := range budgets {
		if free := b - t.perRep[id]; free > room || (free == room && id < best) {
			best, room = id, free
		}
	}
	return best, true, len(t.byKey) == 0 || max(need, int64(t.expect)) <= room
}

// recountLocked sums the working sets again: what a session counts
// changes with expect.
func (t *sessionTable) recountLocked() {
	clear(t.perRep)
	t.working = 0
	for _, e := range t.byKey {
		t.addLocked(e, e.work(int64(t.expect)))
	}
}

// sweepLocked drops sessions idle for longer than the idle timeout, at most
// every tenth of it.
func (t *sessionTable) sweepLocked(now time.Time) {
	idle := t.s.cfg.Sessions.IdleTimeout
	if now.Sub(t.lastSweep) < idle/10 {
		return
	}
	t.lastSweep = now
	for k, e := range t.byKey {
		if e.inflight == 0 && now.Sub(e.last) >= idle {
			t.addLocked(e, -e.work(int64(t.expect)))
			delete(t.byKey, k)
		}
	}
}

// addLocked adds n to e's replica's working set and the total.
func (t *sessionTable) addLocked(e *sessionEntry, n int64) {
	t.working += n
	if e.bound {
		if t.perRep[e.replica] += n; t.perRep[e.replica] <= 0 {
			delete(t.perRep, e.replica)
		}
	}
}

// insertLocked admits session k onto r (when chosen) and tells the
// session memory, so that the agent policy places its first call there.
func (t *sessionTable) insertLocked(k uint64, key string, need int64, r kvindex.Replica, chosen bool, now time.Time) {
	e := &sessionEntry{tokens: need, last: now, replica: r, bound: chosen, key: key}
	t.byKey[k] = e
	t.addLocked(e, e.work(int64(t.expect)))
	if chosen {
		t.s.sess.set(key, r, now)
	}
}

// admit returns when req's session may go on: at once for a request
// without a session key or of an admitted session, else when the new
// session fits (see sessionTable), bounded by sessions.queue_ttl from
// req.Arrived and by ctx.
func (t *sessionTable) admit(ctx context.Context, req *Request) *Error {
	k := sessionKey(req.SessionKey)
	if !t.enabled || k == 0 {
		return nil
	}
	need := promptTokens(req)
	budgets := t.budgets()
	now := t.s.now()
	t.mu.Lock()
	t.sweepLocked(now)
	if e, ok := t.byKey[k]; ok {
		e.last = now
		t.mu.Unlock()
		return nil
	}
	if t.queue.Len() == 0 {
		if r, chosen, ok := t.placeLocked(need, budgets); ok {
			t.insertLocked(k, req.SessionKey, need, r, chosen, now)
			t.gaugesLocked(budgets)
			t.mu.Unlock()
			return nil
		}
	}
	if t.queue.Len() >= *t.s.cfg.Sessions.QueueCapacity {
		t.mu.Unlock()
		t.s.m.sessionRefused.WithLabelValues(ErrSessionQueueFull.Reason).Inc()
		return ErrSessionQueueFull
	}
	w := &sessionWaiter{key: k, name: req.SessionKey, need: need, ch: make(chan struct{})}
	el := t.queue.PushBack(w)
	t.gaugesLocked(budgets)
	t.mu.Unlock()

	start := time.Now()
	ttl := t.s.cfg.Sessions.QueueTTL
	if !req.Arrived.IsZero() {
		ttl -= time.Since(req.Arrived)
	}
	timer := time.NewTimer(max(ttl, 0))
	defer timer.Stop()
	var cause *Error
	select {
	case <-w.ch:
		t.s.m.sessionWait.Observe(time.Since(start).Seconds())
		return nil
	case <-ctx.Done():
		cause = ErrClientGone
	case <-timer.C:
		cause = ErrSessionQueueExpired
	}
	t.mu.Lock()
	if w.admitted {
		t.mu.Unlock()
		t.s.m.sessionWait.Observe(time.Since(start).Seconds())
		return nil
	}
	t.queue.Remove(el)
	t.gaugesLocked(budgets)
	t.mu.Unlock()
	if cause != ErrClientGone {
		t.s.m.sessionRefused.WithLabelValues(cause.Reason).Inc()
	}
	return cause
}

// dispatch admits waiting sessions, oldest first, while they fit; a
// waiter whose key was admitted meanwhile goes at once. Run's dispatcher
// calls it with the band queues'.
func (t *sessionTable) dispatch() {
	if !t.enabled {
		return
	}
	budgets := t.budgets()
	now := t.s.now()
	t.mu.Lock()
	defer t.mu.Unlock()
	t.sweepLocked(now)
	for t.queue.Len() > 0 {
		w := t.queue.Front().Value.(*sessionWaiter)
		if _, ok := t.byKey[w.key]; !ok {
			r, chosen, ok := t.placeLocked(w.need, budgets)
			if !ok {
				break
			}
			t.insertLocked(w.key, w.name, w.need, r, chosen, now)
		}
		t.queue.Remove(t.queue.Front())
		w.admitted = true
		close(w.ch)
	}
	t.gaugesLocked(budgets)
}

func (t *sessionTable) gaugesLocked(budgets map[kvindex.Replica]int64) {
	var total int64
	for _, b := range budgets {
		total += b
	}
	t.s.m.sessionsActive.Set(float64(len(t.byKey)))
	t.s.m.sessionsQueued.Set(float64(t.queue.Len()))
	t.s.m.sessionWorkingSet.Set(float64(t.working))
	t.s.m.sessionKV.Set(float64(total))
}

// started counts a picked call of session k in flight on replica r,
// whose prompt is prompt tokens of which resident were held there. At a
// session's first call what its replica holds is the shared prefix; a call
// that moved takes the history's tokens to its new replica.
func (t *sessionTable) started(k uint64, r kvindex.Replica, prompt, resident int64) {
	if k == 0 {
		return
	}
	t.s.m.sessionResident.Observe(float64(resident))
	if !t.enabled {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	e, ok := t.byKey[k]
	if !ok {
		return
	}
	e.inflight++
	x := int64(t.expect)
	t.addLocked(e, -e.work(x))
	if !e.started {
		e.started, e.shared = true, min(resident, prompt)
	}
	e.replica, e.bound = r, true
	e.tokens = max(e.tokens, prompt)
	t.addLocked(e, e.work(x))
}

// ended records the end of a call of session k: its history is now at
// least history tokens long, and its idle time starts.
func (t *sessionTable) ended(k uint64, history int64) {
	if k == 0 || !t.enabled {
		return
	}
	now := t.s.now()
	t.mu.Lock()
	defer t.mu.Unlock()
	if e, ok := t.byKey[k]; ok {
		e.inflight = max(e.inflight-1, 0)
		e.last = now
		x := int64(t.expect)
		t.addLocked(e, -e.work(x))
		e.tokens = max(e.tokens, history)
		t.addLocked(e, e.work(x))
		if history > 0 {
			if t.expect == 0 {
				t.expect = float64(history)
			} else {
				t.expect += expectWeight * (float64(history) - t.expect)
			}
		}
	}
}

// counts returns the admitted and the waiting sessions, for tests.
func (t *sessionTable) counts() (active, queued int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.byKey), t.queue.Len()
}

// engineSGLang is endpoint.Endpoint.Engine of an SGLang replica.
const engineSGLang = "sglang"

// retention is the request priority a call routed to eps carries
// (Decision.Priority): nil unless sessions.sglang_priority is on and every
// endpoint is SGLang; then that priority when the call's session is
// admitted, else 0. It reads only the EPP's own session table, never a
// priority the client sent.
func (t *sessionTable) retention(req *Request, eps []*endpoint.Endpoint) *int {
	p := t.s.cfg.Sessions.SGLangPriority
	if p <= 0 || len(eps) == 0 {
		return nil
	}
	for _, ep := range eps {
		if ep.Engine != engineSGLang {
			return nil
		}
	}
	v := 0
	if k := sessionKey(req.SessionKey); t.enabled && k != 0 {
		t.mu.Lock()
		if _, ok := t.byKey[k]; ok {
			v = p
		}
		t.mu.Unlock()
	}
	return &v
}

package scheduler

import (
	"container/list"
	"context"
	"net/http"
	"sync"
	"time"

	"github.com/cespare/xxhash/v2"
)

// Session admission: flow control for chains of calls rather than calls.
// An agent session's history must stay in a replica's KV cache across its
// tool gaps; when more sessions are active than the fleet's KV cache can
// keep, every session's history is evicted in its gaps and re-prefilled on
// its next call, and all of them slow down. So a new session (a session
// key the table does not hold) is admitted only while
//
//	working set + its prompt <= kv_fraction × Σ replicas' KV capacity
//
// where the working set is the sum of the active sessions' history lengths
// (their longest prompt plus output so far). Otherwise it waits in the
// session queue, first come first served, until sessions end (idle
// timeout) and leave room, or sessions.queue_ttl passes (429
// session_queue_expired). Calls of admitted sessions never wait here.
// With nothing active a session is always admitted, and before the engines
// report their KV capacity nothing waits.
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

	mu        sync.Mutex
	byKey     map[uint64]*sessionEntry
	working   int64     // Σ entries' tokens
	queue     list.List // of *sessionWaiter, oldest first
	lastSweep time.Time
}

type sessionEntry struct {
	tokens   int64     // the history's length: longest prompt + output seen
	inflight int       // calls picked and not done
	last     time.Time // the last call's arrival or end
}

type sessionWaiter struct {
	key      uint64
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
	return &sessionTable{s: s, enabled: *s.cfg.Sessions.Admission, byKey: make(map[uint64]*sessionEntry)}
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
	if req.Tokens != nil {
		return int64(len(req.Tokens))
	}
	return int64(len(req.PromptText) / 4)
}

// budget is kv_fraction of the fleet's KV capacity in tokens, 0 while no
// engine reports it.
func (t *sessionTable) budget() int64 {
	var total int64
	for _, r := range t.s.snap.Load().all {
		if g := r.signal(); g != nil {
			total += g.sm.Signals.KVCapacityTokens()
		}
	}
	return int64(float64(total) * t.s.cfg.Sessions.KVFraction)
}

// fitsLocked reports whether a new session needing need tokens may start.
func (t *sessionTable) fitsLocked(need, budget int64) bool {
	switch {
	case len(t.byKey) >= t.s.cfg.Sessions.MaxSessions:
		return false
	case len(t.byKey) == 0 || budget == 0:
		return true
	}
	return t.working+need <= budget
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
			t.working -= e.tokens
			delete(t.byKey, k)
		}
	}
}

func (t *sessionTable) insertLocked(k uint64, need int64, now time.Time) {
	t.byKey[k] = &sessionEntry{tokens: need, last: now}
	t.working += need
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
	budget := t.budget()
	now := t.s.now()
	t.mu.Lock()
	t.sweepLocked(now)
	if e, ok := t.byKey[k]; ok {
		e.last = now
		t.mu.Unlock()
		return nil
	}
	if t.queue.Len() == 0 && t.fitsLocked(need, budget) {
		t.insertLocked(k, need, now)
		t.gaugesLocked(budget)
		t.mu.Unlock()
		return nil
	}
	if t.queue.Len() >= *t.s.cfg.Sessions.QueueCapacity {
		t.mu.Unlock()
		t.s.m.sessionRefused.WithLabelValues(ErrSessionQueueFull.Reason).Inc()
		return ErrSessionQueueFull
	}
	w := &sessionWaiter{key: k, need: need, ch: make(chan struct{})}
	el := t.queue.PushBack(w)
	t.gaugesLocked(budget)
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
	t.gaugesLocked(budget)
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
	budget := t.budget()
	now := t.s.now()
	t.mu.Lock()
	defer t.mu.Unlock()
	t.sweepLocked(now)
	for t.queue.Len() > 0 {
		w := t.queue.Front().Value.(*sessionWaiter)
		if _, ok := t.byKey[w.key]; !ok {
			if !t.fitsLocked(w.need, budget) {
				break
			}
			t.insertLocked(w.key, w.need, now)
		}
		t.queue.Remove(t.queue.Front())
		w.admitted = true
		close(w.ch)
	}
	t.gaugesLocked(budget)
}

func (t *sessionTable) gaugesLocked(budget int64) {
	t.s.m.sessionsActive.Set(float64(len(t.byKey)))
	t.s.m.sessionsQueued.Set(float64(t.queue.Len()))
	t.s.m.sessionWorkingSet.Set(float64(t.working))
	t.s.m.sessionKV.Set(float64(budget))
}

// started counts a picked call of session k in flight, whose prompt is
// prompt tokens of which resident were held by its replica.
func (t *sessionTable) started(k uint64, prompt, resident int64) {
	if k == 0 {
		return
	}
	t.s.m.sessionResident.Observe(float64(resident))
	if !t.enabled {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if e, ok := t.byKey[k]; ok {
		e.inflight++
		t.growLocked(e, prompt)
	}
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
		t.growLocked(e, history)
	}
}

func (t *sessionTable) growLocked(e *sessionEntry, n int64) {
	if n > e.tokens {
		t.working += n - e.tokens
		e.tokens = n
	}
}

// counts returns the admitted and the waiting sessions, for tests.
func (t *sessionTable) counts() (active, queued int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.byKey), t.queue.Len()
}

package scheduler

import (
	"container/list"
	"context"
	"math"
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
// its next call, and all of them slow down. But a session held back while
// the fleet has compute to spare is goodput lost for nothing. So a new
// session (a session key the table does not hold) is admitted
//
//	onto the replica r with the most room, when
//	    reserved(r) + its prompt <= kv_fraction × KV capacity(r)
//	else, when the fleet has compute to spare,
//	    (Σ pending + Σ starting + its prompt) / Σ rate <= spare_work × ttft_objective
//	    and no replica's engine queue is non-empty,
//	onto the replica r of least work among those with compute to spare:
//	    no engine queue, KV usage < kv_fraction, and
//	    (pending(r) + starting(r) + its prompt) / rate(r) <= spare_work × ttft_objective
//
// where reserved(r) is the sum, over the active sessions whose calls went
// to r last, of what each holds and will need at its next call: its
// history (longest prompt plus output so far) or its last prompt plus the
// mean growth from one call's prompt to the next (output and tool
// result), whichever is more, less the shared prefix the replica held at
// its first call (TestSessionReserve). A session idle for longer than
// its tool gaps last, the mean observed gap plus three standard
// deviations (Cantelli: at most a tenth of any gap distribution lies
// beyond it), reserves nothing: most likely it is done, and if it comes
// back its call still goes first (TestSessionQueue). pending(r) is the agent policy's
// pending prefill work, starting(r) the prompts of sessions admitted onto
// r whose first call is not picked yet, so that one idle moment admits
// only what fits in it (TestSessionSpareCompute). Past the budget an
// eviction costs a recompute the replica has time for; when evictions
// make it busy, its queue and pending work close the second way. The
// fleet comes first because the agent policy moves calls off busy
// holders: a replica idle for a moment while the fleet is recompute-bound
// is where those calls go next, not spare compute. And a call waiting in
// any engine's queue (num_requests_waiting at its last fresh scrape) is
// waiting for KV, which a new session past the budget takes more of,
// however little prefill work is pending: a fleet short of KV for the
// calls it serves has nothing to spare (TestSessionSpareCompute, "one
// replica queueing"). A stale scrape is no evidence of a queue now.
//
// The session is then bound to that replica (the agent policy's holder);
// when a call moves, its history's tokens move with it. Otherwise it
// waits in the session queue, first come first served, until sessions
// end (idle timeout) and leave room, compute is spare again, or
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

	mu    sync.Mutex
	byKey map[uint64]*sessionEntry
	// working, perRep and starting are what recountLocked last summed.
	working  int64                     // Σ entries' reserved tokens
	perRep   map[kvindex.Replica]int64 // the same per bound replica
	starting map[kvindex.Replica]int64 // prompts of bound sessions not yet picked
	// growth is the mean growth of a session's prompt from one call to
	// the next (an exponentially weighted mean; 0 before the first): what
	// a session will need beyond its last prompt at its next call.
	growth float64
	// gapMean and gapVar are the exponentially weighted mean and variance
	// of the observed tool gaps (a call's end to its session's next call),
	// seconds; gaps counts the observations.
	gapMean, gapVar float64
	gaps            int
	queue           list.List // of *sessionWaiter, oldest first
	lastSweep       time.Time
}

// growthWeight is the weight of one observation in sessionTable.growth
// and the gap statistics.
const growthWeight = 0.05

type sessionEntry struct {
	tokens   int64 // the history's length: longest prompt + output seen
	prompt   int64 // the last call's prompt (the first's estimate before it)
	shared   int64 // held by its replica at its first call: a shared prefix
	inflight int   // calls picked and not done
	started  bool  // a call was picked
	replica  kvindex.Replica
	bound    bool      // replica is set
	last     time.Time // the last call's arrival or end
	ended    bool      // a call ended and none arrived since: in a tool gap
	key      string    // the client's key, for the session memory
}

// work is what the session reserves on its replica: what it holds and
// will need at its next call, growth tokens beyond its last prompt.
func (e *sessionEntry) work(growth int64) int64 {
	return max(max(e.tokens, e.prompt+growth)-e.shared, 0)
}

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

// Why a new session was admitted (omnious_epp_sessions_admitted_total).
const (
	admitRoom  = "room"          // within the KV budget, or nothing known to wait for
	admitSpare = "spare_compute" // past the budget, onto a replica with compute to spare
)

// maxSessionsLimit bounds sessions.max_sessions and sessions.queue_capacity.
const maxSessionsLimit = 1 << 20

func newSessionTable(s *Scheduler) *sessionTable {
	return &sessionTable{s: s, enabled: s.cfg.sessionAdmission(), byKey: make(map[uint64]*sessionEntry),
		perRep: make(map[kvindex.Replica]int64), starting: make(map[kvindex.Replica]int64)}
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

// repRoom is what admission reads of one replica.
type repRoom struct {
	id     kvindex.Replica
	budget int64 // kv_fraction of its KV capacity, tokens
	// idle: no engine queue and KV usage below kv_fraction at the last
	// scrape.
	idle bool
	// queued: requests waiting in its engine's queue at its last scrape,
	// which is not stale.
	queued  bool
	pending int64   // the agent policy's pending prefill, tokens
	rate    float64 // prefill tokens per second, > 0
}

// rooms are the replicas whose engines report their KV capacity; empty
// while none does.
func (t *sessionTable) rooms() []repRoom {
	var out []repRoom
	staleBefore := t.s.staleBefore(t.s.now())
	for _, r := range t.s.snap.Load().all.reps {
		g, stale := signals(r, staleBefore)
		if g == nil {
			continue
		}
		c := g.sm.Signals.KVCapacityTokens()
		if c <= 0 {
			continue
		}
		rate := float64frombits(r.prefillRate.Load())
		if !(rate > 0) {
			rate = t.s.cfg.Sessions.PrefillRate
		}
		f := t.s.cfg.Sessions.KVFraction
		out = append(out, repRoom{id: r.id, budget: int64(float64(c) * f),
			idle:    g.sm.Signals.Waiting == 0 && g.sm.Signals.KVUsage < f,
			queued:  g.sm.Signals.Waiting > 0 && !stale,
			pending: r.pending.Load(), rate: rate})
	}
	return out
}

// placeLocked returns the replica a new session needing need tokens may
// start on, whether one was chosen at all (none before capacities are
// known), and why it may start ("" when it may not).
func (t *sessionTable) placeLocked(need int64, rooms []repRoom, now time.Time) (r kvindex.Replica, chosen bool, why string) {
	if len(t.byKey) >= t.s.cfg.Sessions.MaxSessions {
		return 0, false, ""
	}
	if len(rooms) == 0 {
		return 0, false, admitRoom
	}
	t.recountLocked(now)
	best, room := kvindex.Replica(0), int64(-1<<62)
	for _, x := range rooms {
		if free := x.budget - t.perRep[x.id]; free > room || (free == room && x.id < best) {
			best, room = x.id, free
		}
	}
	if len(t.byKey) == 0 || need+int64(t.growth) <= room {
		return best, true, admitRoom
	}
	limit := *t.s.cfg.Sessions.SpareWork * t.s.cfg.Sessions.TTFTObjective.Seconds()
	// The fleet first: the agent policy moves a call off a busy holder to
	// the least-worked replica, so one replica idle at its last scrape has
	// no compute to spare while the fleet's pending prefill work, per
	// replica, is past the bound: the sessions already admitted bring it
	// their recomputes (TestSessionSpareCompute, "fleet recompute-bound").
	// Nor while any engine has calls waiting for KV (TestSessionSpareCompute,
	// "one replica queueing").
	var fleetWork, fleetRate float64
	for _, x := range rooms {
		if x.queued {
			return 0, false, ""
		}
		fleetWork += float64(x.pending + t.starting[x.id])
		fleetRate += x.rate
	}
	if (fleetWork+float64(need))/fleetRate > limit {
		return 0, false, ""
	}
	spare, least := -1, math.Inf(1)
	for i, x := range rooms {
		if !x.idle {
			continue
		}
		if w := float64(x.pending+t.starting[x.id]+need) / x.rate; w <= limit && w < least {
			spare, least = i, w
		}
	}
	if spare < 0 {
		return 0, false, ""
	}
	return rooms[spare].id, true, admitSpare
}

// horizonLocked is how long a session in a tool gap keeps its
// reservation: the mean observed gap plus three standard deviations, at
// most the idle timeout (the idle timeout until two gaps are seen).
func (t *sessionTable) horizonLocked() time.Duration {
	idle := t.s.cfg.Sessions.IdleTimeout
	if t.gaps < 2 {
		return idle
	}
	return min(time.Duration((t.gapMean+3*math.Sqrt(t.gapVar))*float64(time.Second)), idle)
}

// recountLocked sums the reservations at now: each session's work, none
// for a session idle past the horizon.
func (t *sessionTable) recountLocked(now time.Time) {
	clear(t.perRep)
	clear(t.starting)
	t.working = 0
	g, h := int64(t.growth), t.horizonLocked()
	for _, e := range t.byKey {
		if e.ended && e.inflight == 0 && now.Sub(e.last) > h {
			continue
		}
		w := e.work(g)
		t.working += w
		if e.bound {
			t.perRep[e.replica] += w
			if !e.started {
				t.starting[e.replica] += e.prompt
			}
		}
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
			delete(t.byKey, k)
		}
	}
}

// insertLocked admits session k onto r (when chosen) and tells the
// session memory, so that the agent policy places its first call there.
func (t *sessionTable) insertLocked(k uint64, key string, need int64, r kvindex.Replica, chosen bool, why string, now time.Time) {
	e := &sessionEntry{tokens: need, prompt: need, last: now, replica: r, bound: chosen, key: key}
	t.byKey[k] = e
	if chosen {
		t.s.sess.set(key, r, now)
	}
	t.s.m.sessionAdmitted.WithLabelValues(why).Inc()
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
	rooms := t.rooms()
	now := t.s.now()
	t.mu.Lock()
	t.sweepLocked(now)
	if e, ok := t.byKey[k]; ok {
		if e.ended {
			t.observeGapLocked(now.Sub(e.last))
		}
		e.last, e.ended = now, false
		t.mu.Unlock()
		return nil
	}
	if t.queue.Len() == 0 {
		if r, chosen, why := t.placeLocked(need, rooms, now); why != "" {
			t.insertLocked(k, req.SessionKey, need, r, chosen, why, now)
			t.gaugesLocked(rooms)
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
	t.gaugesLocked(rooms)
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
	t.gaugesLocked(rooms)
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
	rooms := t.rooms()
	now := t.s.now()
	t.mu.Lock()
	defer t.mu.Unlock()
	t.sweepLocked(now)
	for t.queue.Len() > 0 {
		w := t.queue.Front().Value.(*sessionWaiter)
		if _, ok := t.byKey[w.key]; !ok {
			r, chosen, why := t.placeLocked(w.need, rooms, now)
			if why == "" {
				break
			}
			t.insertLocked(w.key, w.name, w.need, r, chosen, why, now)
		}
		t.queue.Remove(t.queue.Front())
		w.admitted = true
		close(w.ch)
	}
	t.gaugesLocked(rooms)
}

// observeGapLocked adds a tool gap to the gap statistics.
func (t *sessionTable) observeGapLocked(gap time.Duration) {
	x := gap.Seconds()
	t.gaps++
	if t.gaps == 1 {
		t.gapMean = x
		return
	}
	d := x - t.gapMean
	t.gapMean += growthWeight * d
	t.gapVar = (1 - growthWeight) * (t.gapVar + growthWeight*d*d)
}

func (t *sessionTable) gaugesLocked(rooms []repRoom) {
	t.recountLocked(t.s.now())
	var total int64
	for _, x := range rooms {
		total += x.budget
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
	e.ended = false
	if !e.started {
		e.started, e.shared = true, min(resident, prompt)
	} else if d := float64(prompt - e.prompt); d > 0 {
		if t.growth == 0 {
			t.growth = d
		} else {
			t.growth += growthWeight * (d - t.growth)
		}
	}
	e.replica, e.bound = r, true
	e.prompt = prompt
	e.tokens = max(e.tokens, prompt)
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
		e.last, e.ended = now, e.inflight == 0
		e.tokens = max(e.tokens, history)
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

package scheduler

import (
	"container/list"
	"context"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// flow is admission control: it decides when a request may be scheduled.
// Each band has a saturation ceiling; a request whose band's ceiling is at
// or below the pool's saturation waits in its band's FIFO queue, so the pool
// degrades from the lowest band up. Queues are dispatched highest priority
// first whenever saturation falls below a band's ceiling, checked on every
// Done and every admission interval.
//
// Pool saturation is the mean over candidate replicas (breaker not open;
// all replicas if every breaker is open) of
//
//	max(waiting/target_waiting, busy/admission.target_inflight, kv_usage/kv_ceiling)
//	busy = max(inflight, running + waiting + routed since the sample)
//
// where running, waiting and kv_usage come from the engine's last scrape
// (ignored when stale), inflight is this EPP's own count and "routed since
// the sample" the growth of that count since the scrape, so 1.0 means the
// pool is at its healthy limit. The engine's counts are the truth every
// EPP replica shares: with several EPPs in front of one pool, each counts
// what the others routed once the engines report it, so they do not all
// admit up to the ceiling on their own in-flight counts; between scrapes
// each adds only what it routed itself. Requests released from a queue but
// not yet scheduled count as in flight, so one dispatch round cannot
// overshoot.
type flow struct {
	s       *Scheduler
	enabled bool
	bands   []*bandQueue // highest priority first
	byName  map[string]*bandQueue
	def     *bandQueue
	kickCh  chan struct{}

	mu       sync.Mutex
	reserved int
}

type bandQueue struct {
	Band
	q     list.List // of *waiter
	depth prometheus.Gauge
	wait  prometheus.Observer
}

type waiter struct {
	ch       chan struct{}
	admitted bool
}

func newFlow(s *Scheduler) *flow {
	a := s.cfg.Admission
	f := &flow{s: s, enabled: *a.Enabled, byName: make(map[string]*bandQueue), kickCh: make(chan struct{}, 1)}
	for _, b := range a.Bands {
		bq := &bandQueue{Band: b, depth: s.m.queueDepth.WithLabelValues(b.Name), wait: s.m.queueWait.WithLabelValues(b.Name)}
		f.bands = append(f.bands, bq)
		f.byName[b.Name] = bq
	}
	slices.SortStableFunc(f.bands, func(x, y *bandQueue) int { return y.Priority - x.Priority })
	f.def = f.byName[a.DefaultBand]
	return f
}

// band resolves a band name; "" and unknown names get the default band.
func (f *flow) band(name string) *bandQueue {
	if b, ok := f.byName[name]; ok {
		return b
	}
	return f.def
}

func (f *flow) saturation() float64 {
	sum, n := f.load(f.s.snap.Load().all.reps, f.s.now(), nil)
	if n == 0 {
		return 0
	}
	f.mu.Lock()
	reserved := f.reserved
	f.mu.Unlock()
	return (sum + float64(reserved)/f.s.cfg.Admission.TargetInflight) / float64(n)
}

// load sums the saturation terms of the candidate replicas among reps
// (those keep accepts, nil: all) and counts them: the replicas whose
// breaker is not open, or all of them when every breaker is open.
func (f *flow) load(reps []*replica, now time.Time, keep func(*replica) bool) (sum float64, n int) {
	staleBefore := f.s.staleBefore(now)
	if keep == nil {
		if sum, whole := f.addTerms(0, reps, staleBefore, true); whole {
			return sum, len(reps)
		}
	}
	for pass := 0; pass < 2 && n == 0; pass++ {
		for i, r := range reps {
			if keep != nil && !keep(r) {
				continue
			}
			if pass == 0 && r.br.state.Load() == BreakerOpen && r.br.current(now, f.s.cfg.Breaker.Cooldown) == BreakerOpen {
				continue
			}
			sum, _ = f.addTerms(sum, reps[i:i+1], staleBefore, false)
			n++
		}
	}
	return sum, n
}

// addTerms adds the saturation terms of reps to sum, in order; with
// stopAtOpen it gives up at the first open breaker (whole false). The
// common case, no filter and no open breaker, sums every replica in this
// one loop, which has no call in it: a call in a loop over every replica
// spills every register.
func (f *flow) addTerms(sum float64, reps []*replica, staleBefore stamp, stopAtOpen bool) (_ float64, whole bool) {
	target := f.s.cfg.Admission.TargetInflight
	for _, r := range reps {
		if stopAtOpen && r.br.state.Load() == BreakerOpen {
			return 0, false
		}
		own := float64(r.inflight.Load())
		g := r.signal()
		if g == nil || r.staleAt(g, staleBefore) {
			sum += own / target
			continue
		}
		engine := g.engine
		if sh := r.sharing.Load(); sh > 1 {
			engine /= float64(sh)
		}
		busy := engine + max(own-float64(r.inflightAtSample.Load()), 0)
		// max(own, busy)/target is max(own/target, busy/target): division
		// by a positive number keeps the order.
		sum += max(max(own, busy)/target, g.sat)
	}
	return sum, true
}

// Ticket is a request's admission through flow control, handed from Admit
// to Pick. A request released from a queue holds a reservation: it counts as
// in flight until Pick has counted it for real, so one dispatch round cannot
// overshoot a band's ceiling. A nil ticket holds nothing.
type Ticket struct {
	f      *flow
	waited time.Duration
}

func (t *Ticket) queued() time.Duration {
	if t == nil {
		return 0
	}
	return t.waited
}

// release gives back the reservation, once.
func (t *Ticket) release() {
	if t == nil || t.f == nil {
		return
	}
	t.f.unreserve()
	t.f = nil
}

// admit returns when req may be scheduled: at once (a nil ticket) while its
// band is below its ceiling and nobody of its band waits, else after waiting
// in the band's queue (a ticket holding a reservation).
func (f *flow) admit(ctx context.Context, req *Request, b *bandQueue) (*Ticket, *Error) {
	if !f.enabled {
		return nil, nil
	}
	sat := f.saturation()
	f.mu.Lock()
	if b.q.Len() == 0 && sat < b.SaturationCeiling {
		f.mu.Unlock()
		return nil, nil
	}
	if b.q.Len() >= *f.s.cfg.Admission.QueueCapacityPerBand {
		f.mu.Unlock()
		return nil, ErrQueueFull
	}
	w := &waiter{ch: make(chan struct{})}
	el := b.q.PushBack(w)
	b.depth.Set(float64(b.q.Len()))
	f.mu.Unlock()
	f.kick()

	start := time.Now()
	ttl := f.s.cfg.Admission.QueueTTL
	if !req.Arrived.IsZero() {
		// The TTL counts from arrival, so time spent before Admit counts too.
		ttl -= time.Since(req.Arrived)
	}
	timer := time.NewTimer(max(ttl, 0))
	defer timer.Stop()
	admitted := func() (*Ticket, *Error) {
		waited := time.Since(start)
		b.wait.Observe(waited.Seconds())
		return &Ticket{f: f, waited: waited}, nil
	}
	var cause *Error
	select {
	case <-w.ch:
		return admitted()
	case <-ctx.Done():
		cause = ErrClientGone
	case <-timer.C:
		cause = ErrQueueExpired
	}
	f.mu.Lock()
	if w.admitted {
		// Released at the same moment: go ahead.
		f.mu.Unlock()
		return admitted()
	}
	b.q.Remove(el)
	b.depth.Set(float64(b.q.Len()))
	f.mu.Unlock()
	return nil, cause
}

func (f *flow) unreserve() {
	f.mu.Lock()
	f.reserved--
	f.mu.Unlock()
	f.kick()
}

// kick asks the dispatcher to re-evaluate; it never blocks.
func (f *flow) kick() {
	select {
	case f.kickCh <- struct{}{}:
	default:
	}
}

func (f *flow) run(ctx context.Context) {
	tick := time.NewTicker(f.s.cfg.Admission.Interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-f.kickCh:
		}
		f.dispatch()
		f.s.stab.dispatch()
	}
}

// dispatch releases queued requests, highest band first, while saturation
// stays below their band's ceiling.
func (f *flow) dispatch() {
	for {
		sat := f.saturation()
		f.mu.Lock()
		var next *bandQueue
		for _, b := range f.bands {
			if b.q.Len() > 0 && sat < b.SaturationCeiling {
				next = b
				break
			}
		}
		if next == nil {
			f.mu.Unlock()
			return
		}
		w := next.q.Remove(next.q.Front()).(*waiter)
		next.depth.Set(float64(next.q.Len()))
		w.admitted = true
		f.reserved++
		close(w.ch)
		f.mu.Unlock()
	}
}

// depth returns how many requests wait in the band named name.
func (f *flow) depth(name string) int {
	b, ok := f.byName[name]
	if !ok {
		return 0
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return b.q.Len()
}

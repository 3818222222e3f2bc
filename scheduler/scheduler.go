package scheduler

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/omnious/provider-node/capacity"
	"github.com/omnious/provider-node/endpoint"
	"github.com/omnious/provider-node/engines/metrics"
	"github.com/omnious/provider-node/internal/label"
	"github.com/omnious/provider-node/kvindex"
)

// Scheduler admits and places requests. Pick reads an immutable snapshot of
// the pool behind an atomic pointer and per-replica atomics, so decisions
// never wait for SetEndpoints or for scrapes; the locks it takes (the random
// source, the speculative-credit map, the approximate and session LRUs) are
// held for a few map operations and never across I/O or a wait. Waiting
// belongs to Admit.
type Scheduler struct {
	cfg Config
	ix  *kvindex.Index
	log *zap.Logger
	m   *schedMetrics

	// now and rnd are replaced by tests.
	now func() time.Time
	rnd func() float64
	// epoch is the clock at New, the origin of stamps.
	epoch time.Time

	onWindow func(addr string, w capacity.Window) // nil: none

	snap atomic.Pointer[snapshot]

	// mu serialises SetEndpoints.
	mu sync.Mutex

	spec    *speculative
	keys    *kvindex.KeyCache // recent prompts' block keys
	recall  *routes           // the precise policy's routing memory
	approx  *approximate
	sess    *sessions
	flow    *flow
	stab    *sessionTable // session admission
	rr      atomic.Uint64
	tenants *label.Set // tenants with series of their own

	scratch sync.Pool
	// decisions holds the memory of decisions that are done and
	// released (picked), for the next ones: a decision does not allocate.
	decisions sync.Pool
}

// Target is one endpoint of the pool with its index replica id. The ids are
// assigned by whoever also feeds the index (the EPP's assembly, through
// kvindex.IDs), so the scheduler's matches and the engines' events meet
// under the same id.
type Target struct {
	endpoint.Endpoint
	Replica kvindex.Replica
}

// replica is one endpoint's live state. ep never changes after creation
// (decisions hand out &ep); everything else is atomic or locked. What every
// decision reads of every replica comes first, in the first cache line
// with the breaker's state (replicas are allocated 64-byte aligned,
// TestReplicaHotLine).
type replica struct {
	inflight atomic.Int64
	sample   atomic.Pointer[sampled]
	// inflightAtSample is this EPP's in-flight count when the last good
	// sample arrived: what it routed since is not in the engine's counts.
	inflightAtSample atomic.Int64
	score            atomic.Uint64 // math.Float64bits of the last total score
	// sharing is how many replicas report through the same metrics URL
	// (their engine counts are split evenly between them).
	sharing atomic.Int32
	id      kvindex.Replica
	metered bool // ep.MetricsURL != ""
	// added is when the endpoint joined the pool: a metered replica without
	// a good scrape is stale once stale_after has passed since then
	// (TestNewReplicaNotStaleBeforeStaleAfter).
	added stamp
	br    breaker

	// pending is the uncached prompt tokens of this EPP's requests routed
	// here that have not finished (the agent policy's pending work).
	pending atomic.Int64
	// sessionsPlaced counts the new sessions the agent policy placed here.
	sessionsPlaced atomic.Int64
	// prefillRate is math.Float64bits of the capacity curve's measured
	// prefill rate in tokens per second (0: not measured), refreshed with
	// the gauges.
	prefillRate atomic.Uint64

	ep endpoint.Endpoint

	// curve learns the replica's latency against its batch size from its
	// scrapes (Observe) for the capacity snapshot.
	curve *curveLearner

	queueGauge, breakerGauge, scoreGauge, staleGauge prometheus.Gauge
	capConcurrencyGauge, capDispersionGauge          prometheus.Gauge
	capPrefillGauge                                  prometheus.Gauge
}

// sampled is a replica's last scrape with what admission, the filters and
// the scorers read of it for every replica on every decision, computed once
// when it arrives. A metrics.Sample spans many cache lines (its
// histograms); these take 56 bytes, one cache line (64-byte allocations
// are aligned to one, TestSampledFitsALine).
type sampled struct {
	at stamp // sm.At
	// waiting is the engine's queue, engine its running + waiting.
	waiting, engine float64
	// sat is the saturation term of the engine's queue and KV usage (see
	// flow): max(waiting/target_waiting, kv_usage/kv_ceiling).
	sat float64
	// kvScore is the KV scorer of the sample.
	kvScore float64
	// scraped: sm.At is not zero, the engine was scraped successfully
	// once; over: its KV usage is above the ceiling.
	scraped, over bool
	sm            *metrics.Sample
}

// stamp is a time read on the scheduler's clock, in nanoseconds since its
// epoch: the loops over every replica compare integers instead of calling
// time.Time.Before. t.Sub(epoch) reads the monotonic clock when both
// times carry it and the wall clock otherwise, as Before does, so stamps
// of times from one clock order as the times do (TestDecisionsGolden,
// TestStampOrder).
type stamp int64

func (s *Scheduler) stamp(t time.Time) stamp { return stamp(t.Sub(s.epoch)) }

func (s *Scheduler) sampled(sm *metrics.Sample) *sampled {
	sig := &sm.Signals
	return &sampled{
		sm: sm, at: s.stamp(sm.At), scraped: !sm.At.IsZero(),
		waiting: sig.Waiting, engine: sig.Running + sig.Waiting,
		sat:     capacity.Saturation(sig.Waiting, sig.KVUsage, s.cfg.Scoring.TargetWaiting, s.cfg.Scoring.KVCeiling),
		kvScore: kvScorer(sig.KVUsage, s.cfg.Scoring.KVCeiling),
		over:    sig.KVUsage > s.cfg.Scoring.KVCeiling,
	}
}

// snapshot is the pool at one SetEndpoints call. It is immutable.
type snapshot struct {
	all    group
	byAddr map[string]*replica
	byURL  map[string][]*replica
	models map[string]group
	maxID  int
}

// group is a list of replicas (the pool, or those of one model) with
// where each one is in it by replica id, built with the snapshot so a
// decision does not index its candidates by id replica by replica. A
// decision uses pos only while its candidates are reps in order
// (filtered.whole; TestDecisionsGolden has subset hints and filtered
// replicas).
type group struct {
	reps []*replica
	// pos[id] is 1 + the position of replica id in reps, 0 when it is
	// not there; nil for a list built during a decision.
	pos []int32
}

func newGroup(reps []*replica, maxID int) group {
	pos := make([]int32, maxID+1)
	for i, r := range reps {
		pos[r.id] = int32(i + 1)
	}
	return group{reps: reps, pos: pos}
}

// Option changes how a Scheduler is built beyond its Config.
type Option func(*Scheduler)

// WithClock makes the scheduler read the time from now instead of
// time.Now for its decisions, scrapes' staleness, breakers and routing
// records: a replay on a simulated clock drives Pick and Headroom with it.
// Admit's queue still waits in real time.
func WithClock(now func() time.Time) Option { return func(s *Scheduler) { s.now = now } }

// WithWindowObserver calls f with every scrape window a replica's capacity
// curve learns from, on the scraper's goroutine, so that a harness can
// record what the curves were fitted to and replay it.
func WithWindowObserver(f func(addr string, w capacity.Window)) Option {
	return func(s *Scheduler) { s.onWindow = f }
}

// New builds a scheduler. ix may be nil when the policy never uses the
// index (the precise policy then behaves as approximate); reg nil registers
// nowhere; log nil logs nowhere.
func New(cfg Config, ix *kvindex.Index, reg prometheus.Registerer, log *zap.Logger, opts ...Option) (*Scheduler, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = zap.NewNop()
	}
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	m, err := newSchedMetrics(reg, cfg.PoolName)
	if err != nil {
		return nil, err
	}
	approx, err := newApproximate(cfg.Prefix.ChunkBytes, cfg.Prefix.MaxNodes, cfg.Prefix.TTL)
	if err != nil {
		return nil, fmt.Errorf("cannot build approximate prefix index: %w", err)
	}
	recall, err := newRoutes(cfg.Prefix.MaxNodes, cfg.Prefix.TTL)
	if err != nil {
		return nil, fmt.Errorf("cannot build the routing memory: %w", err)
	}
	keys, err := kvindex.NewKeyCache(keyCacheTokens, cfg.BlockSize)
	if err != nil {
		return nil, fmt.Errorf("cannot build the key cache: %w", err)
	}
	sess, err := newSessions(cfg.Prefix.MaxNodes, *cfg.Scoring.SessionTTL)
	if err != nil {
		return nil, fmt.Errorf("cannot build session table: %w", err)
	}
	seed := uint64(cfg.Seed)
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	var rndMu sync.Mutex
	src := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	s := &Scheduler{
		cfg: cfg, ix: ix, log: log, m: m,
		now: time.Now,
		rnd: func() float64 {
			rndMu.Lock()
			defer rndMu.Unlock()
			return src.Float64()
		},
		spec:    newSpeculative(*cfg.Prefix.SpeculativeTTL),
		keys:    keys,
		recall:  recall,
		approx:  approx,
		sess:    sess,
		tenants: label.NewSet(maxTenantSeries, otherTenant),
	}
	for _, o := range opts {
		o(s)
	}
	s.epoch = s.now()
	s.scratch.New = func() any { return new(scratch) }
	s.decisions.New = func() any { return new(picked) }
	s.snap.Store(&snapshot{byAddr: map[string]*replica{}, byURL: map[string][]*replica{}, models: map[string]group{}})
	s.flow = newFlow(s)
	s.stab = newSessionTable(s)
	return s, nil
}

// SetEndpoints replaces the pool. An endpoint keeps its in-flight count and
// signals across calls while its Addr, replica id and wiring stay the same.
// The caller owns the ids: it clears a departed endpoint's index entries
// before its id is handed out again.
func (s *Scheduler) SetEndpoints(eps []Target) {
	s.mu.Lock()
	defer s.mu.Unlock()
	old := s.snap.Load()
	next := &snapshot{
		byAddr: make(map[string]*replica, len(eps)),
		byURL:  make(map[string][]*replica),
		models: make(map[string]group),
	}
	var all []*replica
	for _, ep := range eps {
		if ep.Addr == "" {
			continue
		}
		if prev, dup := next.byAddr[ep.Addr]; dup {
			// The later entry wins; drop the earlier one from the list.
			all = slices.DeleteFunc(all, func(r *replica) bool { return r == prev })
		}
		r := old.byAddr[ep.Addr]
		if r == nil || r.id != ep.Replica || !sameEndpoint(&r.ep, &ep.Endpoint) {
			nr := &replica{ep: ep.Endpoint, id: ep.Replica, metered: ep.MetricsURL != ""}
			nr.ep.Labels = cloneLabels(ep.Labels)
			if r != nil {
				// In-flight counts stay with the old replica, whose
				// decisions decrement them; signals and what was learnt
				// of its capacity carry over.
				nr.sample.Store(r.sample.Load())
				nr.curve, nr.added = r.curve, r.added
			} else {
				nr.curve = &curveLearner{l: capacity.NewLearner(*s.cfg.Signals.CapacityHalfLife)}
				nr.added = s.stamp(s.now())
			}
			nr.queueGauge = s.m.perPodQ.WithLabelValues(s.cfg.PoolName, ep.Addr)
			nr.breakerGauge = s.m.breakerState.WithLabelValues(ep.Addr)
			nr.scoreGauge = s.m.score.WithLabelValues(ep.Addr)
			nr.staleGauge = s.m.replicaStale.WithLabelValues(ep.Addr)
			nr.capConcurrencyGauge = s.m.capacityConcurrency.WithLabelValues(ep.Addr)
			nr.capDispersionGauge = s.m.capacityDispersion.WithLabelValues(ep.Addr)
			nr.capPrefillGauge = s.m.capacityPrefill.WithLabelValues(ep.Addr)
			r = nr
		}
		all = append(all, r)
		next.byAddr[ep.Addr] = r
	}
	models := make(map[string][]*replica)
	for _, r := range all {
		models[r.ep.Model] = append(models[r.ep.Model], r)
		if u := r.ep.MetricsURL; u != "" {
			next.byURL[u] = append(next.byURL[u], r)
		}
		next.maxID = max(next.maxID, int(r.id))
	}
	next.all = newGroup(all, next.maxID)
	for m, reps := range models {
		next.models[m] = newGroup(reps, next.maxID)
	}
	for _, reps := range next.byURL {
		for _, r := range reps {
			r.sharing.Store(int32(len(reps)))
		}
	}
	s.snap.Store(next)

	for addr := range old.byAddr {
		if _, ok := next.byAddr[addr]; ok {
			continue
		}
		s.m.perPodQ.DeleteLabelValues(s.cfg.PoolName, addr)
		s.m.breakerState.DeleteLabelValues(addr)
		s.m.score.DeleteLabelValues(addr)
		s.m.replicaStale.DeleteLabelValues(addr)
		s.m.capacityConcurrency.DeleteLabelValues(addr)
		s.m.capacityDispersion.DeleteLabelValues(addr)
		s.m.capacityPrefill.DeleteLabelValues(addr)
	}
}

func sameEndpoint(a, b *endpoint.Endpoint) bool {
	return a.Addr == b.Addr && a.Model == b.Model && a.Engine == b.Engine && a.MetricsURL == b.MetricsURL &&
		a.KVEvents == b.KVEvents && a.KVReplay == b.KVReplay
}

func cloneLabels(m map[string]string) map[string]string {
	if m == nil {
		return nil
	}
	c := make(map[string]string, len(m))
	for k, v := range m {
		c[k] = v
	}
	return c
}

// Observe takes one scrape result of an engine's metrics (the scraper's
// OnSample): every endpoint behind that metrics URL gets the sample, and a
// failed scrape counts against their breakers when signals.scrape_failures_trip
// is on.
func (s *Scheduler) Observe(sm *metrics.Sample) {
	now := s.now()
	trip := *s.cfg.Signals.ScrapeFailuresTrip
	g := s.sampled(sm)
	for _, r := range s.snap.Load().byURL[sm.URL] {
		if sm.Err == nil {
			r.inflightAtSample.Store(r.inflight.Load())
		}
		r.sample.Store(g)
		if sm.Err == nil && sm.Window.Seconds > 0 {
			w := r.learn(sm)
			if s.onWindow != nil {
				s.onWindow(r.ep.Addr, w)
			}
		}
		if trip {
			r.br.scrape(sm.Err == nil, now, s.cfg.Breaker.FailureThreshold)
		}
	}
}

// Run dispatches flow-control queues and refreshes pool gauges until ctx is
// done. The engines' metrics reach the scheduler through Observe.
func (s *Scheduler) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); s.flow.run(ctx) }()
	tick := time.NewTicker(s.cfg.Signals.ScrapeInterval)
	defer tick.Stop()
	for {
		s.refreshGauges()
		select {
		case <-ctx.Done():
			wg.Wait()
			return nil
		case <-tick.C:
		}
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// refreshGauges exports per-endpoint and pool gauges.
func (s *Scheduler) refreshGauges() {
	snap := s.snap.Load()
	now := s.now()
	staleBefore := s.staleBefore(now)
	var kv, q, run float64
	var ready, stale, n int
	for _, r := range snap.all.reps {
		g, isStale := signals(r, staleBefore)
		state := r.br.current(now, s.cfg.Breaker.Cooldown)
		r.breakerGauge.Set(float64(state))
		r.scoreGauge.Set(float64frombits(r.score.Load()))
		r.staleGauge.Set(b2f(isStale))
		r.curve.mu.Lock()
		sum := r.curve.l.Summary()
		r.curve.mu.Unlock()
		r.capConcurrencyGauge.Set(sum.Largest)
		r.capDispersionGauge.Set(sum.Dispersion)
		r.capPrefillGauge.Set(sum.PrefillTokensPerSec)
		r.prefillRate.Store(math.Float64bits(sum.PrefillTokensPerSec))
		if isStale {
			stale++
		} else if state == BreakerClosed && (g != nil || !r.metered) {
			ready++
		}
		if g != nil {
			r.queueGauge.Set(g.waiting)
			kv += g.sm.Signals.KVUsage
			q += g.waiting
			run += g.sm.Signals.Running
			n++
		}
	}
	if n > 0 {
		s.m.avgKV.Set(kv / float64(n))
		s.m.avgQueue.Set(q / float64(n))
		s.m.avgRunning.Set(run / float64(n))
	}
	s.m.readyPods.Set(float64(ready))
	s.m.stale.Set(float64(stale))
}

// staleBefore is the sample time before which signals are stale at now
// (older than signals.stale_after), computed once per pass over the pool.
func (s *Scheduler) staleBefore(now time.Time) stamp {
	return s.stamp(now.Add(-s.cfg.Signals.StaleAfter))
}

// signals returns r's last sample (nil if none) and whether it is stale,
// that is taken before staleBefore. A replica without a metrics URL is
// never stale: there is nothing to wait for.
func signals(r *replica, staleBefore stamp) (*sampled, bool) {
	g := r.signal()
	return g, r.staleAt(g, staleBefore)
}

// signal and staleAt are signals in two halves small enough to inline: a
// call in a loop over every replica spills every register. signal is r's
// last sample, nil when there is none or a metered replica never had a
// good scrape.
func (r *replica) signal() *sampled {
	g := r.sample.Load()
	if r.metered && (g == nil || !g.scraped) {
		return nil
	}
	return g
}

// staleAt reports whether g, r's signal, is stale at staleBefore.
func (r *replica) staleAt(g *sampled, staleBefore stamp) bool {
	at := r.added
	if g != nil {
		at = g.at
	}
	return r.metered && at < staleBefore
}

// Tenant ids come from a client header: the first maxTenantSeries
// distinct ones get series of their own on omnious_epp_tenant_tokens_total,
// later ones share otherTenant's.
const (
	// CalibrationTenant is the reserved tenant of `quoter calibrate`'s
	// requests (marked x-omnious-calibration: 1), so their tokens are never
	// counted as a customer's.
	CalibrationTenant = "omnious-calibration"

	defaultTenant   = "default-flow"
	otherTenant     = "other"
	maxTenantSeries = 100
)

// Admit lets req through flow control: at once while its band is below
// its saturation ceiling and nobody of its band waits, else after waiting in
// the band's queue, bounded by the band's TTL (from req.Arrived) and ctx.
// The ticket goes to Pick, which releases it. Queued requests are released
// by Run's dispatcher, so Run must be running when admission is enabled.
// Errors are *Error values (ErrModelNotServed, ErrQueueFull,
// ErrQueueExpired, ErrClientGone).
func (s *Scheduler) Admit(ctx context.Context, req *Request) (*Ticket, error) {
	if req == nil {
		return nil, errNoRequest
	}
	if _, _, _, err := s.serving(s.snap.Load(), req.Model); err != nil {
		// Not worth a place in the queue: no wait can make it servable.
		s.failed(err.Reason)
		return nil, err
	}
	if err := s.stab.admit(ctx, req); err != nil {
		s.failed(err.Reason)
		return nil, err
	}
	t, err := s.flow.admit(ctx, req, s.flow.band(req.Band))
	if err != nil {
		s.failed(err.Reason)
		return nil, err
	}
	return t, nil
}

// Pick decides where an admitted request goes. It never waits: it reads the
// current snapshot, scores, and returns. It releases t (nil: the request
// holds no admission reservation), after counting the request in flight so
// that the dispatcher cannot overshoot in between. The caller must call
// Done on the returned decision exactly once. Errors are *Error values
// (ErrModelNotServed, ErrNoEndpoint).
//
// Decision.Mode is "precise" or "approximate" for the scoring policies and
// "" for random, round-robin and least-queue.
func (s *Scheduler) Pick(req *Request, t *Ticket) (*Decision, error) {
	defer t.release()
	if req == nil {
		return nil, errNoRequest
	}
	start := time.Now()
	d, err := s.schedule(req)
	s.m.e2e.Observe(time.Since(start).Seconds())
	if err != nil {
		s.failed(err.Reason)
		return nil, err
	}
	s.m.succeeded.Inc()
	d.Queued = t.queued()
	d.Priority = s.stab.retention(req, d.Endpoints)
	return d, nil
}

func (s *Scheduler) failed(reason string) {
	s.m.failedAttempts.Inc()
	s.m.errors.WithLabelValues(reason).Inc()
}

// serving resolves a requested model to the base model, the LoRA adapter
// ("" for a base model) and the replicas that may serve it.
func (s *Scheduler) serving(snap *snapshot, model string) (base, adapter string, g group, err *Error) {
	if g := snap.models[model]; len(g.reps) > 0 {
		return model, "", g, nil
	}
	if model == "" && len(snap.all.reps) > 0 {
		// A request that names no model (GET /v1/models, /health) can be
		// answered by any endpoint; 404 would fail the quoter's conformance
		// gate through the production path.
		return "", "", snap.all, nil
	}
	if b, ok := s.cfg.Adapters[model]; ok {
		if g := snap.models[b]; len(g.reps) > 0 {
			return b, model, g, nil
		}
		return "", "", group{}, ErrModelNotServed
	}
	// An adapter the configuration does not name is served where an engine
	// reports it loaded.
	for _, r := range snap.all.reps {
		if sm := r.sample.Load(); sm != nil && sm.sm.Signals.HasAdapter(model) {
			g.reps = append(g.reps, r)
			base = r.ep.Model
		}
	}
	if len(g.reps) == 0 {
		return "", "", group{}, ErrModelNotServed
	}
	return base, model, g, nil
}

// scratch is the per-decision working memory, pooled so a decision does not
// allocate slices.
type scratch struct {
	subset  []*replica // the candidates of a request with a subset hint
	cands   []cand
	keys    []kvindex.Key
	matches []kvindex.Match
	hits    []prefixHit
	hashes  []uint64
	seen    []specVal // the routing records matchPrefix read
	agent   []agentView
	byID    []int32
	// pos, when not nil, is byID for candidates that are a group's
	// replicas in order (group.pos), built with the snapshot.
	pos   []int32
	order []int
}

// schedule runs filters, scorers, guard and picker over the current
// snapshot.
func (s *Scheduler) schedule(req *Request) (*Decision, *Error) {
	snap := s.snap.Load()
	base, adapter, g, err := s.serving(snap, req.Model)
	if err != nil {
		return nil, err
	}
	sc := s.scratch.Get().(*scratch)
	defer s.scratch.Put(sc)
	now := s.now()

	f, ferr := s.filter(sc, g.reps, req, now)
	if ferr != nil {
		return nil, ferr
	}
	cands, relaxed := f.cands, f.relaxed
	if f.whole {
		// The candidates are g.reps in order: g.pos finds them by id.
		sc.pos = g.pos
	} else {
		sc.pos = nil
	}
	pk := s.decisions.Get().(*picked)
	more := pk.more
	clear(more)
	*pk = picked{more: more[:0]}
	d := &pk.d
	var reason string
	var primary int
	var promptUnits int // tokens (precise) or bytes (approximate)
	switch s.cfg.Policy {
	case PolicyRandom:
		primary, reason = int(s.rnd()*float64(len(cands))), ReasonRandom
		primary = min(primary, len(cands)-1)
		s.rankByLoad(cands)
	case PolicyRoundRobin:
		primary, reason = int(s.rr.Add(1)-1)%len(cands), ReasonRoundRobin
		s.rankByLoad(cands)
	case PolicyLeastQueue:
		s.rankByLoad(cands)
		primary, reason = s.pickBest(cands), ReasonLeastQueue
	case PolicyAgent:
		d.Mode, promptUnits = s.matchPrefix(sc, snap, cands, req, base, adapter, now)
		primary, reason = s.agentPick(sc, cands, req, promptUnits, d.Mode, now)
	default:
		d.Mode, promptUnits = s.matchPrefix(sc, snap, cands, req, base, adapter, now)
		override := s.scoreAll(cands, &f, req, adapter, promptUnits, d.Mode, now)
		primary = s.pickPrimary(cands)
		c := &cands[primary]
		switch {
		case prefixScorer(c) > 0 && c.recalled:
			reason = ReasonRecall
		case prefixScorer(c) > 0:
			reason = ReasonPrefix
		case c.sessionHit:
			reason = ReasonSession
		case override:
			reason = ReasonOverride
		default:
			reason = ReasonCold
		}
	}
	if relaxed {
		reason = ReasonFallback
	}
	s.fallbacks(sc, cands, primary)

	p := &cands[primary]
	d.Reason = reason
	if len(sc.order) <= len(pk.eps) {
		d.Endpoints = pk.eps[:0:len(sc.order)]
	} else {
		d.Endpoints = slices.Grow(pk.more[:0], len(sc.order))
		pk.more = d.Endpoints
	}
	for _, i := range sc.order {
		d.Endpoints = append(d.Endpoints, &cands[i].r.ep)
	}
	held := int(p.prefixUnits) // what the replica is expected to hold
	if p.recalled {
		held = int(p.heldUnits)
	}
	if d.Mode == ModePrecise {
		d.PromptBlocks = len(sc.keys)
		d.PrefixBlocks = held / s.cfg.BlockSize
	}
	if promptUnits > 0 {
		s.m.hitRatio.Observe(float64(held) / float64(promptUnits))
	}
	s.m.decision(reason, d.Mode)

	// After the pick: account in-flight, claim a half-open probe, credit
	// the prefix and the session.
	r := p.r
	r.inflight.Add(1)
	if promptUnits > 0 {
		pk.pending = int64(float64(max(promptUnits-held, 0)) / unitsPerToken(d.Mode))
		r.pending.Add(pk.pending)
	}
	probe := p.probe && r.br.claimProbe(now)
	switch d.Mode {
	case ModePrecise:
		s.spec.credit(r.id, sc.keys, now)
		s.recall.record(sc.hashes, sc.seen, r.id, now)
	case ModeApproximate:
		s.approx.record(sc.hashes, sc.seen, r.id, now)
	}
	s.sess.set(req.SessionKey, r.id, now)
	if pk.sessKey = sessionKey(req.SessionKey); pk.sessKey != 0 {
		perTok := unitsPerToken(d.Mode)
		s.stab.started(pk.sessKey, r.id, int64(float64(promptUnits)/perTok), int64(float64(held)/perTok))
	}
	pk.s, pk.r, pk.probe, pk.tenant = s, r, probe, req.Tenant
	d.picked, d.mem = pk, pk
	return d, nil
}

// picked is a decision of the Scheduler with what its Done needs and room
// for the default number of endpoints (the primary and two fallbacks), in
// one allocation instead of three (the decision, its endpoints and a
// closure for Done).
type picked struct {
	d      Decision
	s      *Scheduler
	r      *replica // the primary
	probe  bool     // the primary's half-open probe was claimed
	tenant string
	// pending is what the decision added to r.pending.
	pending int64
	sessKey uint64 // sessionKey of the request's session, 0 for none
	eps     [3]*endpoint.Endpoint
	// more holds the endpoints of a decision with more than two
	// fallbacks, kept for the decisions that reuse this memory.
	more []*endpoint.Endpoint
}

func (pk *picked) done(info DoneInfo) {
	pk.r.inflight.Add(-1)
	pk.r.pending.Add(-pk.pending)
	pk.s.stab.ended(pk.sessKey, int64(info.PromptTokens+info.CompletionTokens))
	pk.s.done(pk.r, pk.probe, pk.tenant, info)
}

// done feeds the breaker, the tenant token counters and flow control.
func (s *Scheduler) done(primary *replica, probe bool, tenant string, info DoneInfo) {
	now := s.now()
	served := primary
	if info.Served != "" {
		if r, ok := s.snap.Load().byAddr[info.Served]; ok {
			served = r
		}
	}
	out := info.Outcome()
	s.m.outcomes[out].Inc()
	switch out {
	case OutcomeFailure:
		served.br.request(false, now, s.cfg.Breaker.FailureThreshold)
	case OutcomeSuccess:
		served.br.request(true, now, s.cfg.Breaker.FailureThreshold)
	}
	if probe && (served != primary || out == OutcomeUnknown) {
		// The probe proved nothing about the primary: let another one go.
		primary.br.releaseProbe()
	}
	if info.PromptTokens > 0 || info.CompletionTokens > 0 {
		if tenant == "" {
			tenant = defaultTenant
		}
		tenant = s.tenants.Label(tenant)
		s.m.tenantTokens.WithLabelValues(tenant, "prompt").Add(float64(info.PromptTokens))
		s.m.tenantTokens.WithLabelValues(tenant, "cached").Add(float64(info.CachedTokens))
		s.m.tenantTokens.WithLabelValues(tenant, "completion").Add(float64(info.CompletionTokens))
	}
	s.flow.kick()
}

package scheduler

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/omnious/provider-node/endpoint"
	"github.com/omnious/provider-node/engines/metrics"
	"github.com/omnious/provider-node/kvindex"
)

// Scheduler picks endpoints. Pick reads an immutable snapshot of the pool
// behind an atomic pointer and per-replica atomics, so decisions never wait
// for SetEndpoints or for scrapes; only the speculative-credit map and the
// approximate/session LRUs take short locks.
type Scheduler struct {
	cfg Config
	ix  *kvindex.Index
	log *zap.Logger
	m   *schedMetrics

	// now and rnd are replaced by tests.
	now func() time.Time
	rnd func() float64

	snap atomic.Pointer[snapshot]

	// mu serialises SetEndpoints and guards the id allocator.
	mu     sync.Mutex
	ids    map[string]kvindex.Replica
	nextID int
	freed  []kvindex.Replica

	scraper *metrics.Scraper
	spec    *speculative
	approx  *approximate
	sess    *sessions
	flow    *flow
	rr      atomic.Uint64

	usageMu sync.Mutex
	usage   map[string]TokenUsage

	scratch sync.Pool
}

// TokenUsage is a tenant's cumulative token use, from DoneInfo.
type TokenUsage struct {
	Prompt, Cached, Completion int64
}

// replica is one endpoint's live state. ep never changes after creation
// (decisions hand out &ep); everything else is atomic or locked.
type replica struct {
	ep       endpoint.Endpoint
	id       kvindex.Replica
	inflight atomic.Int64
	sample   atomic.Pointer[metrics.Sample]
	br       breaker
	score    atomic.Uint64 // math.Float64bits of the last total score

	queueGauge, breakerGauge, scoreGauge, staleGauge prometheus.Gauge
}

// snapshot is the pool at one SetEndpoints call. It is immutable.
type snapshot struct {
	all    []*replica
	byAddr map[string]*replica
	byURL  map[string][]*replica
	models map[string][]*replica
	maxID  int
}

// New builds a scheduler. ix may be nil when the policy never uses the
// index (the precise policy then behaves as approximate); reg nil registers
// nowhere; log nil logs nowhere.
func New(cfg Config, ix *kvindex.Index, reg prometheus.Registerer, log *zap.Logger) (*Scheduler, error) {
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
		ids:    make(map[string]kvindex.Replica),
		spec:   newSpeculative(*cfg.Prefix.SpeculativeTTL),
		approx: approx,
		sess:   sess,
		usage:  make(map[string]TokenUsage),
	}
	s.scratch.New = func() any { return new(scratch) }
	s.snap.Store(&snapshot{byAddr: map[string]*replica{}, byURL: map[string][]*replica{}, models: map[string][]*replica{}})
	s.scraper = metrics.NewScraper(metrics.ScraperConfig{
		Interval: cfg.Signals.ScrapeInterval,
		Timeout:  cfg.Signals.ScrapeTimeout,
		OnSample: s.onSample,
	}, log)
	s.flow = newFlow(s)
	return s, nil
}

// Config returns the defaulted configuration in use.
func (s *Scheduler) Config() Config { return s.cfg }

// SetEndpoints replaces the pool. Endpoints keep their replica id (and
// in-flight counts) across calls while their Addr is present; an endpoint
// that leaves has its index entries cleared before its id is freed, and
// freed ids are reused only after every fresh id has been handed out.
func (s *Scheduler) SetEndpoints(eps []endpoint.Endpoint) {
	s.mu.Lock()
	defer s.mu.Unlock()
	old := s.snap.Load()
	next := &snapshot{
		byAddr: make(map[string]*replica, len(eps)),
		byURL:  make(map[string][]*replica),
		models: make(map[string][]*replica),
	}
	for _, ep := range eps {
		if ep.Addr == "" {
			continue
		}
		if prev, dup := next.byAddr[ep.Addr]; dup {
			// The later entry wins; drop the earlier one from the list.
			next.all = slices.DeleteFunc(next.all, func(r *replica) bool { return r == prev })
		}
		r := old.byAddr[ep.Addr]
		if r == nil || !sameEndpoint(&r.ep, &ep) {
			id, err := s.allocIDLocked(ep.Addr)
			if err != nil {
				s.log.Error("cannot add endpoint", zap.String("addr", ep.Addr), zap.Error(err))
				continue
			}
			nr := &replica{ep: ep, id: id}
			nr.ep.Labels = cloneLabels(ep.Labels)
			if r != nil {
				// In-flight counts stay with the old replica, whose
				// decisions decrement them; signals carry over.
				nr.sample.Store(r.sample.Load())
			}
			nr.queueGauge = s.m.perPodQ.WithLabelValues(s.cfg.PoolName, ep.Addr)
			nr.breakerGauge = s.m.breakerState.WithLabelValues(ep.Addr)
			nr.scoreGauge = s.m.score.WithLabelValues(ep.Addr)
			nr.staleGauge = s.m.replicaStale.WithLabelValues(ep.Addr)
			r = nr
		}
		next.all = append(next.all, r)
		next.byAddr[ep.Addr] = r
	}
	urls := make([]string, 0, len(next.all))
	for _, r := range next.all {
		next.models[r.ep.Model] = append(next.models[r.ep.Model], r)
		if u := r.ep.MetricsURL; u != "" {
			if len(next.byURL[u]) == 0 {
				urls = append(urls, u)
			}
			next.byURL[u] = append(next.byURL[u], r)
		}
		next.maxID = max(next.maxID, int(r.id))
	}
	s.snap.Store(next)
	s.scraper.SetTargets(urls)

	for addr, id := range s.ids {
		if _, ok := next.byAddr[addr]; ok {
			continue
		}
		// Clear before freeing: a reused id must not inherit blocks.
		if s.ix != nil {
			s.ix.ClearReplica(id)
		}
		delete(s.ids, addr)
		s.freed = append(s.freed, id)
		s.m.perPodQ.DeleteLabelValues(s.cfg.PoolName, addr)
		s.m.breakerState.DeleteLabelValues(addr)
		s.m.score.DeleteLabelValues(addr)
		s.m.replicaStale.DeleteLabelValues(addr)
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

// allocIDLocked returns addr's id, assigning one if needed.
func (s *Scheduler) allocIDLocked(addr string) (kvindex.Replica, error) {
	if id, ok := s.ids[addr]; ok {
		return id, nil
	}
	var id kvindex.Replica
	switch {
	case s.nextID <= 0xFFFF:
		id = kvindex.Replica(s.nextID)
		s.nextID++
	case len(s.freed) > 0:
		id, s.freed = s.freed[0], s.freed[1:]
	default:
		return 0, errors.New("no free replica id")
	}
	s.ids[addr] = id
	return id, nil
}

// ReplicaID returns the kvindex replica id of the endpoint at addr, for the
// KV-event ingestion to store under the same id the scheduler matches.
func (s *Scheduler) ReplicaID(addr string) (kvindex.Replica, bool) {
	if r, ok := s.snap.Load().byAddr[addr]; ok {
		return r.id, true
	}
	return 0, false
}

// onSample receives every scrape result.
func (s *Scheduler) onSample(sm *metrics.Sample) {
	now := s.now()
	trip := *s.cfg.Signals.ScrapeFailuresTrip
	for _, r := range s.snap.Load().byURL[sm.URL] {
		r.sample.Store(sm)
		if trip {
			r.br.scrape(sm.Err == nil, now, s.cfg.Breaker.FailureThreshold)
		}
	}
}

// Run scrapes engine metrics, dispatches flow-control queues and refreshes
// pool gauges until ctx is done.
func (s *Scheduler) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); s.scraper.Run(ctx) }()
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

// refreshGauges exports per-endpoint and pool gauges.
func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

func (s *Scheduler) refreshGauges() {
	snap := s.snap.Load()
	now := s.now()
	var kv, q, run float64
	var ready, stale, n int
	for _, r := range snap.all {
		sig, isStale := s.signals(r, now)
		state := r.br.current(now, s.cfg.Breaker.Cooldown)
		r.breakerGauge.Set(float64(state))
		r.scoreGauge.Set(float64frombits(r.score.Load()))
		r.staleGauge.Set(b2f(isStale))
		if isStale {
			stale++
		} else if state == BreakerClosed {
			ready++
		}
		if sig != nil {
			r.queueGauge.Set(sig.Signals.Waiting)
			kv += sig.Signals.KVUsage
			q += sig.Signals.Waiting
			run += sig.Signals.Running
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

// signals returns r's last sample (nil if none) and whether it is stale. A
// replica without a metrics URL is never stale: there is nothing to wait for.
func (s *Scheduler) signals(r *replica, now time.Time) (*metrics.Sample, bool) {
	sm := r.sample.Load()
	if r.ep.MetricsURL == "" {
		return sm, false
	}
	if sm == nil || sm.At.IsZero() {
		return nil, true
	}
	return sm, now.Sub(sm.At) > s.cfg.Signals.StaleAfter
}

// Usage returns the cumulative token use of tenant ("" = "default-flow").
func (s *Scheduler) Usage(tenant string) TokenUsage {
	if tenant == "" {
		tenant = defaultTenant
	}
	s.usageMu.Lock()
	defer s.usageMu.Unlock()
	return s.usage[tenant]
}

const defaultTenant = "default-flow"

// Pick admits the request through flow control (it may wait there, bounded
// by its band's TTL and ctx) and then decides where it goes. The caller
// must call Done on the returned decision exactly once. Queued requests are
// released by Run's dispatcher, so Run must be running when admission is
// enabled. Errors are *Error values (ErrModelNotServed, ErrNoEndpoint,
// ErrQueueFull, ErrQueueExpired, ErrClientGone).
//
// Decision.Mode is "precise" or "approximate" for the scoring policies and
// "" for random, round-robin and least-queue.
func (s *Scheduler) Pick(ctx context.Context, req *Request) (*Decision, error) {
	if req == nil {
		return nil, &Error{http.StatusBadRequest, "bad_request", "no request"}
	}
	band := s.flow.band(req.Band)
	if _, _, _, err := s.serving(s.snap.Load(), req.Model); err != nil {
		s.failed(err.Reason)
		return nil, err
	}
	queued, reserved, err := s.flow.admit(ctx, req, band)
	if err != nil {
		var e *Error
		if errors.As(err, &e) {
			s.failed(e.Reason)
		}
		return nil, err
	}
	start := time.Now()
	d, serr := s.schedule(req)
	if reserved {
		s.flow.unreserve()
	}
	s.m.e2e.Observe(time.Since(start).Seconds())
	if serr != nil {
		s.failed(serr.Reason)
		return nil, serr
	}
	s.m.attempts.WithLabelValues("success").Inc()
	d.Queued = queued
	return d, nil
}

func (s *Scheduler) failed(reason string) {
	s.m.attempts.WithLabelValues("failure").Inc()
	s.m.errors.WithLabelValues(reason).Inc()
}

// serving resolves a requested model to the base model, the LoRA adapter
// ("" for a base model) and the replicas that may serve it.
func (s *Scheduler) serving(snap *snapshot, model string) (base, adapter string, reps []*replica, err *Error) {
	if reps := snap.models[model]; len(reps) > 0 {
		return model, "", reps, nil
	}
	if model == "" && len(snap.all) > 0 {
		// A request that names no model (GET /v1/models, /health) can be
		// answered by any endpoint; 404 would fail the quoter's conformance
		// gate through the production path.
		return "", "", snap.all, nil
	}
	if b, ok := s.cfg.Adapters[model]; ok {
		if reps := snap.models[b]; len(reps) > 0 {
			return b, model, reps, nil
		}
		return "", "", nil, ErrModelNotServed
	}
	// An adapter the configuration does not name is served where an engine
	// reports it loaded.
	for _, r := range snap.all {
		if sm := r.sample.Load(); sm != nil && sm.Signals.HasAdapter(model) {
			reps = append(reps, r)
			base = r.ep.Model
		}
	}
	if len(reps) == 0 {
		return "", "", nil, ErrModelNotServed
	}
	return base, model, reps, nil
}

// scratch is the per-decision working memory, pooled so a decision does not
// allocate slices.
type scratch struct {
	cands   []cand
	keys    []kvindex.Key
	matches []kvindex.Match
	hits    []prefixHit
	hashes  []uint64
	byID    []int32
	order   []int
}

// schedule runs filters, scorers, guard and picker over the current
// snapshot.
func (s *Scheduler) schedule(req *Request) (*Decision, *Error) {
	snap := s.snap.Load()
	base, adapter, reps, err := s.serving(snap, req.Model)
	if err != nil {
		return nil, err
	}
	sc := s.scratch.Get().(*scratch)
	defer s.scratch.Put(sc)
	now := s.now()

	cands, relaxed, ferr := s.filter(sc, reps, req, now)
	if ferr != nil {
		return nil, ferr
	}
	d := &Decision{}
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
	default:
		d.Mode, promptUnits = s.matchPrefix(sc, snap, cands, req, base, adapter, now)
		override := s.scoreAll(cands, req, adapter, promptUnits, d.Mode, now)
		primary = s.pickPrimary(cands)
		c := &cands[primary]
		switch {
		case c.prefixOK && c.prefixScore > 0:
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
	d.Endpoints = make([]*endpoint.Endpoint, 0, len(sc.order))
	for _, i := range sc.order {
		d.Endpoints = append(d.Endpoints, &cands[i].r.ep)
	}
	if d.Mode == ModePrecise {
		d.PromptBlocks = len(sc.keys)
		d.PrefixBlocks = p.prefixUnits / s.cfg.BlockSize
	}
	if promptUnits > 0 {
		s.m.hitRatio.Observe(float64(p.prefixUnits) / float64(promptUnits))
	}
	s.m.decision(reason, d.Mode)

	// After the pick: account in-flight, claim a half-open probe, credit
	// the prefix and the session.
	r := p.r
	r.inflight.Add(1)
	probe := p.probe && r.br.claimProbe(now)
	switch d.Mode {
	case ModePrecise:
		s.spec.credit(r.id, sc.keys, now)
	case ModeApproximate:
		s.approx.record(sc.hashes, r.id, now)
	}
	s.sess.set(req.SessionKey, r.id, now)
	tenant := req.Tenant
	d.SetDone(func(info DoneInfo) {
		r.inflight.Add(-1)
		s.done(r, probe, tenant, info)
	})
	return d, nil
}

// done feeds the breaker, usage counters and flow control.
func (s *Scheduler) done(primary *replica, probe bool, tenant string, info DoneInfo) {
	now := s.now()
	served := primary
	if info.Served != "" {
		if r, ok := s.snap.Load().byAddr[info.Served]; ok {
			served = r
		}
	}
	switch {
	case info.Err != nil || info.Status >= 500:
		served.br.request(false, now, s.cfg.Breaker.FailureThreshold)
	case info.Status > 0:
		served.br.request(true, now, s.cfg.Breaker.FailureThreshold)
	}
	if probe && served != primary {
		primary.br.releaseProbe()
	} else if probe && info.Status == 0 && info.Err == nil {
		primary.br.releaseProbe()
	}
	if info.PromptTokens > 0 || info.CompletionTokens > 0 {
		if tenant == "" {
			tenant = defaultTenant
		}
		s.usageMu.Lock()
		u := s.usage[tenant]
		u.Prompt += int64(info.PromptTokens)
		u.Cached += int64(info.CachedTokens)
		u.Completion += int64(info.CompletionTokens)
		s.usage[tenant] = u
		s.usageMu.Unlock()
		s.m.tenantTokens.WithLabelValues(tenant, "prompt").Add(float64(info.PromptTokens))
		s.m.tenantTokens.WithLabelValues(tenant, "cached").Add(float64(info.CachedTokens))
		s.m.tenantTokens.WithLabelValues(tenant, "completion").Add(float64(info.CompletionTokens))
	}
	s.flow.kick()
}

// Package ingest connects the engines' KV-event streams to the KV index: one
// ZMQ subscriber per engine rank (dialing its publisher, filling gaps by
// replay, resetting on restarts) applies that rank's events to the index as
// one replica. Engines that publish by connecting (llm-d's centralized mode)
// reach one socket the manager binds instead, and are told apart by topic.
// Replicas that leave the pool are purged from the index.
//
// A manager can start from replica states loaded from a sibling EPP's
// snapshot (Preload): each resumes its engine's stream from the snapshot's
// position, or is dropped when the engine cannot prove it still runs that
// stream. WriteSnapshot writes the manager's own replicas for a sibling.
//
// Each replica's events are received and decoded on one goroutine (its
// subscriber's, or the bound socket's), replicas in parallel; one applier
// goroutine then applies every replica's batches to the index in the order
// they were handed over (applier.go), so a replica's events stay in order
// and the index has one writer.
package ingest

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/omnious/provider-node/engines/kvevents"
	"github.com/omnious/provider-node/internal/opt"
	"github.com/omnious/provider-node/kvindex"
)

// Source is one engine rank's event stream.
type Source struct {
	// Replica is the index id of the rank, from the same kvindex.IDs that
	// gives the scheduler its ids.
	Replica kvindex.Replica
	// Name labels the source in logs and metrics (its "ip:port").
	Name string
	// Model is the base model: it is mixed into the root of every key.
	Model string
	// Endpoint is the ZMQ PUB endpoint to dial; Replay the ROUTER endpoint
	// or "".
	Endpoint, Replay string
	// Connect says the engine publishes by connecting to the manager's
	// bound socket (Config.Bind) with the topic "kv@<Name>@<model>";
	// Endpoint and Replay are then unused.
	Connect bool
}

// Config configures the ingestion; zero fields (never legal settings) take
// their defaults. The block size is not here: it is the scheduler's, which
// the caller passes to New, so the two cannot disagree.
type Config struct {
	// ReplayTimeout bounds one replay. Default 2s.
	ReplayTimeout time.Duration `yaml:"replay_timeout"`
	// MaxBackoff caps the reconnect delay. Default 5s.
	MaxBackoff time.Duration `yaml:"max_backoff"`
	// Bind is the ZMQ endpoint bound for engines that publish by
	// connecting (e.g. "tcp://*:5557"); every such engine connects to it
	// and is told apart by its topic, kv@<ip>:<port>@<model>, which is
	// accepted only on a connection from that ip: a connection from an
	// address no connecting endpoint has is closed, and a topic of
	// another endpoint's is dropped. Replay is not
	// used on it: a gap resets the replica. Several EPP replicas cannot
	// share engines this way (each engine connects to one address, so
	// each EPP would see part of the events): run them with engines that
	// bind (dial mode). Default "" (none).
	Bind string `yaml:"bind"`
}

// Defaults of Config.
const (
	defaultReplayTimeout = 2 * time.Second
	defaultMaxBackoff    = 5 * time.Second
)

// WithDefaults returns c with every unset field at its default.
func (c Config) WithDefaults() Config {
	opt.Zero(&c.ReplayTimeout, defaultReplayTimeout)
	opt.Zero(&c.MaxBackoff, defaultMaxBackoff)
	return c
}

// Validate refuses a negative field of a defaulted config, named as the
// EPP's YAML names it.
func (c Config) Validate() error {
	return errors.Join(opt.DefaultNonNegative("ingest.replay_timeout", c.ReplayTimeout, defaultReplayTimeout),
		opt.DefaultNonNegative("ingest.max_backoff", c.MaxBackoff, defaultMaxBackoff))
}

// maxWarnedTopics bounds the unknown topics remembered for logging once.
const maxWarnedTopics = 256

// Manager runs one subscriber per dialed source and the bound socket for
// connecting ones. Safe for concurrent use.
type Manager struct {
	cfg       Config
	blockSize int
	ix        *kvindex.Index
	log       *zap.Logger

	bound       *kvevents.Subscriber // nil without Config.Bind
	apply       *applier
	boundCancel context.CancelFunc
	boundDone   chan struct{}

	mu      sync.Mutex
	running map[kvindex.Replica]*feed
	closed  bool
	pending map[string]kvindex.LoadedReplica // preloaded, until the first Set
	started bool                             // Set ran once
	noBind  map[string]bool                  // connecting sources logged without Config.Bind

	// connected are the connecting sources' feeds by address, read on the
	// bound socket's goroutine.
	connMu    sync.RWMutex
	connected map[string]*feed
	warnMu    sync.Mutex
	warned    map[string]bool // unknown topics logged

	lag prometheus.Histogram // omnious_epp_kv_event_apply_lag_seconds
}

// feed is one running source.
type feed struct {
	src    Source
	sub    *kvevents.Subscriber // nil for a connecting source
	cancel context.CancelFunc
	done   chan struct{}

	// mu guards everything below. The subscriber's goroutine applies
	// batches under it; a snapshot reads the state under it.
	mu        sync.Mutex
	state     *kvindex.ReplicaState
	pos       kvevents.Position // of the last batch applied, if posOK
	posOK     bool
	stopped   bool                 // no batch may touch the state any more
	stats     kvindex.ReplicaStats // copied after each batch for metrics
	batches   uint64               // batches applied (connecting sources)
	mismatch  uint64               // blocks of a size the scheduler does not key with
	warnedSiz bool
	log       *zap.Logger
	blockSize int
	lag       prometheus.Histogram // the manager's
	apply     *applier             // the manager's

	// spare is the memory of this feed's last batch applied, handed to
	// its subscriber with the next batch (applier.batch).
	spare atomic.Pointer[item]
}

// New returns a manager applying events to ix. blockSize is the one the
// scheduler keys prompts with: events of another size cannot match and are
// counted and logged. With Config.Bind it binds that endpoint, and fails if
// it cannot. Register exposes its metrics.
func New(cfg Config, blockSize int, ix *kvindex.Index, log *zap.Logger) (*Manager, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	m := &Manager{cfg: cfg, blockSize: blockSize, ix: ix, log: log,
		running: map[kvindex.Replica]*feed{}, connected: map[string]*feed{}, warned: map[string]bool{}, noBind: map[string]bool{},
		lag: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "omnious_epp_kv_event_apply_lag_seconds",
			Help:    "From a KV-event batch's engine timestamp to its application to the index (includes clock skew between hosts; replayed batches count as late as they are).",
			Buckets: lagBuckets})}
	m.apply = newApplier(ix, applyQueue)
	if m.cfg.Bind == "" {
		return m, nil
	}
	sub, err := kvevents.NewSubscriber(kvevents.SubscriberConfig{Endpoint: m.cfg.Bind, Bind: true, TopicKey: m.topicKey,
		PeerAllowed: m.peerAllowed, TopicFrom: m.topicFrom},
		boundHandler{m}, log.Named("bound"))
	if err != nil {
		m.apply.close()
		return nil, fmt.Errorf("cannot bind the KV-event socket: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	m.bound, m.boundCancel, m.boundDone = sub, cancel, make(chan struct{})
	go func() {
		defer close(m.boundDone)
		if err := sub.Run(ctx); err != nil && ctx.Err() == nil {
			log.Error("bound KV-event socket stopped", zap.Error(err))
		}
	}()
	log.Info("KV-event socket bound for engines that connect", zap.String("endpoint", sub.Endpoint()))
	return m, nil
}

// BoundEndpoint returns the bound socket's endpoint with its real port, or
// "" without Config.Bind.
func (m *Manager) BoundEndpoint() string {
	if m.bound == nil {
		return ""
	}
	return m.bound.Endpoint()
}

// Preload hands the manager replica states loaded from a snapshot into its
// index (kvindex.LoadSnapshot with the manager's index). The first Set
// resumes each from its position if its source is in the set, dials with
// replay, and serves the model the state was built for; the others are
// dropped from the index. Call it before the first Set.
func (m *Manager) Preload(reps []kvindex.LoadedReplica) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.started || m.closed {
		for _, lr := range reps {
			lr.State.Reset()
		}
		return
	}
	m.pending = make(map[string]kvindex.LoadedReplica, len(reps))
	for _, lr := range reps {
		m.pending[lr.Name] = lr
	}
}

// Set makes the running subscribers match sources: new ones start, removed
// ones stop and their replicas are purged from the index, changed ones
// (another endpoint or model) restart from an empty replica.
func (m *Manager) Set(sources []Source) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return
	}
	want := make(map[kvindex.Replica]Source, len(sources))
	for _, s := range sources {
		switch {
		case s.Connect && m.bound == nil:
			if !m.noBind[s.Name] {
				m.noBind[s.Name] = true
				m.log.Error("endpoint publishes KV events by connecting, but ingest.bind is not set: its events cannot arrive",
					zap.String("replica", s.Name))
			}
		case s.Connect || s.Endpoint != "":
			want[s.Replica] = s
		}
	}
	var gone []*feed
	for id, f := range m.running {
		if s, ok := want[id]; !ok || s != f.src {
			gone = append(gone, f)
			delete(m.running, id)
		}
	}
	m.stopAll(gone)
	resumed := 0
	for id, s := range want {
		if _, ok := m.running[id]; ok {
			continue
		}
		var from *kvindex.LoadedReplica
		if lr, ok := m.pending[s.Name]; ok {
			delete(m.pending, s.Name)
			if reason := adoptable(s, lr); reason != "" {
				lr.State.Reset()
				m.log.Info("snapshot replica not resumed; it starts cold", zap.String("replica", s.Name), zap.String("reason", reason))
			} else {
				from = &lr
			}
		}
		f, err := m.start(s, from)
		if err != nil {
			m.log.Error("cannot subscribe to KV events", zap.String("replica", s.Name), zap.Error(err))
			if from != nil {
				from.State.Reset()
			}
			continue
		}
		if from != nil {
			resumed++
		}
		m.running[id] = f
	}
	if !m.started {
		m.started = true
		left := len(m.pending)
		for _, lr := range m.pending {
			lr.State.Reset()
		}
		m.pending = nil
		if resumed > 0 || left > 0 {
			m.log.Info("warm start: replicas handed over by the snapshot", zap.Int("resuming", resumed),
				zap.Int("not_in_pool", left), zap.Int("sources", len(want)))
		}
	}
}

// adoptable says why a loaded replica cannot be resumed for s ("" if it can).
func adoptable(s Source, lr kvindex.LoadedReplica) string {
	switch {
	case s.Connect:
		return "the engine publishes by connecting: without replay nothing proves its stream continues"
	case s.Replay == "":
		return "the engine has no replay endpoint: nothing proves its stream continues"
	case s.Model != lr.State.Model():
		return fmt.Sprintf("the snapshot is for model %q, the endpoint serves %q", lr.State.Model(), s.Model)
	case s.Replica != lr.State.Replica():
		return "replica id differs"
	}
	return ""
}

// Close stops every subscriber and purges their replicas.
func (m *Manager) Close() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return
	}
	m.closed = true
	all := make([]*feed, 0, len(m.running))
	for id, f := range m.running {
		all = append(all, f)
		delete(m.running, id)
	}
	m.stopAll(all)
	for _, lr := range m.pending {
		lr.State.Reset()
	}
	m.pending = nil
	if m.bound != nil {
		m.boundCancel()
		<-m.boundDone
		_ = m.bound.Close()
	}
	// Last: every feed and the bound socket are stopped, so nothing hands
	// over any more.
	m.apply.close()
}

func (m *Manager) start(s Source, from *kvindex.LoadedReplica) (*feed, error) {
	f := &feed{src: s, done: make(chan struct{}), log: m.log.With(zap.String("replica", s.Name)), blockSize: m.blockSize, lag: m.lag,
		apply: m.apply}
	f.state = kvindex.NewReplicaState(m.ix, s.Replica, s.Model)
	if s.Connect {
		close(f.done)
		m.bound.Forget(s.Name)
		m.connMu.Lock()
		m.connected[s.Name] = f
		m.connMu.Unlock()
		f.log.Info("KV events expected on the bound socket", zap.String("topic", "kv@"+s.Name+"@"+s.Model))
		return f, nil
	}
	scfg := kvevents.SubscriberConfig{
		Endpoint: s.Endpoint, ReplayEndpoint: s.Replay, ReplayTimeout: m.cfg.ReplayTimeout, MaxBackoff: m.cfg.MaxBackoff,
	}
	if from != nil {
		f.state, f.pos, f.posOK = from.State, from.Pos, true
		scfg.Resume = &from.Pos
	}
	f.stats = f.state.Stats()
	// Read before the subscriber runs: from then on its goroutine changes
	// the state, and f.stats only under f.mu.
	resumed := f.stats.Blocks
	sub, err := kvevents.NewSubscriber(scfg, f, f.log)
	if err != nil {
		return nil, err
	}
	f.sub = sub
	ctx, cancel := context.WithCancel(context.Background())
	f.cancel = cancel
	go func() {
		defer close(f.done)
		if err := sub.Run(ctx); err != nil && ctx.Err() == nil {
			f.log.Error("KV-event subscriber stopped", zap.Error(err))
		}
	}()
	if from != nil {
		f.log.Info("subscribed to KV events, resuming from the snapshot", zap.String("endpoint", s.Endpoint),
			zap.String("replay", s.Replay), zap.Uint64("seq", from.Pos.Seq), zap.Int("blocks", resumed))
	} else {
		f.log.Info("subscribed to KV events", zap.String("endpoint", s.Endpoint), zap.String("replay", s.Replay))
	}
	return f, nil
}

// stopAll stops feeds: every subscriber is told to stop before any is
// waited for, so stopping a pool takes as long as its slowest feed, not
// the sum of them (1,024 subscribers queued on the index's writer lock
// took minutes one after the other; BenchmarkIngest stops 1,024).
func (m *Manager) stopAll(feeds []*feed) {
	for _, f := range feeds {
		if f.cancel != nil {
			f.cancel()
		}
	}
	for _, f := range feeds {
		m.stop(f)
	}
}

// stop ends the feed and purges the replica: what it held can no longer be
// kept current.
func (m *Manager) stop(f *feed) {
	if f.src.Connect {
		m.connMu.Lock()
		if m.connected[f.src.Name] == f {
			delete(m.connected, f.src.Name)
		}
		m.connMu.Unlock()
		m.bound.Forget(f.src.Name)
	} else {
		f.cancel()
		<-f.done
		_ = f.sub.Close()
	}
	f.apply.stop(f)
}

// HandleBatch implements kvevents.Handler: it hands a copy of the batch to
// the applier.
func (f *feed) HandleBatch(_ string, pos kvevents.Position, b *kvevents.Batch) {
	var mismatched uint64
	for i := range b.Events {
		ev := &b.Events[i]
		if ev.Kind == kvevents.KindBlockStored && ev.BlockSize != f.blockSize {
			mismatched += uint64(len(ev.BlockHashes))
		}
	}
	f.apply.batch(f, pos, b, mismatched)
}

// HandleReset implements kvevents.Handler: the reset is applied after the
// batches handed over before it.
func (f *feed) HandleReset(_ string, reason string) {
	f.apply.reset(f, reason)
}

// applyToLocked applies a handed-over batch to the replica's state, its
// index writes to w, on the applier's goroutine with f.mu held; false if
// the feed was stopped.
func (f *feed) applyToLocked(w *kvindex.Writes, it *item) bool {
	b := &it.batch
	if f.stopped {
		return false
	}
	f.state.ApplyBatchTo(w, b)
	f.pos, f.posOK = it.pos, true
	f.stats = f.state.Stats()
	f.batches++
	f.mismatch += it.mismatch
	warn := it.mismatch > 0 && !f.warnedSiz
	f.warnedSiz = f.warnedSiz || warn
	if warn {
		// Once per replica: the engines' block size must equal the EPP's.
		f.log.Warn("engine block size differs from the EPP's; its prefixes cannot match",
			zap.Int("engine_block_size", b.Events[0].BlockSize), zap.Int("epp_block_size", f.blockSize))
	}
	return true
}

// applyResetLocked drops the replica's state, on the applier's goroutine
// with f.mu held.
func (f *feed) applyResetLocked(reason string) {
	if f.stopped {
		return
	}
	f.state.Reset()
	f.posOK = false
	f.stats = f.state.Stats()
	f.log.Info("KV index entries of replica dropped", zap.String("reason", reason))
}

// applyStopLocked ends the feed and purges the replica, on the applier's
// goroutine with f.mu held: what it held can no longer be kept current.
func (f *feed) applyStopLocked() {
	f.stopped = true
	f.state.Reset()
}

// WriteSnapshot adds every dialed replica that has applied a batch since its
// last reset to sw, flushing after each; each replica is still only while
// it is encoded. Replicas of connecting engines are left out: without
// replay, a sibling could not resume them.
func (m *Manager) WriteSnapshot(sw *kvindex.SnapshotWriter) error {
	m.mu.Lock()
	feeds := make([]*feed, 0, len(m.running))
	for _, f := range m.running {
		if !f.src.Connect {
			feeds = append(feeds, f)
		}
	}
	m.mu.Unlock()
	slices.SortFunc(feeds, func(a, b *feed) int { return strings.Compare(a.src.Name, b.src.Name) })
	for _, f := range feeds {
		f.mu.Lock()
		var err error
		if f.posOK && !f.stopped {
			err = sw.AddReplica(kvindex.ReplicaTag{Name: f.src.Name, Pos: f.pos}, f.state)
		}
		f.mu.Unlock()
		if err != nil {
			return err
		}
		if err := sw.Flush(); err != nil {
			return err
		}
	}
	return nil
}

// boundHandler hands the bound socket's batches to the connecting source
// whose address is their replica key.
type boundHandler struct{ m *Manager }

func (h boundHandler) feed(key string) *feed {
	h.m.connMu.RLock()
	defer h.m.connMu.RUnlock()
	return h.m.connected[key]
}

func (h boundHandler) HandleBatch(key string, pos kvevents.Position, b *kvevents.Batch) {
	if f := h.feed(key); f != nil {
		f.HandleBatch(key, pos, b)
	}
}

func (h boundHandler) HandleReset(key, reason string) {
	if f := h.feed(key); f != nil {
		f.HandleReset(key, reason)
	}
}

// topicKey maps a bound-socket topic, kv@<ip>:<port>@<model> (llm-d's), to
// the address of a connecting source, or rejects it: an unknown topic is
// counted by the subscriber, logged once here, and creates no state.
func (m *Manager) topicKey(topic []byte) ([]byte, bool) {
	addr, ok := topicAddr(topic)
	if ok {
		m.connMu.RLock()
		_, ok = m.connected[string(addr)]
		m.connMu.RUnlock()
		if !ok {
			// An address spelt otherwise (IPv6 without brackets, an
			// IPv4-mapped address): the rare slow path.
			if canon, err := canonicalAddr(string(addr)); err == nil && canon != string(addr) {
				m.connMu.RLock()
				_, ok = m.connected[canon]
				m.connMu.RUnlock()
				addr = []byte(canon)
			}
		}
	}
	if !ok {
		m.unknownTopic(topic)
	}
	return addr, ok
}

// peerAllowed says whether a connection from peer may publish: only the
// address of a connecting source can.
func (m *Manager) peerAllowed(peer netip.Addr) bool {
	m.connMu.RLock()
	defer m.connMu.RUnlock()
	for addr := range m.connected {
		if ap, err := netip.ParseAddrPort(addr); err == nil && ap.Addr().Unmap() == peer {
			return true
		}
	}
	return false
}

// topicFrom says whether the connection from peer may publish for the
// source at addr (topicKey's result): only from the address its topic
// names. Anything else is counted by the subscriber
// (outcome="forged_topic"), logged once per topic and address, and creates
// no state (TestForgedPublisher).
func (m *Manager) topicFrom(addr []byte, peer netip.Addr) bool {
	if ap, err := netip.ParseAddrPort(string(addr)); err == nil && ap.Addr().Unmap() == peer {
		return true
	}
	key := "forged " + string(addr) + " from " + peer.String()
	m.warnMu.Lock()
	first := !m.warned[key] && len(m.warned) < maxWarnedTopics
	if first {
		m.warned[key] = true
	}
	m.warnMu.Unlock()
	if first {
		m.log.Warn("KV events for an endpoint from another address; dropped (counted in omnious_epp_kv_events_total{outcome=\"forged_topic\"})",
			zap.String("topic_endpoint", string(addr)), zap.Stringer("peer", peer))
	}
	return false
}

func (m *Manager) unknownTopic(topic []byte) {
	m.warnMu.Lock()
	first := !m.warned[string(topic)] && len(m.warned) < maxWarnedTopics
	if first {
		m.warned[string(topic)] = true
	}
	m.warnMu.Unlock()
	if first {
		m.log.Warn("KV events on a topic no connecting endpoint of the pool publishes; dropped (counted in omnious_epp_kv_events_total{outcome=\"unknown_topic\"})",
			zap.ByteString("topic", topic[:min(len(topic), 256)]))
	}
}

// topicAddr returns the <ip>:<port> of a kv@<ip>:<port>@<model> topic.
func topicAddr(topic []byte) ([]byte, bool) {
	const prefix = "kv@"
	if len(topic) <= len(prefix) || string(topic[:len(prefix)]) != prefix {
		return nil, false
	}
	rest := topic[len(prefix):]
	for i, c := range rest {
		if c == '@' {
			return rest[:i], i > 0
		}
	}
	return nil, false
}

// canonicalAddr spells an ip:port as discovery does (IPv6 in brackets,
// IPv4-mapped addresses unmapped); a bare IPv6 address and port
// ("fd00::1:8000") is split at its last colon.
func canonicalAddr(s string) (string, error) {
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()).String(), nil
	}
	i := strings.LastIndexByte(s, ':')
	if i < 0 {
		return "", errors.New("no port")
	}
	ip, err := netip.ParseAddr(s[:i])
	if err != nil {
		return "", err
	}
	ap, err := netip.ParseAddrPort("[" + ip.Unmap().String() + "]:" + s[i+1:])
	if err != nil {
		return "", err
	}
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()).String(), nil
}

// Register exposes the ingestion's and the index's counters on reg.
func (m *Manager) Register(reg prometheus.Registerer) error {
	return errors.Join(reg.Register(collector{m}), reg.Register(m.lag))
}

// lagBuckets are the apply-lag histogram's bounds: 1 ms to about 16 s.
var lagBuckets = prometheus.ExponentialBuckets(0.001, 2, 15)

// applyLag is the time from a batch's engine timestamp ts (seconds since
// the epoch) to now, clamped at 0 (an engine clock ahead of the EPP's);
// false when the batch carries no timestamp. TestApplyLag keeps it.
func applyLag(ts float64, now time.Time) (float64, bool) {
	if !(ts > 0) {
		return 0, false
	}
	return max(0, float64(now.UnixNano())/1e9-ts), true
}

var (
	descEvents   = prometheus.NewDesc("omnious_epp_kv_events_total", "KV-event batches and events by outcome.", []string{"replica", "outcome"}, nil)
	descBlocks   = prometheus.NewDesc("omnious_epp_kv_blocks_total", "Blocks applied to or skipped by the index.", []string{"replica", "outcome"}, nil)
	descSeq      = prometheus.NewDesc("omnious_epp_kv_sequence_total", "Sequence events: gaps, replays, replay failures, resets, reconnects, replays at start, resumes from a snapshot and their failures.", []string{"replica", "event"}, nil)
	descResident = prometheus.NewDesc("omnious_epp_kv_replica_blocks", "Blocks the index tracks per replica.", []string{"replica"}, nil)
	descKeys     = prometheus.NewDesc("omnious_epp_kv_index_keys", "Distinct block keys in the index.", nil, nil)
	descRes      = prometheus.NewDesc("omnious_epp_kv_index_residencies", "Block-replica pairs in the index.", nil, nil)
	descBytes    = prometheus.NewDesc("omnious_epp_kv_index_bytes", "Bytes the index accounts for (its memory budget applies to this).", nil, nil)
	descEvict    = prometheus.NewDesc("omnious_epp_kv_index_evictions_total", "Keys evicted to stay within the memory budget.", nil, nil)
	descQueue    = prometheus.NewDesc("omnious_epp_kv_apply_queue", "Decoded KV-event batches and resets waiting for the index's applier.", nil, nil)
	descWaits    = prometheus.NewDesc("omnious_epp_kv_apply_queue_full_total", "Hand-overs to the index's applier that found its queue full and waited (the subscriber stops reading meanwhile).", nil, nil)
)

// boundLabel is the replica label of the bound socket's own counters.
const boundLabel = "bound"

// collector reads the subscribers' atomics and the index's stats at scrape
// time, so the hot path only increments counters it already has.
type collector struct{ m *Manager }

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descEvents, descBlocks, descSeq, descResident, descKeys, descRes, descBytes, descEvict, descQueue, descWaits} {
		ch <- d
	}
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	subscriber := func(n string, s *kvevents.Stats) {
		counter(descEvents, s.Received.Load(), n, "received")
		counter(descEvents, s.Applied.Load(), n, "applied")
		counter(descEvents, s.DroppedFrames.Load(), n, "dropped_bad_frames")
		counter(descEvents, s.DroppedDecode.Load(), n, "dropped_bad_payload")
		counter(descEvents, s.DroppedDuplicate.Load(), n, "dropped_duplicate")
		counter(descEvents, s.UnknownEvents.Load(), n, "unknown_event_type")
		counter(descSeq, s.Gaps.Load(), n, "gap")
		counter(descSeq, s.Replays.Load(), n, "replay")
		counter(descSeq, s.ReplayFailures.Load(), n, "replay_failure")
		counter(descSeq, s.Resets.Load(), n, "reset")
		counter(descSeq, s.Reconnects.Load(), n, "reconnect")
	}
	c.m.mu.Lock()
	feeds := make([]*feed, 0, len(c.m.running))
	for _, f := range c.m.running {
		feeds = append(feeds, f)
	}
	c.m.mu.Unlock()
	if b := c.m.bound; b != nil {
		s := b.Stats()
		subscriber(boundLabel, s)
		counter(descEvents, s.UnknownTopics.Load(), boundLabel, "unknown_topic")
		counter(descEvents, s.ForgedTopics.Load(), boundLabel, "forged_topic")
		counter(descEvents, s.RefusedPeers.Load(), boundLabel, "refused_peer")
		counter(descEvents, s.DroppedReplicas.Load(), boundLabel, "dropped_too_many_replicas")
	}
	for _, f := range feeds {
		n := f.src.Name
		f.mu.Lock()
		st, mismatch, batches := f.stats, f.mismatch, f.batches
		f.mu.Unlock()
		if f.sub != nil {
			s := f.sub.Stats()
			subscriber(n, s)
			counter(descSeq, s.StartReplays.Load(), n, "start_replay")
			counter(descSeq, s.Resumes.Load(), n, "resume")
			counter(descSeq, s.ResumeFailures.Load(), n, "resume_failure")
		} else {
			// The bound socket counts for all connecting engines; what
			// reached this one is what was applied to it.
			counter(descEvents, batches, n, "received")
			counter(descEvents, batches, n, "applied")
		}
		counter(descBlocks, st.StoredBlocks, n, "stored")
		counter(descBlocks, st.RemovedBlocks, n, "removed")
		counter(descBlocks, st.SkippedBlocks, n, "skipped_unknown_parent")
		counter(descBlocks, st.IgnoredBlocks, n, "ignored_group")
		counter(descBlocks, st.UnknownRemoved, n, "unknown_removed")
		counter(descBlocks, mismatch, n, "block_size_mismatch")
		ch <- prometheus.MustNewConstMetric(descResident, prometheus.GaugeValue, float64(st.Blocks), n)
	}
	is := c.m.ix.Stats()
	ch <- prometheus.MustNewConstMetric(descKeys, prometheus.GaugeValue, float64(is.Keys))
	ch <- prometheus.MustNewConstMetric(descRes, prometheus.GaugeValue, float64(is.Residencies))
	ch <- prometheus.MustNewConstMetric(descBytes, prometheus.GaugeValue, float64(is.Bytes))
	ch <- prometheus.MustNewConstMetric(descEvict, prometheus.CounterValue, float64(is.Evictions))
	ch <- prometheus.MustNewConstMetric(descQueue, prometheus.GaugeValue, float64(len(c.m.apply.q)))
	ch <- prometheus.MustNewConstMetric(descWaits, prometheus.CounterValue, float64(c.m.apply.full.Load()))
}

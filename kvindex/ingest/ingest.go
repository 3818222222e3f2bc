// Package ingest connects the engines' KV-event streams to the KV index: one
// ZMQ subscriber per engine rank (dialing its publisher, filling gaps by
// replay, resetting on restarts) applies that rank's events to the index as
// one replica. Replicas that leave the pool are purged from the index.
//
// Events of one replica are applied in order on that replica's goroutine;
// different replicas run in parallel (the index serialises its writers).
package ingest

import (
	"context"
	"sync"
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
	// Endpoint is the ZMQ PUB endpoint; Replay the ROUTER endpoint or "".
	Endpoint, Replay string
}

// Config configures the ingestion; zero fields (never legal settings) take
// their defaults. The block size is not here: it is the scheduler's, which
// the caller passes to New, so the two cannot disagree.
type Config struct {
	// ReplayTimeout bounds one replay. Default 2s.
	ReplayTimeout time.Duration `yaml:"replay_timeout"`
	// MaxBackoff caps the reconnect delay. Default 5s.
	MaxBackoff time.Duration `yaml:"max_backoff"`
}

// WithDefaults returns c with every unset field at its default.
func (c Config) WithDefaults() Config {
	opt.Zero(&c.ReplayTimeout, 2*time.Second)
	opt.Zero(&c.MaxBackoff, 5*time.Second)
	return c
}

// Manager runs one subscriber per source. Safe for concurrent use.
type Manager struct {
	cfg       Config
	blockSize int
	ix        *kvindex.Index
	log       *zap.Logger

	mu      sync.Mutex
	running map[kvindex.Replica]*feed
	closed  bool
}

// feed is one running source.
type feed struct {
	src    Source
	sub    *kvevents.Subscriber
	cancel context.CancelFunc
	done   chan struct{}

	// state is touched only by the subscriber's goroutine while it runs,
	// and by stop after it has ended.
	state *kvindex.ReplicaState

	mu        sync.Mutex
	stats     kvindex.ReplicaStats // copied after each batch for metrics
	mismatch  uint64               // blocks of a size the scheduler does not key with
	warnedSiz bool
	log       *zap.Logger
	blockSize int
}

// New returns a manager applying events to ix. blockSize is the one the
// scheduler keys prompts with: events of another size cannot match and are
// counted and logged. Register exposes its metrics.
func New(cfg Config, blockSize int, ix *kvindex.Index, log *zap.Logger) *Manager {
	return &Manager{cfg: cfg.WithDefaults(), blockSize: blockSize, ix: ix, log: log, running: map[kvindex.Replica]*feed{}}
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
		if s.Endpoint != "" {
			want[s.Replica] = s
		}
	}
	for id, f := range m.running {
		if s, ok := want[id]; !ok || s != f.src {
			f.stop()
			delete(m.running, id)
		}
	}
	for id, s := range want {
		if _, ok := m.running[id]; ok {
			continue
		}
		f, err := m.start(s)
		if err != nil {
			m.log.Error("cannot subscribe to KV events", zap.String("replica", s.Name), zap.Error(err))
			continue
		}
		m.running[id] = f
	}
}

// Close stops every subscriber and purges their replicas.
func (m *Manager) Close() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.closed = true
	for id, f := range m.running {
		f.stop()
		delete(m.running, id)
	}
}

func (m *Manager) start(s Source) (*feed, error) {
	f := &feed{src: s, state: kvindex.NewReplicaState(m.ix, s.Replica, s.Model), done: make(chan struct{}),
		log: m.log.With(zap.String("replica", s.Name)), blockSize: m.blockSize}
	sub, err := kvevents.NewSubscriber(kvevents.SubscriberConfig{
		Endpoint: s.Endpoint, ReplayEndpoint: s.Replay, ReplayTimeout: m.cfg.ReplayTimeout, MaxBackoff: m.cfg.MaxBackoff,
	}, f, f.log)
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
	f.log.Info("subscribed to KV events", zap.String("endpoint", s.Endpoint), zap.String("replay", s.Replay))
	return f, nil
}

// stop ends the subscriber and purges the replica: what it held can no
// longer be kept current.
func (f *feed) stop() {
	f.cancel()
	<-f.done
	_ = f.sub.Close()
	f.state.Reset()
}

// HandleBatch implements kvevents.Handler.
func (f *feed) HandleBatch(_ string, _ kvevents.Position, b *kvevents.Batch) {
	var mismatched uint64
	for i := range b.Events {
		ev := &b.Events[i]
		if ev.Kind == kvevents.KindBlockStored && ev.BlockSize != f.blockSize {
			mismatched += uint64(len(ev.BlockHashes))
		}
	}
	f.state.ApplyBatch(b)
	st := f.state.Stats()
	f.mu.Lock()
	f.stats = st
	f.mismatch += mismatched
	warn := mismatched > 0 && !f.warnedSiz
	f.warnedSiz = f.warnedSiz || warn
	f.mu.Unlock()
	if warn {
		// Once per replica: the engines' block size must equal the EPP's.
		f.log.Warn("engine block size differs from the EPP's; its prefixes cannot match",
			zap.Int("engine_block_size", b.Events[0].BlockSize), zap.Int("epp_block_size", f.blockSize))
	}
}

// HandleReset implements kvevents.Handler.
func (f *feed) HandleReset(_ string, reason string) {
	f.state.Reset()
	st := f.state.Stats()
	f.mu.Lock()
	f.stats = st
	f.mu.Unlock()
	f.log.Info("KV index entries of replica dropped", zap.String("reason", reason))
}

// Register exposes the ingestion's and the index's counters on reg.
func (m *Manager) Register(reg prometheus.Registerer) error {
	return reg.Register(collector{m})
}

var (
	descEvents   = prometheus.NewDesc("omnious_epp_kv_events_total", "KV-event batches and events by outcome.", []string{"replica", "outcome"}, nil)
	descBlocks   = prometheus.NewDesc("omnious_epp_kv_blocks_total", "Blocks applied to or skipped by the index.", []string{"replica", "outcome"}, nil)
	descSeq      = prometheus.NewDesc("omnious_epp_kv_sequence_total", "Sequence events: gaps, replays, replay failures, resets, reconnects.", []string{"replica", "event"}, nil)
	descResident = prometheus.NewDesc("omnious_epp_kv_replica_blocks", "Blocks the index tracks per replica.", []string{"replica"}, nil)
	descKeys     = prometheus.NewDesc("omnious_epp_kv_index_keys", "Distinct block keys in the index.", nil, nil)
	descRes      = prometheus.NewDesc("omnious_epp_kv_index_residencies", "Block-replica pairs in the index.", nil, nil)
	descBytes    = prometheus.NewDesc("omnious_epp_kv_index_bytes", "Bytes the index accounts for (its memory budget applies to this).", nil, nil)
	descEvict    = prometheus.NewDesc("omnious_epp_kv_index_evictions_total", "Keys evicted to stay within the memory budget.", nil, nil)
)

// collector reads the subscribers' atomics and the index's stats at scrape
// time, so the hot path only increments counters it already has.
type collector struct{ m *Manager }

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descEvents, descBlocks, descSeq, descResident, descKeys, descRes, descBytes, descEvict} {
		ch <- d
	}
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	c.m.mu.Lock()
	feeds := make([]*feed, 0, len(c.m.running))
	for _, f := range c.m.running {
		feeds = append(feeds, f)
	}
	c.m.mu.Unlock()
	for _, f := range feeds {
		n := f.src.Name
		s := f.sub.Stats()
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
		f.mu.Lock()
		st, mismatch := f.stats, f.mismatch
		f.mu.Unlock()
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
}

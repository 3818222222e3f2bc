package kvevents

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/go-zeromq/zmq4"
	"go.uber.org/zap"

	"github.com/omnious/provider-node/internal/opt"
)

// Handler receives a subscriber's batches and resets, from the subscriber's
// single goroutine, in sequence order. In dial mode topic is the message's
// topic; in bind mode it is the replica's key (SubscriberConfig.TopicKey's
// result, or the topic when there is none).
type Handler interface {
	// HandleBatch applies one batch. pos is where it sits in the engine's
	// stream: a subscriber started with Resume at pos continues from it. b
	// is reused after the call returns: a handler that keeps the batch
	// exchanges it for one of its own (*b, mine = mine, *b), whose memory
	// the subscriber then decodes the next batch into, so a batch handed on
	// is never copied (TestSubscriberDecodesIntoTheBatchHandedBack).
	HandleBatch(topic string, pos Position, b *Batch)
	// HandleReset says the events of topic's replica can no longer be
	// trusted (restart, or loss that replay could not fill): drop its state
	// and rebuild from the batches that follow.
	HandleReset(topic string, reason string)
}

// Position is a point in one engine run's event stream: the sequence number
// of a batch and the xxhash64 of its payload. vLLM and SGLang carry no run id
// in their events, and a restarted engine numbers its batches from 0 again,
// so a sequence number alone does not say which run it belongs to. The
// payload does: it carries the batch's timestamp and events, so a batch of
// another run at the same sequence number differs from it. A run is shown
// to continue from a Position only by the engine's replay buffer returning
// that very batch; nothing else (a sequence that went backwards, an
// AllBlocksCleared, a buffer that no longer holds the batch, no replay
// endpoint at all) proves it, and the subscriber then starts the replica
// over rather than guess.
type Position struct {
	Seq uint64
	Sum uint64
}

// PayloadSum is the checksum a Position carries for payload.
func PayloadSum(payload []byte) uint64 { return xxhash.Sum64(payload) }

// SubscriberConfig configures a Subscriber. Zero values take the defaults
// stated per field.
type SubscriberConfig struct {
	// Endpoint is the engine's PUB endpoint to dial, or with Bind the
	// endpoint to bind for engines to connect to. Required.
	Endpoint string
	// Bind binds Endpoint and accepts many engines; each is identified by
	// its topic (llm-d's "kv@<ip>:<port>@<model>"). Replay is not attempted
	// in this mode: a gap resets that replica. Default false (dial).
	Bind bool
	// ReplayEndpoint is the engine's ROUTER endpoint used to fill gaps.
	// Default "" (no replay: a gap resets).
	ReplayEndpoint string
	// Topic is the subscription prefix. Default "" (everything).
	Topic string
	// ReplayTimeout bounds one replay, end marker included. Default 2s.
	ReplayTimeout time.Duration
	// MinBackoff and MaxBackoff bound the reconnect delay, which doubles
	// after each failure. Defaults 100ms and 5s.
	MinBackoff time.Duration
	MaxBackoff time.Duration
	// MaxReplicas bounds the topics tracked in bind mode; messages on
	// further topics are dropped. Default 4096.
	MaxReplicas int
	// TopicKey, in bind mode, maps a message's topic to the key of the
	// replica that sent it (the result may alias topic), or rejects it: a
	// rejected message is counted in Stats.UnknownTopics and creates no
	// state. Messages with the same key share one sequence. Default nil:
	// every topic is its own replica.
	TopicKey func(topic []byte) (key []byte, ok bool)
	// PeerAllowed, in bind mode, says whether an engine connecting from
	// this address may publish at all; a refused connection is closed and
	// counted in Stats.RefusedPeers. Default nil: every address.
	PeerAllowed func(peer netip.Addr) bool
	// TopicFrom, in bind mode, says whether the connection from peer may
	// publish for the replica key (TopicKey's result): a message it
	// rejects is counted in Stats.ForgedTopics and creates no state.
	// Default nil: any connection publishes for any key.
	TopicFrom func(key []byte, peer netip.Addr) bool
	// Resume, in dial mode with a replay endpoint, is where the handler's
	// state stands (a snapshot taken at that batch): on the first
	// connection the subscriber asks the replay buffer for that batch and,
	// if it is the same one, applies only what followed. Otherwise the
	// handler gets a reset and the subscriber starts as without Resume.
	// Default nil.
	Resume *Position
}

// Stats counts what a subscriber saw. Fields are updated atomically and can
// be read at any time.
type Stats struct {
	// Received counts live messages.
	Received atomic.Uint64
	// Applied counts batches delivered to the handler (live and replayed).
	Applied atomic.Uint64
	// DroppedFrames counts messages with a bad frame layout.
	DroppedFrames atomic.Uint64
	// DroppedDecode counts batches whose payload did not decode.
	DroppedDecode atomic.Uint64
	// DroppedDuplicate counts live batches already applied by a replay.
	DroppedDuplicate atomic.Uint64
	// DroppedReplicas counts messages on topics past MaxReplicas.
	DroppedReplicas atomic.Uint64
	// UnknownEvents counts skipped events of unknown type.
	UnknownEvents atomic.Uint64
	// Gaps counts jumps forward in the sequence.
	Gaps atomic.Uint64
	// UnknownTopics counts bind-mode messages whose topic TopicKey rejected.
	UnknownTopics atomic.Uint64
	// ForgedTopics counts bind-mode messages whose topic names a replica
	// the connection they came on may not speak for (TopicFrom).
	ForgedTopics atomic.Uint64
	// RefusedPeers counts bind-mode connections PeerAllowed refused.
	RefusedPeers atomic.Uint64
	// Replays counts replay attempts after a gap or restart; ReplayFailures
	// those that did not fill the gap.
	Replays        atomic.Uint64
	ReplayFailures atomic.Uint64
	// StartReplays counts the replays of the engine's buffer on the first
	// connection (see Subscriber.Run); Resumes the starts that continued
	// from SubscriberConfig.Resume, ResumeFailures those that could not.
	StartReplays   atomic.Uint64
	Resumes        atomic.Uint64
	ResumeFailures atomic.Uint64
	// ReplayedBatches counts batches applied from replays.
	ReplayedBatches atomic.Uint64
	// Resets counts HandleReset calls.
	Resets atomic.Uint64
	// Reconnects counts failed dials and lost connections.
	Reconnects atomic.Uint64
}

// SeqVerdict classifies a live sequence number.
type SeqVerdict uint8

const (
	// SeqFirst is the first sequence seen: the baseline.
	SeqFirst SeqVerdict = iota
	// SeqNext follows the last applied batch.
	SeqNext
	// SeqGap skips batches: fill them by replay or reset.
	SeqGap
	// SeqDuplicate was already applied by a replay.
	SeqDuplicate
	// SeqRestart went backwards on the live stream: the engine restarted.
	SeqRestart
)

// SeqTracker follows one replica's sequence numbers. The zero value is ready.
type SeqTracker struct {
	started  bool
	last     uint64 // last applied, live or replayed
	liveSeen bool
	lastLive uint64 // highest seen on the live stream
}

// Live classifies seq received on the live stream. Live sequences only go
// up, so one at or below the previous live one means a restart, while one
// at or below the last applied (after a replay ran ahead, or before any
// live batch was seen) is a duplicate.
func (t *SeqTracker) Live(seq uint64) SeqVerdict {
	defer func() { t.lastLive, t.liveSeen = seq, true }()
	switch {
	case !t.started:
		return SeqFirst
	case t.liveSeen && seq <= t.lastLive:
		return SeqRestart
	case seq <= t.last:
		return SeqDuplicate
	case seq == t.last+1:
		return SeqNext
	}
	return SeqGap
}

// Applied records that batch seq reached the handler.
func (t *SeqTracker) Applied(seq uint64) {
	t.started, t.last = true, seq
}

// Last returns the last applied sequence; ok is false before the first.
func (t *SeqTracker) Last() (seq uint64, ok bool) { return t.last, t.started }

type replica struct {
	topic string
	seq   SeqTracker
	// lastSum is the xxhash of the last applied batch's payload, and
	// verify is set when the connection was lost: the publisher found
	// after a reconnect may be a restarted engine whose new sequence
	// already ran past ours, which sequence numbers alone cannot tell.
	lastSum uint64
	verify  bool
	// startCheck is set after the replay at start: the first live batch
	// may be one queued during the replay, or come from a run the engine
	// started since (restarted without the connection breaking, its first
	// batches sent before the subscription reached the publisher), whose
	// sequence numbers may even follow the replayed ones; so it is checked
	// like verify.
	startCheck bool
}

// Subscriber receives KV events from one engine (dial mode) or many (bind
// mode), keeps each replica's sequence, fills gaps by replay and reports
// what cannot be filled as a reset.
type Subscriber struct {
	cfg   SubscriberConfig
	h     Handler
	log   *zap.Logger
	stats Stats

	bound net.Listener // bind mode only, opened by NewSubscriber

	mu       sync.Mutex // guards closed and bound's lifetime against Close
	closed   bool
	single   *replica  // dial mode
	synced   bool      // dial mode: the start replay ran
	resumeAt *Position // dial mode: cfg.Resume until it is used or given up
	// replicas are the bind-mode replicas by key; topicsMu guards the map
	// (Forget runs on other goroutines), not the replicas.
	topicsMu sync.Mutex
	replicas map[string]*replica
	batch    Batch
	// peer is the address of the connection the bind-mode message being
	// handled came on (runBound's goroutine only).
	peer netip.Addr
}

// NewSubscriber validates cfg and, in bind mode, binds the endpoint.
func NewSubscriber(cfg SubscriberConfig, h Handler, log *zap.Logger) (*Subscriber, error) {
	if cfg.Endpoint == "" {
		return nil, errors.New("cannot create subscriber: empty endpoint")
	}
	if h == nil {
		return nil, errors.New("cannot create subscriber: nil handler")
	}
	if cfg.Resume != nil && (cfg.Bind || cfg.ReplayEndpoint == "") {
		return nil, errors.New("cannot create subscriber: Resume needs dial mode and a replay endpoint to prove the engine run continues")
	}
	if err := errors.Join(opt.NonNegative("ReplayTimeout", cfg.ReplayTimeout), opt.NonNegative("MinBackoff", cfg.MinBackoff),
		opt.NonNegative("MaxBackoff", cfg.MaxBackoff), opt.NonNegative("MaxReplicas", cfg.MaxReplicas)); err != nil {
		return nil, fmt.Errorf("cannot create subscriber: %w", err)
	}
	opt.Zero(&cfg.ReplayTimeout, 2*time.Second)
	opt.Zero(&cfg.MinBackoff, 100*time.Millisecond)
	if cfg.MaxBackoff < cfg.MinBackoff {
		cfg.MaxBackoff = max(5*time.Second, cfg.MinBackoff)
	}
	opt.Zero(&cfg.MaxReplicas, 4096)
	if log == nil {
		log = zap.NewNop()
	}
	s := &Subscriber{cfg: cfg, h: h, log: log, replicas: make(map[string]*replica), resumeAt: cfg.Resume}
	if cfg.Bind {
		ln, err := listenTCP(cfg.Endpoint)
		if err != nil {
			return nil, fmt.Errorf("cannot create subscriber on %s: %w", cfg.Endpoint, err)
		}
		s.bound = ln
	}
	return s, nil
}

// Stats returns the live counters.
func (s *Subscriber) Stats() *Stats { return &s.stats }

// Endpoint returns the bound endpoint with its real port in bind mode, else
// the configured endpoint.
func (s *Subscriber) Endpoint() string {
	if s.bound != nil {
		return "tcp://" + s.bound.Addr().String()
	}
	return s.cfg.Endpoint
}

// Forget drops the sequence state of the bind-mode replica with key, so
// that its next message starts it afresh (its handler state was replaced).
// Safe to call from any goroutine.
func (s *Subscriber) Forget(key string) {
	s.topicsMu.Lock()
	delete(s.replicas, key)
	s.topicsMu.Unlock()
}

// Close releases the bound socket if Run was never called. Run closes it
// itself when it returns.
func (s *Subscriber) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	if s.bound != nil {
		if err := s.bound.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
			return fmt.Errorf("cannot close subscriber: %w", err)
		}
	}
	return nil
}

// Run receives until ctx is done, reconnecting forever in dial mode. It
// returns ctx's error.
//
// In dial mode with a replay endpoint, the first connection starts with a
// replay: from SubscriberConfig.Resume when it is set and the engine still
// runs the same stream, else of everything the engine still buffers, from
// its oldest batch, so a subscriber started late knows what the engine
// stored before (a buffer that begins at the run's first batch gives the
// whole state; a later one gives the blocks stored since, whose parents it
// holds). Without a replay endpoint the stream starts at the first live
// batch, and a Resume is impossible (NewSubscriber refuses it).
func (s *Subscriber) Run(ctx context.Context) error {
	if s.cfg.Bind {
		return s.runBound(ctx)
	}
	backoff := s.cfg.MinBackoff
	for ctx.Err() == nil {
		received, err := s.runDialed(ctx)
		if ctx.Err() != nil {
			break
		}
		if s.single != nil {
			s.single.verify = true // runDialed has returned: no race
		}
		if received {
			backoff = s.cfg.MinBackoff
		}
		s.stats.Reconnects.Add(1)
		s.log.Info("kv event subscription lost, reconnecting",
			zap.String("endpoint", s.cfg.Endpoint), zap.Duration("backoff", backoff), zap.Error(err))
		select {
		case <-ctx.Done():
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, s.cfg.MaxBackoff)
	}
	return ctx.Err()
}

// runDialed runs one connection; received reports whether any message came.
func (s *Subscriber) runDialed(ctx context.Context) (received bool, err error) {
	conn, err := dialEndpoint(ctx, s.cfg.Endpoint, s.cfg.MaxBackoff)
	var zc *zmq4.Conn
	if err == nil {
		defer conn.Close()
		defer context.AfterFunc(ctx, func() { _ = conn.Close() })()
		zc, err = openSub(conn, s.cfg.Topic, s.cfg.MaxBackoff)
	}
	if err != nil {
		if r := s.resumeAt; r != nil {
			// The state handed over cannot be shown current while the
			// engine is unreachable: drop it now rather than serve it.
			s.resumeAt = nil
			s.stats.ResumeFailures.Add(1)
			s.reset(s.replicaFor(nil), fmt.Sprintf("cannot resume at seq %d: engine unreachable: %v", r.Seq, err))
		}
		return false, fmt.Errorf("cannot subscribe: %w", err)
	}
	if !s.synced {
		s.synced = true
		if s.cfg.ReplayEndpoint != "" {
			s.startReplay(ctx, s.replicaFor(nil))
		}
	}
	for {
		frames, err := recvMsg(zc)
		if err != nil {
			return received, err
		}
		received = true
		s.handle(ctx, frames, true)
	}
}

// startReplay runs on the first connection, the live socket already
// subscribed (what it receives meanwhile waits in its queue): it resumes
// from cfg.Resume or, failing that, applies what the engine buffers. The
// first live batch is checked against the last replayed one (startCheck).
func (s *Subscriber) startReplay(ctx context.Context, rep *replica) {
	defer func() { rep.startCheck = true }()
	if r := s.resumeAt; r != nil {
		s.resumeAt = nil
		err := s.resume(ctx, rep, *r)
		if err == nil {
			s.stats.Resumes.Add(1)
			last, _ := rep.seq.Last()
			s.log.Info("kv event stream resumed", zap.Uint64("from_seq", r.Seq), zap.Uint64("at_seq", last))
			return
		}
		s.stats.ResumeFailures.Add(1)
		rep.seq = SeqTracker{}
		s.reset(rep, fmt.Sprintf("cannot resume at seq %d: %v", r.Seq, err))
	}
	s.stats.StartReplays.Add(1)
	if err := s.replayBuffered(ctx, rep); err != nil {
		s.stats.ReplayFailures.Add(1)
		if _, started := rep.seq.Last(); started {
			rep.seq = SeqTracker{}
			s.reset(rep, fmt.Sprintf("replay of the engine's buffer at start failed: %v", err))
		} else {
			s.log.Info("no replay of the engine's buffer at start; following the live stream", zap.Error(err))
		}
	}
}

// errRunChanged says the replay buffer does not hold the batch a Resume
// names: the engine restarted, or the batch is too old to prove anything.
var errRunChanged = errors.New("the engine no longer runs the stream that batch belongs to, or its replay buffer no longer holds it")

// resume checks that the engine's buffer still holds batch r (same sequence,
// same payload) and applies the batches after it.
func (s *Subscriber) resume(ctx context.Context, rep *replica, r Position) error {
	rep.seq = SeqTracker{}
	rep.seq.Applied(r.Seq)
	rep.lastSum = r.Sum
	first := true
	return s.replayStream(ctx, r.Seq, func(rr ReplayReply) error {
		if first {
			first = false
			switch {
			case rr.Seq > r.Seq:
				return fmt.Errorf("buffer starts at %d, after %d: %w", rr.Seq, r.Seq, errRunChanged)
			case rr.Seq < r.Seq:
				return fmt.Errorf("replay from %d began at %d: %w", r.Seq, rr.Seq, errRunChanged)
			case PayloadSum(rr.Payload) != r.Sum:
				return fmt.Errorf("batch %d differs: %w", r.Seq, errRunChanged)
			}
			return nil
		}
		return s.applyReplayed(rep, rr)
	}, func() error {
		if first {
			return fmt.Errorf("buffer holds nothing from %d: %w", r.Seq, errRunChanged)
		}
		return nil
	})
}

// replayBuffered applies every batch the engine buffers, the oldest being
// the baseline.
func (s *Subscriber) replayBuffered(ctx context.Context, rep *replica) error {
	return s.replayStream(ctx, 0, func(rr ReplayReply) error {
		if rr.Topic != nil && string(rr.Topic) != rep.topic {
			rep.topic = string(rr.Topic) // before any live batch: only vLLM 0.26+ says
		}
		if _, started := rep.seq.Last(); !started {
			s.stats.ReplayedBatches.Add(1)
			s.apply(rep, rr.Seq, rr.Payload)
			return nil
		}
		return s.applyReplayed(rep, rr)
	}, nil)
}

// applyReplayed applies a replayed batch that must follow the last applied
// one; batches already applied are skipped.
func (s *Subscriber) applyReplayed(rep *replica, rr ReplayReply) error {
	last, _ := rep.seq.Last()
	if rr.Seq <= last {
		return nil
	}
	if rr.Seq != last+1 {
		return fmt.Errorf("replay skips from %d to %d", last, rr.Seq)
	}
	s.stats.ReplayedBatches.Add(1)
	s.apply(rep, rr.Seq, rr.Payload)
	return nil
}

// runBound accepts engines (acceptPeers) and handles every message on
// this goroutine, with the address of the connection it came on.
func (s *Subscriber) runBound(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	msgs := make(chan peerMsg, 1024)
	accepted := make(chan struct{})
	go func() {
		defer close(accepted)
		s.acceptPeers(ctx, s.bound, msgs)
	}()
	defer func() { <-accepted }()
	defer cancel()
	defer s.Close()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-accepted:
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return errors.New("subscriber closed")
		case m := <-msgs:
			s.peer = m.peer
			s.handle(ctx, m.frames, false)
		}
	}
}

// replicaFor returns the sequence state for a message, nil when the message
// is dropped (the counter says why). A dialed endpoint is one engine
// whatever its topic says (SGLang changes the topic per epoch), so dial mode
// keeps one replica; bind mode tells engines apart by topic.
func (s *Subscriber) replicaFor(topic []byte) *replica {
	if !s.cfg.Bind {
		if s.single == nil {
			s.single = &replica{}
		}
		if s.single.topic != string(topic) {
			s.single.topic = string(topic)
		}
		return s.single
	}
	key := topic
	if s.cfg.TopicKey != nil {
		var ok bool
		if key, ok = s.cfg.TopicKey(topic); !ok {
			s.stats.UnknownTopics.Add(1)
			return nil
		}
	}
	if s.cfg.TopicFrom != nil && !s.cfg.TopicFrom(key, s.peer) {
		s.stats.ForgedTopics.Add(1)
		return nil
	}
	s.topicsMu.Lock()
	defer s.topicsMu.Unlock()
	if r, ok := s.replicas[string(key)]; ok {
		return r
	}
	if len(s.replicas) >= s.cfg.MaxReplicas {
		s.stats.DroppedReplicas.Add(1)
		return nil
	}
	r := &replica{topic: string(key)}
	s.replicas[r.topic] = r
	return r
}

func (s *Subscriber) handle(ctx context.Context, frames [][]byte, canReplay bool) {
	s.stats.Received.Add(1)
	topic, seq, payload, err := ParseMessage(frames)
	if err != nil {
		s.stats.DroppedFrames.Add(1)
		// Counted always; the production logger samples repeated lines.
		s.log.Warn("dropping malformed kv event message", zap.Error(err))
		return
	}
	rep := s.replicaFor(topic)
	if rep == nil {
		return
	}
	verdict := rep.seq.Live(seq)
	afterStart := rep.startCheck
	check := rep.verify || afterStart
	rep.startCheck = false
	if check && canReplay {
		rep.verify = false
		if verdict != SeqFirst && verdict != SeqRestart && !s.sameStream(ctx, rep) {
			s.reset(rep, fmt.Sprintf("live batch %d comes from a publisher without our last batch: engine restarted", seq))
			s.restartFrom(ctx, rep, seq, payload)
			return
		}
	}
	switch verdict {
	case SeqFirst:
		if afterStart && seq > 0 && canReplay {
			// The replay at start found nothing buffered, yet the stream
			// is past its first batch: the publisher dropped what it sent
			// before our subscription reached it. Fetch those batches as
			// for a run joined late.
			s.restartFrom(ctx, rep, seq, payload)
			return
		}
		s.apply(rep, seq, payload)
	case SeqNext:
		s.apply(rep, seq, payload)
	case SeqDuplicate:
		s.stats.DroppedDuplicate.Add(1)
	case SeqRestart:
		last, _ := rep.seq.Last()
		s.reset(rep, fmt.Sprintf("sequence went back from %d to %d: engine restarted", last, seq))
		s.restartFrom(ctx, rep, seq, payload)
	case SeqGap:
		s.stats.Gaps.Add(1)
		last, _ := rep.seq.Last()
		if canReplay && s.cfg.ReplayEndpoint != "" {
			err := s.replay(ctx, rep, last+1, seq)
			if err == nil {
				if applied, _ := rep.seq.Last(); applied < seq {
					s.apply(rep, seq, payload)
				}
				return
			}
			s.stats.ReplayFailures.Add(1)
			applied, _ := rep.seq.Last()
			s.reset(rep, fmt.Sprintf("gap after %d: replay failed: %v", applied, err))
		} else {
			s.reset(rep, fmt.Sprintf("gap: %d batches lost after %d, no replay", seq-last-1, last))
		}
		s.apply(rep, seq, payload)
	}
}

func (s *Subscriber) reset(rep *replica, reason string) {
	s.stats.Resets.Add(1)
	s.log.Info("kv event stream reset", zap.String("topic", rep.topic), zap.String("reason", reason))
	s.h.HandleReset(rep.topic, reason)
}

// restartFrom follows a run (a restarted engine's, or one joined after its
// first batches were dropped) from live batch seq. Batches the run
// published before seq are fetched by replay from its first one, so the
// replica is rebuilt whole; when replay cannot give them, the replica stays
// reset and is rebuilt from seq on.
func (s *Subscriber) restartFrom(ctx context.Context, rep *replica, seq uint64, payload []byte) {
	if seq > 0 && s.cfg.ReplayEndpoint != "" {
		rep.seq = SeqTracker{liveSeen: true, lastLive: seq} // a new run: nothing of it applied yet
		err := s.replay(ctx, rep, 0, seq)
		if err == nil {
			if applied, _ := rep.seq.Last(); applied < seq {
				s.apply(rep, seq, payload)
			}
			return
		}
		s.stats.ReplayFailures.Add(1)
		if _, started := rep.seq.Last(); started {
			// Part of the new run was applied: drop it rather than keep a
			// run with a hole.
			s.reset(rep, fmt.Sprintf("restarted engine's earlier batches: replay failed: %v", err))
		}
	}
	s.apply(rep, seq, payload)
}

// sameStream asks the replay endpoint for the last batch applied and says
// whether it is the one we applied: only then does the publisher found
// after a reconnect continue the stream we followed. Without replay, or
// when the batch is gone from the publisher's buffer, continuity cannot be
// shown, and the caller resets rather than guess.
func (s *Subscriber) sameStream(ctx context.Context, rep *replica) bool {
	last, ok := rep.seq.Last()
	if !ok {
		return true
	}
	if s.cfg.ReplayEndpoint == "" {
		return false
	}
	errFound := errors.New("found")
	err := s.replayStream(ctx, last, func(rr ReplayReply) error {
		if rr.Seq == last && PayloadSum(rr.Payload) == rep.lastSum {
			return errFound
		}
		return errRunChanged
	}, func() error { return errRunChanged })
	if !errors.Is(err, errFound) && !errors.Is(err, errRunChanged) {
		s.log.Info("cannot check the stream after a reconnect", zap.Error(err))
	}
	return errors.Is(err, errFound)
}

// apply decodes and delivers one batch. An undecodable batch loses its
// events, so the replica is reset and rebuilt from the next batch.
func (s *Subscriber) apply(rep *replica, seq uint64, payload []byte) {
	rep.seq.Applied(seq)
	rep.lastSum = PayloadSum(payload)
	if err := DecodeBatch(payload, &s.batch); err != nil {
		s.stats.DroppedDecode.Add(1)
		s.reset(rep, fmt.Sprintf("batch %d: %v", seq, err))
		return
	}
	if s.batch.Unknown > 0 {
		s.stats.UnknownEvents.Add(uint64(s.batch.Unknown))
	}
	s.stats.Applied.Add(1)
	s.h.HandleBatch(rep.topic, Position{Seq: seq, Sum: rep.lastSum}, &s.batch)
}

// replay asks the engine for every batch from start and applies those not
// yet applied, in order. It succeeds only if the batches are contiguous and
// reach at least until-1, so that the live batch until can follow.
func (s *Subscriber) replay(ctx context.Context, rep *replica, start, until uint64) error {
	s.stats.Replays.Add(1)
	err := s.replayStream(ctx, start, func(rr ReplayReply) error {
		if _, started := rep.seq.Last(); !started { // a new run, replayed from start
			if rr.Seq != start {
				return fmt.Errorf("replay starts at %d, need %d (buffer too short)", rr.Seq, start)
			}
			s.stats.ReplayedBatches.Add(1)
			s.apply(rep, rr.Seq, rr.Payload)
			return nil
		}
		if last, _ := rep.seq.Last(); rr.Seq > last+1 {
			return fmt.Errorf("replay starts at %d, need %d (buffer too short)", rr.Seq, last+1)
		}
		return s.applyReplayed(rep, rr)
	}, nil)
	if err != nil {
		return err
	}
	if last, started := rep.seq.Last(); !started || last+1 < until {
		return fmt.Errorf("replay ended at %d before %d", last, until-1)
	}
	return nil
}

// replayStream asks the replay endpoint for every buffered batch from start
// and calls each for them in order until the end marker, then end (when not
// nil). The first error from each or end stops it and is returned.
func (s *Subscriber) replayStream(ctx context.Context, start uint64, each func(ReplayReply) error, end func() error) error {
	rctx, cancel := context.WithTimeout(ctx, s.cfg.ReplayTimeout)
	defer cancel()
	dealer := zmq4.NewDealer(rctx, zmq4.WithDialerMaxRetries(0), zmq4.WithDialerTimeout(s.cfg.ReplayTimeout))
	defer dealer.Close()
	if err := dealer.Dial(s.cfg.ReplayEndpoint); err != nil {
		return fmt.Errorf("dial %s: %w", s.cfg.ReplayEndpoint, err)
	}
	if err := dealer.SendMulti(zmq4.NewMsgFrom(ReplayRequestFrames(start)...)); err != nil {
		return fmt.Errorf("send request: %w", err)
	}
	for {
		msg, err := dealer.Recv()
		if err != nil {
			if rctx.Err() != nil {
				err = rctx.Err()
			}
			return fmt.Errorf("receive: %w", err)
		}
		rr, err := ParseReplayReply(msg.Frames)
		if err != nil {
			return err
		}
		if rr.End {
			if end != nil {
				return end()
			}
			return nil
		}
		if err := each(rr); err != nil {
			return err
		}
	}
}

package kvevents

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"
	"go.uber.org/zap"

	"github.com/omnious/provider-node/internal/opt"
)

// PublisherConfig configures a Publisher. Zero values take the defaults
// stated per field, which are vLLM's.
type PublisherConfig struct {
	// Endpoint is the PUB endpoint, e.g. "tcp://127.0.0.1:5557" (port 0
	// picks a free port; see Publisher.Endpoint). Required.
	Endpoint string
	// Dial makes the PUB socket connect to Endpoint instead of binding it,
	// for subscribers in bind mode. As libzmq's connect, NewPublisher does
	// not wait for the subscriber: the publisher redials every
	// DialRetry until it is let in (and again after the subscriber
	// restarts), batches published meanwhile go nowhere but stay in the
	// replay buffer, one warning is logged per wait, and Close stops it.
	// Default false (bind).
	Dial bool
	// DialRetry is the pause between two dials in dial mode. Default
	// 100ms, libzmq's ZMQ_RECONNECT_IVL.
	DialRetry time.Duration
	// ReplayEndpoint is the ROUTER endpoint answering replay requests.
	// Default "" (replay disabled).
	ReplayEndpoint string
	// ReplayLayout is the reply layout. Default ReplayLayoutSeq.
	ReplayLayout ReplayLayout
	// Topic is the first frame of every message. Default "" (vLLM's).
	Topic string
	// Format is the event encoding. Default FormatArray.
	Format Format
	// HashEncoding is the block-hash encoding. Default HashUint64.
	HashEncoding HashEncoding
	// DPRank is sent in every batch unless OmitDPRank. Default 0.
	DPRank int
	// OmitDPRank sends nil as the rank. Default false (vLLM always sets it).
	OmitDPRank bool
	// BufferSteps is how many recent batches are kept for replay.
	// Default 10000 (vLLM's buffer_steps).
	BufferSteps int
	// HWM is the PUB queue bound; batches past it are dropped silently, as
	// ZMQ does. Default 100000.
	HWM int
	// Now stamps batches. Default time.Now.
	Now func() time.Time
}

const (
	defaultBufferSteps = 10000
	defaultHWM         = 100000
	defaultDialRetry   = 100 * time.Millisecond
	// dialWarnAfter is how long a first dial may take before the wait is
	// logged: a subscriber that is up connects at once.
	dialWarnAfter = time.Second
)

type bufferedBatch struct {
	seq     uint64
	payload []byte
}

// Publisher is a vLLM-compatible KV-event publisher: a ZMQ PUB socket plus an
// optional ROUTER answering replay requests from a ring of recent batches.
// It is safe for concurrent use.
type Publisher struct {
	cfg   PublisherConfig
	log   *zap.Logger
	topic []byte
	// pubEP and replayEP are the endpoints as bound (real ports), fixed at
	// creation so that a publisher back from Vanish binds the same ones.
	pubEP, replayEP string

	mu sync.Mutex
	// The sockets, their context and the replay goroutine's done channel
	// are replaced when the publisher comes back from Vanish.
	pub      zmq4.Socket
	router   zmq4.Socket
	cancel   context.CancelFunc
	done     chan struct{}
	closed   bool
	vanished bool        // sockets closed by Vanish: batches are buffered only
	back     *time.Timer // ends a Vanish
	seq      uint64
	drop     int
	ring     []bufferedBatch // circular, oldest at head once full
	head     int
}

// NewPublisher opens the PUB socket (and the ROUTER when replay is
// configured) and starts serving replay requests.
func NewPublisher(cfg PublisherConfig, log *zap.Logger) (*Publisher, error) {
	if cfg.Endpoint == "" {
		return nil, errors.New("cannot create publisher: empty endpoint")
	}
	if cfg.Format > FormatMapSGLang || cfg.HashEncoding > HashBytes || cfg.ReplayLayout > ReplayLayoutTopicSeq {
		return nil, errors.New("cannot create publisher: unknown format, hash encoding or replay layout")
	}
	if err := errors.Join(opt.DefaultNonNegative("BufferSteps", cfg.BufferSteps, defaultBufferSteps),
		opt.DefaultNonNegative("HWM", cfg.HWM, defaultHWM),
		opt.DefaultNonNegative("DialRetry", cfg.DialRetry, defaultDialRetry)); err != nil {
		return nil, fmt.Errorf("cannot create publisher: %w", err)
	}
	opt.Zero(&cfg.BufferSteps, defaultBufferSteps)
	opt.Zero(&cfg.HWM, defaultHWM)
	opt.Zero(&cfg.DialRetry, defaultDialRetry)
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if log == nil {
		log = zap.NewNop()
	}
	p := &Publisher{
		cfg:   cfg,
		log:   log,
		topic: []byte(cfg.Topic),
		ring:  make([]bufferedBatch, 0, min(cfg.BufferSteps, 1024)),
	}
	if err := p.openLocked(cfg.Endpoint, cfg.ReplayEndpoint); err != nil {
		return nil, err
	}
	p.pubEP = boundEndpoint(p.pub, cfg.Endpoint)
	if p.router != nil {
		p.replayEP = boundEndpoint(p.router, cfg.ReplayEndpoint)
	}
	return p, nil
}

// openLocked opens the PUB socket (and the ROUTER when replay is on) on
// the given endpoints and starts serving replay requests. On error
// nothing stays open. Called at creation and, with p.mu held, when the
// publisher comes back from Vanish.
func (p *Publisher) openLocked(endpoint, replayEndpoint string) error {
	ctx, cancel := context.WithCancel(context.Background())
	p.cancel, p.done, p.pub, p.router = cancel, make(chan struct{}), nil, nil
	var opts []zmq4.Option
	if p.cfg.Dial {
		// Like libzmq's connect: dial until let in, then follow the
		// subscriber across its restarts, at a bounded interval, until the
		// socket is closed (zmq4 checks its context between dials).
		opts = append(opts, zmq4.WithAutomaticReconnect(true),
			zmq4.WithDialerMaxRetries(-1), zmq4.WithDialerRetry(p.cfg.DialRetry))
	}
	p.pub = zmq4.NewPub(ctx, opts...)
	if err := p.pub.SetOption(zmq4.OptionHWM, p.cfg.HWM); err != nil {
		_ = p.closeSockets()
		close(p.done)
		return fmt.Errorf("cannot create publisher: set hwm: %w", err)
	}
	var err error
	if p.cfg.Dial {
		err = p.dial(ctx, endpoint)
	} else {
		err = p.pub.Listen(endpoint)
	}
	if err != nil {
		_ = p.closeSockets()
		close(p.done)
		return fmt.Errorf("cannot create publisher on %s: %w", endpoint, err)
	}
	if replayEndpoint == "" {
		close(p.done)
		return nil
	}
	p.router = zmq4.NewRouter(ctx)
	if err := p.router.Listen(replayEndpoint); err != nil {
		_ = p.closeSockets()
		close(p.done)
		return fmt.Errorf("cannot create publisher replay socket on %s: %w", replayEndpoint, err)
	}
	go p.serveReplay(ctx, p.router, p.done)
	return nil
}

// dial connects the PUB socket to endpoint in the background: zmq4's Dial
// blocks until the subscriber lets it in, as libzmq's connect would not.
// A malformed endpoint or an unknown transport fails here; a refused
// connection is redialled until the socket's context ends (Close), with
// one warning when the wait passes dialWarnAfter and one line when it
// ends (TestPublisherDialsBeforeSubscriberListens).
func (p *Publisher) dial(ctx context.Context, endpoint string) error {
	if _, _, err := splitEndpoint(endpoint); err != nil {
		return err
	}
	pub := p.pub
	dialed := make(chan error, 1)
	go func() { dialed <- pub.Dial(endpoint) }()
	go func() {
		warn := time.NewTimer(dialWarnAfter)
		defer warn.Stop()
		waited := false
		for {
			select {
			case err := <-dialed:
				switch {
				case ctx.Err() != nil:
				case err != nil:
					p.log.Error("KV-event publisher gave up dialing", zap.String("endpoint", endpoint), zap.Error(err))
				case waited:
					p.log.Info("KV-event publisher connected", zap.String("endpoint", endpoint))
				}
				return
			case <-warn.C:
				waited = true
				p.log.Warn("KV-event publisher cannot reach its subscriber yet: redialing; batches meanwhile are kept for replay only",
					zap.String("endpoint", endpoint), zap.Duration("every", p.cfg.DialRetry))
			}
		}
	}()
	return nil
}

// splitEndpoint checks a ZMQ endpoint's shape, transport://address, for
// the transports the publisher speaks.
func splitEndpoint(ep string) (transport, addr string, err error) {
	transport, addr, ok := strings.Cut(ep, "://")
	if !ok || addr == "" {
		return "", "", fmt.Errorf("bad ZMQ endpoint %q: want transport://address", ep)
	}
	switch transport {
	case "tcp", "ipc", "inproc":
		return transport, addr, nil
	}
	return "", "", fmt.Errorf("bad ZMQ endpoint %q: unknown transport %q", ep, transport)
}

// Endpoint returns the bound PUB endpoint with the real port, or the
// configured endpoint when dialing.
func (p *Publisher) Endpoint() string { return p.pubEP }

// ReplayEndpoint returns the bound ROUTER endpoint, or "" without replay.
func (p *Publisher) ReplayEndpoint() string { return p.replayEP }

func boundEndpoint(s zmq4.Socket, configured string) string {
	if a := s.Addr(); a != nil {
		return a.Network() + "://" + a.String()
	}
	return configured
}

// Publish sends events as one batch and returns its sequence number.
// Encoding happens before the lock; sequence assignment, buffering and the
// enqueue to the socket happen under it so that seq order is wire order.
func (p *Publisher) Publish(events []Event) (uint64, error) {
	b := Batch{TS: float64(p.cfg.Now().UnixNano()) / 1e9, Events: events, DPRank: p.cfg.DPRank, HasDPRank: !p.cfg.OmitDPRank}
	payload, err := AppendBatch(make([]byte, 0, 64+len(events)*64), &b, p.cfg.Format, p.cfg.HashEncoding)
	if err != nil {
		return 0, fmt.Errorf("cannot publish: %w", err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return 0, errors.New("cannot publish: publisher closed")
	}
	seq := p.seq
	p.seq++
	p.buffer(seq, payload)
	if p.drop > 0 {
		p.drop--
		return seq, nil
	}
	if p.vanished {
		return seq, nil
	}
	if err := p.pub.SendMulti(zmq4.NewMsgFrom(MessageFrames(p.topic, seq, payload)...)); err != nil {
		return seq, fmt.Errorf("cannot publish seq %d: %w", seq, err)
	}
	return seq, nil
}

func (p *Publisher) buffer(seq uint64, payload []byte) {
	if len(p.ring) < p.cfg.BufferSteps {
		p.ring = append(p.ring, bufferedBatch{seq, payload})
		return
	}
	p.ring[p.head] = bufferedBatch{seq, payload}
	p.head = (p.head + 1) % len(p.ring)
}

// DropNext makes the next n batches take a sequence number and enter the
// replay buffer without being sent: a gap a subscriber can fill by replay.
func (p *Publisher) DropNext(n int) {
	p.mu.Lock()
	p.drop += n
	p.mu.Unlock()
}

// Reset simulates an engine restart: the sequence restarts at 0 and the
// replay buffer is emptied.
func (p *Publisher) Reset() {
	p.mu.Lock()
	p.seq, p.drop, p.head = 0, 0, 0
	clear(p.ring)
	p.ring = p.ring[:0]
	p.mu.Unlock()
}

// Vanish closes the sockets for d, then binds them again on the same
// endpoints: a publisher that went away and came back with its engine
// still running (the network between them failed, the host paused).
// Batches published meanwhile take sequence numbers and enter the replay
// buffer unsent, so a subscriber sees a gap it can fill by replay once the
// publisher is back. Not available in dial mode.
func (p *Publisher) Vanish(d time.Duration) error {
	if p.cfg.Dial {
		return errors.New("cannot vanish a dialing publisher")
	}
	p.mu.Lock()
	if p.closed || p.vanished {
		p.mu.Unlock()
		return errors.New("publisher closed or already gone")
	}
	// Publish sends nothing from here on; the sockets are closed outside
	// the lock because the replay goroutine takes it to read the ring.
	p.vanished = true
	pub, router, cancel, done := p.pub, p.router, p.cancel, p.done
	p.mu.Unlock()
	err := closeSockets(cancel, pub, router)
	<-done
	p.mu.Lock()
	if !p.closed {
		p.back = time.AfterFunc(d, p.comeBack)
	}
	p.mu.Unlock()
	if err != nil {
		return fmt.Errorf("cannot vanish: %w", err)
	}
	return nil
}

// comeBack ends a Vanish. A failed re-bind (the port was taken meanwhile)
// leaves the publisher gone, as a process that cannot bind would be.
func (p *Publisher) comeBack() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || !p.vanished {
		return
	}
	if err := p.openLocked(p.pubEP, p.replayEP); err != nil {
		p.log.Error("publisher cannot come back", zap.Error(err))
		return
	}
	p.vanished, p.back = false, nil
	p.log.Info("publisher back", zap.String("endpoint", p.pubEP))
}

// Close stops replay service and closes the sockets.
func (p *Publisher) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	if p.back != nil {
		p.back.Stop()
	}
	if p.vanished {
		p.mu.Unlock()
		return nil // Vanish closed the sockets; comeBack sees closed
	}
	pub, router, cancel, done := p.pub, p.router, p.cancel, p.done
	p.mu.Unlock()
	// Outside the lock: the replay goroutine takes it to read the ring.
	err := closeSockets(cancel, pub, router)
	<-done
	return err
}

func (p *Publisher) closeSockets() error { return closeSockets(p.cancel, p.pub, p.router) }

func closeSockets(cancel context.CancelFunc, sockets ...zmq4.Socket) error {
	cancel()
	var errs []error
	for _, s := range sockets {
		// zmq4 reports connections it already tore down; that is not a failure.
		if s != nil {
			if err := s.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
				errs = append(errs, err)
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("cannot close publisher: %w", err)
	}
	return nil
}

// snapshot returns the buffered batches with seq >= start, oldest first.
func (p *Publisher) snapshot(start uint64) []bufferedBatch {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []bufferedBatch
	for i := range p.ring {
		bb := p.ring[(p.head+i)%len(p.ring)]
		if bb.seq >= start {
			out = append(out, bb)
		}
	}
	return out
}

func (p *Publisher) serveReplay(ctx context.Context, router zmq4.Socket, done chan struct{}) {
	defer close(done)
	for {
		msg, err := router.Recv()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			// A peer went away; the socket stays usable.
			p.log.Debug("replay receive failed", zap.Error(err))
			continue
		}
		id, start, err := ParseReplayRequest(msg.Frames)
		if err != nil {
			p.log.Warn("ignoring invalid replay request", zap.Error(err))
			continue
		}
		batches := p.snapshot(start)
		p.log.Debug("serving replay", zap.Uint64("start", start), zap.Int("batches", len(batches)))
		if err := p.reply(router, id, batches); err != nil {
			if ctx.Err() != nil {
				return
			}
			p.log.Warn("replay reply failed", zap.Uint64("start", start), zap.Error(err))
		}
	}
}

func (p *Publisher) reply(router zmq4.Socket, id []byte, batches []bufferedBatch) error {
	for _, bb := range batches {
		frames := append([][]byte{id}, ReplayReplyFrames(p.cfg.ReplayLayout, p.topic, bb.seq, bb.payload)...)
		if err := router.SendMulti(zmq4.NewMsgFrom(frames...)); err != nil {
			return err
		}
	}
	frames := append([][]byte{id}, ReplayEndFrames(p.cfg.ReplayLayout)...)
	return router.SendMulti(zmq4.NewMsgFrom(frames...))
}

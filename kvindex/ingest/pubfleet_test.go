package ingest

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/omnious/provider-node/engines/kvevents"
	"github.com/omnious/provider-node/kvindex"
)

// pubFleet is BenchmarkIngest's publishers: simulated engine ranks that
// each bind a loopback TCP port, speak ZMTP 3.0 as a PUB socket (NULL
// mechanism) to every zmq4 SUB that dials them, and publish a cycle of
// batches encoded once. A send patches the batch's sequence number and
// timestamp into its pre-encoded message and writes it to each subscriber
// with one system call; several engines share one goroutine. What the
// subscriber reads is byte for byte what a vLLM publisher sends (topic "",
// 8-byte sequence, msgpack EventBatch in the array format), so the
// receiver's cost is the EPP's while the publishers' stays small.
// TestPubFleetFeedsTheManager keeps the wire and the cycle right.
type pubFleet struct {
	pubs   []*zmtpPub
	period time.Duration

	mu   sync.Mutex
	sent uint64        // batches written to a subscriber
	late uint64        // sends more than lateAfter behind their schedule
	max  time.Duration // the largest delay behind schedule
}

// pubsPerGoroutine is how many engines one sending goroutine serves.
const pubsPerGoroutine = 64

// sendTick is how often a sending goroutine looks for batches due: the
// schedule's resolution.
const sendTick = time.Millisecond

// lateAfter is the delay behind schedule a send is counted late past.
const lateAfter = 10 * time.Millisecond

// zmtpPub is one engine rank's PUB socket.
type zmtpPub struct {
	ln   net.Listener
	msgs []pubMsg // the engine's cycle, played in a loop
	next int
	seq  uint64
	due  time.Time

	mu    sync.Mutex
	conns []net.Conn
}

// pubMsg is one pre-encoded message: the three ZMTP frames (topic, seq,
// payload) with their headers, and where the payload's timestamp sits.
type pubMsg struct {
	wire  []byte
	tsOff int
}

// seqOff is where the sequence number sits in every message: after the
// empty topic frame's header (2 bytes) and the seq frame's header (2).
const seqOff = 4

// newPubFleet binds n engines numbered from first on 127.0.0.1, each with
// its own blocks (engineCycle).
func newPubFleet(first, n int, rate float64) (*pubFleet, error) {
	if !(rate > 0) {
		return nil, fmt.Errorf("rate %v: want > 0", rate)
	}
	f := &pubFleet{period: time.Duration(float64(time.Second) / rate)}
	for i := range n {
		msgs, err := encodeCycle(engineCycle(uint64(first + i)))
		if err != nil {
			f.close()
			return nil, err
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			f.close()
			return nil, fmt.Errorf("cannot bind publisher %d: %w", i, err)
		}
		p := &zmtpPub{ln: ln, msgs: msgs}
		f.pubs = append(f.pubs, p)
		go p.accept()
	}
	return f, nil
}

// endpoints returns the engines' PUB endpoints, tcp://127.0.0.1:port.
func (f *pubFleet) endpoints() []string {
	eps := make([]string, len(f.pubs))
	for i, p := range f.pubs {
		eps[i] = "tcp://" + p.ln.Addr().String()
	}
	return eps
}

// run publishes until ctx ends, each engine once a period, their phases
// spread evenly over it.
func (f *pubFleet) run(ctx context.Context) {
	start := time.Now()
	for i, p := range f.pubs {
		p.due = start.Add(f.period * time.Duration(i) / time.Duration(len(f.pubs)))
	}
	var wg sync.WaitGroup
	for lo := 0; lo < len(f.pubs); lo += pubsPerGoroutine {
		group := f.pubs[lo:min(lo+pubsPerGoroutine, len(f.pubs))]
		wg.Add(1)
		go func() {
			defer wg.Done()
			f.send(ctx, group)
		}()
	}
	wg.Wait()
}

// send is one goroutine's loop over its engines: every tick, each engine
// publishes the batches due by then.
func (f *pubFleet) send(ctx context.Context, group []*zmtpPub) {
	tick := time.NewTicker(sendTick)
	defer tick.Stop()
	var sent, late uint64
	var worst time.Duration
	defer func() {
		f.mu.Lock()
		f.sent, f.late, f.max = f.sent+sent, f.late+late, max(f.max, worst)
		f.mu.Unlock()
	}()
	for {
		now := time.Now()
		for _, p := range group {
			for !p.due.After(now) {
				if d := now.Sub(p.due); d > lateAfter {
					late++
					worst = max(worst, d)
				}
				sent += uint64(p.publish(now))
				p.due = p.due.Add(f.period)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// stats returns what the fleet sent, once run has returned.
func (f *pubFleet) stats() (sent, late uint64, worst time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.sent, f.late, f.max
}

func (f *pubFleet) close() {
	for _, p := range f.pubs {
		_ = p.ln.Close()
		p.mu.Lock()
		for _, c := range p.conns {
			_ = c.Close()
		}
		p.conns = nil
		p.mu.Unlock()
	}
}

// publish stamps the engine's next batch with the next sequence number
// and now, and writes it to every subscriber; it returns to how many.
// As a PUB socket, it numbers the batch whether or not anyone listens.
func (p *zmtpPub) publish(now time.Time) int {
	m := &p.msgs[p.next]
	p.next = (p.next + 1) % len(p.msgs)
	binary.BigEndian.PutUint64(m.wire[seqOff:], p.seq)
	p.seq++
	binary.BigEndian.PutUint64(m.wire[m.tsOff:], math.Float64bits(float64(now.UnixNano())/1e9))
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for i := 0; i < len(p.conns); {
		if _, err := p.conns[i].Write(m.wire); err != nil {
			_ = p.conns[i].Close()
			p.conns = append(p.conns[:i], p.conns[i+1:]...)
			continue
		}
		n++
		i++
	}
	return n
}

// accept lets subscribers in until the listener closes.
func (p *zmtpPub) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		go func() {
			if err := zmtpPubHandshake(c); err != nil {
				_ = c.Close()
				return
			}
			p.mu.Lock()
			p.conns = append(p.conns, c)
			p.mu.Unlock()
			// What the subscriber sends from now on (its subscription) is
			// read and dropped: the fleet publishes every batch to every
			// subscriber, as a PUB socket does for the topic "".
			_, _ = io.Copy(io.Discard, c)
		}()
	}
}

// zmtpPubHandshake is a PUB socket's side of a ZMTP 3.0 handshake with the
// NULL mechanism: greeting and READY (Socket-Type PUB) sent, the peer's
// read and checked.
func zmtpPubHandshake(c net.Conn) error {
	if err := c.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
		return err
	}
	var g [64]byte
	g[0], g[9], g[10], g[11] = 0xff, 0x7f, 3, 0
	copy(g[12:32], "NULL")
	out := append(g[:0:0], g[:]...)
	out = append(out, zmtpCommand("READY", "Socket-Type", "PUB")...)
	if _, err := c.Write(out); err != nil {
		return fmt.Errorf("cannot send the ZMTP greeting: %w", err)
	}
	r := c // read unbuffered: the subscription may follow in the same segment
	var peer [64]byte
	if _, err := io.ReadFull(r, peer[:]); err != nil {
		return fmt.Errorf("cannot read the peer's greeting: %w", err)
	}
	if peer[0] != 0xff || peer[9] != 0x7f || peer[10] < 3 || string(peer[12:16]) != "NULL" {
		return errors.New("the peer's greeting is not ZMTP 3 with the NULL mechanism")
	}
	var h [2]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return fmt.Errorf("cannot read the peer's READY: %w", err)
	}
	if h[0] != 0x04 { // a short command
		return fmt.Errorf("the peer's READY has flags %#x", h[0])
	}
	body := make([]byte, h[1])
	if _, err := io.ReadFull(r, body); err != nil {
		return fmt.Errorf("cannot read the peer's READY: %w", err)
	}
	if len(body) < 6 || string(body[:6]) != "\x05READY" {
		return errors.New("the peer's first command is not READY")
	}
	return c.SetDeadline(time.Time{})
}

// zmtpCommand encodes a short ZMTP command with one property.
func zmtpCommand(name, key, value string) []byte {
	body := append([]byte{byte(len(name))}, name...)
	body = append(body, byte(len(key)))
	body = append(body, key...)
	body = binary.BigEndian.AppendUint32(body, uint32(len(value)))
	body = append(body, value...)
	return append([]byte{0x04, byte(len(body))}, body...)
}

// engineCycle is one engine rank's batches for two lifetimes of its
// requests, to be played in a loop: every step each of its slots requests
// stores one benchBlock-token block chained to that request's previous
// one; after chainLimit blocks a request ends, frees them all, and the
// next starts. The first half's requests run chains "A", the second half's
// chains "B", and the first step of each half frees the other half's
// chains, so a loop stores and frees blocks at the same rate and (after
// the first lap) frees only blocks it stored. The first block of every
// request has one of systemPrompts token contents that every engine
// shares (one index key held by every replica, as a system prompt); every
// other block, its hash and its tokens, is this engine's own.
func engineCycle(engine uint64) [][]kvevents.Event {
	id := func(slot, half, pos int) uint64 {
		return 1<<63 | engine<<32 | uint64(slot)<<16 | uint64(half)<<8 | uint64(pos)
	}
	hash := func(slot, half, pos int) uint64 { return mix64(id(slot, half, pos)) | 1 }
	steps := make([][]kvevents.Event, 0, 2*chainLimit)
	for s := range 2 * chainLimit {
		half, pos := s/chainLimit, s%chainLimit
		var evs []kvevents.Event
		for slot := range slots {
			if pos == 0 {
				freed := make([]uint64, chainLimit)
				for p := range freed {
					freed[p] = hash(slot, 1-half, p)
				}
				evs = append(evs, kvevents.Event{Kind: kvevents.KindBlockRemoved, BlockHashes: freed, Medium: "GPU"})
			}
			content := id(slot, half, pos)
			if pos == 0 {
				content = uint64(slot+half) % systemPrompts
			}
			toks := make([]uint32, benchBlock)
			for j := range toks {
				toks[j] = uint32(mix64(content*benchBlock+uint64(j)) % 151936)
			}
			ev := kvevents.Event{Kind: kvevents.KindBlockStored, BlockHashes: []uint64{hash(slot, half, pos)}, TokenIDs: toks,
				BlockSize: benchBlock, Medium: "GPU"}
			if pos > 0 {
				ev.ParentHash, ev.HasParent = hash(slot, half, pos-1), true
			}
			evs = append(evs, ev)
		}
		steps = append(steps, evs)
	}
	return steps
}

// encodeCycle encodes each step as vLLM publishes it (array format, uint64
// hashes, dp_rank 0) inside its three ZMTP frames.
func encodeCycle(steps [][]kvevents.Event) ([]pubMsg, error) {
	msgs := make([]pubMsg, len(steps))
	for i, evs := range steps {
		payload, err := kvevents.AppendBatch(nil, &kvevents.Batch{TS: 1, Events: evs, HasDPRank: true},
			kvevents.FormatArray, kvevents.HashUint64)
		if err != nil {
			return nil, err
		}
		// [ts, events, dp_rank]: a 3-array, then ts as a float64.
		if payload[0] != 0x93 || payload[1] != 0xcb {
			return nil, fmt.Errorf("step %d: the batch does not start with a float64 timestamp", i)
		}
		wire := []byte{0x01, 0x00, 0x01, kvevents.SeqLen}
		wire = append(wire, make([]byte, kvevents.SeqLen)...)
		if len(payload) <= math.MaxUint8 {
			wire = append(wire, 0x00, byte(len(payload)))
		} else {
			wire = binary.BigEndian.AppendUint64(append(wire, 0x02), uint64(len(payload)))
		}
		msgs[i] = pubMsg{wire: append(wire, payload...), tsOff: len(wire) + 2}
	}
	return msgs, nil
}

// TestPubFleetFeedsTheManager runs a small fleet in this process with the
// manager subscribed as the EPP subscribes: every batch arrives in order,
// decodes, carries the time it was sent, and the cycle frees only blocks
// it stored once its first lap (which frees the other half's chains,
// never stored) is done.
func TestPubFleetFeedsTheManager(t *testing.T) {
	const engines, rate, laps = 4, 400.0, 3
	fleet, err := newPubFleet(0, engines, rate)
	require.NoError(t, err)
	defer fleet.close()
	m, err := New(Config{}, benchBlock, kvindex.New(kvindex.Config{}), zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)))
	require.NoError(t, err)
	defer m.Close()
	rec := &lagRecorder{Histogram: m.lag}
	m.lag = rec
	srcs := make([]Source, engines)
	for i, ep := range fleet.endpoints() {
		srcs[i] = Source{Replica: kvindex.Replica(i + 1), Name: fmt.Sprintf("10.0.0.%d:8000", i), Model: model, Endpoint: ep}
	}
	m.Set(srcs)
	// Publish from sequence 0 once every subscriber is in, so that each
	// replica sees the cycle from its start.
	require.Eventually(t, func() bool {
		for _, p := range fleet.pubs {
			p.mu.Lock()
			n := len(p.conns)
			p.mu.Unlock()
			if n != 1 {
				return false
			}
		}
		return true
	}, 10*time.Second, 5*time.Millisecond)
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() { defer close(ran); fleet.run(ctx) }()
	defer func() { cancel(); <-ran }()
	lap := uint64(2 * chainLimit)
	require.Eventually(t, func() bool {
		for _, f := range m.running {
			if f.sub.Stats().Applied.Load() < laps*lap {
				return false
			}
		}
		return true
	}, 30*time.Second, 10*time.Millisecond)
	for _, f := range m.running {
		s := f.sub.Stats()
		require.Zero(t, s.Gaps.Load(), f.src.Name)
		require.Zero(t, s.Resets.Load(), f.src.Name)
		require.Zero(t, s.DroppedDecode.Load()+s.DroppedFrames.Load()+s.DroppedDuplicate.Load()+s.UnknownEvents.Load(), f.src.Name)
		f.mu.Lock()
		st := f.stats
		f.mu.Unlock()
		// Those of the first removal before the replica's first store count
		// as ignored (no KV group known yet), the others as unknown.
		require.Equal(t, uint64(slots*chainLimit), st.UnknownRemoved+st.IgnoredBlocks, "only the first lap frees blocks never stored")
		require.Zero(t, st.SkippedBlocks+st.UnknownParent+st.Malformed, f.src.Name)
		require.LessOrEqual(t, st.Blocks, slots*chainLimit, "the cycle frees what it stores")
		require.GreaterOrEqual(t, st.RemovedBlocks, uint64(slots*chainLimit), "the second lap frees the first's chains")
	}
	rec.mu.Lock()
	lags := slices.Clone(rec.lags)
	rec.mu.Unlock()
	require.NotEmpty(t, lags)
	slices.Sort(lags)
	// Each batch carries the time it was sent: a timestamp left as encoded
	// would read as decades of lag.
	require.Less(t, lags[len(lags)/2], 5.0)
}

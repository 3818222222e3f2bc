package kvevents

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/omnious/provider-node/internal/testutil/freeport"
)

type seen struct {
	topic  string
	seq    uint64
	hashes []uint64 // first hash of every event
}

// recorder is a Handler that copies what it is given.
type recorder struct {
	mu        sync.Mutex
	batches   []seen
	positions []Position // of batches, in the same order
	resets    []string
}

func (r *recorder) HandleBatch(topic string, pos Position, b *Batch) {
	s := seen{topic: topic, seq: pos.Seq}
	for _, ev := range b.Events {
		s.hashes = append(s.hashes, ev.BlockHashes[0])
	}
	r.mu.Lock()
	r.batches = append(r.batches, s)
	r.positions = append(r.positions, pos)
	r.mu.Unlock()
}

// position returns the position of the last batch seq delivered.
func (r *recorder) position(t *testing.T, seq uint64) Position {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := len(r.positions) - 1; i >= 0; i-- {
		if r.positions[i].Seq == seq {
			return r.positions[i]
		}
	}
	t.Fatalf("seq %d never delivered", seq)
	return Position{}
}

func (r *recorder) HandleReset(topic, reason string) {
	r.mu.Lock()
	r.resets = append(r.resets, topic+": "+reason)
	r.mu.Unlock()
}

func (r *recorder) snapshot() ([]seen, []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]seen(nil), r.batches...), append([]string(nil), r.resets...)
}

// waitSeq waits until the recorder saw seq on topic.
func (r *recorder) waitSeq(t *testing.T, topic string, seq uint64) {
	t.Helper()
	require.Eventually(t, func() bool {
		bs, _ := r.snapshot()
		for _, b := range bs {
			if b.topic == topic && b.seq == seq {
				return true
			}
		}
		return false
	}, 10*time.Second, 5*time.Millisecond, "seq %d on %q never arrived", seq, topic)
}

// hashFor gives each published batch a distinct, checkable block hash.
func hashFor(tag, i int) uint64 { return splitmix64(uint64(tag)<<32 | uint64(i)) }

func storedEvent(h uint64) []Event {
	return []Event{{Kind: KindBlockStored, BlockHashes: []uint64{h}, TokenIDs: []uint32{1, 2}, BlockSize: 2, Medium: "GPU"}}
}

// connect publishes probe batches until the subscriber receives one, which
// becomes its baseline, and returns the last probe seq.
func connect(t *testing.T, p *Publisher, rec *recorder, topic string) uint64 {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	// A first arrival may come from the replay at start, which says nothing
	// of the live subscription; a probe published after it can only come
	// live, and once it has, the first live batch has been checked.
	var after uint64
	arrived := false
	for {
		seq, err := p.Publish(storedEvent(hashFor(0, 0)))
		require.NoError(t, err)
		time.Sleep(20 * time.Millisecond)
		bs, _ := rec.snapshot()
		for _, b := range bs {
			if b.topic != topic {
				continue
			}
			if arrived && b.seq >= after {
				// Once one probe arrived live the later ones will: wait for
				// the last so none lands among the test's own batches.
				rec.waitSeq(t, topic, seq)
				return seq
			}
			if !arrived {
				arrived, after = true, seq+1
			}
		}
		require.True(t, time.Now().Before(deadline), "subscriber never connected")
	}
}

func startSubscriber(t *testing.T, cfg SubscriberConfig, rec Handler) *Subscriber {
	t.Helper()
	s, err := NewSubscriber(cfg, rec, zaptest.NewLogger(t))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			require.ErrorIs(t, err, context.Canceled)
		case <-time.After(5 * time.Second):
			t.Error("subscriber did not stop")
		}
	})
	return s
}

func startPublisher(t *testing.T, cfg PublisherConfig) *Publisher {
	t.Helper()
	p, err := NewPublisher(cfg, zaptest.NewLogger(t))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, p.Close()) })
	return p
}

// requireContiguous checks that topic's batches ("*": every topic's) run
// from..to without holes or repeats and carry the hashes published for them.
func requireContiguous(t *testing.T, bs []seen, topic string, from, to uint64, want map[uint64]uint64) {
	t.Helper()
	next := from
	for _, b := range bs {
		if (topic != "*" && b.topic != topic) || b.seq < from {
			continue
		}
		require.Equal(t, next, b.seq, "batches out of order or missing")
		if h, ok := want[b.seq]; ok {
			require.Equal(t, []uint64{h}, b.hashes, "seq %d", b.seq)
		}
		next++
	}
	require.Equal(t, to+1, next, "last batch")
}

func TestGapFilledByReplay(t *testing.T) {
	tests := []struct {
		name   string
		format Format
		hash   HashEncoding
		layout ReplayLayout
	}{
		{"vLLM 0.26 map bytes topic-seq", FormatMap, HashBytes, ReplayLayoutTopicSeq},
		{"vLLM legacy array uint64 seq", FormatArray, HashUint64, ReplayLayoutSeq},
		{"SGLang array int64 seq", FormatArraySGLang, HashInt64, ReplayLayoutSeq},
		{"SGLang 0.5.23 map int64 topic-seq", FormatMapSGLang, HashInt64, ReplayLayoutTopicSeq},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := startPublisher(t, PublisherConfig{
				Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0", ReplayLayout: tt.layout,
				Topic: "kv-events", Format: tt.format, HashEncoding: tt.hash,
			})
			rec := &recorder{}
			s := startSubscriber(t, SubscriberConfig{Endpoint: p.Endpoint(), ReplayEndpoint: p.ReplayEndpoint(), Topic: "kv"}, rec)
			base := connect(t, p, rec, "kv-events")

			want := map[uint64]uint64{}
			var last uint64
			for i := 1; i <= 10; i++ {
				if i == 4 {
					p.DropNext(3)
				}
				h := hashFor(1, i)
				seq, err := p.Publish(storedEvent(h))
				require.NoError(t, err)
				want[seq], last = h, seq
			}
			rec.waitSeq(t, "kv-events", last)
			bs, resets := rec.snapshot()
			require.Empty(t, resets)
			requireContiguous(t, bs, "kv-events", base+1, last, want)
			require.Equal(t, uint64(1), s.Stats().Gaps.Load())
			require.Equal(t, uint64(1), s.Stats().Replays.Load())
			require.Zero(t, s.Stats().ReplayFailures.Load())
			require.GreaterOrEqual(t, s.Stats().ReplayedBatches.Load(), uint64(3))
		})
	}
}

// An engine that restarts after the replay at start, its new run's first
// batches lost before the live subscription joined, may go on with sequence
// numbers that follow the replayed ones: the first live batch is checked,
// not taken as their successor.
func TestRestartBeforeFirstLiveBatchResets(t *testing.T) {
	p := startPublisher(t, PublisherConfig{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0"})
	for i := 0; i < 3; i++ {
		_, err := p.Publish(storedEvent(hashFor(5, i)))
		require.NoError(t, err)
	}
	rec := &recorder{}
	s := startSubscriber(t, SubscriberConfig{Endpoint: p.Endpoint(), ReplayEndpoint: p.ReplayEndpoint()}, rec)
	rec.waitSeq(t, "", 2) // replayed: nothing was published since it started
	p.Reset()
	p.DropNext(3)
	want := map[uint64]uint64{}
	publish := func() uint64 {
		h := hashFor(6, len(want))
		seq, err := p.Publish(storedEvent(h))
		require.NoError(t, err)
		want[seq] = h
		return seq
	}
	for range 3 {
		publish()
	}
	// Live batches of the new run until one arrives: the subscription may
	// still be joining.
	require.Eventually(t, func() bool {
		publish()
		time.Sleep(20 * time.Millisecond)
		_, resets := rec.snapshot()
		return len(resets) > 0
	}, 10*time.Second, time.Millisecond)
	last := publish()
	rec.waitSeq(t, "", last)
	bs, resets := rec.snapshot()
	require.Len(t, resets, 1)
	require.Contains(t, resets[0], "without our last batch")
	require.Equal(t, uint64(1), s.Stats().Resets.Load())
	for i, b := range bs[len(bs)-int(last+1):] {
		require.Equal(t, seen{"", uint64(i), []uint64{want[uint64(i)]}}, b, "the new run rebuilt whole, in order")
	}
}

func TestGapWithoutReplayResets(t *testing.T) {
	tests := []struct {
		name        string
		pcfg        PublisherConfig
		replay      bool
		resetReason string
	}{
		{"replay disabled", PublisherConfig{}, false, "no replay"},
		{"replay buffer too short", PublisherConfig{ReplayEndpoint: "tcp://127.0.0.1:0", BufferSteps: 2}, true, "buffer too short"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := tt.pcfg
			cfg.Endpoint = "tcp://127.0.0.1:0"
			p := startPublisher(t, cfg)
			rec := &recorder{}
			scfg := SubscriberConfig{Endpoint: p.Endpoint()}
			if tt.replay {
				scfg.ReplayEndpoint = p.ReplayEndpoint()
			}
			s := startSubscriber(t, scfg, rec)
			base := connect(t, p, rec, "")

			p.DropNext(5)
			var last uint64
			for i := 1; i <= 8; i++ {
				seq, err := p.Publish(storedEvent(hashFor(2, i)))
				require.NoError(t, err)
				last = seq
			}
			rec.waitSeq(t, "", last)
			bs, resets := rec.snapshot()
			require.Len(t, resets, 1)
			require.Contains(t, resets[0], tt.resetReason)
			// After the reset the stream restarts at the first live batch.
			requireContiguous(t, bs, "", base+6, last, nil)
			for _, b := range bs {
				require.False(t, b.seq > base && b.seq <= base+5, "dropped seq %d delivered", b.seq)
			}
			require.Equal(t, uint64(1), s.Stats().Resets.Load())
			require.Equal(t, uint64(1), s.Stats().Gaps.Load())
		})
	}
}

func TestRestartResets(t *testing.T) {
	p := startPublisher(t, PublisherConfig{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0"})
	rec := &recorder{}
	s := startSubscriber(t, SubscriberConfig{Endpoint: p.Endpoint(), ReplayEndpoint: p.ReplayEndpoint()}, rec)
	connect(t, p, rec, "")
	for i := 0; i < 3; i++ {
		_, err := p.Publish(storedEvent(hashFor(3, i)))
		require.NoError(t, err)
	}
	p.Reset()
	want := map[uint64]uint64{}
	var last uint64
	for i := 0; i < 3; i++ {
		h := hashFor(4, i)
		seq, err := p.Publish(storedEvent(h))
		require.NoError(t, err)
		want[seq], last = h, seq
	}
	require.Equal(t, uint64(2), last)
	require.Eventually(t, func() bool {
		bs, _ := rec.snapshot()
		return len(bs) > 0 && bs[len(bs)-1].seq == last && bs[len(bs)-1].hashes[0] == want[last]
	}, 10*time.Second, 5*time.Millisecond)
	bs, resets := rec.snapshot()
	require.Len(t, resets, 1)
	require.Contains(t, resets[0], "engine restarted")
	require.Equal(t, []seen{{"", 0, []uint64{want[0]}}, {"", 1, []uint64{want[1]}}, {"", 2, []uint64{want[2]}}}, bs[len(bs)-3:])
	require.Equal(t, uint64(1), s.Stats().Resets.Load())
}

func TestReconnectAfterPublisherStarts(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ep := "tcp://" + l.Addr().String()
	require.NoError(t, l.Close())

	rec := &recorder{}
	s := startSubscriber(t, SubscriberConfig{Endpoint: ep, MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond}, rec)
	require.Eventually(t, func() bool { return s.Stats().Reconnects.Load() >= 2 }, 5*time.Second, 5*time.Millisecond)

	p := startPublisher(t, PublisherConfig{Endpoint: ep})
	connect(t, p, rec, "")
	_, resets := rec.snapshot()
	require.Empty(t, resets)
}

func TestPublisherRestartOnSamePort(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ep := "tcp://" + l.Addr().String()
	require.NoError(t, l.Close())

	p1, err := NewPublisher(PublisherConfig{Endpoint: ep}, zaptest.NewLogger(t))
	require.NoError(t, err)
	rec := &recorder{}
	s := startSubscriber(t, SubscriberConfig{Endpoint: ep, MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond}, rec)
	connect(t, p1, rec, "")
	require.NoError(t, p1.Close())

	p2 := startPublisher(t, PublisherConfig{Endpoint: ep})
	marker := hashFor(6, 0)
	require.Eventually(t, func() bool {
		if _, err := p2.Publish(storedEvent(marker)); err != nil {
			return false
		}
		bs, _ := rec.snapshot()
		return len(bs) > 0 && bs[len(bs)-1].hashes[0] == marker
	}, 10*time.Second, 20*time.Millisecond, "no batch from the restarted publisher")
	_, resets := rec.snapshot()
	require.Len(t, resets, 1)
	require.Contains(t, resets[0], "engine restarted")
	require.GreaterOrEqual(t, s.Stats().Reconnects.Load(), uint64(1))
}

func TestBindModeTracksReplicas(t *testing.T) {
	rec := &recorder{}
	s := startSubscriber(t, SubscriberConfig{Endpoint: "tcp://127.0.0.1:0", Bind: true, Topic: "kv@"}, rec)
	topics := []string{"kv@10.0.0.1:8000@m", "kv@10.0.0.2:8000@m"}
	pubs := make([]*Publisher, len(topics))
	for i, topic := range topics {
		pubs[i] = startPublisher(t, PublisherConfig{Endpoint: s.Endpoint(), Dial: true, Topic: topic, Format: FormatMap})
	}
	for i, topic := range topics {
		connect(t, pubs[i], rec, topic)
	}
	// A restart of one replica resets only that replica.
	pubs[0].Reset()
	seq0, err := pubs[0].Publish(storedEvent(hashFor(5, 0)))
	require.NoError(t, err)
	seq1, err := pubs[1].Publish(storedEvent(hashFor(5, 1)))
	require.NoError(t, err)
	rec.waitSeq(t, topics[1], seq1)
	require.Eventually(t, func() bool {
		_, resets := rec.snapshot()
		return len(resets) == 1
	}, 10*time.Second, 5*time.Millisecond)
	rec.waitSeq(t, topics[0], seq0)
	_, resets := rec.snapshot()
	require.True(t, strings.HasPrefix(resets[0], topics[0]+": "), resets[0])
	require.Contains(t, resets[0], "engine restarted")
	require.Equal(t, uint64(1), s.Stats().Resets.Load())
}

func TestSeqTracker(t *testing.T) {
	var tr SeqTracker
	steps := []struct {
		seq     uint64
		verdict SeqVerdict
		apply   []uint64 // what the caller applies after the verdict
	}{
		{5, SeqFirst, []uint64{5}},
		{6, SeqNext, []uint64{6}},
		{9, SeqGap, []uint64{7, 8, 9, 10}}, // replay ran past the live batch
		{10, SeqDuplicate, nil},
		{11, SeqNext, []uint64{11}},
		{11, SeqRestart, []uint64{11}},
		{0, SeqRestart, []uint64{0}},
		{1, SeqNext, []uint64{1}},
	}
	for i, st := range steps {
		require.Equal(t, st.verdict, tr.Live(st.seq), "step %d", i)
		for _, a := range st.apply {
			tr.Applied(a)
		}
	}
	last, ok := tr.Last()
	require.True(t, ok)
	require.Equal(t, uint64(1), last)
}

func TestConfigErrors(t *testing.T) {
	_, err := NewPublisher(PublisherConfig{}, nil)
	require.ErrorContains(t, err, "empty endpoint")
	_, err = NewPublisher(PublisherConfig{Endpoint: "bogus://x"}, nil)
	require.ErrorContains(t, err, "cannot create publisher")
	_, err = NewSubscriber(SubscriberConfig{}, &recorder{}, nil)
	require.ErrorContains(t, err, "empty endpoint")
	_, err = NewSubscriber(SubscriberConfig{Endpoint: "tcp://127.0.0.1:1"}, nil, nil)
	require.ErrorContains(t, err, "nil handler")

	p, err := NewPublisher(PublisherConfig{Endpoint: "tcp://127.0.0.1:0"}, nil)
	require.NoError(t, err)
	require.NoError(t, p.Close())
	require.NoError(t, p.Close())
	_, err = p.Publish(storedEvent(1))
	require.ErrorContains(t, err, "closed")
}

// TestPublisherVanishes checks that a publisher that goes away and comes
// back on the same ports leaves a gap the subscriber fills by replay: the
// engine kept running, so nothing is reset and nothing is lost.
func TestPublisherVanishes(t *testing.T) {
	p := startPublisher(t, PublisherConfig{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0"})
	rec := &recorder{}
	s := startSubscriber(t, SubscriberConfig{Endpoint: p.Endpoint(), ReplayEndpoint: p.ReplayEndpoint(),
		MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond}, rec)
	base := connect(t, p, rec, "")
	endpoint := p.Endpoint()

	require.NoError(t, p.Vanish(300*time.Millisecond))
	require.Error(t, p.Vanish(time.Second), "already gone")
	want := map[uint64]uint64{}
	for i := 1; i <= 3; i++ { // published while gone: buffered, not sent
		h := hashFor(2, i)
		seq, err := p.Publish(storedEvent(h))
		require.NoError(t, err)
		want[seq] = h
	}
	require.Equal(t, endpoint, p.Endpoint(), "the endpoint does not change")
	// Once back (and the subscriber has reconnected), a live batch reveals
	// the gap; publish until one arrives.
	var last uint64
	require.Eventually(t, func() bool {
		h := hashFor(3, int(last))
		seq, err := p.Publish(storedEvent(h))
		require.NoError(t, err)
		want[seq], last = h, seq
		time.Sleep(20 * time.Millisecond)
		bs, _ := rec.snapshot()
		return len(bs) > 0 && bs[len(bs)-1].seq > base+3
	}, 10*time.Second, 5*time.Millisecond, "no batch after the publisher came back")
	rec.waitSeq(t, "", last)
	bs, resets := rec.snapshot()
	require.Empty(t, resets, "a vanished publisher is not an engine restart")
	requireContiguous(t, bs, "", base+1, last, want)
	require.GreaterOrEqual(t, s.Stats().Replays.Load(), uint64(1))
	require.GreaterOrEqual(t, s.Stats().Reconnects.Load(), uint64(1))
}

// TestRestartPastOurSequenceResets covers an engine that restarted while
// the subscriber was disconnected and published more batches than the
// subscriber had seen before it reconnected: its sequence looks like a
// continuation (or a gap replay could "fill" from the new engine's
// buffer), so only the replayed last batch tells the streams apart.
func TestRestartPastOurSequenceResets(t *testing.T) {
	taken, err := freeport.Take(2)
	require.NoError(t, err)
	ports := make([]string, 2)
	for i, p := range taken {
		ports[i] = fmt.Sprintf("tcp://127.0.0.1:%d", p)
	}
	cfg := PublisherConfig{Endpoint: ports[0], ReplayEndpoint: ports[1]}
	p1, err := NewPublisher(cfg, zaptest.NewLogger(t))
	require.NoError(t, err)
	rec := &recorder{}
	startSubscriber(t, SubscriberConfig{Endpoint: ports[0], ReplayEndpoint: ports[1],
		MinBackoff: 500 * time.Millisecond, MaxBackoff: 500 * time.Millisecond}, rec)
	base := connect(t, p1, rec, "")
	require.NoError(t, p1.Close())

	// The restarted engine runs ahead of base while nobody listens.
	p2 := startPublisher(t, cfg)
	early := map[uint64]bool{}
	for i := uint64(0); i <= base+5; i++ {
		h := hashFor(7, int(i))
		_, err := p2.Publish(storedEvent(h))
		require.NoError(t, err)
		early[h] = true
	}
	marker := hashFor(8, 0)
	require.Eventually(t, func() bool {
		_, err := p2.Publish(storedEvent(marker))
		require.NoError(t, err)
		bs, _ := rec.snapshot()
		return len(bs) > 0 && bs[len(bs)-1].hashes[0] == marker
	}, 10*time.Second, 20*time.Millisecond, "no batch from the restarted publisher")
	_, resets := rec.snapshot()
	require.Len(t, resets, 1, "the restarted engine's stream is not spliced onto the old one")
	require.Contains(t, resets[0], "engine restarted")
	// What the new run published before the subscriber was back is
	// replayed from its first batch: the replica is rebuilt whole.
	bs, _ := rec.snapshot()
	for _, b := range bs {
		delete(early, b.hashes[0])
	}
	require.Empty(t, early, "batches of the new run missed while reconnecting")
}

// publishN publishes n batches tagged tag and returns their hashes by seq.
func publishN(t *testing.T, p *Publisher, tag, n int) map[uint64]uint64 {
	t.Helper()
	want := map[uint64]uint64{}
	for i := 0; i < n; i++ {
		h := hashFor(tag, i)
		seq, err := p.Publish(storedEvent(h))
		require.NoError(t, err)
		want[seq] = h
	}
	return want
}

// TestStartReplaysBuffer: a subscriber started after the engine published
// gets every buffered batch at once, from the oldest, before any live one.
func TestStartReplaysBuffer(t *testing.T) {
	tests := []struct {
		name   string
		buffer int
		from   uint64 // oldest batch the buffer still holds
	}{
		{"buffer holds the whole run", 0, 0},
		{"buffer holds the newest batches only", 4, 6},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := startPublisher(t, PublisherConfig{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0", BufferSteps: tt.buffer})
			want := publishN(t, p, 9, 10)
			rec := &recorder{}
			s := startSubscriber(t, SubscriberConfig{Endpoint: p.Endpoint(), ReplayEndpoint: p.ReplayEndpoint()}, rec)
			rec.waitSeq(t, "", 9)
			bs, resets := rec.snapshot()
			require.Empty(t, resets)
			requireContiguous(t, bs, "", tt.from, 9, want)
			require.Equal(t, tt.from, bs[0].seq, "the oldest buffered batch is the baseline")
			require.Equal(t, uint64(1), s.Stats().StartReplays.Load())
			require.Zero(t, s.Stats().Replays.Load(), "no gap")

			// Live batches follow the replayed ones.
			for {
				seq, err := p.Publish(storedEvent(hashFor(10, 0)))
				require.NoError(t, err)
				time.Sleep(10 * time.Millisecond)
				if bs, _ := rec.snapshot(); bs[len(bs)-1].seq == seq {
					break
				}
			}
			bs, resets = rec.snapshot()
			require.Empty(t, resets)
			requireContiguous(t, bs, "", tt.from, bs[len(bs)-1].seq, want)
		})
	}
}

// TestResume: a subscriber given the position of a batch it (or a sibling)
// already applied continues after it when the engine's buffer holds that
// very batch, and resets otherwise: the engine restarted since (a shorter
// or a longer new run), the buffer moved past the batch, the engine cannot
// be reached.
func TestResume(t *testing.T) {
	tests := []struct {
		name string
		// after runs once the position of batch 5 of the first run is
		// known; it returns the hashes the resumed subscriber must get.
		buffer  int
		after   func(t *testing.T, p *Publisher) map[uint64]uint64
		reset   string // "" = resumed
		from    uint64 // first batch the resumed subscriber gets
		to      uint64
		unreach bool
	}{
		{name: "same run", after: func(t *testing.T, p *Publisher) map[uint64]uint64 {
			return publishN(t, p, 11, 3) // 10..12 follow 0..9
		}, from: 6, to: 12},
		{name: "engine restarted, shorter run", after: func(t *testing.T, p *Publisher) map[uint64]uint64 {
			p.Reset()
			return publishN(t, p, 12, 3)
		}, reset: "buffer holds nothing from 5", from: 0, to: 2},
		{name: "engine restarted, run past the position", after: func(t *testing.T, p *Publisher) map[uint64]uint64 {
			p.Reset()
			return publishN(t, p, 13, 8)
		}, reset: "batch 5 differs", from: 0, to: 7},
		{name: "buffer moved past the batch", buffer: 3, after: func(t *testing.T, p *Publisher) map[uint64]uint64 {
			return publishN(t, p, 14, 2) // buffer: 9..11
		}, reset: "buffer starts at 9", from: 9, to: 11},
		{name: "engine unreachable", unreach: true, reset: "engine unreachable"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := startPublisher(t, PublisherConfig{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0", BufferSteps: tt.buffer})
			first := &recorder{}
			startSubscriber(t, SubscriberConfig{Endpoint: p.Endpoint(), ReplayEndpoint: p.ReplayEndpoint()}, first)
			base := connect(t, p, first, "")
			publishN(t, p, 10, 9-int(base))
			first.waitSeq(t, "", 9)
			pos := first.position(t, 5)

			cfg := SubscriberConfig{Endpoint: p.Endpoint(), ReplayEndpoint: p.ReplayEndpoint(), Resume: &pos}
			var want map[uint64]uint64
			if tt.unreach {
				l, err := net.Listen("tcp", "127.0.0.1:0")
				require.NoError(t, err)
				cfg.Endpoint = "tcp://" + l.Addr().String()
				require.NoError(t, l.Close())
			} else {
				want = tt.after(t, p)
			}
			rec := &recorder{}
			s := startSubscriber(t, cfg, rec)
			if tt.unreach {
				require.Eventually(t, func() bool { _, resets := rec.snapshot(); return len(resets) == 1 }, 10*time.Second, 5*time.Millisecond)
			} else {
				rec.waitSeq(t, "", tt.to)
			}
			bs, resets := rec.snapshot()
			if tt.reset == "" {
				require.Empty(t, resets)
				// Counted once the replay that delivered the batches ends.
				require.Eventually(t, func() bool { return s.Stats().Resumes.Load() == 1 }, 5*time.Second, time.Millisecond)
				require.Equal(t, tt.from, bs[0].seq, "batches up to the position are not applied again")
			} else {
				require.Len(t, resets, 1)
				require.Contains(t, resets[0], "cannot resume at seq 5")
				require.Contains(t, resets[0], tt.reset)
				require.Equal(t, uint64(1), s.Stats().ResumeFailures.Load())
				require.Zero(t, s.Stats().Resumes.Load())
			}
			if !tt.unreach {
				requireContiguous(t, bs, "", tt.from, tt.to, want)
			}
		})
	}
}

// TestBindModeTopicKey: bind mode keys replicas by TopicKey, drops what it
// rejects without keeping state for it, and forgets a replica on request.
func TestBindModeTopicKey(t *testing.T) {
	rec := &recorder{}
	key := func(topic []byte) ([]byte, bool) {
		addr, ok := strings.CutPrefix(string(topic), "kv@")
		addr, _, _ = strings.Cut(addr, "@")
		return []byte(addr), ok && addr == "10.0.0.1:8000"
	}
	s := startSubscriber(t, SubscriberConfig{Endpoint: "tcp://127.0.0.1:0", Bind: true, TopicKey: key}, rec)
	known := startPublisher(t, PublisherConfig{Endpoint: s.Endpoint(), Dial: true, Topic: "kv@10.0.0.1:8000@m"})
	unknown := startPublisher(t, PublisherConfig{Endpoint: s.Endpoint(), Dial: true, Topic: "kv@10.0.0.9:8000@m"})
	connect(t, known, rec, "10.0.0.1:8000")
	require.Eventually(t, func() bool {
		_, err := unknown.Publish(storedEvent(hashFor(15, 0)))
		require.NoError(t, err)
		return s.Stats().UnknownTopics.Load() > 0
	}, 10*time.Second, 10*time.Millisecond)
	s.topicsMu.Lock()
	require.Len(t, s.replicas, 1, "an unknown topic creates no state")
	s.topicsMu.Unlock()
	bs, _ := rec.snapshot()
	for _, b := range bs {
		require.Equal(t, "10.0.0.1:8000", b.topic, "the handler gets the key")
	}

	// Forgotten, the replica starts afresh: a restart is not seen as one.
	s.Forget("10.0.0.1:8000")
	known.Reset()
	seq, err := known.Publish(storedEvent(hashFor(15, 1)))
	require.NoError(t, err)
	rec.waitSeq(t, "10.0.0.1:8000", seq)
	_, resets := rec.snapshot()
	require.Empty(t, resets)
}

func TestResumeConfigErrors(t *testing.T) {
	pos := &Position{Seq: 1}
	_, err := NewSubscriber(SubscriberConfig{Endpoint: "tcp://127.0.0.1:1", Resume: pos}, &recorder{}, nil)
	require.ErrorContains(t, err, "Resume needs dial mode and a replay endpoint")
	_, err = NewSubscriber(SubscriberConfig{Endpoint: "tcp://127.0.0.1:0", Bind: true, ReplayEndpoint: "tcp://127.0.0.1:1", Resume: pos}, &recorder{}, nil)
	require.ErrorContains(t, err, "Resume needs dial mode")
}

// keeper is a Handler that keeps every batch without copying it, as the
// Handler contract allows: it takes the subscriber's batch and hands back
// one of its own.
type keeper struct {
	recorder
	mu   sync.Mutex
	kept []Batch
}

func (k *keeper) HandleBatch(topic string, pos Position, b *Batch) {
	k.recorder.HandleBatch(topic, pos, b)
	var mine Batch
	mine, *b = *b, mine
	k.mu.Lock()
	k.kept = append(k.kept, mine)
	k.mu.Unlock()
}

// TestSubscriberDecodesIntoTheBatchHandedBack: batches a handler keeps by
// exchanging them for its own are never written again by the subscriber,
// which decodes each next batch into what it was handed back.
func TestSubscriberDecodesIntoTheBatchHandedBack(t *testing.T) {
	p := startPublisher(t, PublisherConfig{Endpoint: "tcp://127.0.0.1:0"})
	k := &keeper{}
	startSubscriber(t, SubscriberConfig{Endpoint: p.Endpoint()}, k)
	from := connect(t, p, &k.recorder, "") + 1
	want := publishN(t, p, 7, 50)
	k.waitSeq(t, "", from+49)
	k.mu.Lock()
	defer k.mu.Unlock()
	got := map[uint64]uint64{}
	for _, b := range k.kept[len(k.kept)-50:] {
		require.Len(t, b.Events, 1)
		require.Equal(t, []uint32{1, 2}, b.Events[0].TokenIDs)
		got[uint64(len(got))+from] = b.Events[0].BlockHashes[0]
	}
	require.Equal(t, want, got)
}

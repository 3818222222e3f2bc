package engine

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omnious/provider-node/engines/kvevents"
)

// fakeClock is a manual clock; SleepUntil jumps to the deadline at once.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{t: time.Unix(1_800_000_000, 0)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) SleepUntil(ctx context.Context, t time.Time) {
	c.set(t)
}

func (c *fakeClock) set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if t.After(c.t) {
		c.t = t
	}
}

// recordingSink keeps a deep copy of every published event.
type recordingSink struct {
	mu      sync.Mutex
	batches [][]kvevents.Event
}

func (s *recordingSink) Publish(events []kvevents.Event) {
	if len(events) == 0 {
		panic("Publish called with no events")
	}
	cp := make([]kvevents.Event, len(events))
	for i, ev := range events {
		ev.BlockHashes = slices.Clone(ev.BlockHashes)
		ev.TokenIDs = slices.Clone(ev.TokenIDs)
		cp[i] = ev
	}
	s.mu.Lock()
	s.batches = append(s.batches, cp)
	s.mu.Unlock()
}

func (s *recordingSink) events() []kvevents.Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []kvevents.Event
	for _, b := range s.batches {
		out = append(out, b...)
	}
	return out
}

// take returns and forgets the events recorded so far.
func (s *recordingSink) take() []kvevents.Event {
	out := s.events()
	s.mu.Lock()
	s.batches = nil
	s.mu.Unlock()
	return out
}

type harness struct {
	t     testing.TB
	e     *Engine
	clock *fakeClock
	sink  *recordingSink
}

func newHarness(t testing.TB, cfg Config) *harness {
	t.Helper()
	h := &harness{t: t, clock: newFakeClock(), sink: &recordingSink{}}
	e, err := New(cfg, h.sink, nil, WithClock(h.clock))
	require.NoError(t, err)
	h.e = e
	return h
}

// step runs one step and moves the clock to its end, as Run would.
func (h *harness) step() time.Duration {
	d := h.e.Step()
	h.clock.set(h.e.WallTime(h.e.Snapshot().ModelTime))
	return d
}

// submit queues a request and fails the test on error.
func (h *harness) submit(id string, prompt, output []uint32) <-chan Update {
	h.t.Helper()
	ch, err := h.e.Submit(context.Background(), &Request{ID: id, Prompt: prompt, Output: output})
	require.NoError(h.t, err)
	return ch
}

// complete runs a request to its end and returns its updates.
func (h *harness) complete(id string, prompt, output []uint32) []Update {
	h.t.Helper()
	ch := h.submit(id, prompt, output)
	h.runIdle()
	return drain(h.t, ch)
}

// runIdle steps until the engine has nothing left to do.
func (h *harness) runIdle() {
	h.t.Helper()
	for i := 0; ; i++ {
		require.Less(h.t, i, 100000, "engine did not go idle")
		if h.step() == 0 {
			return
		}
	}
}

// drain reads every update of a finished request, checking they never go
// backwards and that the last is Done.
func drain(t testing.TB, ch <-chan Update) []Update {
	t.Helper()
	var ups []Update
	for u := range ch {
		if len(ups) > 0 {
			require.GreaterOrEqual(t, u.Generated, ups[len(ups)-1].Generated)
			require.False(t, ups[len(ups)-1].Done, "update after Done")
		}
		ups = append(ups, u)
	}
	require.NotEmpty(t, ups)
	require.True(t, ups[len(ups)-1].Done)
	return ups
}

func seq(from, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(from + i)
	}
	return out
}

type residentKey struct {
	medium string
	hash   uint64
}

// replay applies events to a set the way a router's index would.
func replay(t testing.TB, events []kvevents.Event, blockSize int) map[residentKey][]uint32 {
	t.Helper()
	set := make(map[residentKey][]uint32)
	for _, ev := range events {
		switch ev.Kind {
		case kvevents.KindBlockStored:
			require.Equal(t, blockSize, ev.BlockSize)
			require.Len(t, ev.TokenIDs, len(ev.BlockHashes)*blockSize)
			for i, h := range ev.BlockHashes {
				k := residentKey{ev.Medium, h}
				_, dup := set[k]
				require.False(t, dup, "block %x stored twice on %s", h, ev.Medium)
				set[k] = ev.TokenIDs[i*blockSize : (i+1)*blockSize]
			}
		case kvevents.KindBlockRemoved:
			for _, h := range ev.BlockHashes {
				k := residentKey{ev.Medium, h}
				_, ok := set[k]
				require.True(t, ok, "block %x removed from %s but not stored", h, ev.Medium)
				delete(set, k)
			}
		case kvevents.KindAllBlocksCleared:
			clear(set)
		}
	}
	return set
}

func residentSet(rs []ResidentBlock) map[residentKey][]uint32 {
	set := make(map[residentKey][]uint32, len(rs))
	for _, r := range rs {
		set[residentKey{r.Medium, r.Hash}] = r.TokenIDs
	}
	return set
}

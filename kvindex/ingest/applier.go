package ingest

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/omnious/provider-node/engines/kvevents"
	"github.com/omnious/provider-node/kvindex"
)

// applyQueue bounds the decoded batches (and resets) waiting for the
// applier: 4,096 is 200 ms of a 1,024-engine pool publishing 20 batches a
// second each, about 16 MB of batches of 16 stored blocks.
const applyQueue = 4096

// applyGroup bounds the queued items the applier takes at once; their
// index writes go to the index together (kvindex.Index.Write).
const applyGroup = 256

// applier is the one goroutine that writes every running feed's events to
// the index. Subscribers receive and decode on their own goroutines and
// hand each batch over in a bounded queue; the applier takes what is
// queued, in arrival order, updates each replica's state and writes their
// index changes under as few lock holds as it can. One goroutine per engine
// writing the index itself made a convoy on its lock at 1,024 engines.
//
// Each feed hands over its batches, resets and its stop on one goroutine,
// in order, and the queue is FIFO, so a replica's events are applied in
// the order its subscriber delivered them (TestApplierKeepsEachReplicasOrder).
//
// A feed whose lock WriteSnapshot holds (milliseconds, while it encodes
// that replica) does not stop the applier: the feed's items wait, in
// order, while the others are applied
// (TestApplierGoesOnWhileASnapshotHoldsAFeed).
//
// A full queue blocks the subscriber that hands over (counted in full):
// it stops reading its socket, and what the engine then drops for a slow
// subscriber comes back as a sequence gap, filled by replay or reset like
// any other loss. Nothing queued is ever dropped.
type applier struct {
	ix   *kvindex.Index
	q    chan *item
	full atomic.Uint64 // hand-overs that found the queue full and waited
	pool sync.Pool     // *item
	done chan struct{}
}

// itemKind says what an item asks of the applier.
type itemKind uint8

const (
	itemBatch itemKind = iota
	itemReset
	itemStop
)

// item is one hand-over from a feed.
type item struct {
	f        *feed
	kind     itemKind
	pos      kvevents.Position
	batch    kvevents.Batch // exchanged for the subscriber's (kvevents.Handler)
	mismatch uint64         // blocks of another block size
	reason   string         // of a reset
	stopped  chan struct{}  // closed once a stop is applied
}

// newApplier starts an applier with a queue of size items.
func newApplier(ix *kvindex.Index, size int) *applier {
	a := &applier{ix: ix, q: make(chan *item, size), done: make(chan struct{})}
	a.pool.New = func() any { return new(item) }
	go a.run()
	return a
}

// close stops the applier once every item queued before is applied. No
// feed may hand over after it.
func (a *applier) close() {
	close(a.q)
	<-a.done
}

// put queues it, waiting while the queue is full.
func (a *applier) put(it *item) {
	select {
	case a.q <- it:
	default:
		a.full.Add(1)
		a.q <- it
	}
}

// batch queues b for f, taking it without a copy: the subscriber gets
// the memory of a batch applied earlier to decode its next one into,
// f's own last one when it is applied (spare), so that its events have
// the shapes of that engine's and decoding allocates nothing.
func (a *applier) batch(f *feed, pos kvevents.Position, b *kvevents.Batch, mismatch uint64) {
	it := f.spare.Swap(nil)
	if it == nil {
		it = a.pool.Get().(*item)
	}
	it.f, it.kind, it.pos, it.mismatch = f, itemBatch, pos, mismatch
	it.batch, *b = *b, it.batch
	a.put(it)
}

// reset queues a reset of f's replica.
func (a *applier) reset(f *feed, reason string) {
	it := a.pool.Get().(*item)
	it.f, it.kind, it.reason = f, itemReset, reason
	a.put(it)
}

// stop queues the end of f and waits until it is applied: f's replica is
// purged and no batch queued for it afterwards touches it.
func (a *applier) stop(f *feed) {
	done := make(chan struct{})
	a.put(&item{f: f, kind: itemStop, stopped: done})
	<-done
}

func (a *applier) run() {
	defer close(a.done)
	var (
		w     kvindex.Writes
		group []*item
		// done are the items applied since the last flush; held the
		// items of feeds whose lock a snapshot holds, in order.
		done []*item
		held = map[*feed][]*item{}
	)
	flush := func() {
		a.ix.Write(&w)
		now := time.Now()
		for _, it := range done {
			if it.kind == itemBatch && it.f != nil {
				if lag, ok := applyLag(it.batch.TS, now); ok {
					it.f.lag.Observe(lag)
				}
			}
			if it.kind != itemStop {
				f := it.f
				it.f = nil
				// A batch's memory goes back to its feed for the next
				// batch, unless the feed has one (or is stopped: f nil).
				if it.kind != itemBatch || f == nil || !f.spare.CompareAndSwap(nil, it) {
					a.pool.Put(it)
				}
			}
		}
		done = done[:0]
	}
	// apply applies it with its feed's lock held.
	apply := func(it *item) {
		switch it.kind {
		case itemBatch:
			if !it.f.applyToLocked(&w, it) {
				it.f = nil // stopped: no lag to record
			}
		case itemReset, itemStop:
			// They write the index directly: what is in w (this
			// replica's earlier batches among them) goes first.
			flush()
			if it.kind == itemReset {
				it.f.applyResetLocked(it.reason)
			} else {
				it.f.applyStopLocked()
			}
		}
		done = append(done, it)
	}
	// offer applies it unless its feed's lock is taken (WriteSnapshot
	// encoding the replica, for milliseconds): then it and the feed's
	// later items wait in held while the other feeds go on.
	offer := func(it *item) {
		f := it.f
		if q, ok := held[f]; ok {
			held[f] = append(q, it)
			return
		}
		if !f.mu.TryLock() {
			held[f] = []*item{it}
			return
		}
		apply(it)
		f.mu.Unlock()
		if it.kind == itemStop {
			close(it.stopped)
		}
	}
	retry := func() {
		for f, items := range held {
			if !f.mu.TryLock() {
				continue
			}
			for _, it := range items {
				apply(it)
			}
			f.mu.Unlock()
			delete(held, f)
			for _, it := range items {
				if it.kind == itemStop {
					close(it.stopped)
				}
			}
		}
	}
	open := true
	for open || len(held) > 0 {
		group = group[:0]
		if len(held) == 0 {
			it, ok := <-a.q
			if !ok {
				break
			}
			group = append(group, it)
		} else {
			var ch <-chan *item
			if open {
				ch = a.q
			}
			// Rare (a snapshot being written): a timer a wait is cheap.
			t := time.NewTimer(heldRetry)
			select {
			case it, ok := <-ch:
				if ok {
					group = append(group, it)
				} else {
					open = false
				}
			case <-t.C:
			}
			t.Stop()
		}
	more:
		for open && len(group) < applyGroup {
			select {
			case it, ok := <-a.q:
				if !ok {
					open = false
					break more
				}
				group = append(group, it)
			default:
				break more
			}
		}
		for _, it := range group {
			offer(it)
		}
		if len(held) > 0 {
			retry()
		}
		flush()
	}
}

// heldRetry is how often the applier tries again the feeds a snapshot
// holds while nothing else arrives.
const heldRetry = time.Millisecond

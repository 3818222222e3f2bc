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
	batch    kvevents.Batch // a copy: the subscriber reuses its own
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

// batch queues a copy of b for f.
func (a *applier) batch(f *feed, pos kvevents.Position, b *kvevents.Batch, mismatch uint64) {
	it := a.pool.Get().(*item)
	it.f, it.kind, it.pos, it.mismatch = f, itemBatch, pos, mismatch
	copyBatch(&it.batch, b)
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
		w       kvindex.Writes
		group   []*item
		applied []*item // batches whose index writes are in w
	)
	for it := range a.q {
		group = append(group[:0], it)
	more:
		for len(group) < applyGroup {
			select {
			case it, ok := <-a.q:
				if !ok {
					break more
				}
				group = append(group, it)
			default:
				break more
			}
		}
		for _, it := range group {
			if it.kind == itemBatch {
				if it.f.applyTo(&w, it) {
					applied = append(applied, it)
				}
				continue
			}
			// A reset or stop writes the index directly: what is in w
			// (this replica's earlier batches among them) goes first.
			a.ix.Write(&w)
			a.observe(applied)
			applied = applied[:0]
			if it.kind == itemReset {
				it.f.applyReset(it.reason)
			} else {
				it.f.applyStop()
				close(it.stopped)
			}
		}
		a.ix.Write(&w)
		a.observe(applied)
		applied = applied[:0]
		for _, it := range group {
			if it.kind != itemStop {
				it.f = nil
				a.pool.Put(it)
			}
		}
	}
}

// observe records the apply lag of batches just written to the index.
func (a *applier) observe(batches []*item) {
	if len(batches) == 0 {
		return
	}
	now := time.Now()
	for _, it := range batches {
		if lag, ok := applyLag(it.batch.TS, now); ok {
			it.f.lag.Observe(lag)
		}
	}
}

// copyBatch makes dst a copy of src, reusing dst's memory: events, their
// block hashes and token ids (strings are immutable and shared).
func copyBatch(dst, src *kvevents.Batch) {
	evs := dst.Events[:cap(dst.Events)]
	if len(evs) < len(src.Events) {
		evs = append(evs, make([]kvevents.Event, len(src.Events)-len(evs))...)
	}
	for i := range src.Events {
		hashes := append(evs[i].BlockHashes[:0], src.Events[i].BlockHashes...)
		toks := append(evs[i].TokenIDs[:0], src.Events[i].TokenIDs...)
		evs[i] = src.Events[i]
		evs[i].BlockHashes, evs[i].TokenIDs = hashes, toks
	}
	dst.Events = evs[:len(src.Events)]
	dst.TS, dst.DPRank, dst.HasDPRank, dst.Unknown = src.TS, src.DPRank, src.HasDPRank, src.Unknown
}

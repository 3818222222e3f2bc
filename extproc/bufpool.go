package extproc

import (
	"math/bits"
	"sync"
)

// bodyPool recycles the buffers that gather a chunked request body and hold
// a rewritten one. Fresh large buffers cost more than their copy: the
// runtime zeroes them and the kernel faults their pages in again after the
// scavenger returned them. A buffer goes back only after gRPC's Send has
// encoded every message that points into it (Send encodes before it
// returns; the server installs no stats handler that keeps messages). A
// recycled buffer costs the pool's slice header: TestAllocsBodyPool.
type bodyPool struct {
	classes [bodyPoolClasses]sync.Pool
}

const (
	bodyPoolMinShift = 16 // 64 KiB
	bodyPoolClasses  = 10 // up to 32 MiB
)

// get returns an empty buffer with capacity of at least n.
func (p *bodyPool) get(n int) []byte {
	c := bodyClass(n)
	if c < 0 {
		return make([]byte, 0, n)
	}
	if b, ok := p.classes[c].Get().(*[]byte); ok {
		return (*b)[:0]
	}
	return make([]byte, 0, 1<<(c+bodyPoolMinShift))
}

// put recycles b; buffers of other sizes are left to the GC.
func (p *bodyPool) put(b []byte) {
	c := bodyClass(cap(b))
	if c < 0 || cap(b) != 1<<(c+bodyPoolMinShift) {
		return
	}
	b = b[:0]
	p.classes[c].Put(&b)
}

// bodyClass is the class whose buffers hold n bytes, or -1.
func bodyClass(n int) int { return tier(n, bodyPoolMinShift, bodyPoolClasses) }

// tier is the index of the smallest of tiers powers of two from
// 1<<minShift up that holds n bytes, or -1 when none does.
func tier(n, minShift, tiers int) int {
	t := 0
	if n > 1<<minShift {
		t = bits.Len(uint(n-1)) - minShift
	}
	if t >= tiers {
		return -1
	}
	return t
}

// msgPool is gRPC's buffer pool for ext_proc messages (NewBufferPool): a
// sync.Pool per power of two from 256 bytes to 64 MiB. A buffer comes back
// as it was put, not cleared as gRPC's own pools clear theirs: gRPC fills
// the whole length it asks for (a received message is copied in, Codec
// writes a marshalled one), so clearing was one more pass over every
// message, about 27 µs for a 200 KB body's chunks (a CPU profile of
// BenchmarkEPPInEnvoy/200KB). Larger buffers are left to the GC.
// TestMsgPool; TestMsgPoolReuse sends bodies of falling sizes through
// recycled buffers and fails if a stale byte comes back.
type msgPool struct {
	tiers [msgPoolTiers]sync.Pool
}

const (
	msgPoolMinShift = 8 // 256 B
	msgPoolTiers    = 19
)

// Get implements mem.BufferPool.
func (p *msgPool) Get(n int) *[]byte {
	t := msgTier(n)
	if t < 0 {
		b := make([]byte, n)
		return &b
	}
	if b, ok := p.tiers[t].Get().(*[]byte); ok {
		*b = (*b)[:n]
		return b
	}
	b := make([]byte, n, 1<<(t+msgPoolMinShift))
	return &b
}

// Put implements mem.BufferPool; buffers of other capacities are dropped.
func (p *msgPool) Put(b *[]byte) {
	t := msgTier(cap(*b))
	if t < 0 || cap(*b) != 1<<(t+msgPoolMinShift) {
		return
	}
	*b = (*b)[:0]
	p.tiers[t].Put(b)
}

// msgTier is the tier whose buffers hold n bytes, or -1.
func msgTier(n int) int { return tier(n, msgPoolMinShift, msgPoolTiers) }

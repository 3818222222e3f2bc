package engine

import (
	"container/list"
	"slices"
	"sort"

	"github.com/omnious/provider-node/engines/kvevents"
)

// Storage media as the engines name them in KV events.
const (
	MediumGPU = "GPU"
	// MediumCPU is vLLM's CPU offload tier.
	MediumCPU = "CPU"
	// MediumCPUPinned is SGLang's host-memory (HiCache) tier.
	MediumCPUPinned = "CPU_PINNED"
)

// specKindFull is the KV cache spec kind vLLM names in every BlockStored of
// a model whose layers are all full attention (one KV cache group);
// routers match prefixes on such groups only.
const specKindFull = "full_attention"

// block is one GPU KV block. A block is cached when it holds a full,
// hashed run of tokens that later requests may reuse.
type block struct {
	id  int
	ref int

	cached    bool
	d         digest
	hash      uint64
	parent    uint64
	hasParent bool
	tokens    []uint32 // never mutated once set, so events may share it
	lora      string
	salt      string

	// free-queue links; inFree says whether the block is in the queue.
	prev, next *block
	inFree     bool
	// prio is the highest priority of the requests that released the
	// block since it was cached (SGLang's radix node priority, raised to
	// the max of its requests' and never lowered); 0 unless the cache
	// evicts by priority.
	prio int
}

// cpuBlock is one block in the CPU tier.
type cpuBlock struct {
	d         digest
	hash      uint64
	parent    uint64
	hasParent bool
	tokens    []uint32
	lora      string
	salt      string
}

// kvCache is the paged KV cache with prefix caching. Like vLLM's block pool,
// unreferenced blocks stay cached in a free queue and are evicted only when a
// free block is needed: the queue's head is the next block handed out.
// Blocks without a hash are put at the head (reused first) and freed cached
// blocks at the tail, so eviction is least-recently-freed first. A request's
// blocks are freed last-block-first, so its tail is evicted before its prefix.
//
// With a CPU tier, a cached block evicted from the GPU is offloaded to the CPU
// tier (its own LRU, evicting its least recently used block when full).
//
// With priority eviction (SGLang's --radix-eviction-policy priority), a
// freed cached block of priority p > 0 waits in the free queue of level p
// instead: blocks are handed out from the main queue first, then from the
// lowest level's, least recently freed first within each, so a block
// used by a higher-priority request outlives every lower one
// (TestPriorityEviction). SGLang's eviction heap orders leaves by
// (priority, last access) the same way; negative priorities count as 0
// here.
//
// kvCache is not safe for concurrent use; the Engine's lock guards it.
type kvCache struct {
	blockSize int
	blocks    []block
	// head and tail sentinels of the free queue.
	head, tail block
	numFree    int
	gpu        map[digest]*block
	// byPriority turns priority eviction on; levels are its free queues
	// of priority above 0, lowest first.
	byPriority bool
	levels     []*freeLevel

	cpuCap    int
	cpuMedium string
	cpu       map[digest]*list.Element // values are *cpuBlock
	cpuLRU    *list.List               // front is most recently used

	// emit receives the eviction and offload events.
	emit func(kvevents.Event)
}

// freeLevel is the free queue of the cached blocks of one priority.
type freeLevel struct {
	prio       int
	head, tail block
}

func newKVCache(blockSize, numGPU, numCPU int, cpuMedium string, emit func(kvevents.Event)) *kvCache {
	c := &kvCache{
		blockSize: blockSize,
		cpuMedium: cpuMedium,
		blocks:    make([]block, numGPU),
		gpu:       make(map[digest]*block),
		cpuCap:    numCPU,
		cpu:       make(map[digest]*list.Element),
		cpuLRU:    list.New(),
		emit:      emit,
	}
	c.reset()
	return c
}

// reset drops every block and entry without emitting events.
func (c *kvCache) reset() {
	c.head.next, c.tail.prev = &c.tail, &c.head
	c.head.prev, c.tail.next = nil, nil
	c.numFree = 0
	c.levels = nil
	for i := range c.blocks {
		c.blocks[i] = block{id: i}
		c.pushTail(&c.blocks[i])
	}
	clear(c.gpu)
	clear(c.cpu)
	c.cpuLRU.Init()
}

func (c *kvCache) pushTail(b *block) {
	tail := &c.tail
	if c.byPriority && b.cached && b.prio > 0 {
		tail = &c.level(b.prio).tail
	}
	b.prev, b.next = tail.prev, tail
	tail.prev.next = b
	tail.prev = b
	b.inFree = true
	c.numFree++
}

// level returns the free queue of priority p, adding it in order. Adding
// one drops the empty ones, so there are never more levels than free
// blocks, whatever priorities clients send.
func (c *kvCache) level(p int) *freeLevel {
	if i := sort.Search(len(c.levels), func(i int) bool { return c.levels[i].prio >= p }); i < len(c.levels) && c.levels[i].prio == p {
		return c.levels[i]
	}
	c.levels = slices.DeleteFunc(c.levels, func(l *freeLevel) bool { return l.head.next == &l.tail })
	i := sort.Search(len(c.levels), func(i int) bool { return c.levels[i].prio >= p })
	if i < len(c.levels) && c.levels[i].prio == p {
		return c.levels[i]
	}
	l := &freeLevel{prio: p}
	l.head.next, l.tail.prev = &l.tail, &l.head
	c.levels = slices.Insert(c.levels, i, l)
	return l
}

// next is the free block allocate hands out: the main queue's head, else
// the head of the lowest priority level holding one; nil when none is free.
func (c *kvCache) next() *block {
	if b := c.head.next; b != &c.tail {
		return b
	}
	for _, l := range c.levels {
		if b := l.head.next; b != &l.tail {
			return b
		}
	}
	return nil
}

func (c *kvCache) pushHead(b *block) {
	b.prev, b.next = &c.head, c.head.next
	c.head.next.prev = b
	c.head.next = b
	b.inFree = true
	c.numFree++
}

func (c *kvCache) unlink(b *block) {
	b.prev.next = b.next
	b.next.prev = b.prev
	b.prev, b.next = nil, nil
	b.inFree = false
	c.numFree--
}

// used returns the number of blocks referenced by requests.
func (c *kvCache) used() int { return len(c.blocks) - c.numFree }

// usage is the fraction of blocks referenced by requests (vLLM's
// kv_cache_usage: cached but unreferenced blocks count as free).
func (c *kvCache) usage() float64 {
	if len(c.blocks) == 0 {
		return 0
	}
	return float64(c.used()) / float64(len(c.blocks))
}

// lookupGPU returns the GPU block caching d, or nil.
func (c *kvCache) lookupGPU(d digest) *block { return c.gpu[d] }

// lookupCPU reports whether the CPU tier holds d.
func (c *kvCache) lookupCPU(d digest) bool {
	_, ok := c.cpu[d]
	return ok
}

// touchCPU marks d most recently used in the CPU tier.
func (c *kvCache) touchCPU(d digest) {
	if el, ok := c.cpu[d]; ok {
		c.cpuLRU.MoveToFront(el)
	}
}

// acquire takes a reference on a cached block (a prefix-cache hit).
func (c *kvCache) acquire(b *block) {
	if b.ref == 0 && b.inFree {
		c.unlink(b)
	}
	b.ref++
}

// allocate hands out a free block with one reference, evicting the cached
// block at the head of the free queue if needed. The caller checks numFree.
func (c *kvCache) allocate() *block {
	b := c.next()
	if b == nil {
		panic("engine: kv cache allocate with no free block") // guarded by callers
	}
	c.unlink(b)
	if b.cached {
		c.evict(b)
	}
	b.ref = 1
	return b
}

// evict removes b from the GPU prefix cache, emitting BlockRemoved and
// offloading it to the CPU tier when there is one.
func (c *kvCache) evict(b *block) {
	delete(c.gpu, b.d)
	c.emit(kvevents.Event{
		Kind:        kvevents.KindBlockRemoved,
		BlockHashes: []uint64{b.hash},
		BlockSize:   c.blockSize,
		Medium:      MediumGPU,
		LoraName:    b.lora,
	})
	if c.cpuCap > 0 {
		c.offload(b)
	}
	*b = block{id: b.id}
}

func (c *kvCache) offload(b *block) {
	if el, ok := c.cpu[b.d]; ok {
		c.cpuLRU.MoveToFront(el)
		return
	}
	if c.cpuLRU.Len() >= c.cpuCap {
		old := c.cpuLRU.Back()
		ob := old.Value.(*cpuBlock)
		c.cpuLRU.Remove(old)
		delete(c.cpu, ob.d)
		c.emit(kvevents.Event{
			Kind:        kvevents.KindBlockRemoved,
			BlockHashes: []uint64{ob.hash},
			BlockSize:   c.blockSize,
			Medium:      c.cpuMedium,
			LoraName:    ob.lora,
		})
	}
	cb := &cpuBlock{d: b.d, hash: b.hash, parent: b.parent, hasParent: b.hasParent,
		tokens: b.tokens, lora: b.lora, salt: b.salt}
	c.cpu[b.d] = c.cpuLRU.PushFront(cb)
	c.emit(kvevents.Event{
		Kind:        kvevents.KindBlockStored,
		BlockHashes: []uint64{cb.hash},
		ParentHash:  cb.parent,
		HasParent:   cb.hasParent,
		TokenIDs:    cb.tokens,
		BlockSize:   c.blockSize,
		LoraName:    cb.lora,
		CacheSalt:   cb.salt,
		Medium:      c.cpuMedium,
		SpecKind:    specKindFull,
	})
}

// register caches b under d. It returns false, leaving b uncached, when another
// block already caches d (two requests computed the same block at once); the
// simulator keeps one copy so the resident set stays a set.
func (c *kvCache) register(b *block, d digest, hash, parent uint64, hasParent bool, tokens []uint32, lora, salt string) bool {
	if _, dup := c.gpu[d]; dup {
		return false
	}
	b.cached, b.d, b.hash, b.parent, b.hasParent = true, d, hash, parent, hasParent
	b.tokens, b.lora, b.salt = tokens, lora, salt
	c.gpu[d] = b
	return true
}

// release drops one reference on each block, last block first, so that the
// tail of a sequence is evicted before its shared prefix; with priority
// eviction each cached block's priority rises to prio if below it.
func (c *kvCache) release(blocks []*block, prio int) {
	for i := len(blocks) - 1; i >= 0; i-- {
		b := blocks[i]
		if c.byPriority && b.cached {
			b.prio = max(b.prio, prio)
		}
		b.ref--
		if b.ref > 0 {
			continue
		}
		if b.cached {
			c.pushTail(b)
		} else {
			c.pushHead(b)
		}
	}
}

// ResidentBlock is one block in the cache, as the engine would report it.
type ResidentBlock struct {
	// Hash is the engine hash as a uint64 bit pattern (what events carry).
	Hash       uint64   `json:"hash"`
	ParentHash uint64   `json:"parent_hash"`
	HasParent  bool     `json:"has_parent"`
	TokenIDs   []uint32 `json:"token_ids"`
	Medium     string   `json:"medium"`
	LoraName   string   `json:"lora_name,omitempty"`
	// RefCount is the number of running requests using the block (0 on CPU).
	RefCount int `json:"ref_count"`
}

// resident lists every cached block: GPU blocks by block id, then the CPU
// tier from most to least recently used.
func (c *kvCache) resident() []ResidentBlock {
	out := make([]ResidentBlock, 0, len(c.gpu)+len(c.cpu))
	gpu := make([]*block, 0, len(c.gpu))
	for _, b := range c.gpu {
		gpu = append(gpu, b)
	}
	sort.Slice(gpu, func(i, j int) bool { return gpu[i].id < gpu[j].id })
	for _, b := range gpu {
		out = append(out, ResidentBlock{Hash: b.hash, ParentHash: b.parent, HasParent: b.hasParent,
			TokenIDs: append([]uint32(nil), b.tokens...), Medium: MediumGPU, LoraName: b.lora, RefCount: b.ref})
	}
	for el := c.cpuLRU.Front(); el != nil; el = el.Next() {
		cb := el.Value.(*cpuBlock)
		out = append(out, ResidentBlock{Hash: cb.hash, ParentHash: cb.parent, HasParent: cb.hasParent,
			TokenIDs: append([]uint32(nil), cb.tokens...), Medium: c.cpuMedium, LoraName: cb.lora})
	}
	return out
}

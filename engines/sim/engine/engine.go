// Package engine is the core of the engine simulator: one vLLM or SGLang
// replica without a GPU. It owns the paged KV cache with prefix caching (and
// an optional CPU tier), the continuous-batching step loop with chunked
// prefill and recompute preemption, the step-time model, the KV events the
// real engine would publish, and its Prometheus metrics under their real
// names. The HTTP/OpenAI layer sits on top in package sim.
//
// Where the simulator departs from the engines, on purpose:
//   - Block hashes use the engines' inputs and truncations but a fixed byte
//     layout (vLLM pickles or CBOR-encodes; see hasher.block).
//   - Two requests computing the same block at once keep one cached copy (vLLM
//     would store both and emit BlockStored twice), so the resident set and the
//     event stream stay a set.
//   - The CPU tier receives blocks when they are evicted from the GPU; a CPU
//     hit is loaded back at Timing.CPULoadPerToken per token (about 5% of
//     recomputing it) and is cached on the GPU again with a BlockStored event.
//   - Freed blocks without a hash are reused before any cached block is
//     evicted.
//   - vLLM steps mix decodes and prefill chunks; SGLang steps are either a
//     prefill batch (which has priority) or a decode batch, as with its
//     default of mixed chunks off.
package engine

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/omnious/provider-node/engines/kvevents"
)

// EventSink receives the KV events of one step. It is called from the step
// loop, never with an empty slice; the slice is reused after Publish returns,
// so the sink encodes or copies synchronously.
type EventSink interface {
	Publish(events []kvevents.Event)
}

// Request is one generation request. Output is decided by the HTTP layer:
// the exact token ids to generate, len(Output) of them. The engine keeps the
// slices; the caller must not modify them after Submit.
type Request struct {
	ID       string
	Prompt   []uint32
	Output   []uint32
	LoraName string
	// CacheSalt isolates the request's prefix cache (vLLM cache_salt).
	CacheSalt string
	// Priority is the request's priority; with radix_eviction_policy
	// "priority" (SGLang) the blocks it used are evicted after those of
	// lower-priority requests.
	Priority int
	// FinishReason is reported in vllm:request_success when the request
	// completes: "stop" (default) or "length".
	FinishReason string
}

// Update reports a request's progress. Updates on one channel never go
// backwards; the last one has Done set and the channel is then closed.
type Update struct {
	// Generated is the number of output tokens generated so far.
	Generated int
	// PromptTokens and CachedTokens (prefix-cache hits, GPU or CPU) are set
	// from the first update on.
	PromptTokens, CachedTokens int
	Done                       bool
	// Err is set when the request was aborted (client gone, engine restart).
	Err error
}

// ErrRestarted is the error of requests aborted by Restart.
var ErrRestarted = errors.New("engine restarted")

// ErrStopped is the error of requests still in flight when Run returns.
var ErrStopped = errors.New("engine stopped")

// updateBuffer is the depth of a request's update channel; when a reader
// falls this far behind, the oldest pending update is dropped (the newest
// Generated count supersedes it).
const updateBuffer = 16

type reqState uint8

const (
	stateWaiting reqState = iota
	stateRunning
	// stateFinishing: generated its last token in a step not yet delivered.
	stateFinishing
	stateDone
)

type request struct {
	Request
	state reqState
	ch    chan Update
	stop  func() bool // stops the ctx watcher

	generated   int
	numComputed int
	blocks      []*block
	digests     []digest // chain digests of full blocks, by index
	// numRegistered counts the leading blocks whose caching has been settled.
	numRegistered int
	cachedTokens  int
	admitted      bool
	promptCounted bool

	// model times
	arrival, firstSched, lastToken time.Duration
}

func (r *request) numTokens() int { return len(r.Prompt) + r.generated }

func (r *request) tokenAt(i int) uint32 {
	if i < len(r.Prompt) {
		return r.Prompt[i]
	}
	return r.Output[i-len(r.Prompt)]
}

// blockTokens returns a new slice with the tokens of block j.
func (r *request) blockTokens(j, bs int) []uint32 {
	out := make([]uint32, bs)
	for k := range out {
		out[k] = r.tokenAt(j*bs + k)
	}
	return out
}

// Stats is a point-in-time summary of the engine.
type Stats struct {
	Running, Waiting int
	// KVUsage is the fraction (0-1) of GPU blocks referenced by requests.
	KVUsage      float64
	NumGPUBlocks int
	NumCPUBlocks int
	// UsedBlocks are referenced by requests; CachedBlocks hold reusable
	// prefixes (referenced or not); CPUCachedBlocks are in the CPU tier.
	UsedBlocks, CachedBlocks, CPUCachedBlocks int
	// Prefix-cache queries and GPU hits, in tokens, as vLLM counts them; CPU
	// tier hits are counted separately.
	PrefixCacheQueries, PrefixCacheHits, CPUCacheHits int64
	Preemptions                                       int64
	PromptTokens, GenerationTokens                    int64
	// ModelTime is the end of the last step in model time.
	ModelTime time.Duration
}

// Engine simulates one engine replica. Its methods are safe for concurrent use.
type Engine struct {
	cfg   Config
	sink  EventSink
	log   *zap.Logger
	clock Clock
	hash  *hasher
	wake  chan struct{}

	wallStart time.Time
	reg       *prometheus.Registry
	metrics   *metrics

	mu      sync.Mutex
	cache   *kvCache
	waiting []*request // FCFS; preempted requests go back to the head
	running []*request // in admission order; the newest is preempted first
	pending []kvevents.Event
	lastEnd time.Duration
	stopped bool // Run has returned
	stats   Stats
	tokBuf  []uint32
}

// New builds an engine; cfg is completed with WithDefaults and validated.
// sink may be nil when events are not needed.
func New(cfg Config, sink EventSink, log *zap.Logger, opts ...Option) (*Engine, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = zap.NewNop()
	}
	e := &Engine{
		cfg:   cfg,
		sink:  sink,
		log:   log,
		clock: realClock{},
		hash:  newHasher(cfg.Flavour, *cfg.Seed),
		wake:  make(chan struct{}, 1),
	}
	for _, o := range opts {
		o(e)
	}
	e.wallStart = e.clock.Now()
	cpuMedium := MediumCPU
	if cfg.Flavour == FlavourSGLang {
		cpuMedium = MediumCPUPinned
	}
	e.cache = newKVCache(cfg.BlockSize, cfg.usableGPUBlocks(), cfg.NumCPUBlocks, cpuMedium, e.emitLocked)
	e.cache.byPriority = cfg.RadixEvictionPolicy == "priority"
	e.stats.NumGPUBlocks, e.stats.NumCPUBlocks = cfg.NumGPUBlocks, cfg.NumCPUBlocks
	e.reg = prometheus.NewRegistry()
	m, err := newMetrics(e)
	if err != nil {
		return nil, fmt.Errorf("cannot register engine metrics: %w", err)
	}
	e.metrics = m
	return e, nil
}

// Config returns the engine's completed configuration.
func (e *Engine) Config() Config { return e.cfg }

// Registry returns the registry holding the engine's metrics.
func (e *Engine) Registry() *prometheus.Registry { return e.reg }

func (e *Engine) emitLocked(ev kvevents.Event) {
	if e.cfg.DisablePrefixCaching {
		return
	}
	e.pending = append(e.pending, ev)
}

// modelNow converts the wall clock to model time.
func (e *Engine) modelNow() time.Duration {
	return time.Duration(float64(e.clock.Now().Sub(e.wallStart)) * e.cfg.TimeScale)
}

// WallTime converts a model time to the wall-clock instant it maps to.
func (e *Engine) WallTime(model time.Duration) time.Time {
	return e.wallStart.Add(time.Duration(float64(model) / e.cfg.TimeScale))
}

func (e *Engine) signal() {
	select {
	case e.wake <- struct{}{}:
	default:
	}
}

// Submit queues r. The returned channel delivers its progress; it is
// buffered and coalescing, so the step loop never waits for a reader. When
// ctx ends first the request is aborted, its blocks released, and a final
// Update carries ctx.Err().
func (e *Engine) Submit(ctx context.Context, r *Request) (<-chan Update, error) {
	if r == nil {
		return nil, errors.New("cannot submit: nil request")
	}
	if len(r.Prompt) == 0 {
		return nil, fmt.Errorf("cannot submit request %q: empty prompt", r.ID)
	}
	if len(r.Output) == 0 {
		return nil, fmt.Errorf("cannot submit request %q: no output tokens to generate", r.ID)
	}
	// The KV of the last output token is never computed.
	need := ceilDiv(len(r.Prompt)+len(r.Output)-1, e.cfg.BlockSize)
	if need > e.cfg.usableGPUBlocks() {
		return nil, fmt.Errorf("cannot submit request %q: %d prompt + %d output tokens need %d KV blocks, cache has %d",
			r.ID, len(r.Prompt), len(r.Output), need, e.cfg.usableGPUBlocks())
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("cannot submit request %q: %w", r.ID, err)
	}
	req := &request{Request: *r, ch: make(chan Update, updateBuffer)}
	switch req.FinishReason {
	case "":
		req.FinishReason = "stop"
	case "stop", "length":
	default:
		return nil, fmt.Errorf("cannot submit request %q: finish reason %q: want stop or length", r.ID, r.FinishReason)
	}
	e.mu.Lock()
	if e.stopped {
		e.mu.Unlock()
		return nil, fmt.Errorf("cannot submit request %q: %w", r.ID, ErrStopped)
	}
	req.arrival = e.modelNow()
	e.waiting = append(e.waiting, req)
	// The watcher runs in its own goroutine and takes the lock, so it is
	// registered under the lock to publish req.stop before any use.
	req.stop = context.AfterFunc(ctx, func() { e.abort(req, ctx.Err()) })
	e.mu.Unlock()
	e.signal()
	return req.ch, nil
}

// abort ends req with err if it is still in flight.
func (e *Engine) abort(req *request, err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if req.state == stateDone {
		return
	}
	e.dropLocked(req)
	e.finishLocked(req, err, "abort", e.lastEnd)
	e.signal()
}

// dropLocked removes req from the queues and releases its blocks.
func (e *Engine) dropLocked(req *request) {
	switch req.state {
	case stateWaiting:
		e.waiting = removeReq(e.waiting, req)
	case stateRunning:
		e.running = removeReq(e.running, req)
	}
	e.cache.release(req.blocks, req.Priority)
	req.blocks = nil
}

func removeReq(s []*request, r *request) []*request {
	for i, x := range s {
		if x == r {
			copy(s[i:], s[i+1:])
			s[len(s)-1] = nil
			return s[:len(s)-1]
		}
	}
	return s
}

// finishLocked sends the final update and records the request's end.
func (e *Engine) finishLocked(req *request, err error, reason string, at time.Duration) {
	req.state = stateDone
	if req.stop != nil {
		req.stop()
	}
	e.send(req, Update{Generated: req.generated, PromptTokens: len(req.Prompt),
		CachedTokens: req.cachedTokens, Done: true, Err: err})
	close(req.ch)
	e.metrics.finished(req, reason, at)
}

// send delivers u without blocking, dropping the oldest pending update when
// the reader is behind. Only the step loop and abort send, under e.mu.
func (e *Engine) send(req *request, u Update) {
	for {
		select {
		case req.ch <- u:
			return
		default:
		}
		select {
		case <-req.ch:
		default:
		}
	}
}

// Restart simulates an engine restart: every request is aborted with
// ErrRestarted, the cache (GPU and CPU) is emptied and AllBlocksCleared is
// published with the next step.
func (e *Engine) Restart() {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, r := range append(append([]*request(nil), e.running...), e.waiting...) {
		r.blocks = nil
		e.finishLocked(r, ErrRestarted, "abort", e.lastEnd)
	}
	e.running, e.waiting = nil, nil
	e.cache.reset()
	e.pending = append(e.pending, kvevents.Event{Kind: kvevents.KindAllBlocksCleared})
	e.log.Info("engine restarted")
	e.signal()
}

// Resident lists every cached block (GPU, then CPU tier).
func (e *Engine) Resident() []ResidentBlock {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.cache.resident()
}

// Snapshot returns current statistics.
func (e *Engine) Snapshot() Stats {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.snapshotLocked()
}

func (e *Engine) snapshotLocked() Stats {
	s := e.stats
	s.Running, s.Waiting = len(e.running), len(e.waiting)
	s.KVUsage = e.cache.usage()
	s.UsedBlocks = e.cache.used()
	s.CachedBlocks = len(e.cache.gpu)
	s.CPUCachedBlocks = len(e.cache.cpu)
	s.ModelTime = e.lastEnd
	return s
}

// Run drives the step loop until ctx is done, sleeping until each step's
// absolute end so that timing errors do not accumulate, and blocking while
// idle. Requests still in flight when it returns end with ErrStopped.
func (e *Engine) Run(ctx context.Context) {
	defer e.stopAll()
	for ctx.Err() == nil {
		p := e.step()
		if p.dur == 0 {
			select {
			case <-e.wake:
			case <-ctx.Done():
			}
			continue
		}
		e.clock.SleepUntil(ctx, e.WallTime(p.end))
		// Deliver even when stopping: requests that finished in this step
		// are in no queue for stopAll to end.
		e.commit(p)
	}
}

func (e *Engine) stopAll() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.stopped = true
	for _, r := range append(append([]*request(nil), e.running...), e.waiting...) {
		e.dropLocked(r)
		e.finishLocked(r, ErrStopped, "abort", e.lastEnd)
	}
}

// Step runs one engine step without sleeping: it schedules, advances model
// time by the step's duration and delivers the step's tokens. It returns the
// step's model duration, 0 when there was nothing to run. Tests and
// benchmarks call it instead of Run (never both); a driver with a fake Clock
// moves it to WallTime(Snapshot().ModelTime) after each step so that request
// arrivals are stamped in model time.
func (e *Engine) Step() time.Duration {
	p := e.step()
	if p.dur > 0 {
		e.commit(p)
	}
	return p.dur
}

// emission is one request's progress in a step.
type emission struct {
	req       *request
	generated int
	first     bool
	done      bool
}

// plan is a scheduled step whose tokens are delivered at its end.
type plan struct {
	start, end time.Duration
	dur        time.Duration
	emissions  []emission
	// tokens computed in the step, split as the timing model sees them.
	prefillTokens, decodeSeqs, cpuLoadTokens int
	kvOccupancy                              float64
}

// step schedules one step under the lock, applies its effect on the cache
// and the queues, then publishes the step's events.
func (e *Engine) step() plan {
	e.mu.Lock()
	p := e.scheduleLocked()
	events := e.pending
	e.pending = e.pending[:0:0]
	e.mu.Unlock()
	if len(events) > 0 && e.sink != nil {
		e.sink.Publish(events)
	}
	return p
}

// commit delivers a step's tokens at its end time.
func (e *Engine) commit(p plan) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, em := range p.emissions {
		r := em.req
		if r.state == stateDone {
			continue // aborted or restarted during the step
		}
		if em.first {
			e.metrics.firstToken(r, p.end)
		} else {
			e.metrics.interToken(p.end - r.lastToken)
		}
		r.lastToken = p.end
		if em.done {
			e.finishLocked(r, nil, r.FinishReason, p.end)
			continue
		}
		e.send(r, Update{Generated: em.generated, PromptTokens: len(r.Prompt), CachedTokens: r.cachedTokens})
	}
}

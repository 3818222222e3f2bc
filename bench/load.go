package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/omnious/provider-node/engines/tokenizer"
	"github.com/omnious/provider-node/extproc"
	"github.com/omnious/provider-node/extproc/testgw"
	"github.com/omnious/provider-node/internal/cputime"
)

// LoadOptions configure `bench load`: the EPP (bin/epp as its own process,
// precise policy, stand-in tokenizer, a static endpoint file) behind the
// test gateway, in front of cheap stub backends, driven open-loop at
// increasing request rates until a budget breaks, or held at one rate for a
// soak. Zero values take the defaults (WithDefaults).
type LoadOptions struct {
	// EPPBin is the EPP binary. Default "bin/epp".
	EPPBin string
	// Floor runs `FloorBin floor`, a no-op ext_proc server that answers
	// message for message as the EPP does (testgw.Floor), in the EPP's
	// place: the same ladder then measures what gRPC, the harness and the
	// machine cost alone, the floor under the EPP's figures. FloorBin
	// defaults to "bin/bench". No soak, no KV events.
	Floor    bool
	FloorBin string
	// Policy is the scheduler policy. Default "precise".
	Policy string
	// Model is the served model name. Default "Qwen/Qwen3-32B".
	Model string
	// Tokenizer is how the EPP gets prompt tokens: "standin" (the engine
	// simulator's tokenizer, the default), a directory holding the model's
	// tokenizer.json and tokenizer_config.json (a real BPE tokenizer and
	// chat template, as in production), or "none" (no tokenizer: every
	// request is routed in approximate mode).
	Tokenizer string
	// AllRates runs every rate of the ladder instead of stopping at the
	// first one over budget, to map the whole curve.
	AllRates bool
	// Replicas is how many stub backends. Default 4.
	Replicas int
	// PromptBytes is the size of each request body. Default 32 KiB (an
	// 8k-token chat with the stand-in tokenizer, about 4 bytes a token).
	PromptBytes int
	// Groups is how many system prompts the requests share; each request
	// is its group's system prompt (SharedFraction of the body) plus a
	// unique user turn. Default 16.
	Groups int
	// SharedFraction is the share of the prompt that is the group's system
	// prompt. Default 0.75.
	SharedFraction float64
	// KVEvents makes each stub publish its groups' system prompts as
	// stored KV blocks before the run, so the index holds what a warm
	// fleet's would. Default true (set NoKVEvents to disable).
	NoKVEvents bool
	// Rates is the ladder of offered requests per second.
	Rates []float64
	// Step is how long each rate is measured, after StepWarmup at that
	// rate. Defaults 10s and 2s.
	Step, StepWarmup time.Duration
	// MaxInFlight bounds the requests in flight; a request that would pass
	// it is not sent and counted as dropped (the step then fails). Default
	// 512.
	MaxInFlight int
	// Timeout bounds one request. Default 10s.
	Timeout time.Duration
	// HTTP sends every request over loopback HTTP to the test gateway, and
	// from it to the stubs. By default the load generator calls the
	// gateway in process and the stubs answer it in process, so the
	// machine's CPU goes to the ext_proc exchange being measured (a real
	// gRPC stream to the EPP process either way), as it would with Envoy
	// and clients on other cores.
	HTTP bool
	// BudgetP99 is the largest p99 added latency a step may have, and
	// BudgetErrors the largest error share. Defaults 2ms and 0.001. A step
	// also fails when it delivers under 95% of its offered rate.
	BudgetP99    time.Duration
	BudgetErrors float64

	// Soak, when set, replaces the ladder: SoakRate is held for Soak while
	// the EPP's heap and RSS are sampled every SoakSample; after
	// SoakWarmup, the linear-fit growth over the rest of the run must stay
	// under SoakMaxGrowth bytes for both (fitted on the series' floor,
	// see MemTrend). Defaults 250/s, 5s, 1m, 32 MiB.
	Soak          time.Duration
	SoakRate      float64
	SoakSample    time.Duration
	SoakWarmup    time.Duration
	SoakMaxGrowth int64

	// Dir holds the EPP's config, endpoint file and log. Default: a new
	// temporary directory, removed afterwards.
	Dir      string
	Log      *zap.Logger
	Progress io.Writer
}

// DefaultLoadRates is the default ladder.
func DefaultLoadRates() []float64 {
	return []float64{250, 500, 1000, 1500, 2000, 2500, 3000, 4000, 5000}
}

// WithDefaults fills every unset field.
func (o LoadOptions) WithDefaults() LoadOptions {
	def := func(s *string, v string) {
		if *s == "" {
			*s = v
		}
	}
	def(&o.EPPBin, "bin/epp")
	def(&o.FloorBin, "bin/bench")
	def(&o.Policy, "precise")
	def(&o.Model, "Qwen/Qwen3-32B")
	def(&o.Tokenizer, "standin")
	defInt := func(p *int, v int) {
		if *p == 0 {
			*p = v
		}
	}
	defInt(&o.Replicas, 4)
	defInt(&o.PromptBytes, 32<<10)
	defInt(&o.Groups, 16)
	defInt(&o.MaxInFlight, 512)
	defDur := func(p *time.Duration, v time.Duration) {
		if *p == 0 {
			*p = v
		}
	}
	defDur(&o.Step, 10*time.Second)
	defDur(&o.StepWarmup, 2*time.Second)
	defDur(&o.Timeout, 10*time.Second)
	defDur(&o.BudgetP99, 2*time.Millisecond)
	defDur(&o.SoakSample, 5*time.Second)
	defDur(&o.SoakWarmup, time.Minute)
	if o.SharedFraction == 0 {
		o.SharedFraction = 0.75
	}
	if len(o.Rates) == 0 {
		o.Rates = DefaultLoadRates()
	}
	if o.BudgetErrors == 0 {
		o.BudgetErrors = 0.001
	}
	if o.SoakRate == 0 {
		o.SoakRate = 250
	}
	if o.SoakMaxGrowth == 0 {
		o.SoakMaxGrowth = 32 << 20
	}
	if o.Log == nil {
		o.Log = zap.NewNop()
	}
	return o
}

// Validate reports options that cannot work.
func (o LoadOptions) Validate() error {
	var errs []error
	if o.Replicas < 1 || o.Groups < 1 || o.MaxInFlight < 1 {
		errs = append(errs, errors.New("replicas, groups and max in-flight must be positive"))
	}
	if o.PromptBytes < 1024 {
		errs = append(errs, fmt.Errorf("prompt bytes %d: want at least 1024", o.PromptBytes))
	}
	if o.SharedFraction < 0 || o.SharedFraction >= 1 {
		errs = append(errs, fmt.Errorf("shared fraction %v: want [0, 1)", o.SharedFraction))
	}
	for _, r := range o.Rates {
		if !(r > 0) {
			errs = append(errs, fmt.Errorf("rate %v: want > 0", r))
		}
	}
	if o.Floor && o.Soak > 0 {
		errs = append(errs, errors.New("floor: no soak (the no-op server has no memory to watch)"))
	}
	if o.Soak > 0 && (!(o.SoakRate > 0) || o.SoakSample <= 0 || o.SoakWarmup < 0 || o.SoakWarmup >= o.Soak) {
		errs = append(errs, errors.New("soak: want a positive rate and sample interval, and a warm-up shorter than the soak"))
	}
	return errors.Join(errs...)
}

// LoadStep is one measured rate.
type LoadStep struct {
	Rate    float64 `json:"offered_per_s"`
	Seconds float64 `json:"seconds"`
	OK      int     `json:"ok"`
	Errors  int     `json:"errors"`
	Dropped int     `json:"dropped"`
	// Decisions is successful routed requests per second.
	Decisions float64 `json:"decisions_per_s"`
	// EPPCores is the EPP process's CPU time over wall time; PerEPPCore
	// is decisions per EPP CPU-second.
	EPPCores   float64 `json:"epp_cores"`
	PerEPPCore float64 `json:"decisions_per_epp_cpu_s"`
	// BenchCores is this process's CPU (load generator, test gateway,
	// stubs) over wall time; HostCores the whole machine's busy CPU.
	BenchCores float64 `json:"bench_cores"`
	HostCores  float64 `json:"host_busy_cores"`
	// Added latency (ms): the time the gateway waited on the EPP for the
	// request (testgw.Timing.Request + Response).
	AddedP50 float64 `json:"added_p50_ms"`
	AddedP99 float64 `json:"added_p99_ms"`
	// RouteP50 and RouteP99 (ms) are the EPP's own share of the added
	// latency, from its omnious_extproc_route_duration_seconds histogram
	// (interpolated within buckets); zero for the floor server.
	RouteP50 float64 `json:"epp_route_p50_ms,omitempty"`
	RouteP99 float64 `json:"epp_route_p99_ms,omitempty"`
	// RequestP99 is the request-path part alone; E2E is the client's
	// whole request through gateway, EPP and stub.
	RequestP99 float64 `json:"request_path_p99_ms"`
	E2EP50     float64 `json:"e2e_p50_ms"`
	E2EP99     float64 `json:"e2e_p99_ms"`
	Pass       bool    `json:"pass"`
	Why        string  `json:"why,omitempty"`
}

// MemSample is one soak sample of the EPP's memory, with what the machine
// did since the previous sample (to tell a stall of the EPP from a machine
// taken by other work).
type MemSample struct {
	At        float64 `json:"at_s"`
	Heap      float64 `json:"heap_inuse_bytes"`
	RSS       float64 `json:"rss_bytes"`
	InFlight  int64   `json:"in_flight"`
	EPPCores  float64 `json:"epp_cores"`
	HostCores float64 `json:"host_busy_cores"`
}

// MemTrend summarises one memory series after the warm-up.
type MemTrend struct {
	First, Last, Max float64
	// SlopePerMin is the least-squares slope of every sample in bytes per
	// minute, and Growth that slope over the measured span.
	SlopePerMin float64
	Growth      float64
	// FloorGrowth is the same fit over the floor of the series (the
	// minimum of each tenth of the samples, at least 3): a leak raises the floor,
	// while a transient backlog (a burst of buffered requests when the
	// machine stalls, memory the runtime returns to the OS minutes later)
	// only raises the peaks. The verdict uses it.
	FloorGrowth float64
}

// SoakResult is a soak's outcome.
type SoakResult struct {
	Load      LoadStep    `json:"load"`
	Samples   []MemSample `json:"samples"`
	Warmup    float64     `json:"warmup_s"`
	Heap      MemTrend    `json:"heap"`
	RSS       MemTrend    `json:"rss"`
	MaxGrowth float64     `json:"max_growth_bytes"`
	// ErrorBudget is the largest share of failed or dropped requests.
	ErrorBudget float64 `json:"error_budget"`
	// MemoryPass is the memory verdict alone; Pass also needs the load
	// held within the error budget.
	MemoryPass bool   `json:"memory_pass"`
	Pass       bool   `json:"pass"`
	Why        string `json:"why,omitempty"`
}

// LoadReport is the outcome of `bench load`.
type LoadReport struct {
	// Floor: a no-op ext_proc server stood in for the EPP.
	Floor        bool       `json:"floor,omitempty"`
	Policy       string     `json:"policy"`
	Tokenizer    string     `json:"tokenizer"`
	Replicas     int        `json:"replicas"`
	PromptBytes  int        `json:"prompt_bytes"`
	PromptTokens int        `json:"prompt_tokens"`
	CPUs         int        `json:"cpus"`
	IndexBlocks  int        `json:"index_blocks"`
	BudgetP99    float64    `json:"budget_p99_ms"`
	Steps        []LoadStep `json:"steps,omitempty"`
	// Sustained is the fastest step within budget (nil: none).
	Sustained *LoadStep   `json:"sustained,omitempty"`
	Soak      *SoakResult `json:"soak,omitempty"`
	// EPPDecisions is the EPP's own count of routed requests over the run,
	// a cross-check of the client's.
	EPPDecisions float64 `json:"epp_decisions"`
	ClientOK     int     `json:"client_ok"`
}

// RunLoad starts the stubs, the EPP process and the gateway, runs the ladder
// (or the soak) and stops everything.
func RunLoad(ctx context.Context, o LoadOptions) (rep *LoadReport, err error) {
	o = o.WithDefaults()
	if err := o.Validate(); err != nil {
		return nil, fmt.Errorf("bad load options: %w", err)
	}
	dir := o.Dir
	if dir == "" {
		if dir, err = os.MkdirTemp("", "bench-load-"); err != nil {
			return nil, fmt.Errorf("cannot create a work directory: %w", err)
		}
		defer os.RemoveAll(dir)
	}
	w, err := newLoadWorkload(o)
	if err != nil {
		return nil, err
	}
	var stubs []*stub
	defer func() {
		for _, s := range stubs {
			err = errors.Join(err, s.Close())
		}
	}()
	for range o.Replicas {
		s, serr := startStub(o.Model, w.tokens, !o.NoKVEvents, o.Log)
		if serr != nil {
			return nil, serr
		}
		stubs = append(stubs, s)
	}
	var epp *eppProcess
	if o.Floor {
		epp, err = startFloorProcess(ctx, o.FloorBin, dir, stubs)
	} else {
		epp, err = startEPPProcess(ctx, o.EPPBin, dir, o.Policy, o.Model, o.Tokenizer, stubs)
	}
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, epp.Close()) }()

	l := &loader{o: o, w: w, epp: epp}
	gwCfg := testgw.Config{EPP: epp.grpcAddr, OnExchange: l.onExchange}
	if !o.HTTP {
		gwCfg.Upstream = newStubUpstream(stubs)
	}
	gw, err := testgw.New(gwCfg, o.Log.Named("gateway"))
	if err != nil {
		return nil, fmt.Errorf("cannot start the test gateway: %w", err)
	}
	gwCtx, stopGW := context.WithCancel(context.Background())
	gwDone := make(chan error, 1)
	go func() { gwDone <- gw.Run(gwCtx) }()
	defer func() {
		stopGW()
		err = errors.Join(err, <-gwDone)
	}()
	l.url = "http://" + gw.Addr() + "/v1/chat/completions"
	if o.HTTP {
		l.http = &http.Client{Transport: newTransport(), Timeout: o.Timeout}
		defer l.http.CloseIdleConnections()
	} else {
		l.gw = gw
	}

	rep = &LoadReport{Floor: o.Floor, Policy: o.Policy, Tokenizer: o.Tokenizer, Replicas: o.Replicas, PromptBytes: w.bytes, PromptTokens: w.tokens,
		CPUs: runtime.NumCPU(), BudgetP99: ms(o.BudgetP99)}
	if !o.Floor && !o.NoKVEvents && len(w.system) > 0 {
		if rep.IndexBlocks, err = l.warmIndex(ctx, stubs); err != nil {
			return rep, err
		}
	}
	// A first pass over every group, so speculative state and connection
	// pools are warm before anything is measured.
	if _, err := l.step(ctx, math.Min(o.Rates[0], 100), time.Duration(0), time.Second); err != nil {
		return rep, err
	}
	if o.Soak > 0 {
		rep.Soak, err = l.soak(ctx)
	} else {
		for _, rate := range o.Rates {
			st, serr := l.step(ctx, rate, o.StepWarmup, o.Step)
			if serr != nil {
				return rep, serr
			}
			rep.Steps = append(rep.Steps, st)
			l.progress("rate %6.0f/s: %7.1f decisions/s, EPP %.2f cores, %6.0f decisions/EPP-CPU-s, added p50 %.3f ms p99 %.3f ms (EPP's own %.3f / %.3f), errors %d, dropped %d %s\n",
				rate, st.Decisions, st.EPPCores, st.PerEPPCore, st.AddedP50, st.AddedP99, st.RouteP50, st.RouteP99, st.Errors, st.Dropped, st.Why)
			if !st.Pass {
				if o.AllRates {
					continue
				}
				break
			}
			if rep.Sustained == nil || st.Decisions > rep.Sustained.Decisions {
				s := st
				rep.Sustained = &s
			}
		}
	}
	rep.ClientOK = int(l.okTotal.Load())
	if o.Floor {
		return rep, nil
	}
	if rep.EPPDecisions, err = epp.counter(ctx, "inference_objective_request_total"); err != nil {
		return rep, err
	}
	return rep, nil
}

// loadWorkload is the request bodies: per group, a template whose user turn
// starts with a 16-digit counter, so every request is unique past its
// group's system prompt.
type loadWorkload struct {
	templates [][]byte
	counterAt []int
	system    [][]uint32 // per group: the system prompt's tokens as the EPP renders them
	bytes     int
	tokens    int
	next      atomic.Uint64
}

const counterDigits = 16

func newLoadWorkload(o LoadOptions) (*loadWorkload, error) {
	w := &loadWorkload{}
	var prompter extproc.Prompter
	switch o.Tokenizer {
	case "standin":
		prompter = extproc.NewStandInPrompter()
	case "none":
	default:
		tok, err := tokenizer.Load(o.Model, o.Tokenizer)
		if err != nil {
			return nil, fmt.Errorf("cannot load the tokenizer: %w", err)
		}
		tmpl, err := tok.NewChatTemplate()
		if err != nil {
			return nil, fmt.Errorf("cannot load the chat template: %w", err)
		}
		prompter = extproc.NewTokenPrompter(map[string]extproc.ModelTokenizer{o.Model: {Tokenizer: tok, Template: tmpl}}, nil)
	}
	for g := range o.Groups {
		// JSON and role overhead is small; fill the rest with text.
		textBytes := o.PromptBytes - 160
		sysText := loadText(uint64(g)<<32, int(float64(textBytes)*o.SharedFraction))
		userText := loadText(uint64(g)<<32|1, textBytes-len(sysText)-counterDigits-1)
		sys, _ := json.Marshal(sysText)
		user, _ := json.Marshal(strings.Repeat("0", counterDigits) + " " + userText)
		var b bytes.Buffer
		b.WriteString(`{"model":`)
		m, _ := json.Marshal(o.Model)
		b.Write(m)
		b.WriteString(`,"max_tokens":1,"messages":[{"role":"system","content":`)
		b.Write(sys)
		b.WriteString(`},{"role":"user","content":`)
		at := b.Len() + 1
		b.Write(user)
		b.WriteString(`}]}`)
		w.templates = append(w.templates, b.Bytes())
		w.counterAt = append(w.counterAt, at)

		w.bytes = max(w.bytes, b.Len())
		if prompter == nil {
			continue // no tokens: nothing to put in the index
		}
		msgs := b.Bytes()[bytes.Index(b.Bytes(), []byte(`[{"role"`)) : b.Len()-1]
		full, ok := prompter.Prompt(o.Model, &extproc.PromptInput{API: extproc.APIChat, Messages: msgs, AddGenerationPrompt: true})
		sysOnly, ok2 := prompter.Prompt(o.Model, &extproc.PromptInput{API: extproc.APIChat,
			Messages: []byte(`[{"role":"system","content":` + string(sys) + `}]`), AddGenerationPrompt: false})
		if !ok || !ok2 {
			return nil, errors.New("the tokenizer cannot render the load workload")
		}
		n := 0
		for n < len(sysOnly) && n < len(full) && sysOnly[n] == full[n] {
			n++
		}
		w.system = append(w.system, full[:n])
		w.tokens = max(w.tokens, len(full))
	}
	return w, nil
}

// loadText is n bytes of words of 1 to 5 letters after a space: the
// stand-in tokenizer reads each as one token, so the text has about one
// token per 4 bytes, as English has with real tokenizers.
func loadText(seed uint64, n int) string {
	var b strings.Builder
	b.Grow(n + 8)
	for i := uint64(0); b.Len() < n; i++ {
		x := mix(seed ^ mix(i))
		b.WriteByte(' ')
		for k := 1 + int(x%5); k > 0 && b.Len() < n; k-- {
			x /= 26
			b.WriteByte(byte('a' + x%26))
		}
	}
	return b.String()
}

// body returns a new unique request body and its group.
func (w *loadWorkload) body() []byte {
	n := w.next.Add(1)
	g := int(n % uint64(len(w.templates)))
	t := w.templates[g]
	b := make([]byte, len(t))
	copy(b, t)
	d := strconv.AppendUint(make([]byte, 0, 20), n, 10)
	copy(b[w.counterAt[g]+counterDigits-len(d):], d)
	return b
}

// window collects one measured interval's observations.
type window struct {
	mu          sync.Mutex
	added, reqs []time.Duration
	e2e         []time.Duration
	ok, errs    int
}

type loader struct {
	o        LoadOptions
	w        *loadWorkload
	epp      *eppProcess
	url      string
	http     *http.Client // with HTTP
	gw       http.Handler // without
	cur      atomic.Pointer[window]
	inflight atomic.Int64
	okTotal  atomic.Int64
}

func (l *loader) progress(format string, args ...any) {
	if l.o.Progress != nil {
		fmt.Fprintf(l.o.Progress, format, args...)
	}
}

// onExchange receives the gateway's view of every request.
func (l *loader) onExchange(t testgw.Timing) {
	w := l.cur.Load()
	if w == nil || t.Status != http.StatusOK {
		return
	}
	w.mu.Lock()
	w.added = append(w.added, t.Request+t.Response)
	w.reqs = append(w.reqs, t.Request)
	w.mu.Unlock()
}

// warmIndex publishes each group's system prompt from the stub the group
// belongs to (group g on stub g mod replicas) and waits until the EPP's
// index holds them. ZMQ drops what is published before the EPP's
// subscription is live, so it publishes again until the blocks show up.
func (l *loader) warmIndex(ctx context.Context, stubs []*stub) (int, error) {
	const blockSize = 16
	want := map[string]int{}
	for g, toks := range l.w.system {
		want[stubs[g%len(stubs)].Addr()] += len(toks) / blockSize
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		for g, toks := range l.w.system {
			if err := stubs[g%len(stubs)].publishBlocks(toks, blockSize, uint64(g)); err != nil {
				return 0, err
			}
		}
		time.Sleep(300 * time.Millisecond)
		got, err := l.epp.residentBlocks(ctx)
		if err != nil {
			return 0, err
		}
		total, ready := 0, true
		for addr, n := range want {
			total += got[addr]
			ready = ready && got[addr] >= n
		}
		if ready {
			return total, nil
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("the EPP's index holds %v blocks per stub after 20s, want %v", got, want)
		}
	}
}

// drive offers rate requests per second, open loop, until dur passed.
func (l *loader) drive(ctx context.Context, rate float64, dur time.Duration, dropped *atomic.Int64, wg *sync.WaitGroup) {
	start := time.Now()
	sent := 0
	for ctx.Err() == nil {
		el := time.Since(start)
		if el >= dur {
			return
		}
		due := int(el.Seconds()*rate) + 1
		for ; sent < due; sent++ {
			if l.inflight.Load() >= int64(l.o.MaxInFlight) {
				dropped.Add(1)
				continue
			}
			l.inflight.Add(1)
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer l.inflight.Add(-1)
				l.one(ctx)
			}()
		}
		time.Sleep(time.Millisecond)
	}
}

func (l *loader) one(ctx context.Context) {
	start := time.Now()
	ok := l.send(ctx)
	took := time.Since(start)
	if ok {
		l.okTotal.Add(1)
	}
	w := l.cur.Load()
	if w == nil {
		return
	}
	w.mu.Lock()
	if ok {
		w.ok++
		w.e2e = append(w.e2e, took)
	} else {
		w.errs++
	}
	w.mu.Unlock()
}

// send sends one request and reads its whole answer; ok is a 200 read
// whole.
func (l *loader) send(ctx context.Context) (ok bool) {
	if l.http == nil { // no HTTP client's Timeout in process: bound it here
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, l.o.Timeout)
		defer cancel()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, l.url, bytes.NewReader(l.w.body()))
	if err != nil {
		return false
	}
	req.Header["Content-Type"] = []string{"application/json"}
	if l.http == nil {
		return serveInProcess(l.gw, req) == http.StatusOK
	}
	resp, err := l.http.Do(req)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	_, err = io.Copy(io.Discard, resp.Body)
	return err == nil && resp.StatusCode == http.StatusOK
}

// counters is a snapshot of the CPU clocks a step reads.
type loadClocks struct {
	at              time.Time
	epp, self, host time.Duration
	route           []bucket // the EPP's route-duration histogram (stepClocks only)
}

func (l *loader) clocks() (loadClocks, error) {
	c := loadClocks{at: time.Now(), self: cputime.Clock()}
	var err1, err2 error
	c.epp, err1 = l.epp.cpu()
	c.host, err2 = hostBusy()
	return c, errors.Join(err1, err2)
}

// stepClocks is clocks plus the EPP's route histogram, which a step's
// quantiles of the EPP's own latency need (the floor server has none).
func (l *loader) stepClocks(ctx context.Context) (loadClocks, error) {
	c, err := l.clocks()
	if err == nil && !l.o.Floor {
		c.route, err = l.epp.routeHistogram(ctx)
	}
	return c, err
}

// step offers rate for warmup (not measured) then measure, and summarises
// the measured interval.
func (l *loader) step(ctx context.Context, rate float64, warmup, measure time.Duration) (LoadStep, error) {
	var dropped atomic.Int64
	var wg sync.WaitGroup
	done := make(chan struct{})
	go func() {
		defer close(done)
		l.drive(ctx, rate, warmup+measure, &dropped, &wg)
	}()
	if err := sleepCtx(ctx, warmup); err != nil {
		<-done
		wg.Wait()
		return LoadStep{}, err
	}
	w := &window{}
	c0, err := l.stepClocks(ctx)
	if err != nil {
		<-done
		wg.Wait()
		return LoadStep{}, err
	}
	d0 := dropped.Load()
	l.cur.Store(w)
	<-done
	l.cur.Store(nil)
	c1, err := l.stepClocks(ctx)
	d1 := dropped.Load()
	wg.Wait()
	if err != nil {
		return LoadStep{}, err
	}
	if err := ctx.Err(); err != nil {
		return LoadStep{}, err
	}
	return l.summarise(rate, w, c0, c1, int(d1-d0)), nil
}

func (l *loader) summarise(rate float64, w *window, c0, c1 loadClocks, dropped int) LoadStep {
	w.mu.Lock()
	defer w.mu.Unlock()
	wall := c1.at.Sub(c0.at).Seconds()
	st := LoadStep{Rate: rate, Seconds: wall, OK: w.ok, Errors: w.errs, Dropped: dropped}
	st.Decisions = float64(w.ok) / wall
	eppCPU := (c1.epp - c0.epp).Seconds()
	st.EPPCores = eppCPU / wall
	if eppCPU > 0 {
		st.PerEPPCore = float64(w.ok) / eppCPU
	}
	st.BenchCores = (c1.self - c0.self).Seconds() / wall
	st.HostCores = (c1.host - c0.host).Seconds() / wall
	added := msSorted(w.added, 1)
	st.AddedP50, st.AddedP99 = percentile(added, 50), percentile(added, 99)
	st.RequestP99 = percentile(msSorted(w.reqs, 1), 99)
	if p50 := histogramQuantile(0.5, c0.route, c1.route); !math.IsNaN(p50) {
		st.RouteP50, st.RouteP99 = 1000*p50, 1000*histogramQuantile(0.99, c0.route, c1.route)
	}
	e2e := msSorted(w.e2e, 1)
	st.E2EP50, st.E2EP99 = percentile(e2e, 50), percentile(e2e, 99)
	var why []string
	total := w.ok + w.errs + dropped
	switch {
	case w.ok == 0:
		why = append(why, "no request succeeded")
	case float64(w.errs+dropped) > l.o.BudgetErrors*float64(total):
		why = append(why, fmt.Sprintf("errors %d + dropped %d of %d over %.2g%%", w.errs, dropped, total, 100*l.o.BudgetErrors))
	}
	if st.Decisions < 0.95*rate {
		why = append(why, fmt.Sprintf("delivered %.0f/s of %.0f/s offered", st.Decisions, rate))
	}
	if !(st.AddedP99 <= ms(l.o.BudgetP99)) {
		why = append(why, fmt.Sprintf("p99 added %.3f ms over %.3f ms", st.AddedP99, ms(l.o.BudgetP99)))
	}
	st.Pass = len(why) == 0
	st.Why = strings.Join(why, "; ")
	return st
}

// soak holds SoakRate for Soak, sampling the EPP's memory.
func (l *loader) soak(ctx context.Context) (*SoakResult, error) {
	o := l.o
	res := &SoakResult{Warmup: o.SoakWarmup.Seconds(), MaxGrowth: float64(o.SoakMaxGrowth), ErrorBudget: o.BudgetErrors}
	sctx, stop := context.WithCancel(ctx)
	defer stop()
	var sampleErr error
	sampled := make(chan struct{})
	start := time.Now()
	go func() {
		defer close(sampled)
		tick := time.NewTicker(o.SoakSample)
		defer tick.Stop()
		prev, _ := l.clocks()
		for {
			heap, rss, err := l.epp.memory(sctx)
			if err != nil {
				if sctx.Err() == nil {
					sampleErr = err
				}
				return
			}
			ms := MemSample{At: time.Since(start).Seconds(), Heap: heap, RSS: rss, InFlight: l.inflight.Load()}
			if c, err := l.clocks(); err == nil {
				if wall := c.at.Sub(prev.at).Seconds(); wall > 0 {
					ms.EPPCores, ms.HostCores = (c.epp-prev.epp).Seconds()/wall, (c.host-prev.host).Seconds()/wall
				}
				prev = c
			}
			res.Samples = append(res.Samples, ms)
			if len(res.Samples)%max(1, int(time.Minute/o.SoakSample)) == 0 {
				l.progress("soak %5.0fs: heap in use %.1f MiB, RSS %.1f MiB\n", ms.At, heap/(1<<20), rss/(1<<20))
			}
			if ms.InFlight > int64(o.MaxInFlight)/4 {
				l.progress("soak %5.0fs: %d requests in flight, EPP %.2f cores, host %.2f busy cores, heap in use %.1f MiB\n",
					ms.At, ms.InFlight, ms.EPPCores, ms.HostCores, heap/(1<<20))
			}
			select {
			case <-sctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	st, err := l.step(ctx, o.SoakRate, 0, o.Soak)
	// One last sample at the end of the load.
	if heap, rss, merr := l.epp.memory(ctx); merr == nil {
		stop()
		<-sampled
		res.Samples = append(res.Samples, MemSample{At: time.Since(start).Seconds(), Heap: heap, RSS: rss})
	} else {
		stop()
		<-sampled
	}
	if err != nil {
		return res, err
	}
	if sampleErr != nil {
		return res, sampleErr
	}
	res.Load = st
	if err := res.judge(); err != nil {
		return res, err
	}
	return res, nil
}

// judge fits the memory samples after the warm-up and gives the verdict.
func (res *SoakResult) judge() error {
	var after []MemSample
	for _, s := range res.Samples {
		if s.At >= res.Warmup {
			after = append(after, s)
		}
	}
	if len(after) < 3 {
		return fmt.Errorf("soak: %d memory samples after the warm-up, need 3 (sample more often or soak longer)", len(after))
	}
	res.Heap = memTrend(after, func(s MemSample) float64 { return s.Heap })
	res.RSS = memTrend(after, func(s MemSample) float64 { return s.RSS })
	var why []string
	if res.Heap.FloorGrowth > res.MaxGrowth {
		why = append(why, fmt.Sprintf("heap floor grew %.1f MiB (fit) after the warm-up, limit %.1f MiB", res.Heap.FloorGrowth/(1<<20), res.MaxGrowth/(1<<20)))
	}
	if res.RSS.FloorGrowth > res.MaxGrowth {
		why = append(why, fmt.Sprintf("RSS floor grew %.1f MiB (fit) after the warm-up, limit %.1f MiB", res.RSS.FloorGrowth/(1<<20), res.MaxGrowth/(1<<20)))
	}
	res.MemoryPass = len(why) == 0
	// Latency is the ladder's business; a soak fails on memory, and on
	// errors or drops over the error budget.
	l := res.Load
	if total := l.OK + l.Errors + l.Dropped; total == 0 || float64(l.Errors+l.Dropped) > res.ErrorBudget*float64(total) {
		why = append(why, fmt.Sprintf("load: %d errors and %d dropped of %d requests", l.Errors, l.Dropped, total))
	}
	res.Pass = len(why) == 0
	res.Why = strings.Join(why, "; ")
	return nil
}

// memTrend fits a least-squares line to one series.
func memTrend(ss []MemSample, v func(MemSample) float64) MemTrend {
	t := MemTrend{First: v(ss[0]), Last: v(ss[len(ss)-1])}
	xs := make([]float64, len(ss))
	ys := make([]float64, len(ss))
	for i, s := range ss {
		xs[i], ys[i] = s.At, v(s)
		t.Max = math.Max(t.Max, ys[i])
	}
	span := xs[len(xs)-1] - xs[0]
	slope := linearSlope(xs, ys)
	t.SlopePerMin = slope * 60
	t.Growth = slope * span
	// The floor: the lowest sample of each tenth (at least 3 samples,
	// keeping at least 3 points to fit), at its own time.
	per := max(1, min(len(ss)/3, max(3, len(ss)/10)))
	k := len(ss) / per // windows of per to per+k-1 samples: no short last one
	var fx, fy []float64
	for w := 0; w < k; w++ {
		lo := w * len(ss) / k
		for j := lo; j < (w+1)*len(ss)/k; j++ {
			if ys[j] < ys[lo] {
				lo = j
			}
		}
		fx, fy = append(fx, xs[lo]), append(fy, ys[lo])
	}
	t.FloorGrowth = linearSlope(fx, fy) * span
	return t
}

// linearSlope is the least-squares slope of ys over xs (0 when undefined).
func linearSlope(xs, ys []float64) float64 {
	n := float64(len(xs))
	var sx, sy float64
	for i := range xs {
		sx += xs[i]
		sy += ys[i]
	}
	mx, my := sx/n, sy/n
	var num, den float64
	for i := range xs {
		num += (xs[i] - mx) * (ys[i] - my)
		den += (xs[i] - mx) * (xs[i] - mx)
	}
	if den == 0 {
		return 0
	}
	return num / den
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// WriteTable prints the report.
func (r *LoadReport) WriteTable(w io.Writer) error {
	var b strings.Builder
	if r.Floor {
		fmt.Fprintf(&b, "FLOOR: a no-op ext_proc server in the EPP's place (EPP columns are its), %d stub replicas, %d-byte chat prompts, %d CPUs\n",
			r.Replicas, r.PromptBytes, r.CPUs)
	} else {
		fmt.Fprintf(&b, "EPP %s policy, %s tokenizer, %d stub replicas, %d-byte chat prompts (%d tokens), %d CPUs, index %d blocks\n",
			r.Policy, r.Tokenizer, r.Replicas, r.PromptBytes, r.PromptTokens, r.CPUs, r.IndexBlocks)
	}
	if len(r.Steps) > 0 {
		b.WriteString("| offered/s | decisions/s | EPP cores | decisions/EPP-CPU-s | bench cores | host busy cores | added p50 ms | added p99 ms | EPP's own p50 / p99 ms | e2e p99 ms | errors | dropped | within budget |\n")
		b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
		for _, s := range r.Steps {
			verdict := "yes"
			if !s.Pass {
				verdict = "no: " + s.Why
			}
			own := "-"
			if s.RouteP50 > 0 {
				own = fmt.Sprintf("%.3f / %.3f", s.RouteP50, s.RouteP99)
			}
			fmt.Fprintf(&b, "| %.0f | %.0f | %.2f | %.0f | %.2f | %.2f | %.3f | %.3f | %s | %.2f | %d | %d | %s |\n",
				s.Rate, s.Decisions, s.EPPCores, s.PerEPPCore, s.BenchCores, s.HostCores, s.AddedP50, s.AddedP99, own, s.E2EP99, s.Errors, s.Dropped, verdict)
		}
		if s := r.Sustained; s != nil {
			fmt.Fprintf(&b, "sustained: %.0f decisions/s (%.0f per machine core, %.0f per EPP CPU-second) with p99 added %.3f ms (budget %.3f ms)\n",
				s.Decisions, s.Decisions/float64(r.CPUs), s.PerEPPCore, s.AddedP99, r.BudgetP99)
		} else {
			fmt.Fprintf(&b, "sustained: no rate within budget (p99 added <= %.3f ms)\n", r.BudgetP99)
		}
	}
	if s := r.Soak; s != nil {
		l := s.Load
		fmt.Fprintf(&b, "soak: %.0f s at %.0f/s: %.0f decisions/s, EPP %.2f cores, added p50 %.3f ms p99 %.3f ms, errors %d, dropped %d\n",
			l.Seconds, l.Rate, l.Decisions, l.EPPCores, l.AddedP50, l.AddedP99, l.Errors, l.Dropped)
		mib := func(v float64) float64 { return v / (1 << 20) }
		for _, m := range []struct {
			name string
			t    MemTrend
		}{{"heap in use", s.Heap}, {"RSS", s.RSS}} {
			fmt.Fprintf(&b, "soak %s after %.1f s warm-up: first %.1f MiB, last %.1f MiB, max %.1f MiB, slope %+.3f MiB/min, fit growth %+.1f MiB, floor fit growth %+.1f MiB (limit %.0f MiB)\n",
				m.name, s.Warmup, mib(m.t.First), mib(m.t.Last), mib(m.t.Max), mib(m.t.SlopePerMin), mib(m.t.Growth), mib(m.t.FloorGrowth), mib(s.MaxGrowth))
		}
		verdict := "PASS"
		if !s.Pass {
			verdict = "FAIL: " + s.Why
		}
		memory := "PASS"
		if !s.MemoryPass {
			memory = "FAIL"
		}
		fmt.Fprintf(&b, "soak: memory %s; overall %s\n", memory, verdict)
	}
	if !r.Floor {
		fmt.Fprintf(&b, "EPP decisions %.0f, client successes %d\n", r.EPPDecisions, r.ClientOK)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// WriteJSON writes the report to path.
func (r *LoadReport) WriteJSON(path string) error {
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return fmt.Errorf("cannot encode the load report: %w", err)
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		return fmt.Errorf("cannot write the load report: %w", err)
	}
	return nil
}

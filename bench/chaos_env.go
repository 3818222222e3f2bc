package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	dto "github.com/prometheus/client_model/go"
	"go.uber.org/zap"
	"go.yaml.in/yaml/v3"

	"github.com/omnious/provider-node/discovery"
	"github.com/omnious/provider-node/endpoint"
	"github.com/omnious/provider-node/engines/sim"
	"github.com/omnious/provider-node/extproc/testgw"
	"github.com/omnious/provider-node/internal/epp"
	"github.com/omnious/provider-node/scheduler"
)

// The chaos fleet's timings. Scrapes are fast so that a scenario sees
// several of them per second; the breaker and ingestion keep their
// production thresholds (failure_threshold 3, max_backoff 5s), so the
// measured recovery times are those a deployment with this scrape
// interval would see.
const (
	chaosScrapeInterval = 200 * time.Millisecond
	chaosScrapeTimeout  = 200 * time.Millisecond
	chaosStaleAfter     = time.Second
	chaosCooldown       = 2 * time.Second
	chaosTimeScale      = 10
	chaosModel          = "Qwen/Qwen3-32B"
)

// chaosEnv is one scenario's world: enginesim processes on loopback, the
// real EPP in process, the test gateway in front of it.
type chaosEnv struct {
	log  *zap.Logger
	bin  string
	dir  string
	http *http.Client

	sims   []*simProc
	eppCfg epp.Config
	eps    discovery.Fixed

	mu        sync.Mutex // guards e (swapped by restartEPP)
	e         *epp.EPP
	eppCancel context.CancelFunc
	eppDone   chan error

	gwURL    string
	gwCancel context.CancelFunc
	gwDone   chan error
}

// simProc is one enginesim process. Its ports are fixed at creation, so a
// killed replica comes back at the same address.
type simProc struct {
	idx                int
	cfgPath            string
	addr, base         string
	kvEvents, kvReplay string
	cmd                *exec.Cmd
	wait               chan error
	bin                string
	stopped            bool
}

// chaosSetup tunes one scenario's environment.
type chaosSetup struct {
	replicas int
	// noReplay lists replicas whose replay endpoint the EPP is not told:
	// a gap on them cannot be filled.
	noReplay []int
	// mutate adjusts the scheduler config.
	mutate func(*scheduler.Config)
}

func newChaosEnv(ctx context.Context, bin string, s chaosSetup, log *zap.Logger) (env *chaosEnv, err error) {
	dir, err := os.MkdirTemp("", "bench-chaos-")
	if err != nil {
		return nil, fmt.Errorf("cannot create chaos dir: %w", err)
	}
	env = &chaosEnv{log: log, bin: bin, dir: dir, http: &http.Client{Transport: newTransport(), Timeout: 30 * time.Second}}
	defer func() {
		if err != nil {
			_ = env.Close()
			env = nil
		}
	}()
	for i := 0; i < s.replicas; i++ {
		p, err := env.newSim(i)
		if err != nil {
			return env, err
		}
		env.sims = append(env.sims, p)
		if err := p.start(ctx, env); err != nil {
			return env, err
		}
	}

	sc := scheduler.DefaultConfig()
	sc.Policy = scheduler.PolicyPrecise
	sc.Seed = 1
	sc.Signals.ScrapeInterval = chaosScrapeInterval
	sc.Signals.ScrapeTimeout = chaosScrapeTimeout
	sc.Signals.StaleAfter = chaosStaleAfter
	sc.Breaker.Cooldown = chaosCooldown
	// Speculative credit would hide what the index itself knows.
	sc.Prefix.SpeculativeTTL = new(300 * time.Millisecond)
	if s.mutate != nil {
		s.mutate(&sc)
	}
	if err := sc.Validate(); err != nil {
		return env, fmt.Errorf("invalid chaos scheduler config: %w", err)
	}
	ports, err := freePorts(4)
	if err != nil {
		return env, err
	}
	at := func(p int) string { return fmt.Sprintf("127.0.0.1:%d", p) }
	// Fixed ports, so that a restarted EPP is where the gateway looks.
	cfg := epp.Config{GRPCAddr: at(ports[0]), HealthAddr: at(ports[1]), MetricsAddr: at(ports[2]), AdminAddr: at(ports[3]),
		Scheduler: sc, DrainTimeout: new(2 * time.Second), StandInTokenizer: true}
	// One endpoint per decision, as behind Envoy's ORIGINAL_DST cluster:
	// a request routed to a dead replica fails instead of being rescued
	// by the gateway's fallback walk, so the client sees what the EPP did.
	cfg.ExtProc.MaxEndpoints = new(1)
	env.eppCfg = cfg.WithDefaults()
	noReplay := map[int]bool{}
	for _, i := range s.noReplay {
		noReplay[i] = true
	}
	for i, p := range env.sims {
		ep := endpoint.Endpoint{Addr: p.addr, Model: chaosModel, Engine: "vllm", MetricsURL: p.base + "/metrics", KVEvents: p.kvEvents}
		if !noReplay[i] {
			ep.KVReplay = p.kvReplay
		}
		env.eps = append(env.eps, ep)
	}
	if err := env.startEPP(); err != nil {
		return env, err
	}
	gw, err := testgw.New(testgw.Config{EPP: env.eppCfg.GRPCAddr}, log.Named("gateway"))
	if err != nil {
		return env, fmt.Errorf("cannot start the test gateway: %w", err)
	}
	env.gwURL = "http://" + gw.Addr()
	gctx, gcancel := context.WithCancel(context.Background())
	env.gwCancel, env.gwDone = gcancel, make(chan error, 1)
	go func() { env.gwDone <- gw.Run(gctx) }()
	if err := waitReady(ctx, env.epp(), len(env.sims)); err != nil {
		return env, err
	}
	for _, p := range env.sims {
		if err := env.sync(ctx, p); err != nil {
			return env, err
		}
	}
	return env, nil
}

func (env *chaosEnv) newSim(i int) (*simProc, error) {
	ports, err := freePorts(3)
	if err != nil {
		return nil, err
	}
	c := sim.Config{Listen: fmt.Sprintf("127.0.0.1:%d", ports[0]), Seed: 1, Model: chaosModel}
	c.KVEvents.Endpoint = fmt.Sprintf("tcp://127.0.0.1:%d", ports[1])
	c.KVEvents.ReplayEndpoint = fmt.Sprintf("tcp://127.0.0.1:%d", ports[2])
	c.Engine.TimeScale = chaosTimeScale
	// A small cache: evictions happen, so the index has removals to follow.
	c.Engine.NumGPUBlocks = 2000
	c = c.WithDefaults()
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("invalid replica config: %w", err)
	}
	b, err := yaml.Marshal(c)
	if err != nil {
		return nil, fmt.Errorf("cannot encode replica config: %w", err)
	}
	path := filepath.Join(env.dir, fmt.Sprintf("replica-%d.yaml", i))
	if err := os.WriteFile(path, b, 0o600); err != nil {
		return nil, fmt.Errorf("cannot write replica config: %w", err)
	}
	return &simProc{idx: i, cfgPath: path, addr: c.Listen, base: "http://" + c.Listen,
		kvEvents: c.KVEvents.Endpoint, kvReplay: c.KVEvents.ReplayEndpoint, bin: env.bin}, nil
}

// start runs the process and waits until it answers /health.
func (p *simProc) start(ctx context.Context, env *chaosEnv) error {
	cmd := exec.Command(p.bin, "-config", p.cfgPath, "-log-level", "error")
	cmd.Stdout, cmd.Stderr = io.Discard, os.Stderr
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("cannot start enginesim %d: %w", p.idx, err)
	}
	p.cmd, p.wait, p.stopped = cmd, make(chan error, 1), false
	go func() { p.wait <- cmd.Wait() }()
	f := &Fleet{http: env.http}
	if err := f.waitHealthy(ctx, p.base, p.wait); err != nil {
		return fmt.Errorf("enginesim %d: %w", p.idx, err)
	}
	return nil
}

// kill ends the process with SIGKILL, as a crash: no clean shutdown.
func (p *simProc) kill() error {
	if p.stopped {
		return nil
	}
	if err := p.cmd.Process.Kill(); err != nil {
		return fmt.Errorf("cannot kill enginesim %d: %w", p.idx, err)
	}
	<-p.wait
	p.stopped = true
	return nil
}

// stop ends the process with SIGTERM, killing it after 10s.
func (p *simProc) stop() error {
	if p.stopped || p.cmd == nil {
		return nil
	}
	p.stopped = true
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-p.wait:
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			return fmt.Errorf("enginesim %d: %w", p.idx, err)
		}
		return nil
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.wait
		return fmt.Errorf("enginesim %d did not stop in 10s: killed", p.idx)
	}
}

func (env *chaosEnv) epp() *epp.EPP {
	env.mu.Lock()
	defer env.mu.Unlock()
	return env.e
}

// startEPP runs a new EPP on the configured (fixed) ports.
func (env *chaosEnv) startEPP() error {
	e, err := epp.New(env.eppCfg, env.eps, env.log.Named("epp"))
	if err != nil {
		return fmt.Errorf("cannot start the EPP: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	env.mu.Lock()
	env.e, env.eppCancel, env.eppDone = e, cancel, done
	env.mu.Unlock()
	return nil
}

// stopEPP drains and stops the running EPP.
func (env *chaosEnv) stopEPP() error {
	env.mu.Lock()
	cancel, done := env.eppCancel, env.eppDone
	env.eppCancel, env.eppDone = nil, nil
	env.mu.Unlock()
	if cancel == nil {
		return nil
	}
	cancel()
	if err := <-done; err != nil {
		return fmt.Errorf("EPP: %w", err)
	}
	return nil
}

// Close stops everything the environment started: gateway, EPP, every
// enginesim process; then removes its files.
func (env *chaosEnv) Close() error {
	var errs []error
	if env.gwCancel != nil {
		env.gwCancel()
		if err := <-env.gwDone; err != nil {
			errs = append(errs, fmt.Errorf("gateway: %w", err))
		}
		env.gwCancel = nil // Close may run again (a test's cleanup)
	}
	errs = append(errs, env.stopEPP())
	for _, p := range env.sims {
		errs = append(errs, p.stop())
	}
	env.http.CloseIdleConnections()
	errs = append(errs, os.RemoveAll(env.dir))
	return errors.Join(errs...)
}

// sync makes the index start from a state it saw whole: ZMQ drops what is
// published before the subscription connects, so a probe request is sent
// until its blocks show in the index, then the replica is restarted
// (AllBlocksCleared) and its index entries are seen to be gone.
func (env *chaosEnv) sync(ctx context.Context, p *simProc) error {
	for i := 0; ; i++ {
		if _, err := env.complete(ctx, chaosPrompt(fmt.Sprintf("sync %d %d", p.idx, i), 80), 1, p.addr); err != nil {
			return fmt.Errorf("sync of replica %d: %w", p.idx, err)
		}
		n, err := env.indexBlocks(ctx, p.addr)
		if err != nil {
			return err
		}
		if n > 0 {
			break
		}
		if i >= 100 {
			return fmt.Errorf("replica %d: its KV events never reached the index", p.idx)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := env.post(ctx, p.base+"/admin/restart", `{}`); err != nil {
		return err
	}
	_, err := waitFor(ctx, 10*time.Second, func() (bool, error) {
		n, err := env.indexBlocks(ctx, p.addr)
		return n == 0, err
	})
	if err != nil {
		return fmt.Errorf("replica %d: index not cleared after restart: %w", p.idx, err)
	}
	return nil
}

// chaosPrompt is a prompt of about words stand-in tokens, distinct per tag.
func chaosPrompt(tag string, words int) string {
	var b strings.Builder
	for i := 0; i < words; i++ {
		fmt.Fprintf(&b, "%s-w%d ", tag, i%7)
	}
	return b.String()
}

// complete sends one non-streamed completion through the gateway, pinned
// to addr when it is not empty (the gateway's subset hint). It returns the
// HTTP status; err is a transport error.
func (env *chaosEnv) complete(ctx context.Context, prompt string, maxTokens int, addr string) (int, error) {
	body, _ := json.Marshal(map[string]any{"model": chaosModel, "prompt": prompt, "max_tokens": maxTokens, "ignore_eos": true})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, env.gwURL+"/v1/completions", bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	if addr != "" {
		req.Header.Set(testgw.HeaderSubsetHint, addr)
	}
	resp, err := env.http.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	_, err = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, err
}

// streamResult is how a streamed completion ended for the client.
type streamResult struct {
	status int
	chunks int
	done   bool // saw data: [DONE]
	err    error
	ended  time.Time
}

// stream sends a streamed completion pinned to addr; first is closed once
// the first content chunk arrived.
func (env *chaosEnv) stream(ctx context.Context, prompt string, maxTokens int, addr string, first chan<- struct{}) streamResult {
	body, _ := json.Marshal(map[string]any{"model": chaosModel, "prompt": prompt, "max_tokens": maxTokens, "ignore_eos": true, "stream": true})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, env.gwURL+"/v1/completions", bytes.NewReader(body))
	if err != nil {
		return streamResult{err: err, ended: time.Now()}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(testgw.HeaderSubsetHint, addr)
	resp, err := env.http.Do(req)
	if err != nil {
		return streamResult{err: err, ended: time.Now()}
	}
	defer resp.Body.Close()
	r := streamResult{status: resp.StatusCode}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "data: ") {
			continue
		}
		if line == "data: [DONE]" {
			r.done = true
			continue
		}
		r.chunks++
		if r.chunks == 1 && first != nil {
			close(first)
		}
	}
	r.err, r.ended = sc.Err(), time.Now()
	return r
}

func (env *chaosEnv) post(ctx context.Context, url, body string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := env.http.Do(req)
	if err != nil {
		return fmt.Errorf("POST %s: %w", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("POST %s: status %d: %s", url, resp.StatusCode, bytes.TrimSpace(b))
	}
	return nil
}

func (env *chaosEnv) getJSON(ctx context.Context, url string, v any) error {
	return getJSON(ctx, env.http, url, v)
}

// indexBlocks is what the EPP's admin view says the index holds for addr.
func (env *chaosEnv) indexBlocks(ctx context.Context, addr string) (int, error) {
	var view []struct {
		Addr     string `json:"Addr"`
		Resident int    `json:"resident_blocks"`
	}
	if err := env.getJSON(ctx, "http://"+env.eppCfg.AdminAddr+"/debug/endpoints", &view); err != nil {
		return 0, err
	}
	for _, v := range view {
		if v.Addr == addr {
			return v.Resident, nil
		}
	}
	return 0, fmt.Errorf("the EPP does not list %s", addr)
}

// truthBlocks is how many GPU blocks the engine holds (GET /admin/blocks).
func (env *chaosEnv) truthBlocks(ctx context.Context, p *simProc) (int, error) {
	var view struct {
		Blocks []struct {
			Medium string `json:"medium"`
		} `json:"blocks"`
	}
	if err := env.getJSON(ctx, p.base+"/admin/blocks", &view); err != nil {
		return 0, err
	}
	n := 0
	for _, b := range view.Blocks {
		if b.Medium == "" || b.Medium == "GPU" {
			n++
		}
	}
	return n, nil
}

// agrees reports whether the index holds exactly the engine's blocks for p
// (counts; the ingest tests pin the block-by-block agreement).
func (env *chaosEnv) agrees(ctx context.Context, p *simProc) (bool, int, int, error) {
	ix, err := env.indexBlocks(ctx, p.addr)
	if err != nil {
		return false, 0, 0, err
	}
	tr, err := env.truthBlocks(ctx, p)
	if err != nil {
		return false, ix, 0, err
	}
	return ix == tr, ix, tr, nil
}

// engineLoad is a replica's cumulative prompt tokens plus its running and
// waiting requests: it changes whenever the replica is sent a request.
func (env *chaosEnv) engineLoad(ctx context.Context, p *simProc) (int64, error) {
	var st struct {
		Engine struct {
			Running, Waiting int
			PromptTokens     int64
		} `json:"engine"`
	}
	if err := env.getJSON(ctx, p.base+"/admin/stats", &st); err != nil {
		return 0, err
	}
	return st.Engine.PromptTokens + int64(st.Engine.Running+st.Engine.Waiting), nil
}

// metric returns the EPP's current value of the series name whose labels
// include want; ok is false when there is none.
func (env *chaosEnv) metric(name string, want map[string]string) (float64, bool) {
	mfs, err := env.epp().Registry().Gather()
	if err != nil {
		return 0, false
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		sum, found := 0.0, false
		for _, m := range mf.GetMetric() {
			if !labelsMatch(m, want) {
				continue
			}
			found = true
			switch {
			case m.GetCounter() != nil:
				sum += m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				sum += m.GetGauge().GetValue()
			}
		}
		return sum, found
	}
	return 0, false
}

func labelsMatch(m *dto.Metric, want map[string]string) bool {
	n := 0
	for _, lp := range m.GetLabel() {
		if v, ok := want[lp.GetName()]; ok {
			if v != lp.GetValue() {
				return false
			}
			n++
		}
	}
	return n == len(want)
}

// breaker is the EPP's breaker state for addr (0 closed, 1 open, 2 half-open).
func (env *chaosEnv) breaker(addr string) int {
	v, _ := env.metric("omnious_epp_breaker_state", map[string]string{"endpoint": addr})
	return int(v)
}

func (env *chaosEnv) stale(addr string) bool {
	v, _ := env.metric("omnious_epp_replica_stale", map[string]string{"endpoint": addr})
	return v == 1
}

func (env *chaosEnv) seqEvents(addr, event string) float64 {
	v, _ := env.metric("omnious_epp_kv_sequence_total", map[string]string{"replica": addr, "event": event})
	return v
}

// waitFor polls cond every 20ms until it holds, returning how long that
// took, or fails after limit.
func waitFor(ctx context.Context, limit time.Duration, cond func() (bool, error)) (time.Duration, error) {
	start := time.Now()
	deadline := start.Add(limit)
	var lastErr error
	for {
		ok, err := cond()
		if ok && err == nil {
			return time.Since(start), nil
		}
		lastErr = err
		if time.Now().After(deadline) {
			if lastErr != nil {
				return time.Since(start), fmt.Errorf("not within %v: %w", limit, lastErr)
			}
			return time.Since(start), fmt.Errorf("not within %v", limit)
		}
		select {
		case <-ctx.Done():
			return time.Since(start), ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// probe is one request of a background probe loop.
type probe struct {
	at, end time.Time
	status  int
	err     error
}

func (p probe) ok() bool { return p.err == nil && p.status == http.StatusOK }

// prober sends a fresh unpinned request every interval until stopped.
type prober struct {
	mu     sync.Mutex
	probes []probe
	cancel context.CancelFunc
	done   chan struct{}
}

// startProber sends requests from workers goroutines, one every interval
// each; prompt gives worker w's i-th prompt (nil: a fresh 60-word prompt).
func (env *chaosEnv) startProber(ctx context.Context, tag string, every time.Duration, workers int, prompt func(w, i int) string) *prober {
	if prompt == nil {
		prompt = func(w, i int) string { return chaosPrompt(fmt.Sprintf("%s-%d-%d", tag, w, i), 60) }
	}
	pctx, cancel := context.WithCancel(ctx)
	pr := &prober{cancel: cancel, done: make(chan struct{})}
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; pctx.Err() == nil; i++ {
				at := time.Now()
				rctx, rcancel := context.WithTimeout(pctx, 10*time.Second)
				status, err := env.complete(rctx, prompt(w, i), 4, "")
				rcancel()
				if pctx.Err() != nil {
					return
				}
				pr.mu.Lock()
				pr.probes = append(pr.probes, probe{at: at, end: time.Now(), status: status, err: err})
				pr.mu.Unlock()
				select {
				case <-pctx.Done():
				case <-time.After(time.Until(at.Add(every))):
				}
			}
		}()
	}
	go func() { wg.Wait(); close(pr.done) }()
	return pr
}

func (pr *prober) stop() []probe {
	pr.cancel()
	<-pr.done
	return pr.snapshot()
}

func (pr *prober) snapshot() []probe {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	return append([]probe(nil), pr.probes...)
}

// failures counts failed probes sent at or after from (zero time: all).
func failures(ps []probe, from time.Time) (failed, total int) {
	for _, p := range ps {
		if p.at.Before(from) {
			continue
		}
		total++
		if !p.ok() {
			failed++
		}
	}
	return failed, total
}

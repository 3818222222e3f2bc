package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"
	"go.yaml.in/yaml/v3"

	"github.com/omnious/provider-node/engines/sim"
)

// Fleet is a started set of replicas. Stop it exactly once.
type Fleet struct {
	endpoints []FleetEndpoint
	simulated bool
	stop      func() error
	http      *http.Client
}

// Endpoints are the replicas, in a stable order.
func (f *Fleet) Endpoints() []FleetEndpoint { return f.endpoints }

// Stop stops every replica the bench started and waits for them.
func (f *Fleet) Stop() error {
	f.http.CloseIdleConnections()
	if f.stop == nil {
		return nil
	}
	return f.stop()
}

// simConfig is one simulated replica's configuration.
func simConfig(o FleetOptions, seed int64, maxLen int) sim.Config {
	c := sim.Config{Listen: "127.0.0.1:0", Seed: seed, Model: o.Model, MaxModelLen: o.MaxModelLen}
	if c.MaxModelLen == 0 {
		c.MaxModelLen = max(40960, maxLen+16)
	}
	c.KVEvents.Endpoint = "tcp://127.0.0.1:0"
	c.KVEvents.ReplayEndpoint = "tcp://127.0.0.1:0"
	c.Engine.Flavour = o.Engine
	c.Engine.TimeScale = o.TimeScale
	c.Engine.NumGPUBlocks = o.NumGPUBlocks
	c.Engine.BlockSize = o.BlockSize
	c.Engine.MaxNumBatchedTokens = o.MaxNumBatchedTokens
	c.Engine.Timing = o.Timing
	return c.WithDefaults()
}

// StartFleet starts (or, for URLs, attaches to) the fleet. Every replica
// gets the same seed, so outputs do not depend on routing. maxLen is the
// workload's longest request, to size simulated context limits.
func StartFleet(ctx context.Context, o FleetOptions, seed int64, maxLen int, log *zap.Logger) (*Fleet, error) {
	f := &Fleet{http: &http.Client{Transport: newTransport(), Timeout: 10 * time.Second}}
	var err error
	switch o.Mode {
	case FleetInProcess:
		err = f.startInProcess(o, seed, maxLen, log)
	case FleetProcess:
		err = f.startProcesses(ctx, o, seed, maxLen)
	case FleetURLs:
		err = f.attach(ctx, o)
	default:
		err = fmt.Errorf("unknown fleet mode %q", o.Mode)
	}
	if err != nil {
		_ = f.Stop()
		return nil, err
	}
	return f, nil
}

func (f *Fleet) startInProcess(o FleetOptions, seed int64, maxLen int, log *zap.Logger) error {
	f.simulated = true
	cfg := simConfig(o, seed, maxLen)
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("invalid replica config: %w", err)
	}
	runCtx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var errMu sync.Mutex
	var runErrs []error
	f.stop = func() error {
		cancel()
		wg.Wait()
		errMu.Lock()
		defer errMu.Unlock()
		return errors.Join(runErrs...)
	}
	for i := 0; i < o.Replicas; i++ {
		r, err := sim.NewReplica(cfg, 0, log.With(zap.Int("replica", i)))
		if err != nil {
			return fmt.Errorf("cannot start replica %d: %w", i, err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := r.Run(runCtx); err != nil {
				errMu.Lock()
				runErrs = append(runErrs, err)
				errMu.Unlock()
			}
		}()
		ep, err := f.describe(context.Background(), "http://"+r.Addr(), cfg.Model, cfg.Engine.Flavour)
		if err != nil {
			return err
		}
		f.endpoints = append(f.endpoints, ep)
	}
	return nil
}

// describe reads a simulated replica's bound KV-event endpoints.
func (f *Fleet) describe(ctx context.Context, base, model, flavour string) (FleetEndpoint, error) {
	u, _ := url.Parse(base)
	ep := FleetEndpoint{Addr: u.Host, Model: model, Engine: flavour, MetricsURL: base + "/metrics"}
	var stats struct {
		KVEvents struct {
			Endpoint       string `json:"endpoint"`
			ReplayEndpoint string `json:"replay_endpoint"`
		} `json:"kv_events"`
	}
	if err := getJSON(ctx, f.http, base+"/admin/stats", &stats); err != nil {
		return ep, fmt.Errorf("cannot read replica %s stats: %w", base, err)
	}
	ep.KVEvents, ep.KVReplay = stats.KVEvents.Endpoint, stats.KVEvents.ReplayEndpoint
	return ep, nil
}

// getJSON GETs url with client and decodes its JSON body into v.
func getJSON(ctx context.Context, client *http.Client, url string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		return fmt.Errorf("GET %s: %w", url, err)
	}
	return nil
}

// sumSeries sums, for each of names, the values of its series in a
// Prometheus text exposition (labels ignored, a trailing timestamp too);
// seen[i] reports whether names[i] had any. A series whose value does not
// parse is skipped and reported in err, after the whole page is read.
func sumSeries(r io.Reader, names ...string) (sums []float64, seen []bool, err error) {
	sums, seen = make([]float64, len(names)), make([]bool, len(names))
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Bytes()
		end := bytes.IndexAny(line, "{ ")
		if len(line) == 0 || line[0] == '#' || end < 0 {
			continue
		}
		i := slices.Index(names, string(line[:end]))
		if i < 0 {
			continue
		}
		rest := line[end:]
		if rest[0] == '{' {
			close := bytes.LastIndexByte(rest, '}')
			if close < 0 {
				continue
			}
			rest = rest[close+1:]
		}
		fields := bytes.Fields(rest)
		if len(fields) == 0 {
			continue
		}
		v, perr := strconv.ParseFloat(string(fields[0]), 64)
		if perr != nil {
			if err == nil {
				err = fmt.Errorf("cannot parse %q: %w", line, perr)
			}
			continue
		}
		sums[i] += v
		seen[i] = true
	}
	if serr := sc.Err(); serr != nil {
		return sums, seen, fmt.Errorf("cannot read metrics: %w", serr)
	}
	return sums, seen, err
}

// freePorts reserves n loopback ports by binding and releasing them; a
// small race with other programs is accepted (the start then fails loudly).
func freePorts(n int) ([]int, error) {
	var lns []net.Listener
	defer func() {
		for _, l := range lns {
			l.Close()
		}
	}()
	var ports []int
	for i := 0; i < n; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("cannot reserve a port: %w", err)
		}
		lns = append(lns, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

func (f *Fleet) startProcesses(ctx context.Context, o FleetOptions, seed int64, maxLen int) error {
	f.simulated = true
	bin, err := exec.LookPath(o.EnginesimBin)
	if err != nil {
		return fmt.Errorf("cannot find enginesim binary %q (run make build, or pass its path): %w", o.EnginesimBin, err)
	}
	dir, err := os.MkdirTemp("", "bench-fleet-")
	if err != nil {
		return fmt.Errorf("cannot create fleet dir: %w", err)
	}
	cfg := simConfig(o, seed, maxLen)
	if err := cfg.Validate(); err != nil {
		os.RemoveAll(dir)
		return fmt.Errorf("invalid replica config: %w", err)
	}
	var procs []*exec.Cmd
	var waits []chan error
	f.stop = func() error {
		var errs []error
		for i, p := range procs {
			_ = p.Process.Signal(syscall.SIGTERM)
			select {
			case err := <-waits[i]:
				var ee *exec.ExitError
				if err != nil && !errors.As(err, &ee) {
					errs = append(errs, err)
				}
			case <-time.After(10 * time.Second):
				_ = p.Process.Kill()
				<-waits[i]
				errs = append(errs, fmt.Errorf("enginesim %d did not stop in 10s: killed", i))
			}
		}
		os.RemoveAll(dir)
		return errors.Join(errs...)
	}
	for i := 0; i < o.Replicas; i++ {
		ports, err := freePorts(3)
		if err != nil {
			return err
		}
		c := cfg
		c.Listen = fmt.Sprintf("127.0.0.1:%d", ports[0])
		c.KVEvents.Endpoint = fmt.Sprintf("tcp://127.0.0.1:%d", ports[1])
		c.KVEvents.ReplayEndpoint = fmt.Sprintf("tcp://127.0.0.1:%d", ports[2])
		b, err := yaml.Marshal(c)
		if err != nil {
			return fmt.Errorf("cannot encode replica config: %w", err)
		}
		path := filepath.Join(dir, fmt.Sprintf("replica-%d.yaml", i))
		if err := os.WriteFile(path, b, 0o600); err != nil {
			return fmt.Errorf("cannot write replica config: %w", err)
		}
		cmd := exec.Command(bin, "-config", path, "-log-level", "warn")
		cmd.Stdout, cmd.Stderr = io.Discard, os.Stderr
		if err := cmd.Start(); err != nil {
			return fmt.Errorf("cannot start enginesim: %w", err)
		}
		wait := make(chan error, 1)
		go func() { wait <- cmd.Wait() }()
		procs, waits = append(procs, cmd), append(waits, wait)
		base := "http://" + c.Listen
		if err := f.waitHealthy(ctx, base, wait); err != nil {
			return fmt.Errorf("enginesim %d: %w", i, err)
		}
		f.endpoints = append(f.endpoints, FleetEndpoint{Addr: c.Listen, Model: c.Model, Engine: c.Engine.Flavour,
			MetricsURL: base + "/metrics", KVEvents: c.KVEvents.Endpoint, KVReplay: c.KVEvents.ReplayEndpoint})
	}
	return nil
}

func (f *Fleet) waitHealthy(ctx context.Context, base string, exited chan error) error {
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case err := <-exited:
			exited <- err // Stop reads it again
			return fmt.Errorf("exited during start-up: %v", err)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/health", nil)
		if resp, err := f.http.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
	}
	return errors.New("not healthy after 15s")
}

// attach describes real endpoints; only loopback addresses are accepted.
func (f *Fleet) attach(ctx context.Context, o FleetOptions) error {
	for _, raw := range o.URLs {
		u, err := url.Parse(strings.TrimRight(raw, "/"))
		if err != nil || u.Host == "" {
			return fmt.Errorf("bad endpoint URL %q", raw)
		}
		host := u.Hostname()
		if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
			return fmt.Errorf("endpoint %q is not on loopback", raw)
		}
		base := u.Scheme + "://" + u.Host
		model := o.Model
		if model == "" {
			var models struct {
				Data []struct {
					ID string `json:"id"`
				} `json:"data"`
			}
			if err := getJSON(ctx, f.http, base+"/v1/models", &models); err != nil || len(models.Data) == 0 {
				return fmt.Errorf("cannot list models of %s (pass the model): %v", base, err)
			}
			model = models.Data[0].ID
		}
		f.endpoints = append(f.endpoints, FleetEndpoint{Addr: u.Host, Model: model, Engine: f.flavourOf(ctx, base), MetricsURL: base + "/metrics"})
	}
	return nil
}

// flavourOf guesses a real endpoint's engine from its metric names.
func (f *Fleet) flavourOf(ctx context.Context, base string) string {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/metrics", nil)
	if err != nil {
		return ""
	}
	resp, err := f.http.Do(req)
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	switch {
	case bytes.Contains(body, []byte("\nsglang:")):
		return "sglang"
	case bytes.Contains(body, []byte("\nvllm:")):
		return "vllm"
	}
	return ""
}

// resetCaches empties the prefix caches of real endpoints before a policy,
// so that it does not profit from the previous policy's cache: vLLM's
// POST /reset_prefix_cache (served in its dev mode) or SGLang's POST
// /flush_cache. It returns a warning naming the endpoints it could not reset.
func (f *Fleet) resetCaches(ctx context.Context) string {
	var failed []string
	for _, ep := range f.endpoints {
		ok := false
		for _, path := range []string{"/reset_prefix_cache", "/flush_cache"} {
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+ep.Addr+path, nil)
			if err != nil {
				continue
			}
			resp, err := f.http.Do(req)
			if err != nil {
				continue
			}
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				ok = true
				break
			}
		}
		if !ok {
			failed = append(failed, ep.Addr)
		}
	}
	if len(failed) == 0 {
		return ""
	}
	return "could not reset the prefix cache of " + strings.Join(failed, ", ") + ": this policy may profit from the previous one's cache"
}

// counters are a replica's cumulative engine counters.
type counters struct {
	OK                     bool // the replica exposed prefix-cache counters
	Queries, Hits          float64
	Requests, PromptTokens float64
}

func (c counters) sub(b counters) counters {
	return counters{OK: c.OK && b.OK, Queries: c.Queries - b.Queries, Hits: c.Hits - b.Hits,
		Requests: c.Requests - b.Requests, PromptTokens: c.PromptTokens - b.PromptTokens}
}

// Counters scrapes every replica's counters (a replica that cannot be read
// gives zero counters with OK false).
func (f *Fleet) counters(ctx context.Context) []counters {
	out := make([]counters, len(f.endpoints))
	for i, ep := range f.endpoints {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, ep.MetricsURL, nil)
		if err != nil {
			continue
		}
		resp, err := f.http.Do(req)
		if err != nil {
			continue
		}
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
		resp.Body.Close()
		out[i] = parseCounters(body)
	}
	return out
}

// counterNames are the engine counters parseCounters reads.
var counterNames = []string{"vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "vllm:request_success_total",
	"vllm:prompt_tokens_total", "sglang:cached_tokens_total", "sglang:prompt_tokens_total", "sglang:num_requests_total"}

// parseCounters sums the counters the bench needs over their label sets,
// for vLLM and SGLang names, from the Prometheus text format. Lines it
// cannot read are skipped.
func parseCounters(body []byte) counters {
	vals, seen, _ := sumSeries(bytes.NewReader(body), counterNames...)
	sums := make(map[string]float64, len(counterNames))
	for i, n := range counterNames {
		if seen[i] {
			sums[n] = vals[i]
		}
	}
	if _, ok := sums["vllm:prefix_cache_queries_total"]; ok {
		return counters{OK: true, Queries: sums["vllm:prefix_cache_queries_total"], Hits: sums["vllm:prefix_cache_hits_total"],
			Requests: sums["vllm:request_success_total"], PromptTokens: sums["vllm:prompt_tokens_total"]}
	}
	if _, ok := sums["sglang:cached_tokens_total"]; ok {
		return counters{OK: true, Queries: sums["sglang:prompt_tokens_total"], Hits: sums["sglang:cached_tokens_total"],
			Requests: sums["sglang:num_requests_total"], PromptTokens: sums["sglang:prompt_tokens_total"]}
	}
	return counters{Requests: sums["vllm:request_success_total"] + sums["sglang:num_requests_total"],
		PromptTokens: sums["vllm:prompt_tokens_total"] + sums["sglang:prompt_tokens_total"]}
}

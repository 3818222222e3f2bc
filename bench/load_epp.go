package bench

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/omnious/provider-node/capacity"
)

// clockTicks is Linux's USER_HZ, the unit of /proc/<pid>/stat CPU times
// (100 on every mainstream architecture).
const clockTicks = 100

// eppProcess is bin/epp (or `bench floor` in its place) running as a child
// process on loopback ports, so that its CPU time and memory are its own.
type eppProcess struct {
	cmd        *exec.Cmd
	grpcAddr   string
	metricsURL string
	adminURL   string
	stderr     *os.File
	exited     chan struct{}
	waitErr    error
}

// startEPPProcess writes the endpoint and config files into dir and runs
// bin against them: a static endpoint file naming the stubs, the tokenizer
// (LoadOptions.Tokenizer: with one, requests carry exact prompt tokens and
// the policy works on the index), and policy.
func startEPPProcess(ctx context.Context, bin, dir, policy, model, tok string, stubs []*stub) (*eppProcess, error) {
	type ep struct {
		IP     string `yaml:"ip"`
		Port   int    `yaml:"port"`
		KVPort int    `yaml:"kv_events_port,omitempty"`
	}
	var eps []ep
	for _, s := range stubs {
		a := s.ln.Addr().(*net.TCPAddr)
		eps = append(eps, ep{IP: "127.0.0.1", Port: a.Port, KVPort: s.KVPort()})
	}
	epFile := filepath.Join(dir, "endpoints.yaml")
	if err := writeYAML(epFile, map[string]any{"defaults": map[string]any{"model": model, "engine": "vllm"}, "endpoints": eps}); err != nil {
		return nil, err
	}
	ports, err := freePorts(4)
	if err != nil {
		return nil, err
	}
	addr := func(i int) string { return "127.0.0.1:" + strconv.Itoa(ports[i]) }
	cfgFile := filepath.Join(dir, "epp.yaml")
	cfg := map[string]any{
		"grpc_addr": addr(0), "health_addr": addr(1), "metrics_addr": addr(2), "admin_addr": addr(3),
		"endpoints_file": epFile, "drain_timeout": "2s",
		"scheduler": map[string]any{"policy": policy},
	}
	switch tok {
	case "standin":
		cfg["standin_tokenizer"] = true
	case "none":
	default:
		abs, err := filepath.Abs(tok)
		if err != nil {
			return nil, fmt.Errorf("bad tokenizer directory: %w", err)
		}
		cfg["tokenizers"] = map[string]string{model: abs}
	}
	if err := writeYAML(cfgFile, cfg); err != nil {
		return nil, err
	}
	p, err := startChild("the EPP", bin, dir, []string{"-config", cfgFile, "-log-level", "warn"})
	if err != nil {
		return nil, err
	}
	p.grpcAddr, p.metricsURL, p.adminURL = addr(0), "http://"+addr(2)+"/metrics", "http://"+addr(3)
	if err := p.ready(func() error { return p.waitReady(ctx, len(stubs)) }); err != nil {
		return nil, err
	}
	return p, nil
}

// startFloorProcess runs `bin floor` (a no-op ext_proc server routing to the
// stubs in turn) in the EPP's place.
func startFloorProcess(ctx context.Context, bin, dir string, stubs []*stub) (*eppProcess, error) {
	ports, err := freePorts(1)
	if err != nil {
		return nil, err
	}
	dests := make([]string, len(stubs))
	for i, s := range stubs {
		dests[i] = s.Addr()
	}
	addr := "127.0.0.1:" + strconv.Itoa(ports[0])
	p, err := startChild("the floor server", bin, dir, []string{"floor", "-grpc-addr", addr, "-dest", strings.Join(dests, ",")})
	if err != nil {
		return nil, err
	}
	p.grpcAddr = addr
	if err := p.ready(func() error { return p.waitListening(ctx) }); err != nil {
		return nil, err
	}
	return p, nil
}

// startChild starts bin with args, its output in dir's epp.log; what names
// it in errors.
func startChild(what, bin, dir string, args []string) (*eppProcess, error) {
	stderr, err := os.Create(filepath.Join(dir, "epp.log"))
	if err != nil {
		return nil, fmt.Errorf("cannot create the EPP log: %w", err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = stderr, stderr
	if err := cmd.Start(); err != nil {
		_ = stderr.Close()
		return nil, fmt.Errorf("cannot start %s %s: %w", what, bin, err)
	}
	p := &eppProcess{cmd: cmd, stderr: stderr, exited: make(chan struct{})}
	go func() { p.waitErr = cmd.Wait(); close(p.exited) }()
	return p, nil
}

// ready runs wait and, when it fails, stops the process and returns the
// error with the log's tail.
func (p *eppProcess) ready(wait func() error) error {
	if err := wait(); err != nil {
		_ = p.Close()
		return fmt.Errorf("%w (log: %s)", err, p.logTail())
	}
	return nil
}

// waitListening waits until the process accepts connections on grpcAddr.
func (p *eppProcess) waitListening(ctx context.Context) error {
	return p.poll(ctx, "nothing listens on "+p.grpcAddr, func() bool {
		c, err := net.DialTimeout("tcp", p.grpcAddr, time.Second)
		if err != nil {
			return false
		}
		_ = c.Close()
		return true
	})
}

// poll calls done every 50 ms until it reports true; it fails when the
// process exits, ctx ends or 30 s pass, the last with what it waited for.
func (p *eppProcess) poll(ctx context.Context, what string, done func() bool) error {
	deadline := time.Now().Add(30 * time.Second)
	for !done() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-p.exited:
			return fmt.Errorf("the process exited: %v", p.waitErr)
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s after 30s", what)
		}
	}
	return nil
}

func writeYAML(path string, v any) error {
	data, err := yaml.Marshal(v)
	if err != nil {
		return fmt.Errorf("cannot encode %s: %w", path, err)
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		return fmt.Errorf("cannot write %s: %w", path, err)
	}
	return nil
}

// waitReady waits until the EPP reports every replica healthy (scraped).
func (p *eppProcess) waitReady(ctx context.Context, replicas int) error {
	return p.poll(ctx, "the EPP does not see every replica healthy", func() bool {
		var snap capacity.Snapshot
		if err := getJSON(ctx, http.DefaultClient, p.adminURL+capacity.Path, &snap); err != nil {
			return false
		}
		healthy := 0
		for _, m := range snap.Models {
			healthy += m.Healthy
		}
		return healthy >= replicas
	})
}

// residentBlocks is the index's resident block count per endpoint address.
func (p *eppProcess) residentBlocks(ctx context.Context) (map[string]int, error) {
	var view []struct {
		Addr     string `json:"addr"`
		Resident int    `json:"resident_blocks"`
	}
	if err := getJSON(ctx, http.DefaultClient, p.adminURL+"/debug/endpoints", &view); err != nil {
		return nil, err
	}
	out := make(map[string]int, len(view))
	for _, v := range view {
		out[v.Addr] = v.Resident
	}
	return out, nil
}

// cpu is the EPP process's user+system CPU time, from /proc/<pid>/stat.
func (p *eppProcess) cpu() (time.Duration, error) { return procCPU(p.cmd.Process.Pid) }

func procCPU(pid int) (time.Duration, error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, fmt.Errorf("cannot read the EPP's CPU time: %w", err)
	}
	// Fields after the parenthesised command name: state is field 3,
	// utime 14 and stime 15.
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return 0, errors.New("cannot parse /proc/<pid>/stat")
	}
	f := strings.Fields(string(data[i+1:]))
	if len(f) < 13 {
		return 0, errors.New("cannot parse /proc/<pid>/stat: too few fields")
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("cannot parse /proc/<pid>/stat: %w", err)
	}
	return time.Duration(ut+st) * time.Second / clockTicks, nil
}

// hostBusy is the machine's busy (non-idle, non-iowait) CPU time summed
// over its CPUs, from /proc/stat.
func hostBusy() (time.Duration, error) {
	f, err := os.Open("/proc/stat")
	if err != nil {
		return 0, fmt.Errorf("cannot read host CPU time: %w", err)
	}
	defer f.Close()
	line, err := bufio.NewReader(f).ReadString('\n')
	if err != nil {
		return 0, fmt.Errorf("cannot read host CPU time: %w", err)
	}
	fields := strings.Fields(line)
	if len(fields) < 5 || fields[0] != "cpu" {
		return 0, errors.New("cannot parse /proc/stat")
	}
	var busy int64
	for i, s := range fields[1:] {
		if i == 3 || i == 4 { // idle, iowait
			continue
		}
		if i >= 7 { // guest time is already counted in user
			break
		}
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("cannot parse /proc/stat: %w", err)
		}
		busy += v
	}
	return time.Duration(busy) * time.Second / clockTicks, nil
}

// memory reads the EPP's Go heap in use and resident set from its /metrics.
func (p *eppProcess) memory(ctx context.Context) (heap, rss float64, err error) {
	vals, err := p.scrape(ctx, "go_memstats_heap_inuse_bytes", "process_resident_memory_bytes")
	if err != nil {
		return 0, 0, err
	}
	return vals[0], vals[1], nil
}

// counter sums the series of a metric in the EPP's /metrics.
func (p *eppProcess) counter(ctx context.Context, name string) (float64, error) {
	vals, err := p.scrape(ctx, name)
	if err != nil {
		return 0, err
	}
	return vals[0], nil
}

// scrape reads the EPP's /metrics and sums each named metric's series.
func (p *eppProcess) scrape(ctx context.Context, names ...string) ([]float64, error) {
	body, err := p.metrics(ctx)
	if err != nil {
		return nil, err
	}
	defer body.Close()
	return scrapeValues(body, names...)
}

// routeHistogram reads the EPP's omnious_extproc_route_duration_seconds.
func (p *eppProcess) routeHistogram(ctx context.Context) ([]bucket, error) {
	body, err := p.metrics(ctx)
	if err != nil {
		return nil, err
	}
	defer body.Close()
	return histogramBuckets(body, "omnious_extproc_route_duration_seconds")
}

func (p *eppProcess) metrics(ctx context.Context) (io.ReadCloser, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.metricsURL, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("cannot scrape the EPP: %w", err)
	}
	return resp.Body, nil
}

// bucket is one cumulative histogram bucket: n samples at most le.
type bucket struct{ le, n float64 }

// histogramBuckets reads the buckets of the unlabelled histogram name from
// a text exposition, in their order (+Inf last).
func histogramBuckets(r io.Reader, name string) ([]bucket, error) {
	prefix := []byte(name + `_bucket{le="`)
	var out []bucket
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		rest, ok := bytes.CutPrefix(sc.Bytes(), prefix)
		if !ok {
			continue
		}
		le, val, ok := bytes.Cut(rest, []byte(`"}`))
		if !ok {
			return nil, fmt.Errorf("cannot parse %q", sc.Text())
		}
		b := bucket{}
		var err1, err2 error
		b.le, err1 = strconv.ParseFloat(string(le), 64)
		b.n, err2 = strconv.ParseFloat(string(bytes.TrimSpace(val)), 64)
		if err := errors.Join(err1, err2); err != nil {
			return nil, fmt.Errorf("cannot parse %q: %w", sc.Text(), err)
		}
		out = append(out, b)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("cannot read metrics: %w", err)
	}
	if len(out) == 0 || !math.IsInf(out[len(out)-1].le, 1) {
		return nil, fmt.Errorf("histogram %s not found", name)
	}
	return out, nil
}

// histogramQuantile is Prometheus's histogram_quantile over the samples
// added between two readings of the same histogram: linear within the
// bucket that holds the rank; a rank in the +Inf bucket gives the largest
// finite bound. NaN when nothing was added.
func histogramQuantile(q float64, before, after []bucket) float64 {
	if len(before) != len(after) || len(after) == 0 {
		return math.NaN()
	}
	n := func(i int) float64 { return after[i].n - before[i].n }
	total := n(len(after) - 1)
	if !(total > 0) {
		return math.NaN()
	}
	rank := q * total
	lo, below := 0.0, 0.0
	for i, b := range after {
		if c := n(i); c >= rank {
			if math.IsInf(b.le, 1) {
				return lo
			}
			if c == below {
				return b.le
			}
			return lo + (b.le-lo)*(rank-below)/(c-below)
		}
		lo, below = b.le, n(i)
	}
	return lo
}

// scrapeValues sums each named metric's series in a text exposition; a name
// without any series, or a series that does not parse, is an error.
func scrapeValues(r io.Reader, names ...string) ([]float64, error) {
	vals, seen, err := sumSeries(r, names...)
	if err != nil {
		return nil, err
	}
	for i, ok := range seen {
		if !ok {
			return nil, fmt.Errorf("metric %s not found", names[i])
		}
	}
	return vals, nil
}

func (p *eppProcess) logTail() string {
	data, err := os.ReadFile(p.stderr.Name())
	if err != nil {
		return err.Error()
	}
	if len(data) > 2000 {
		data = data[len(data)-2000:]
	}
	return strings.TrimSpace(string(data))
}

// Close stops the EPP: SIGTERM, then SIGKILL after 5 s.
func (p *eppProcess) Close() error {
	select {
	case <-p.exited:
	default:
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.exited:
		case <-time.After(5 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.exited
		}
	}
	_ = p.stderr.Close()
	var ee *exec.ExitError
	if p.waitErr != nil && !errors.As(p.waitErr, &ee) {
		return fmt.Errorf("EPP: %w", p.waitErr)
	}
	if ee != nil && !ee.Exited() {
		return nil // ended by our signal
	}
	if p.waitErr != nil {
		return fmt.Errorf("EPP exited badly: %w (log: %s)", p.waitErr, p.logTail())
	}
	return nil
}

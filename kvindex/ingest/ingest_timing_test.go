package ingest

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/omnious/provider-node/internal/cputime"
	"github.com/omnious/provider-node/kvindex"
)

// publishersEnv, set in a child's environment, makes the test binary a
// fleet of that many KV-event publishers (runPublishers) instead of
// running tests, so that the benchmark's process holds the ingestion alone.
const publishersEnv = "OMNIOUS_INGEST_BENCH_PUBLISHERS"

// batchRateEnv is the child's batches per second per publisher.
const batchRateEnv = "OMNIOUS_INGEST_BENCH_RATE"

// firstEnv is the fleet-wide number of the child's first publisher: each
// publisher's blocks differ from every other's.
const firstEnv = "OMNIOUS_INGEST_BENCH_FIRST"

func TestMain(m *testing.M) {
	if n, _ := strconv.Atoi(os.Getenv(publishersEnv)); n > 0 {
		rate, _ := strconv.ParseFloat(os.Getenv(batchRateEnv), 64)
		first, _ := strconv.Atoi(os.Getenv(firstEnv))
		if err := runPublishers(first, n, rate, os.Stdout, os.Stdin); err != nil {
			fmt.Fprintln(os.Stderr, "publishers:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// slots is how many requests a simulated engine runs: each step stores one
// 16-token block for each, chained to that request's previous block.
const (
	slots      = 16
	chainLimit = 64 // blocks per request before it ends and its blocks are freed
	benchBlock = 16
	// systemPrompts is how many first blocks the engines' requests share:
	// every request starts on one of them (the same tokens on every
	// engine, so one index key held by every engine, as a system prompt),
	// then goes on with blocks of its own.
	systemPrompts = 16
)

// mix64 is SplitMix64's finaliser.
func mix64(z uint64) uint64 {
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return z ^ z>>31
}

// runPublishers binds n publishers on loopback, numbered from first,
// writes their endpoints to out one a line, then publishes rate batches a
// second from each, their phases spread evenly over one period, until in
// closes; then it writes one line of what it sent: "sent N late N
// max-late D cpu D".
func runPublishers(first, n int, rate float64, out io.Writer, in io.Reader) error {
	f, err := newPubFleet(first, n, rate)
	if err != nil {
		return err
	}
	defer f.close()
	w := bufio.NewWriter(out)
	for _, ep := range f.endpoints() {
		fmt.Fprintln(w, ep)
	}
	if err := w.Flush(); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() { _, _ = io.Copy(io.Discard, in); cancel() }()
	cpu0 := cputime.Clock()
	f.run(ctx)
	sent, late, worst := f.stats()
	fmt.Fprintf(w, "sent %d late %d max-late %v cpu %v\n", sent, late, worst.Round(time.Millisecond),
		(cputime.Clock() - cpu0).Round(time.Millisecond))
	return w.Flush()
}

// lagRecorder keeps every apply lag the manager observes.
type lagRecorder struct {
	prometheus.Histogram
	mu      sync.Mutex
	lags    []float64
	applied atomic.Int64
}

func (r *lagRecorder) Observe(v float64) {
	r.mu.Lock()
	r.lags = append(r.lags, v)
	r.mu.Unlock()
	r.applied.Add(1)
}

// BenchmarkIngest is one EPP's KV-event ingestion from a pool of engines,
// each publishing 20 batches a second (a busy engine's step rate, 16 blocks
// stored a batch, as many freed; each engine's blocks its own but for the
// first of each request, one of 16 every engine shares), from child
// processes of pubFleet publishers (pre-encoded batches, several engines a
// goroutine, so publishing costs little beside receiving), so this process
// runs only the subscribers, the applier and the index, one zmq4 SUB per
// engine over loopback TCP as the EPP subscribes, on one core: GOMAXPROCS
// 1 while measuring, which lets one thread run Go code at a time. One op
// is one batch applied; it reports the apply lag's p50 and p99 (engine
// timestamp to index), the batches a second delivered, the cores
// ingestion used (process CPU time over wall time), its CPU, allocations
// and bytes allocated a batch, and the host's load average. Target at 1,024 replicas: p99 <= 100 ms
// on one core.
func BenchmarkIngest(b *testing.B) {
	// rate=5 is 1,024 engines at a quarter of the rate: the batches a
	// second of 256 busy engines, from four times as many connections.
	for _, tc := range []struct {
		replicas int
		rate     float64
	}{{64, 20}, {256, 20}, {1024, 20}, {1024, 5}} {
		name := fmt.Sprintf("replicas=%d", tc.replicas)
		if tc.rate != 20 {
			name += fmt.Sprintf("/rate=%g", tc.rate)
		}
		// One fleet for every round of the sub-benchmark, started by its
		// first round (none when -bench leaves it out): starting 1,024
		// publishers and subscriptions takes seconds.
		var f *ingestFleet
		b.Run(name, func(b *testing.B) {
			if f == nil {
				start := time.Now()
				f = startIngestFleet(b, tc.replicas, tc.rate)
				b.Logf("%d publishers followed in %v", tc.replicas, time.Since(start).Round(time.Millisecond))
				b.ResetTimer()
			}
			f.measure(b)
		})
		if f != nil {
			start := time.Now()
			lines := f.close()
			// On stdout beside the results: a parent benchmark's log is
			// not shown.
			fmt.Printf("%s: %d publishers closed in %v; each child: %s\n", name, tc.replicas,
				time.Since(start).Round(time.Millisecond), strings.Join(lines, "; "))
		}
	}
}

// ingestFleet is the publishers' child processes and the manager
// following them.
type ingestFleet struct {
	cmds  []*exec.Cmd
	stdin []io.Closer
	out   []*bufio.Scanner // each child's stdout, for its closing line
	m     *Manager
	rec   *lagRecorder
}

// publishersPerChild bounds one child's publishers, so that the
// publishers spread over every core the host has.
const publishersPerChild = 256

func startIngestFleet(b *testing.B, n int, rate float64) *ingestFleet {
	f := &ingestFleet{}
	endpoints := make([]string, 0, n)
	for len(endpoints) < n {
		k := min(publishersPerChild, n-len(endpoints))
		eps, err := f.startChild(len(endpoints), k, rate)
		if err != nil {
			f.close()
			b.Fatal(err)
		}
		endpoints = append(endpoints, eps...)
	}
	ix := kvindex.New(kvindex.Config{})
	var err error
	if f.m, err = New(Config{}, benchBlock, ix, zap.NewNop()); err != nil {
		f.close()
		b.Fatal(err)
	}
	f.rec = &lagRecorder{Histogram: f.m.lag}
	f.m.lag = f.rec
	srcs := make([]Source, n)
	for i, ep := range endpoints {
		srcs[i] = Source{Replica: kvindex.Replica(i + 1), Name: fmt.Sprintf("10.0.%d.%d:8000", i/256, i%256), Model: model, Endpoint: ep}
	}
	f.m.Set(srcs)
	// Subscriptions take a moment to reach every publisher (ZMQ drops what
	// is published before); measure once a second's worth has arrived.
	warm := int64(float64(n) * rate)
	deadline := time.Now().Add(60 * time.Second)
	for f.rec.applied.Load() < warm {
		if time.Now().After(deadline) {
			f.close()
			b.Fatalf("%d batches applied in 60s, want %d", f.rec.applied.Load(), warm)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return f
}

// startChild starts a child process publishing from n publishers, numbered
// from first, and returns their endpoints.
func (f *ingestFleet) startChild(first, n int, rate float64) ([]string, error) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), publishersEnv+"="+strconv.Itoa(n), batchRateEnv+"="+strconv.FormatFloat(rate, 'f', -1, 64),
		firstEnv+"="+strconv.Itoa(first))
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("cannot start the publishers: %w", err)
	}
	sc := bufio.NewScanner(stdout)
	f.cmds, f.stdin, f.out = append(f.cmds, cmd), append(f.stdin, stdin), append(f.out, sc)
	endpoints := make([]string, 0, n)
	for len(endpoints) < n && sc.Scan() {
		endpoints = append(endpoints, sc.Text())
	}
	if len(endpoints) < n {
		return nil, fmt.Errorf("the publishers named %d endpoints, want %d: %v", len(endpoints), n, sc.Err())
	}
	return endpoints, nil
}

// close stops the manager and the children, and returns each child's
// closing line (what it sent).
func (f *ingestFleet) close() []string {
	if f.m != nil {
		f.m.Close()
	}
	var lines []string
	for i, cmd := range f.cmds {
		_ = f.stdin[i].Close() // a child stops when its stdin closes
		if f.out[i].Scan() {
			lines = append(lines, f.out[i].Text())
		}
		_ = cmd.Wait()
	}
	return lines
}

// measure waits for b.N batches to be applied on one core.
func (f *ingestFleet) measure(b *testing.B) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	time.Sleep(100 * time.Millisecond) // what queued at two cores drains
	rec := f.rec
	rec.mu.Lock()
	rec.lags = rec.lags[:0]
	rec.mu.Unlock()
	from := rec.applied.Load()
	var mem0, mem1 runtime.MemStats
	runtime.ReadMemStats(&mem0)
	start, cpu0 := time.Now(), cputime.Clock()
	for last, at := from, time.Now(); rec.applied.Load()-from < int64(b.N); {
		time.Sleep(5 * time.Millisecond)
		if n := rec.applied.Load(); n != last {
			last, at = n, time.Now()
		} else if time.Since(at) > 10*time.Second {
			b.Fatalf("no batch applied for 10s (%d of %d)", n-from, b.N)
		}
	}
	wall, cpu := time.Since(start), cputime.Clock()-cpu0
	runtime.ReadMemStats(&mem1)
	rec.mu.Lock()
	lags := slices.Clone(rec.lags)
	rec.mu.Unlock()
	if len(lags) == 0 {
		b.Fatal("no batch applied")
	}
	slices.Sort(lags)
	q := func(p float64) float64 { return 1000 * lags[min(len(lags)-1, int(p*float64(len(lags))))] }
	b.ReportMetric(q(0.5), "lag-p50-ms")
	b.ReportMetric(q(0.99), "lag-p99-ms")
	b.ReportMetric(cpu.Seconds()/wall.Seconds(), "cores")
	b.ReportMetric(float64(len(lags))/wall.Seconds(), "batches/s")
	b.ReportMetric(float64(cpu.Microseconds())/float64(len(lags)), "cpu-µs/batch")
	b.ReportMetric(float64(mem1.Mallocs-mem0.Mallocs)/float64(len(lags)), "allocs/batch")
	b.ReportMetric(float64(mem1.TotalAlloc-mem0.TotalAlloc)/float64(len(lags)), "B/batch")
	if l, ok := loadAverage(); ok {
		b.ReportMetric(l, "loadavg-1m")
	}
}

// loadAverage returns the host's one-minute load average, where Linux
// tells it.
func loadAverage() (float64, bool) {
	raw, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0, false
	}
	first, _, _ := strings.Cut(string(raw), " ")
	l, err := strconv.ParseFloat(first, 64)
	return l, err == nil
}

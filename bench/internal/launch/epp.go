package launch

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
	"go.yaml.in/yaml/v3"

	"github.com/omnious/provider-node/bench/internal/loopback"
	"github.com/omnious/provider-node/capacity"
	"github.com/omnious/provider-node/discovery"
	"github.com/omnious/provider-node/endpoint"
	"github.com/omnious/provider-node/internal/epp"
	"github.com/omnious/provider-node/scheduler"
)

// clockTicks is Linux's USER_HZ, the unit of /proc/<pid>/stat CPU times
// (100 on every mainstream architecture).
const clockTicks = 100

// EPP is an ext_proc server the bench runs: the EPP in this process
// (StartInProcess), bin/epp as a child process (StartProcess), or the
// no-op floor server in its place (StartFloor). Whichever it is, the
// harnesses read it the same way, over its loopback ports, as Prometheus
// and the quoter would.
type EPP struct {
	grpcAddr, metricsURL, adminURL string
	// logPath is the child's log, quoted when it fails to start.
	logPath string
	http    *http.Client
	// start runs it (again) on its ports and returns how to stop it.
	start func() (*run, error)

	mu  sync.Mutex
	cur *run // nil while stopped
}

// run is one start of an EPP.
type run struct {
	*running
	stop func() error
	pid  int // 0 in this process
}

// InProcessConfig is an EPP assembled in this process from a scheduler
// config and a fixed endpoint list.
type InProcessConfig struct {
	Scheduler scheduler.Config
	Endpoints []endpoint.Endpoint
	// StandInTokenizer gives the EPP the engine simulator's tokenizer, exact
	// for enginesim only; without it requests are routed in approximate
	// mode (no tokenizer).
	StandInTokenizer bool
	// MaxEndpoints is how many endpoints one routing decision names
	// (extproc.max_endpoints: 0 every one; nil the EPP's default, 1).
	MaxEndpoints *int
	// DrainTimeout bounds the drain when it stops.
	DrainTimeout time.Duration
	// OnPick, when set, is given the duration of every scheduling decision.
	OnPick func(time.Duration)
	// Log receives the EPP's logs (nil: none).
	Log *zap.Logger
}

// StartInProcess assembles the EPP (internal/epp) and runs it on free
// loopback ports; after a Stop, Start runs a new one on the same ports.
func StartInProcess(c InProcessConfig) (*EPP, error) {
	cfg := epp.Config{GRPCAddr: "127.0.0.1:0", HealthAddr: "127.0.0.1:0", MetricsAddr: "127.0.0.1:0", AdminAddr: "127.0.0.1:0",
		Scheduler: c.Scheduler, DrainTimeout: &c.DrainTimeout, StandInTokenizer: c.StandInTokenizer,
		// A harness stops its EPP when it is done with it: nothing waits
		// for health checks to move traffic away.
		DrainDelay: new(time.Duration(0))}
	cfg.ExtProc.MaxEndpoints = c.MaxEndpoints
	cfg = cfg.WithDefaults()
	var opts []epp.Option
	if c.OnPick != nil {
		opts = append(opts, epp.WithPickObserver(c.OnPick))
	}
	log := zap.NewNop()
	if c.Log != nil {
		log = c.Log.Named("epp")
	}
	e := &EPP{http: loopback.Client(10 * time.Second)}
	e.start = func() (*run, error) {
		s, err := epp.New(cfg, discovery.Fixed(c.Endpoints), log, opts...)
		if err != nil {
			return nil, fmt.Errorf("cannot start the EPP: %w", err)
		}
		// The ports bound now are the ports of every later start, so
		// that a restarted EPP is where the gateway looks.
		if e.grpcAddr == "" {
			cfg.GRPCAddr, cfg.HealthAddr, cfg.MetricsAddr, cfg.AdminAddr = s.GRPCAddr(), s.HealthAddr(), s.MetricsAddr(), s.AdminAddr()
			e.setAddrs(s.GRPCAddr(), s.MetricsAddr(), s.AdminAddr())
		}
		ctx, cancel := context.WithCancel(context.Background())
		r := &run{running: newRunning()}
		go func() { r.end(s.Run(ctx)) }()
		r.stop = func() error {
			cancel()
			<-r.exited
			if r.err != nil {
				return fmt.Errorf("EPP: %w", r.err)
			}
			return nil
		}
		return r, nil
	}
	if err := e.Start(); err != nil {
		return nil, err
	}
	return e, nil
}

// ProcessConfig is bin/epp run as a child process, configured as on bare
// metal: a static endpoint file and a config file, written into Dir.
type ProcessConfig struct {
	Bin, Dir string
	// Policy is the scheduler policy.
	Policy string
	// Model and Engine are the endpoints' defaults.
	Model, Engine string
	// Tokenizer is "standin" (the engine simulator's), "none" (approximate
	// routing) or a directory with the model's tokenizer.json.
	Tokenizer string
	// Endpoints are the backends (Addr and KVEvents are read).
	Endpoints []endpoint.Endpoint
}

// StartProcess writes the endpoint and config files and runs the EPP.
func StartProcess(c ProcessConfig) (*EPP, error) {
	type ep struct {
		IP     string `yaml:"ip"`
		Port   int    `yaml:"port"`
		KVPort int    `yaml:"kv_events_port,omitempty"`
	}
	var eps []ep
	for _, e := range c.Endpoints {
		host, port, err := splitPort(e.Addr)
		if err != nil {
			return nil, err
		}
		kv := 0
		if e.KVEvents != "" {
			if _, kv, err = splitPort(strings.TrimPrefix(e.KVEvents, "tcp://")); err != nil {
				return nil, err
			}
		}
		eps = append(eps, ep{IP: host, Port: port, KVPort: kv})
	}
	epFile := filepath.Join(c.Dir, "endpoints.yaml")
	if err := writeYAML(epFile, map[string]any{"defaults": map[string]any{"model": c.Model, "engine": c.Engine}, "endpoints": eps}); err != nil {
		return nil, err
	}
	ports, err := loopback.FreePorts(4)
	if err != nil {
		return nil, err
	}
	addr := func(i int) string { return "127.0.0.1:" + strconv.Itoa(ports[i]) }
	cfg := map[string]any{
		"grpc_addr": addr(0), "health_addr": addr(1), "metrics_addr": addr(2), "admin_addr": addr(3),
		"endpoints_file": epFile, "drain_delay": "0s", "drain_timeout": "2s",
		"scheduler": map[string]any{"policy": c.Policy},
	}
	switch c.Tokenizer {
	case "standin":
		cfg["standin_tokenizer"] = true
	case "none":
	default:
		abs, err := filepath.Abs(c.Tokenizer)
		if err != nil {
			return nil, fmt.Errorf("bad tokenizer directory: %w", err)
		}
		cfg["tokenizers"] = map[string]string{c.Model: abs}
	}
	cfgFile := filepath.Join(c.Dir, "epp.yaml")
	if err := writeYAML(cfgFile, cfg); err != nil {
		return nil, err
	}
	e := startChildEPP("the EPP", c.Bin, c.Dir, []string{"-config", cfgFile, "-log-level", "warn"})
	e.setAddrs(addr(0), addr(2), addr(3))
	if err := e.Start(); err != nil {
		return nil, err
	}
	return e, nil
}

// StartFloor runs `bin floor`, a no-op ext_proc server that routes to
// dests in turn, in the EPP's place, and waits until it listens. It has no
// metrics or admin port.
func StartFloor(ctx context.Context, bin, dir string, dests []string) (*EPP, error) {
	ports, err := loopback.FreePorts(1)
	if err != nil {
		return nil, err
	}
	addr := "127.0.0.1:" + strconv.Itoa(ports[0])
	e := startChildEPP("the floor server", bin, dir, []string{"floor", "-grpc-addr", addr, "-dest", strings.Join(dests, ",")})
	e.setAddrs(addr, "", "")
	if err := e.Start(); err != nil {
		return nil, err
	}
	if err := e.WaitListening(ctx); err != nil {
		_ = e.Stop()
		return nil, err
	}
	return e, nil
}

// startChildEPP is an EPP whose start runs bin with args, its output in
// dir's epp.log; what names it in errors.
func startChildEPP(what, bin, dir string, args []string) *EPP {
	e := &EPP{logPath: filepath.Join(dir, "epp.log"), http: loopback.Client(10 * time.Second)}
	e.start = func() (*run, error) {
		logf, err := os.OpenFile(e.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return nil, fmt.Errorf("cannot create the EPP log: %w", err)
		}
		c, err := startChild(bin, args, logf, logf)
		if err != nil {
			_ = logf.Close()
			return nil, fmt.Errorf("cannot start %s %s: %w", what, bin, err)
		}
		stop := func() error {
			c.stop(5 * time.Second)
			_ = logf.Close()
			if err := c.waitErr(); err != nil {
				return fmt.Errorf("EPP: %w", err)
			}
			var ee *exec.ExitError
			if errors.As(c.err, &ee) && ee.Exited() {
				return fmt.Errorf("EPP exited badly: %w (log: %s)", c.err, e.logTail())
			}
			return nil // exited cleanly, or ended by our signal
		}
		return &run{running: c.running, stop: stop, pid: c.cmd.Process.Pid}, nil
	}
	return e
}

func (e *EPP) setAddrs(grpcAddr, metricsAddr, adminAddr string) {
	e.grpcAddr = grpcAddr
	e.metricsURL, e.adminURL = "", ""
	if metricsAddr != "" {
		e.metricsURL = "http://" + metricsAddr + "/metrics"
	}
	if adminAddr != "" {
		e.adminURL = "http://" + adminAddr
	}
}

// GRPCAddr is the ext_proc address, ip:port.
func (e *EPP) GRPCAddr() string { return e.grpcAddr }

// MetricsURL is its Prometheus endpoint ("" for the floor server).
func (e *EPP) MetricsURL() string { return e.metricsURL }

// AdminURL is the base URL of its admin port, which serves the capacity
// snapshot and /debug/endpoints ("" for the floor server).
func (e *EPP) AdminURL() string { return e.adminURL }

// Start runs the EPP again after a Stop, on the same ports; it does not
// wait for anything.
func (e *EPP) Start() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.cur != nil {
		return nil
	}
	r, err := e.start()
	if err != nil {
		return err
	}
	e.cur = r
	return nil
}

// Stop drains and stops the EPP (a child: SIGTERM, then SIGKILL after
// 5 s). Stopping a stopped EPP does nothing.
func (e *EPP) Stop() error {
	e.mu.Lock()
	r := e.cur
	e.cur = nil
	e.mu.Unlock()
	e.http.CloseIdleConnections()
	if r == nil {
		return nil
	}
	return r.stop()
}

func (e *EPP) current() *run {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.cur
}

// WaitReady waits until the EPP reports replicas healthy replicas (it has
// scraped each), plus a moment for its KV-event subscriptions to connect:
// ZMQ drops what is published before a subscriber is connected.
func (e *EPP) WaitReady(ctx context.Context, replicas int) error {
	var r *running
	if cur := e.current(); cur != nil {
		r = cur.running
	}
	err := poll(ctx, 30*time.Second, r, func() (bool, string) {
		healthy := 0
		if snap, err := e.Capacity(ctx); err == nil {
			for _, m := range snap.Models {
				healthy += m.Healthy
			}
		}
		return healthy >= replicas, fmt.Sprintf("the EPP saw %d of %d replicas healthy", healthy, replicas)
	})
	if err != nil {
		return e.withLog(err)
	}
	time.Sleep(300 * time.Millisecond)
	return nil
}

// WaitListening waits until the server accepts connections.
func (e *EPP) WaitListening(ctx context.Context) error {
	var r *running
	if cur := e.current(); cur != nil {
		r = cur.running
	}
	err := poll(ctx, 30*time.Second, r, func() (bool, string) {
		c, err := net.DialTimeout("tcp", e.grpcAddr, time.Second)
		if err != nil {
			return false, "nothing listens on " + e.grpcAddr
		}
		_ = c.Close()
		return true, ""
	})
	return e.withLog(err)
}

// withLog adds a child's log tail to err.
func (e *EPP) withLog(err error) error {
	if err == nil || e.logPath == "" {
		return err
	}
	return fmt.Errorf("%w (log: %s)", err, e.logTail())
}

func (e *EPP) logTail() string {
	data, err := os.ReadFile(e.logPath)
	if err != nil {
		return err.Error()
	}
	if len(data) > 2000 {
		data = data[len(data)-2000:]
	}
	return strings.TrimSpace(string(data))
}

// Capacity is the EPP's capacity snapshot, as the quoter reads it.
func (e *EPP) Capacity(ctx context.Context) (capacity.Snapshot, error) {
	var snap capacity.Snapshot
	err := loopback.GetJSON(ctx, e.http, e.adminURL+capacity.Path, &snap)
	return snap, err
}

// ResidentBlocks is what the EPP's index holds, in blocks, per endpoint
// address (its admin view, /debug/endpoints).
func (e *EPP) ResidentBlocks(ctx context.Context) (map[string]int, error) {
	var view []struct {
		Addr     string `json:"addr"`
		Resident int    `json:"resident_blocks"`
	}
	if err := loopback.GetJSON(ctx, e.http, e.adminURL+"/debug/endpoints", &view); err != nil {
		return nil, err
	}
	out := make(map[string]int, len(view))
	for _, v := range view {
		out[v.Addr] = v.Resident
	}
	return out, nil
}

// Metrics is the EPP's /metrics page (Prometheus text; see promtext).
func (e *EPP) Metrics(ctx context.Context) (*bytes.Reader, error) {
	body, err := loopback.Get(ctx, e.http, e.metricsURL)
	if err != nil {
		return nil, fmt.Errorf("cannot scrape the EPP: %w", err)
	}
	return bytes.NewReader(body), nil
}

// CPU is a child EPP's user+system CPU time, from /proc/<pid>/stat.
func (e *EPP) CPU() (time.Duration, error) {
	r := e.current()
	if r == nil || r.pid == 0 {
		return 0, errors.New("the EPP is not a running child process")
	}
	return procCPU(r.pid)
}

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

func splitPort(hostport string) (string, int, error) {
	host, p, err := net.SplitHostPort(hostport)
	if err != nil {
		return "", 0, fmt.Errorf("bad endpoint address %q: %w", hostport, err)
	}
	port, err := strconv.Atoi(p)
	if err != nil {
		return "", 0, fmt.Errorf("bad endpoint address %q: %w", hostport, err)
	}
	return host, port, nil
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

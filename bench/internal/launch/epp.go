package launch

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
	"go.yaml.in/yaml/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/omnious/provider-node/bench/internal/loopback"
	"github.com/omnious/provider-node/capacity"
	"github.com/omnious/provider-node/discovery"
	"github.com/omnious/provider-node/endpoint"
	"github.com/omnious/provider-node/epp"
	"github.com/omnious/provider-node/extproc/testgw"
	"github.com/omnious/provider-node/internal/adminauth"
	"github.com/omnious/provider-node/scheduler"
)

// clockTicks is Linux's USER_HZ, the unit of /proc/<pid>/stat CPU times
// (100 on every mainstream architecture).
const clockTicks = 100

// EPP is an ext_proc server the bench runs: the EPP in this process
// (StartInProcess), bin/epp as a child process (StartProcess), or the
// no-op floor server in its place (StartFloor). Whichever it is, the
// harnesses read it the same way, over its loopback ports, as Prometheus
// and the quoter would. Its ports are fixed when it first starts: Stop (or
// Kill) then Start runs it again where the gateway looks.
type EPP struct {
	name                           string // in errors
	grpcAddr, metricsURL, adminURL string
	// logPath is the child's log, quoted when it fails to start.
	logPath string
	// kvBind is where an external EPP takes the fleet's KV events
	// ({kv_events_bind}), "" when it does not.
	kvBind string
	http   *http.Client
	// start runs it (again) on its ports and returns how to stop it.
	start func() (*run, error)

	mu  sync.Mutex
	cur *run // nil while stopped
}

// run is one start of an EPP.
type run struct {
	*running
	stop func() error
	kill func() error // nil in this process
	pid  int          // 0 in this process
}

// TokenizerStandIn is Spec.Tokenizer for the engine simulator's tokenizer.
const TokenizerStandIn = "standin"

// Spec is what configures an EPP the bench runs, in this process or as
// bin/epp: both run the same epp.Config (Spec.config), the child's written
// as its YAML config file.
type Spec struct {
	Scheduler scheduler.Config
	// Endpoints are the backends, as the EPP discovers them.
	Endpoints []endpoint.Endpoint
	// Tokenizer is how the EPP gets prompt tokens: TokenizerStandIn (exact
	// for enginesim only), "" or "none" (approximate routing), or a
	// directory with the endpoints' model's tokenizer.json.
	Tokenizer string
	// MaxEndpoints is how many endpoints one routing decision names
	// (extproc.max_endpoints: 0 every one; nil the EPP's default, 1).
	MaxEndpoints *int
	// Peers are sibling EPPs' admin addresses (host:port) a starting EPP
	// takes its index snapshot from (warm_start.peers).
	Peers []string
	// DrainDelay is how long a stopping EPP still accepts new streams
	// after its health turned NOT_SERVING (0: it refuses them at once, and
	// the test gateway opens them on another EPP).
	DrainDelay time.Duration
	// DrainTimeout bounds the drain when it stops (0: open streams are
	// closed at once).
	DrainTimeout time.Duration
	// AdminTokenFile, when set, is the EPP's admin.token_file: its admin
	// port asks for that bearer token, which the EPP's siblings and this
	// package's reads (AdminClient) present.
	AdminTokenFile string
}

// config is the EPP's config for s on the given addresses.
func (s Spec) config(grpcAddr, healthAddr, metricsAddr, adminAddr string) (epp.Config, error) {
	cfg := epp.Config{GRPCAddr: grpcAddr, HealthAddr: healthAddr, MetricsAddr: metricsAddr, AdminAddr: adminAddr,
		Scheduler: s.Scheduler, DrainDelay: &s.DrainDelay, DrainTimeout: &s.DrainTimeout}
	cfg.ExtProc.MaxEndpoints = s.MaxEndpoints
	cfg.WarmStart.Peers = s.Peers
	cfg.Admin.TokenFile = s.AdminTokenFile
	switch s.Tokenizer {
	case TokenizerStandIn:
		cfg.StandInTokenizer = true
	case "", "none":
	default:
		abs, err := filepath.Abs(s.Tokenizer)
		if err != nil {
			return epp.Config{}, fmt.Errorf("bad tokenizer directory: %w", err)
		}
		cfg.Tokenizers = map[string]string{}
		for _, ep := range s.Endpoints {
			cfg.Tokenizers[ep.Model] = abs
		}
	}
	return cfg.WithDefaults(), nil
}

// InProcessConfig is an EPP assembled in this process.
type InProcessConfig struct {
	Spec
	// OnPick, when set, is given the duration of every scheduling decision.
	OnPick func(time.Duration)
	// OnWindow, when set, is given every scrape window the capacity
	// curves learn from.
	OnWindow func(addr string, w capacity.Window)
	// Log receives the EPP's logs (nil: none).
	Log *zap.Logger
}

// StartInProcess assembles the EPP (epp) and runs it on free
// loopback ports; after a Stop, Start runs a new one on the same ports.
func StartInProcess(c InProcessConfig) (*EPP, error) {
	cfg, err := c.config("127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	var opts []epp.Option
	if c.OnPick != nil {
		opts = append(opts, epp.WithPickObserver(c.OnPick))
	}
	if c.OnWindow != nil {
		opts = append(opts, epp.WithWindowObserver(c.OnWindow))
	}
	log := zap.NewNop()
	if c.Log != nil {
		log = c.Log.Named("epp")
	}
	e := &EPP{name: "the EPP", http: loopback.Client(10 * time.Second)}
	if err := e.presentToken(c.AdminTokenFile); err != nil {
		return nil, err
	}
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
	Spec
	Bin string
	// Dir receives its files (config, endpoint file, epp.log); it is
	// created when missing. Two EPPs side by side need two.
	Dir string
	// Name names it in errors. Default "the EPP".
	Name string
	// LogLevel is its -log-level. Default warn.
	LogLevel string
}

// StartProcess writes the endpoint and config files and runs the EPP on
// free loopback ports, the same at every start. It does not wait for it to
// be ready (WaitReady).
func StartProcess(c ProcessConfig) (*EPP, error) {
	if c.Name == "" {
		c.Name = "the EPP"
	}
	if c.LogLevel == "" {
		c.LogLevel = "warn"
	}
	ports, err := loopback.FreePorts(4)
	if err != nil {
		return nil, err
	}
	var addrs [4]string
	for i, p := range ports {
		addrs[i] = "127.0.0.1:" + strconv.Itoa(p)
	}
	cfgFile, err := c.writeFiles(addrs)
	if err != nil {
		return nil, err
	}
	// A graceful stop drains for up to DrainTimeout; past that and a
	// margin, it is killed (and reported).
	e := startChildEPP(c.Name, c.Dir, startChild, c.Bin, []string{"-config", cfgFile, "-log-level", c.LogLevel}, c.DrainTimeout+5*time.Second)
	if err := e.presentToken(c.AdminTokenFile); err != nil {
		return nil, err
	}
	e.setAddrs(addrs[0], addrs[2], addrs[3])
	if err := e.Start(); err != nil {
		return nil, err
	}
	return e, nil
}

// writeFiles writes the endpoint file and the config file of the EPP on
// addrs (gRPC, health, metrics, admin) into c.Dir, creating it, and
// returns the config file's path.
func (c ProcessConfig) writeFiles(addrs [4]string) (string, error) {
	if err := os.MkdirAll(c.Dir, 0o755); err != nil {
		return "", fmt.Errorf("cannot create the directory of %s: %w", c.Name, err)
	}
	epFile := filepath.Join(c.Dir, "endpoints.yaml")
	if err := writeEndpointFile(epFile, c.Endpoints); err != nil {
		return "", err
	}
	cfg, err := c.config(addrs[0], addrs[1], addrs[2], addrs[3])
	if err != nil {
		return "", err
	}
	cfg.EndpointsFile = epFile
	cfgFile := filepath.Join(c.Dir, "epp.yaml")
	return cfgFile, writeYAML(cfgFile, cfg)
}

// writeEndpointFile writes eps as a static endpoint file (discovery's
// format): each entry's model and engine, its KV event and replay ports
// (or kv_events_connect), and its metrics port and path when they are not
// the defaults (port 0 when it has no metrics URL: not scraped).
func writeEndpointFile(path string, eps []endpoint.Endpoint) error {
	type entry struct {
		IP          string            `yaml:"ip"`
		Port        int               `yaml:"port"`
		Model       string            `yaml:"model"`
		Engine      string            `yaml:"engine,omitempty"`
		KVPort      int               `yaml:"kv_events_port,omitempty"`
		ReplayPort  int               `yaml:"replay_port,omitempty"`
		KVConnect   bool              `yaml:"kv_events_connect,omitempty"`
		MetricsPort *int              `yaml:"metrics_port,omitempty"`
		MetricsPath string            `yaml:"metrics_path,omitempty"`
		Labels      map[string]string `yaml:"labels,omitempty"`
	}
	zmqPort := func(z string) (int, error) {
		if z == "" {
			return 0, nil
		}
		_, p, err := splitPort(strings.TrimPrefix(z, "tcp://"))
		return p, err
	}
	entries := make([]entry, 0, len(eps))
	for _, ep := range eps {
		host, port, err := splitPort(ep.Addr)
		if err != nil {
			return err
		}
		host = loopbackIP(host)
		en := entry{IP: host, Port: port, Model: ep.Model, Engine: ep.Engine, Labels: ep.Labels, KVConnect: ep.KVConnect}
		if en.KVPort, err = zmqPort(ep.KVEvents); err != nil {
			return err
		}
		if en.ReplayPort, err = zmqPort(ep.KVReplay); err != nil {
			return err
		}
		if ep.MetricsURL == "" {
			en.MetricsPort = new(0)
		} else {
			u, err := url.Parse(ep.MetricsURL)
			if err != nil {
				return fmt.Errorf("bad metrics URL %q: %w", ep.MetricsURL, err)
			}
			_, mp, err := splitPort(u.Host)
			if err != nil {
				return err
			}
			if mp != port {
				en.MetricsPort = &mp
			}
			if u.Path != "/metrics" {
				en.MetricsPath = u.Path
			}
		}
		entries = append(entries, en)
	}
	return writeYAML(path, map[string]any{"endpoints": entries})
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
	e := startChildEPP("the floor server", dir, startChild, bin, []string{"floor", "-grpc-addr", addr, "-dest", strings.Join(dests, ",")}, 5*time.Second)
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

// startChildEPP is an EPP whose start runs bin with args (through
// spawn: startChild or startGroup), its output in dir's epp.log; a graceful stop
// waits grace before it kills. name names it in errors.
func startChildEPP(name, dir string, spawn func(bin string, args []string, stdout, stderr io.Writer) (*child, error),
	bin string, args []string, grace time.Duration) *EPP {
	e := &EPP{name: name, logPath: filepath.Join(dir, "epp.log"), http: loopback.Client(10 * time.Second)}
	e.start = func() (*run, error) {
		logf, err := os.OpenFile(e.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return nil, fmt.Errorf("cannot create the log of %s: %w", name, err)
		}
		c, err := spawn(bin, args, logf, logf)
		if err != nil {
			_ = logf.Close()
			return nil, fmt.Errorf("cannot start %s %s: %w", name, bin, err)
		}
		ended := func() error {
			_ = logf.Close()
			if err := c.waitErr(); err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			return nil
		}
		stop := func() error {
			if c.stop(grace) {
				_ = logf.Close()
				return fmt.Errorf("%s did not exit within %v of SIGTERM: killed (log: %s)", name, grace, e.logTail())
			}
			if err := ended(); err != nil {
				return err
			}
			var ee *exec.ExitError
			if errors.As(c.err, &ee) && ee.Exited() {
				return fmt.Errorf("%s exited badly: %w (log: %s)", name, c.err, e.logTail())
			}
			return nil // exited cleanly, or ended by our signal
		}
		kill := func() error {
			if err := c.kill(); err != nil {
				_ = logf.Close()
				return fmt.Errorf("cannot kill %s (pid %d): %w", name, c.cmd.Process.Pid, err)
			}
			return ended()
		}
		return &run{running: c.running, stop: stop, kill: kill, pid: c.cmd.Process.Pid}, nil
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

// presentToken makes the EPP's reads present the admin token in file ("":
// none).
func (e *EPP) presentToken(file string) error {
	if file == "" {
		return nil
	}
	base, _ := e.http.Transport.(*http.Transport)
	rt, err := adminauth.Client{TokenFile: file}.Transport(base)
	if err != nil {
		return err
	}
	e.http = &http.Client{Transport: rt, Timeout: e.http.Timeout}
	return nil
}

// AdminClient is the HTTP client that reads its admin port, with the
// admin token when it asks for one.
func (e *EPP) AdminClient() *http.Client { return e.http }

// AdminURL is the base URL of its admin port, which serves the capacity
// snapshot and /debug/endpoints ("" for the floor server).
func (e *EPP) AdminURL() string { return e.adminURL }

// Start runs the EPP again after a Stop or a Kill, or after it ended on
// its own, on the same ports; it does not wait for anything (WaitReady).
func (e *EPP) Start() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.cur != nil {
		select {
		case <-e.cur.exited: // ended on its own: start it again
			_ = e.cur.stop()
		default:
			return nil
		}
	}
	r, err := e.start()
	if err != nil {
		return err
	}
	e.cur = r
	return nil
}

// Stop drains and stops the EPP and waits until it has ended (a child:
// SIGTERM to its PID, then SIGKILL past its drain timeout and a margin,
// which is an error). Stopping a stopped EPP does nothing.
func (e *EPP) Stop() error {
	r := e.take()
	if r == nil {
		return nil
	}
	return r.stop()
}

// Kill ends a child EPP with SIGKILL to its PID, as a crash: no drain, no
// health change, its streams broken; it returns once the process is gone.
// An EPP in this process cannot be killed.
func (e *EPP) Kill() error {
	e.mu.Lock()
	if e.cur != nil && e.cur.kill == nil {
		e.mu.Unlock()
		return fmt.Errorf("cannot kill %s: it runs in this process", e.name)
	}
	e.mu.Unlock()
	r := e.take()
	if r == nil {
		return nil
	}
	return r.kill()
}

// take detaches the current run, if any.
func (e *EPP) take() *run {
	e.mu.Lock()
	r := e.cur
	e.cur = nil
	e.mu.Unlock()
	e.http.CloseIdleConnections()
	return r
}

func (e *EPP) current() *run {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.cur
}

// WaitReady waits until the EPP is ready: its ext_proc port answers gRPC
// health SERVING (as the gateway checks it) and it reports replicas
// healthy replicas (it has scraped each). It returns how long that took,
// then allows a moment for its KV-event subscriptions to connect (ZMQ
// drops what is published before a subscriber is connected).
func (e *EPP) WaitReady(ctx context.Context, replicas int) (time.Duration, error) {
	start := time.Now()
	err := e.waitServing(ctx, 30*time.Second, false, func() (bool, string) {
		healthy := 0
		if snap, err := e.Capacity(ctx); err == nil {
			for _, m := range snap.Models {
				healthy += m.Healthy
			}
		}
		return healthy >= replicas, fmt.Sprintf("%s saw %d of %d replicas healthy", e.name, healthy, replicas)
	})
	took := time.Since(start)
	if err != nil {
		return took, err
	}
	time.Sleep(300 * time.Millisecond)
	return took, nil
}

// WaitServing waits up to limit until the ext_proc port answers gRPC
// health SERVING for the ext_proc service, or, from a server that does not
// know that service, for the server as a whole (service ""). It is all the
// bench can ask of an EndpointPicker it did not build.
func (e *EPP) WaitServing(ctx context.Context, limit time.Duration) error {
	return e.waitServing(ctx, limit, true, nil)
}

// waitServing polls gRPC health on the ext_proc port, as the gateway checks
// it, until SERVING and then until ready (nil: at once) reports true;
// anyService accepts the whole server's status where the ext_proc service
// is unknown. A run that ends, ctx or limit stop the wait.
func (e *EPP) waitServing(ctx context.Context, limit time.Duration, anyService bool, ready func() (bool, string)) error {
	var r *running
	if cur := e.current(); cur != nil {
		r = cur.running
	}
	// A connection refused while it starts is tried again within a poll
	// or two, not after grpc-go's default 1 s backoff.
	conn, err := grpc.NewClient(e.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{BaseDelay: 20 * time.Millisecond, Multiplier: 1,
			MaxDelay: 20 * time.Millisecond}, MinConnectTimeout: time.Second}))
	if err != nil {
		return fmt.Errorf("cannot health-check %s: %w", e.name, err)
	}
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)
	check := func(service string) (healthpb.HealthCheckResponse_ServingStatus, error) {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		resp, err := hc.Check(cctx, &healthpb.HealthCheckRequest{Service: service})
		return resp.GetStatus(), err
	}
	var fatal error
	err = poll(ctx, limit, r, func() (bool, string) {
		st, err := check(testgw.HealthService)
		if anyService && status.Code(err) == codes.NotFound {
			st, err = check("")
		}
		if status.Code(err) == codes.Unimplemented {
			// Nothing to wait for: the gateway health-checks the ext_proc
			// port, as Envoy checks its ext_proc cluster.
			fatal = fmt.Errorf("%s serves no gRPC health (grpc.health.v1) on its ext_proc port %s", e.name, e.grpcAddr)
			return true, ""
		}
		if err != nil || st != healthpb.HealthCheckResponse_SERVING {
			return false, fmt.Sprintf("%s is not SERVING on %s (%s, %v)", e.name, e.grpcAddr, st, err)
		}
		if ready == nil {
			return true, ""
		}
		return ready()
	})
	if err == nil {
		err = fatal
	}
	return e.withLog(err)
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

// PeakRSS is a child EPP's peak resident set in bytes (VmHWM, from
// /proc/<pid>/status).
func (e *EPP) PeakRSS() (int64, error) {
	r := e.current()
	if r == nil || r.pid == 0 {
		return 0, errors.New("the EPP is not a running child process")
	}
	data, err := os.ReadFile("/proc/" + strconv.Itoa(r.pid) + "/status")
	if err != nil {
		return 0, fmt.Errorf("cannot read the EPP's memory: %w", err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("cannot parse VmHWM %q: %w", v, err)
			}
			return kb << 10, nil
		}
	}
	return 0, errors.New("no VmHWM in /proc/<pid>/status")
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

// loopbackIP is host with localhost spelt as 127.0.0.1: endpoint files
// take IP addresses only.
func loopbackIP(host string) string {
	if host == "localhost" {
		return "127.0.0.1"
	}
	return host
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

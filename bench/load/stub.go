package load

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/omnious/provider-node/endpoint"
	"github.com/omnious/provider-node/engines/kvevents"
)

// stub is one cheap backend of the load bench: a loopback HTTP server that
// answers every OpenAI POST at once with a fixed chat completion, serves
// vLLM metric names (so the EPP scrapes it as a healthy vLLM replica) and,
// optionally, publishes KV events as vLLM does. It costs microseconds per
// request so that the CPU goes to the EPP, not to a simulated engine.
type stub struct {
	srv      *http.Server
	mux      *http.ServeMux
	ln       net.Listener
	pub      *kvevents.Publisher
	model    string
	reply    []byte
	inflight atomic.Int64
	served   atomic.Int64
	done     chan error
}

const stubBlocks = 17600 // vLLM's num_gpu_blocks for Qwen3-32B on 2xH100, as enginesim

func startStub(model string, promptTokens int, kvEvents bool, log *zap.Logger) (*stub, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("cannot listen for a stub backend: %w", err)
	}
	s := &stub{ln: ln, model: model, done: make(chan error, 1)}
	s.reply = []byte(`{"id":"chatcmpl-load","object":"chat.completion","created":0,"model":` + strconv.Quote(model) +
		`,"choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],` +
		`"usage":{"prompt_tokens":` + strconv.Itoa(promptTokens) + `,"completion_tokens":1,"total_tokens":` + strconv.Itoa(promptTokens+1) + `}}`)
	if kvEvents {
		s.pub, err = kvevents.NewPublisher(kvevents.PublisherConfig{Endpoint: "tcp://127.0.0.1:0"}, log.Named("stub-kv"))
		if err != nil {
			_ = ln.Close()
			return nil, fmt.Errorf("cannot start a stub's KV-event publisher: %w", err)
		}
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /", s.serveCompletion)
	mux.HandleFunc("GET /metrics", s.serveMetrics)
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	s.mux = mux
	s.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { s.done <- s.srv.Serve(ln) }()
	return s, nil
}

// Addr is the stub's ip:port.
func (s *stub) Addr() string { return s.ln.Addr().String() }

// endpoint describes the stub as the EPP's endpoint file names it.
func (s *stub) endpoint() endpoint.Endpoint {
	ep := endpoint.Endpoint{Addr: s.Addr(), MetricsURL: "http://" + s.Addr() + "/metrics"}
	if s.pub != nil {
		ep.KVEvents = s.pub.Endpoint()
	}
	return ep
}

func (s *stub) serveCompletion(w http.ResponseWriter, r *http.Request) {
	s.inflight.Add(1)
	defer s.inflight.Add(-1)
	if _, err := io.Copy(io.Discard, r.Body); err != nil {
		http.Error(w, "cannot read body", http.StatusBadRequest)
		return
	}
	s.served.Add(1)
	h := w.Header()
	h["Content-Type"] = []string{"application/json"}
	h["Content-Length"] = []string{strconv.Itoa(len(s.reply))}
	_, _ = w.Write(s.reply)
}

func (s *stub) serveMetrics(w http.ResponseWriter, _ *http.Request) {
	lbl := `{engine="0",model_name=` + strconv.Quote(s.model) + `}`
	w.Header().Set("Content-Type", "text/plain; version=0.0.4")
	_, _ = fmt.Fprintf(w, "vllm:num_requests_running%s %d\nvllm:num_requests_waiting%s 0\nvllm:kv_cache_usage_perc%s 0.1\n"+
		"vllm:cache_config_info{block_size=\"16\",engine=\"0\",num_gpu_blocks=\"%d\"} 1\n",
		lbl, s.inflight.Load(), lbl, lbl, stubBlocks)
}

// publishBlocks announces tokens (whole blocks of blockSize) as stored in
// one BlockStored event, with made-up engine hashes chained as vLLM chains
// them (the EPP recomputes its own keys from the token ids).
func (s *stub) publishBlocks(tokens []uint32, blockSize int, salt uint64) error {
	n := len(tokens) / blockSize
	if s.pub == nil || n == 0 {
		return nil
	}
	hashes := make([]uint64, n)
	h := salt
	for i := range hashes {
		h = mix(h ^ uint64(i+1))
		hashes[i] = h
	}
	_, err := s.pub.Publish([]kvevents.Event{{Kind: kvevents.KindBlockStored, BlockHashes: hashes,
		TokenIDs: tokens[:n*blockSize], BlockSize: blockSize, Medium: "GPU"}})
	if err != nil {
		return fmt.Errorf("stub %s: %w", s.Addr(), err)
	}
	return nil
}

func (s *stub) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	err := s.srv.Shutdown(ctx)
	if serr := <-s.done; serr != nil && !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(err, serr)
	}
	if s.pub != nil {
		err = errors.Join(err, s.pub.Close())
	}
	return err
}

// stubUpstream is the test gateway's upstream when the load bench runs in
// process: it hands each request to the stub at its address, with no
// socket in between.
type stubUpstream map[string]*stub

func newStubUpstream(stubs []*stub) stubUpstream {
	u := make(stubUpstream, len(stubs))
	for _, s := range stubs {
		u[s.Addr()] = s
	}
	return u
}

// RoundTrip implements http.RoundTripper.
func (u stubUpstream) RoundTrip(r *http.Request) (*http.Response, error) {
	s, ok := u[r.URL.Host]
	if !ok {
		return nil, fmt.Errorf("no stub at %s", r.URL.Host)
	}
	rec := &recorder{h: http.Header{}}
	s.mux.ServeHTTP(rec, r)
	if r.Body != nil {
		r.Body.Close()
	}
	return &http.Response{StatusCode: rec.status(), Header: rec.h, Body: io.NopCloser(bytes.NewReader(rec.body.Bytes())),
		ContentLength: int64(rec.body.Len()), Request: r, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1}, nil
}

// recorder is an in-memory http.ResponseWriter.
type recorder struct {
	h    http.Header
	code int
	body bytes.Buffer
}

func (r *recorder) Header() http.Header { return r.h }

func (r *recorder) WriteHeader(code int) {
	if r.code == 0 {
		r.code = code
	}
}

func (r *recorder) Write(p []byte) (int, error) {
	r.WriteHeader(http.StatusOK)
	return r.body.Write(p)
}

func (r *recorder) Flush() {}

func (r *recorder) status() int {
	if r.code == 0 {
		return http.StatusOK
	}
	return r.code
}

// serveInProcess runs h on req and returns the status it answered; a
// handler that aborts the response (http.ErrAbortHandler, as the gateway
// does when the upstream breaks off) counts as status 0.
func serveInProcess(h http.Handler, req *http.Request) (code int) {
	defer func() {
		if v := recover(); v != nil {
			if v != http.ErrAbortHandler {
				panic(v)
			}
			code = 0
		}
	}()
	rec := &recorder{h: http.Header{}}
	h.ServeHTTP(rec, req)
	return rec.status()
}

// churnSlots is how many requests a stub's simulated engine runs: each
// step stores one block for each, chained to that request's previous
// block; a request that reached churnChain blocks frees them all and a new
// one starts, so the stub stores and frees blocks at the same rate and its
// share of the index stays bounded (churnSlots × churnChain blocks).
const (
	churnSlots = 16
	churnChain = 64
)

// churn publishes rate KV-event batches a second, as a busy engine's steps
// do, until stop closes; the first batch waits phase. Token ids are drawn
// so that no block matches a request's prompt: the events cost the EPP
// what a pool's do without changing its decisions.
func (s *stub) churn(rate float64, phase time.Duration, salt uint64, stop <-chan struct{}) {
	if s.pub == nil || !(rate > 0) {
		return
	}
	var chains [churnSlots][]uint64
	var toks [churnSlots][16]uint32
	next := salt << 32
	evs := make([]kvevents.Event, 0, 2*churnSlots)
	select {
	case <-stop:
		return
	case <-time.After(phase):
	}
	tick := time.NewTicker(time.Duration(float64(time.Second) / rate))
	defer tick.Stop()
	for {
		evs = evs[:0]
		for i := range chains {
			ch := chains[i]
			if len(ch) == churnChain {
				evs = append(evs, kvevents.Event{Kind: kvevents.KindBlockRemoved, BlockHashes: append([]uint64(nil), ch...), Medium: "GPU"})
				ch = ch[:0]
			}
			next++
			h := mix(next)
			for j := range toks[i] {
				toks[i][j] = uint32(200000 + mix(next^uint64(j)<<48)%50000) // past Qwen3's vocabulary: never a prompt's
			}
			ev := kvevents.Event{Kind: kvevents.KindBlockStored, BlockHashes: []uint64{h}, TokenIDs: toks[i][:], BlockSize: 16, Medium: "GPU"}
			if len(ch) > 0 {
				ev.ParentHash, ev.HasParent = ch[len(ch)-1], true
			}
			evs = append(evs, ev)
			chains[i] = append(ch, h)
		}
		if _, err := s.pub.Publish(evs); err != nil {
			return
		}
		select {
		case <-stop:
			return
		case <-tick.C:
		}
	}
}

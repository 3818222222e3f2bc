package sim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"

	"github.com/omnious/provider-node/engines/kvevents"
	"github.com/omnious/provider-node/engines/openai"
	"github.com/omnious/provider-node/engines/sim/engine"
	"github.com/omnious/provider-node/engines/tokenizer"
)

// Replica is one simulated engine rank: its HTTP API, batching engine and
// KV-event publisher.
type Replica struct {
	cfg   Config
	rank  int
	log   *zap.Logger
	tok   tokenizer.Tokenizer
	vocab *vocabulary
	// decode is /detokenize's table (decodeTable).
	decode map[uint32]string
	eng    *engine.Engine
	pub    *kvevents.Publisher // nil when events are off

	faultsMu sync.Mutex
	faults   Faults
	faultRNG *rng

	reqSeq  atomic.Uint64
	created int64

	addr string // fixed once NewReplica returns

	lnMu    sync.Mutex
	ln      net.Listener
	conns   map[net.Conn]struct{} // open connections, closed by a refuse fault
	srv     *http.Server
	serveWG sync.WaitGroup
	refuse  *time.Timer // re-opens the listener after a refuse fault
}

// NewReplica builds rank `rank` of cfg (already defaulted and validated).
// It binds its ports; Run serves.
func NewReplica(cfg Config, rank int, log *zap.Logger) (*Replica, error) {
	log = log.With(zap.Int("rank", rank))
	tok := tokenizer.NewStandIn()
	vocab, err := newVocabulary(tok)
	if err != nil {
		return nil, err
	}
	r := &Replica{cfg: cfg, rank: rank, log: log, tok: tok, vocab: vocab, decode: decodeTable(tok, vocab),
		faults: cfg.Faults, faultRNG: splitmix(uint64(cfg.Seed) + uint64(rank)), created: time.Now().Unix()}

	var sink engine.EventSink = discardSink{}
	if *cfg.KVEvents.Enabled {
		pcfg, err := publisherConfig(cfg, rank)
		if err != nil {
			return nil, err
		}
		r.pub, err = kvevents.NewPublisher(pcfg, log)
		if err != nil {
			return nil, fmt.Errorf("cannot start KV-event publisher: %w", err)
		}
		sink = publisherSink{r.pub, log}
	}
	ecfg := cfg.Engine
	ecfg.Seed = new(*ecfg.Seed + int64(rank))
	r.eng, err = engine.New(ecfg, sink, log)
	if err != nil {
		r.closePublisher()
		return nil, fmt.Errorf("cannot create engine: %w", err)
	}
	addr, err := offsetAddr(cfg.Listen, rank)
	if err != nil {
		r.closePublisher()
		return nil, err
	}
	r.srv = &http.Server{Handler: r.routes(), ReadHeaderTimeout: 10 * time.Second, ConnState: r.trackConn,
		ConnContext: func(ctx context.Context, c net.Conn) context.Context { return context.WithValue(ctx, connKey{}, c) }}
	r.conns = map[net.Conn]struct{}{}
	if r.addr, err = r.listen(addr); err != nil {
		r.closePublisher()
		return nil, err
	}
	return r, nil
}

func publisherConfig(cfg Config, rank int) (kvevents.PublisherConfig, error) {
	k := cfg.KVEvents
	f, _ := k.format()
	h, _ := k.hashes()
	layout, _ := k.replayLayout()
	ep, topic := k.Endpoint, k.Topic
	var err error
	if k.Connect {
		// Every rank connects to the one router socket and is told apart
		// by its topic, which names its own HTTP address (port+r).
		topic, err = offsetTopic(topic, rank)
	} else {
		ep, err = offsetEndpoint(k.Endpoint, rank)
	}
	if err != nil {
		return kvevents.PublisherConfig{}, err
	}
	replay := ""
	if k.ReplayEndpoint != "" {
		if replay, err = offsetEndpoint(k.ReplayEndpoint, rank); err != nil {
			return kvevents.PublisherConfig{}, err
		}
	}
	return kvevents.PublisherConfig{
		Endpoint: ep, Dial: k.Connect, ReplayEndpoint: replay, Topic: topic, BufferSteps: k.BufferSteps,
		Format: f, HashEncoding: h, ReplayLayout: layout, DPRank: rank,
	}, nil
}

// Addr is the HTTP address the replica listens on.
func (r *Replica) Addr() string { return r.addr }

// KVEndpoints returns the bound KV-event PUB and replay ROUTER endpoints
// ("" when off), with the real ports when the config asked for port 0.
func (r *Replica) KVEndpoints() (pub, replay string) {
	if r.pub == nil {
		return "", ""
	}
	return r.pub.Endpoint(), r.pub.ReplayEndpoint()
}

// Run serves until ctx is done, then shuts down within a few seconds.
func (r *Replica) Run(ctx context.Context) error {
	engCtx, cancel := context.WithCancel(context.Background())
	engDone := make(chan struct{})
	go func() { defer close(engDone); r.eng.Run(engCtx) }()
	r.log.Info("enginesim rank serving", zap.String("addr", r.addr), zap.String("model", r.cfg.Model),
		zap.String("flavour", r.cfg.Engine.Flavour))
	<-ctx.Done()
	shutCtx, shutCancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer shutCancel()
	r.lnMu.Lock()
	if r.refuse != nil {
		r.refuse.Stop()
	}
	r.lnMu.Unlock()
	err := r.srv.Shutdown(shutCtx)
	r.serveWG.Wait()
	cancel()
	<-engDone
	r.closePublisher()
	// The listener a refuse fault closed may be reported closed again.
	if err != nil && !errors.Is(err, http.ErrServerClosed) && !errors.Is(err, net.ErrClosed) {
		return fmt.Errorf("cannot shut down rank %d: %w", r.rank, err)
	}
	return nil
}

func (r *Replica) closePublisher() {
	if r.pub != nil {
		if err := r.pub.Close(); err != nil {
			r.log.Warn("closing KV-event publisher", zap.Error(err))
		}
	}
}

// listen binds addr, starts serving on it and returns the bound address
// (port 0 resolved).
func (r *Replica) listen(addr string) (string, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", fmt.Errorf("cannot listen on %s: %w", addr, err)
	}
	r.ln = ln
	r.serveWG.Add(1)
	go func() {
		defer r.serveWG.Done()
		if err := r.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) && !errors.Is(err, net.ErrClosed) {
			r.log.Error("HTTP server stopped", zap.Error(err))
		}
	}()
	return ln.Addr().String(), nil
}

type connKey struct{}

// refuseConnections closes the listener for d, so connects are refused as
// by a crashed process, then listens again on the same address. Open
// connections are closed too, except keep (the admin request's own).
func (r *Replica) refuseConnections(d time.Duration, keep net.Conn) error {
	r.lnMu.Lock()
	defer r.lnMu.Unlock()
	if r.ln == nil {
		return errors.New("connections are already being refused")
	}
	if err := r.ln.Close(); err != nil {
		return fmt.Errorf("cannot close listener: %w", err)
	}
	r.ln = nil
	for c := range r.conns {
		if c != keep {
			_ = c.Close() // as a crashed process would drop them
		}
	}
	r.refuse = time.AfterFunc(d, func() {
		r.lnMu.Lock()
		defer r.lnMu.Unlock()
		r.refuse = nil
		if _, err := r.listen(r.addr); err != nil {
			r.log.Error("cannot listen again after refuse fault", zap.Error(err))
		}
	})
	return nil
}

func (r *Replica) trackConn(c net.Conn, state http.ConnState) {
	r.lnMu.Lock()
	defer r.lnMu.Unlock()
	switch state {
	case http.StateNew:
		r.conns[c] = struct{}{}
	case http.StateClosed, http.StateHijacked:
		delete(r.conns, c)
	}
}

func (r *Replica) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	mux.HandleFunc("GET /v1/models", r.handleModels)
	mux.HandleFunc("POST /v1/chat/completions", r.handleChat)
	mux.HandleFunc("POST /v1/completions", r.handleCompletion)
	mux.HandleFunc("POST /v1/responses", r.handleResponses)
	mux.HandleFunc("POST /tokenize", r.handleTokenize)
	mux.HandleFunc("POST /detokenize", r.handleDetokenize)
	mux.HandleFunc("POST /v1/chat/completions/render", r.handleChatRender)
	mux.HandleFunc("POST /v1/completions/render", r.handleCompletionRender)
	mux.Handle("GET /metrics", r.hangWhenFaulty(promhttp.HandlerFor(r.eng.Registry(), promhttp.HandlerOpts{})))
	mux.HandleFunc("GET /admin/blocks", r.handleBlocks)
	mux.HandleFunc("GET /admin/stats", r.handleStats)
	mux.HandleFunc("GET /admin/faults", r.handleGetFaults)
	mux.HandleFunc("POST /admin/faults", r.handleSetFaults)
	mux.HandleFunc("POST /admin/restart", r.handleRestart)
	mux.HandleFunc("POST /admin/drop-events", r.handleDropEvents)
	mux.HandleFunc("POST /admin/refuse", r.handleRefuse)
	mux.HandleFunc("POST /admin/kv-events-outage", r.handleKVOutage)
	mux.HandleFunc("/", func(w http.ResponseWriter, req *http.Request) {
		writeError(w, http.StatusNotFound, "Not Found")
	})
	return mux
}

func (r *Replica) handleModels(w http.ResponseWriter, _ *http.Request) {
	owner := "vllm"
	if r.cfg.Engine.Flavour == engine.FlavourSGLang {
		owner = "sglang"
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"object": "list",
		"data": []map[string]any{{
			"id": r.cfg.Model, "object": "model", "created": r.created, "owned_by": owner,
			"root": r.cfg.Model, "parent": nil, "max_model_len": r.cfg.MaxModelLen,
		}},
	})
}

// readBody reads a JSON request body under the configured limit and
// decodes it into each of vs (several views of one body).
func (r *Replica) readBody(w http.ResponseWriter, req *http.Request, vs ...any) bool {
	body, err := io.ReadAll(http.MaxBytesReader(w, req.Body, r.cfg.MaxBodyBytes))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			writeError(w, http.StatusRequestEntityTooLarge,
				fmt.Sprintf("Request body is larger than %d bytes.", r.cfg.MaxBodyBytes))
			return false
		}
		writeError(w, http.StatusBadRequest, "cannot read request body: "+err.Error())
		return false
	}
	for _, v := range vs {
		if err := json.Unmarshal(body, v); err != nil {
			writeError(w, http.StatusBadRequest, "JSON decode error: "+err.Error())
			return false
		}
	}
	return true
}

// checkModel answers 404 for a model this replica does not serve.
func (r *Replica) checkModel(w http.ResponseWriter, model string) bool {
	if model == "" {
		writeError(w, http.StatusBadRequest, "Field required: model")
		return false
	}
	if model != r.cfg.Model {
		writeError(w, http.StatusNotFound, fmt.Sprintf("The model `%s` does not exist.", model))
		return false
	}
	return true
}

// hangWhenFaulty holds a request while the metrics_hang fault is set,
// until the client gives up; clearing the fault releases it. Polling keeps
// the fault a plain value like the others.
func (r *Replica) hangWhenFaulty(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			r.faultsMu.Lock()
			hang := r.faults.MetricsHang
			r.faultsMu.Unlock()
			if !hang {
				break
			}
			select {
			case <-req.Context().Done():
				return
			case <-tick.C:
			}
		}
		h.ServeHTTP(w, req)
	})
}

// injectFaults applies latency and error-rate faults; false means the
// request was answered with an injected error.
func (r *Replica) injectFaults(w http.ResponseWriter, req *http.Request) (Faults, bool) {
	r.faultsMu.Lock()
	f := r.faults
	fail := f.ErrorRate > 0 && float64(r.faultRNG.next()%1_000_000)/1_000_000 < f.ErrorRate
	r.faultsMu.Unlock()
	if f.Latency > 0 {
		t := time.NewTimer(f.Latency)
		select {
		case <-t.C:
		case <-req.Context().Done():
			t.Stop()
			return f, false
		}
	}
	if fail {
		writeError(w, f.ErrorStatus, "injected fault")
		return f, false
	}
	return f, true
}

func (r *Replica) handleBlocks(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{
		"rank": r.rank, "block_size": r.cfg.Engine.BlockSize, "blocks": r.eng.Resident(),
	})
}

func (r *Replica) handleStats(w http.ResponseWriter, _ *http.Request) {
	out := map[string]any{"rank": r.rank, "engine": r.eng.Snapshot()}
	if r.pub != nil {
		// The bound endpoints, so a test that asked for port 0 can find them.
		out["kv_events"] = map[string]string{"endpoint": r.pub.Endpoint(), "replay_endpoint": r.pub.ReplayEndpoint()}
	}
	writeJSON(w, http.StatusOK, out)
}

func (r *Replica) handleGetFaults(w http.ResponseWriter, _ *http.Request) {
	r.faultsMu.Lock()
	f := r.faults
	r.faultsMu.Unlock()
	writeJSON(w, http.StatusOK, f)
}

// handleSetFaults replaces the fault settings with the posted JSON; durations
// are Go duration strings or nanoseconds.
func (r *Replica) handleSetFaults(w http.ResponseWriter, req *http.Request) {
	var in struct {
		ErrorRate            float64 `json:"error_rate"`
		ErrorStatus          int     `json:"error_status"`
		Latency              string  `json:"latency"`
		StallAfterTokens     int     `json:"stall_after_tokens"`
		StallFor             string  `json:"stall_for"`
		RejectAutoToolChoice bool    `json:"reject_auto_tool_choice"`
		MetricsHang          bool    `json:"metrics_hang"`
	}
	if !r.readBody(w, req, &in) {
		return
	}
	f := Faults{ErrorRate: in.ErrorRate, ErrorStatus: in.ErrorStatus, StallAfterTokens: in.StallAfterTokens,
		RejectAutoToolChoice: in.RejectAutoToolChoice, MetricsHang: in.MetricsHang}
	var err error
	if f.Latency, err = parseDuration(in.Latency); err != nil {
		writeError(w, http.StatusBadRequest, "latency: "+err.Error())
		return
	}
	if f.StallFor, err = parseDuration(in.StallFor); err != nil {
		writeError(w, http.StatusBadRequest, "stall_for: "+err.Error())
		return
	}
	if f.ErrorStatus == 0 {
		f.ErrorStatus = 500
	}
	check := r.cfg
	check.Faults = f
	if err := check.Validate(); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	r.faultsMu.Lock()
	r.faults = f
	r.faultsMu.Unlock()
	r.log.Info("faults set", zap.Float64("error_rate", f.ErrorRate), zap.Duration("latency", f.Latency),
		zap.Int("stall_after_tokens", f.StallAfterTokens), zap.Bool("reject_auto_tool_choice", f.RejectAutoToolChoice), zap.Bool("metrics_hang", f.MetricsHang))
	writeJSON(w, http.StatusOK, f)
}

func parseDuration(s string) (time.Duration, error) {
	if s == "" {
		return 0, nil
	}
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		return time.Duration(n), nil
	}
	return time.ParseDuration(s)
}

// handleRestart simulates an engine restart: running requests fail, the
// cache is cleared (AllBlocksCleared) and the event sequence restarts at 0.
func (r *Replica) handleRestart(w http.ResponseWriter, _ *http.Request) {
	// The sequence restarts first, so the AllBlocksCleared the engine emits
	// at its next step is batch 0 of the new run, as after a real restart.
	if r.pub != nil {
		r.pub.Reset()
	}
	r.eng.Restart()
	r.log.Info("simulated restart")
	writeJSON(w, http.StatusOK, map[string]any{"restarted": true})
}

func (r *Replica) handleDropEvents(w http.ResponseWriter, req *http.Request) {
	var in struct {
		Batches int `json:"batches"`
	}
	if !r.readBody(w, req, &in) {
		return
	}
	if in.Batches <= 0 {
		writeError(w, http.StatusBadRequest, "batches must be positive")
		return
	}
	if r.pub == nil {
		writeError(w, http.StatusBadRequest, "KV events are disabled")
		return
	}
	r.pub.DropNext(in.Batches)
	writeJSON(w, http.StatusOK, map[string]any{"dropping": in.Batches})
}

// handleKVOutage makes the KV-event publisher vanish for a while (its PUB
// and replay ports closed) while the engine keeps serving and numbering
// its batches: subscribers lose the connection and, once it is back, find
// a gap that replay fills.
func (r *Replica) handleKVOutage(w http.ResponseWriter, req *http.Request) {
	d, ok := r.readFor(w, req)
	if !ok {
		return
	}
	if r.pub == nil {
		writeError(w, http.StatusBadRequest, "KV events are disabled")
		return
	}
	if err := r.pub.Vanish(d); err != nil {
		writeError(w, http.StatusConflict, err.Error())
		return
	}
	r.log.Info("KV-event publisher gone", zap.Duration("for", d))
	writeJSON(w, http.StatusOK, map[string]any{"kv_events_gone_for": d.String()})
}

// readFor reads an admin body {"for": "<duration>"}; a missing, malformed
// or non-positive duration is answered 400.
func (r *Replica) readFor(w http.ResponseWriter, req *http.Request) (time.Duration, bool) {
	var in struct {
		For string `json:"for"`
	}
	if !r.readBody(w, req, &in) {
		return 0, false
	}
	d, err := parseDuration(in.For)
	if err != nil || d <= 0 {
		writeError(w, http.StatusBadRequest, "for must be a positive duration")
		return 0, false
	}
	return d, true
}

func (r *Replica) handleRefuse(w http.ResponseWriter, req *http.Request) {
	d, ok := r.readFor(w, req)
	if !ok {
		return
	}
	keep, _ := req.Context().Value(connKey{}).(net.Conn)
	if err := r.refuseConnections(d, keep); err != nil {
		writeError(w, http.StatusConflict, err.Error())
		return
	}
	w.Header().Set("Connection", "close")
	writeJSON(w, http.StatusOK, map[string]any{"refusing_for": d.String()})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// writeError writes vLLM's error body: {"error": {message, type, param, code}}.
func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, openai.ErrorResponse{Error: openai.ErrorBody{
		Message: msg, Type: errorType(status), Code: status,
	}})
}

// errorType is the error "type" vLLM reports for a status.
func errorType(status int) string {
	switch status {
	case http.StatusBadRequest:
		return "BadRequestError"
	case http.StatusNotFound:
		return "NotFoundError"
	case http.StatusRequestEntityTooLarge:
		return "RequestEntityTooLarge"
	case http.StatusUnprocessableEntity:
		return "UnprocessableEntityError"
	case http.StatusNotImplemented:
		return "NotImplementedError"
	case http.StatusTooManyRequests:
		return "TooManyRequests"
	case http.StatusServiceUnavailable:
		return "ServiceUnavailable"
	}
	if status >= 500 {
		return "InternalServerError"
	}
	return http.StatusText(status)
}

type discardSink struct{}

func (discardSink) Publish([]kvevents.Event) {}

// publisherSink hands each engine step's events to the ZMQ publisher.
type publisherSink struct {
	pub *kvevents.Publisher
	log *zap.Logger
}

func (s publisherSink) Publish(events []kvevents.Event) {
	if _, err := s.pub.Publish(events); err != nil {
		s.log.Warn("cannot publish KV events", zap.Error(err))
	}
}

// offsetAddr returns host:port+rank.
func offsetAddr(addr string, rank int) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("bad listen address %q: %w", addr, err)
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		return "", fmt.Errorf("bad port in %q: %w", addr, err)
	}
	if p == 0 {
		return addr, nil
	}
	return net.JoinHostPort(host, strconv.Itoa(p+rank)), nil
}

// offsetEndpoint returns a ZMQ tcp endpoint with its port moved up by rank,
// as vLLM does for data-parallel ranks.
// offsetTopic gives rank r of a kv@<ip>:<port>@<model> topic its own port,
// port+r; other topics are the same for every rank.
func offsetTopic(topic string, rank int) (string, error) {
	rest, ok := strings.CutPrefix(topic, "kv@")
	addr, model, found := strings.Cut(rest, "@")
	if rank == 0 || !ok || !found {
		return topic, nil
	}
	a, err := offsetAddr(addr, rank)
	if err != nil {
		return "", fmt.Errorf("KV-event topic %q: %w", topic, err)
	}
	return "kv@" + a + "@" + model, nil
}

func offsetEndpoint(ep string, rank int) (string, error) {
	const scheme = "tcp://"
	if len(ep) <= len(scheme) || ep[:len(scheme)] != scheme {
		return "", fmt.Errorf("KV-event endpoint %q is not tcp://host:port", ep)
	}
	a, err := offsetAddr(ep[len(scheme):], rank)
	if err != nil {
		return "", err
	}
	return scheme + a, nil
}

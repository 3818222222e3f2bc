package epp

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	stdlog "log"
	"net"
	"net/http"
	"net/http/pprof"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/omnious/provider-node/capacity"
	"github.com/omnious/provider-node/discovery"
	"github.com/omnious/provider-node/endpoint"
	"github.com/omnious/provider-node/engines/metrics"
	"github.com/omnious/provider-node/engines/tokenizer"
	"github.com/omnious/provider-node/extproc"
	"github.com/omnious/provider-node/internal/adminauth"
	"github.com/omnious/provider-node/kvindex"
	"github.com/omnious/provider-node/kvindex/ingest"
	"github.com/omnious/provider-node/rules"
	"github.com/omnious/provider-node/scheduler"
)

// healthServices are the names Envoy and kubelet ask about; all report the
// same state.
var healthServices = []string{"", "liveness", "readiness", "envoy.service.ext_proc.v3.ExternalProcessor"}

// EPP is one running EndpointPicker.
type EPP struct {
	cfg     Config
	log     *zap.Logger
	src     discovery.Source
	reg     *prometheus.Registry
	ix      *kvindex.Index
	ids     *kvindex.IDs // the one owner of replica ids
	sched   *scheduler.Scheduler
	ingest  *ingest.Manager
	scraper *metrics.Scraper
	health  *health.Server
	grpc    *grpc.Server
	xp      *extproc.Server
	http    []*http.Server
	tracer  *sdktrace.TracerProvider // nil: no tracing

	grpcLn, healthLn, metricsLn, adminLn net.Listener
	admin                                http.Handler // the admin mux behind its authentication

	mu        sync.Mutex
	endpoints []endpoint.Endpoint // for the admin view

	snapMu sync.Mutex // one snapshot served at a time
}

// Option changes how New assembles the EPP.
type Option func(*options)

type options struct {
	observePick func(time.Duration)
	rules       *rules.Store
	sched       []scheduler.Option
}

// WithPickObserver calls f with the duration of every scheduling decision,
// not counting time spent waiting in flow control, for harnesses that
// report decision latency.
func WithPickObserver(f func(time.Duration)) Option {
	return func(o *options) { o.observePick = f }
}

// WithWindowObserver calls f with every scrape window a replica's capacity
// curve learns from (scheduler.WithWindowObserver), for harnesses that
// record what the curves were fitted to.
func WithWindowObserver(f func(addr string, w capacity.Window)) Option {
	return func(o *options) { o.sched = append(o.sched, scheduler.WithWindowObserver(f)) }
}

// WithRules makes the EPP apply the model rules in rs, a store from
// NewRules that the discovery source also feeds (FileConfig.Rules,
// PoolConfig.Rules). Without it the EPP applies the config's models alone.
func WithRules(rs *rules.Store) Option {
	return func(o *options) { o.rules = rs }
}

// NewRules returns the model rule store of an EPP with cfg: objectives map
// onto cfg's flow-control bands, and cfg's models are in it as source
// "config".
func NewRules(cfg Config) (*rules.Store, error) {
	a := cfg.Scheduler.WithDefaults().Admission
	bands := make([]rules.Band, len(a.Bands))
	for i, b := range a.Bands {
		bands[i] = rules.Band{Name: b.Name, Priority: b.Priority}
	}
	rs := rules.NewStore(bands, a.DefaultBand)
	if err := rs.Set("config", &rules.Spec{Models: cfg.Models}); err != nil {
		return nil, fmt.Errorf("models: %w", err)
	}
	return rs, nil
}

// timedPicker reports each Pick's duration.
type timedPicker struct {
	extproc.Picker
	observe func(time.Duration)
}

func (p timedPicker) Pick(r *scheduler.Request, t *scheduler.Ticket) (*scheduler.Decision, error) {
	start := time.Now()
	d, err := p.Picker.Pick(r, t)
	p.observe(time.Since(start))
	return d, err
}

// New builds the EPP and binds its ports (port 0 picks a free one; see the
// Addr methods). src supplies the endpoints; Run serves.
func New(cfg Config, src discovery.Source, log *zap.Logger, opts ...Option) (*EPP, error) {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("invalid EPP config: %w", err)
	}
	e := &EPP{cfg: cfg, log: log, src: src, reg: prometheus.NewRegistry()}
	e.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	e.ids = kvindex.NewIDs()
	// A sibling's snapshot loads into an index of its own, which becomes
	// the EPP's only once whole and verified; otherwise the EPP starts
	// from an empty one.
	var preload []kvindex.LoadedReplica
	if snap := e.warmStart(); snap != nil {
		e.ix, preload = snap.Index, snap.Replicas
	} else {
		e.ix = kvindex.New(cfg.Index.kvindex())
	}
	var err error
	if e.sched, err = scheduler.New(cfg.Scheduler, e.ix, e.reg, log.Named("scheduler"), o.sched...); err != nil {
		return nil, fmt.Errorf("cannot create scheduler: %w", err)
	}
	e.scraper = metrics.NewScraper(metrics.ScraperConfig{
		Interval: cfg.Scheduler.Signals.ScrapeInterval,
		Timeout:  cfg.Scheduler.Signals.ScrapeTimeout,
		OnSample: e.sched.Observe,
	}, log.Named("scraper"))
	if e.ingest, err = ingest.New(cfg.Ingest, cfg.Scheduler.BlockSize, e.ix, log.Named("ingest")); err != nil {
		return nil, err
	}
	e.ingest.Preload(preload)
	if err := e.build(o); err != nil {
		e.ingest.Close()
		return nil, err
	}
	return e, nil
}

// build assembles the rest once ingestion runs (New closes it on error).
func (e *EPP) build(o options) error {
	cfg, log := e.cfg, e.log
	if err := e.ingest.Register(e.reg); err != nil {
		return fmt.Errorf("cannot register ingestion metrics: %w", err)
	}
	prompter, err := newPrompter(cfg)
	if err != nil {
		return err
	}
	var picker extproc.Picker = e.sched
	if o.observePick != nil {
		picker = timedPicker{picker, o.observePick}
	}
	xp := extproc.NewServer(cfg.ExtProc, picker, prompter, e.reg, log.Named("extproc"))
	if o.rules == nil {
		if o.rules, err = NewRules(cfg); err != nil {
			return err
		}
	}
	xp.SetRules(o.rules, e.sched)
	if f := cfg.ExtProc.CalibrationTokenFile; f != "" {
		tok, err := adminauth.ReadToken(f)
		if err != nil {
			return fmt.Errorf("extproc.calibration_token_file: %w", err)
		}
		xp.SetCalibrationToken(tok)
	}
	if e.tracer, err = newTracerProvider(cfg.Tracing); err != nil {
		return err
	}
	if e.tracer != nil {
		xp.SetTracerProvider(e.tracer)
	}

	grpcOpts := cfg.ExtProc.ServerOptions()
	if cfg.TLSCertFile != "" {
		cert, err := tls.LoadX509KeyPair(cfg.TLSCertFile, cfg.TLSKeyFile)
		if err != nil {
			_ = shutdownTracing(context.Background(), e.tracer)
			return fmt.Errorf("cannot load TLS key pair: %w", err)
		}
		grpcOpts = append(grpcOpts, grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})))
	}
	e.grpc = grpc.NewServer(grpcOpts...)
	xp.Register(e.grpc)
	e.xp = xp
	e.health = health.NewServer()
	for _, s := range healthServices {
		e.health.SetServingStatus(s, healthpb.HealthCheckResponse_SERVING)
	}
	// Envoy health-checks the ext_proc cluster on the ext_proc port itself.
	healthpb.RegisterHealthServer(e.grpc, e.health)

	if e.admin, err = e.cfg.Admin.auth().Handler(e.adminMux()); err != nil {
		_ = shutdownTracing(context.Background(), e.tracer)
		return err
	}
	adminTLS, err := e.cfg.Admin.auth().ServerTLS()
	if err != nil {
		_ = shutdownTracing(context.Background(), e.tracer)
		return err
	}
	if err := e.listen(); err != nil {
		e.closeListeners()
		_ = shutdownTracing(context.Background(), e.tracer)
		return err
	}
	if adminTLS != nil {
		e.adminLn = tls.NewListener(e.adminLn, adminTLS)
	}
	return nil
}

func newPrompter(cfg Config) (extproc.Prompter, error) {
	if cfg.StandInTokenizer {
		return extproc.NewStandInPrompter(), nil
	}
	models := make(map[string]extproc.ModelTokenizer, len(cfg.Tokenizers))
	for model, dir := range cfg.Tokenizers {
		tok, err := tokenizer.Load(model, dir)
		if err != nil {
			return nil, fmt.Errorf("cannot load tokenizer of %s: %w", model, err)
		}
		tmpl, err := tok.NewChatTemplate()
		if err != nil {
			return nil, fmt.Errorf("cannot load chat template of %s: %w", model, err)
		}
		// Requests share system prompts and earlier turns: the prefix cache
		// tokenizes only what follows the longest prefix seen before, and
		// gives exactly the tokenizer's own ids.
		_, harmony := tok.AddedToken("<|channel|>") // gpt-oss
		models[model] = extproc.ModelTokenizer{Tokenizer: tokenizer.NewPrefixCache(tok, tokenizer.PrefixCacheConfig{}), Template: tmpl, Harmony: harmony}
	}
	return extproc.NewTokenPrompter(models, nil), nil
}

func (e *EPP) listen() error {
	var err error
	for _, l := range []struct {
		ln   *net.Listener
		addr string
	}{{&e.grpcLn, e.cfg.GRPCAddr}, {&e.healthLn, e.cfg.HealthAddr}, {&e.metricsLn, e.cfg.MetricsAddr}, {&e.adminLn, e.cfg.AdminAddr}} {
		if *l.ln, err = net.Listen("tcp", l.addr); err != nil {
			return fmt.Errorf("cannot listen on %s: %w", l.addr, err)
		}
	}
	return nil
}

func (e *EPP) closeListeners() {
	for _, ln := range []net.Listener{e.grpcLn, e.healthLn, e.metricsLn, e.adminLn} {
		if ln != nil {
			_ = ln.Close()
		}
	}
}

// GRPCAddr, HealthAddr, MetricsAddr and AdminAddr are the bound addresses.
func (e *EPP) GRPCAddr() string    { return e.grpcLn.Addr().String() }
func (e *EPP) HealthAddr() string  { return e.healthLn.Addr().String() }
func (e *EPP) MetricsAddr() string { return e.metricsLn.Addr().String() }
func (e *EPP) AdminAddr() string   { return e.adminLn.Addr().String() }

// Registry is the EPP's metric registry.
func (e *EPP) Registry() *prometheus.Registry { return e.reg }

// Scheduler is the running scheduler (for in-process harnesses).
func (e *EPP) Scheduler() *scheduler.Scheduler { return e.sched }

// Run serves until ctx is done, then drains: health turns NOT_SERVING, new
// streams are still served for DrainDelay, then the gRPC server stops
// accepting them and waits up to DrainTimeout for the open ones.
func (e *EPP) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	goRun := func(name string, f func() error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f(); err != nil {
				errs <- fmt.Errorf("%s: %w", name, err)
				cancel()
			}
		}()
	}
	goRun("discovery", func() error { return e.src.Run(ctx, e.update) })
	goRun("scheduler", func() error { return e.sched.Run(ctx) })
	goRun("scraper", func() error { e.scraper.Run(ctx); return nil })

	healthSrv := grpc.NewServer()
	healthpb.RegisterHealthServer(healthSrv, e.health)
	goRun("grpc", func() error { return serveGRPC(e.grpc, e.grpcLn) })
	goRun("health", func() error { return serveGRPC(healthSrv, e.healthLn) })
	metricsMux := http.NewServeMux()
	metricsMux.Handle("GET /metrics", promhttp.HandlerFor(e.reg, promhttp.HandlerOpts{Registry: e.reg}))
	e.http = []*http.Server{
		{Handler: metricsMux, ReadHeaderTimeout: 10 * time.Second},
		// Refused handshakes (a client without the admin certificate) are
		// warnings; the production logger samples them.
		{Handler: e.admin, ReadHeaderTimeout: 10 * time.Second, ErrorLog: mustStdLog(e.log.Named("admin"))},
	}
	for i, ln := range []net.Listener{e.metricsLn, e.adminLn} {
		srv := e.http[i]
		goRun("http", func() error {
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				return err
			}
			return nil
		})
	}
	e.log.Info("EPP serving", zap.String("grpc", e.GRPCAddr()), zap.String("health", e.HealthAddr()),
		zap.String("metrics", e.MetricsAddr()), zap.String("admin", e.AdminAddr()),
		zap.String("policy", e.cfg.Scheduler.Policy), zap.Int("block_size", e.cfg.Scheduler.BlockSize))

	<-ctx.Done()
	e.health.Shutdown() // every service NOT_SERVING: Envoy and kubelet move away
	if d := *e.cfg.DrainDelay; d > 0 {
		// New streams are still served until the health checks have
		// moved them elsewhere; a refused one would fail its request.
		e.log.Info("draining: health NOT_SERVING, new streams still served", zap.Duration("drain_delay", d))
		time.Sleep(d)
	}
	drained := make(chan struct{})
	go func() { e.grpc.GracefulStop(); close(drained) }()
	select {
	case <-drained:
	case <-time.After(*e.cfg.DrainTimeout):
		e.log.Warn("drain timed out; closing open ext_proc streams", zap.Duration("drain_timeout", *e.cfg.DrainTimeout))
		e.grpc.Stop()
	}
	healthSrv.Stop()
	shutCtx, shutCancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer shutCancel()
	for _, s := range e.http {
		_ = s.Shutdown(shutCtx)
	}
	wg.Wait()
	e.ingest.Close()
	if err := shutdownTracing(shutCtx, e.tracer); err != nil {
		errs <- err
	}
	close(errs)
	var all []error
	for err := range errs {
		all = append(all, err)
	}
	return errors.Join(all...)
}

// mustStdLog is log as a standard logger writing at warn level.
func mustStdLog(log *zap.Logger) *stdlog.Logger {
	l, err := zap.NewStdLogAt(log, zap.WarnLevel)
	if err != nil {
		panic(err) // only for a level zap does not know
	}
	return l
}

func serveGRPC(s *grpc.Server, ln net.Listener) error {
	if err := s.Serve(ln); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return err
	}
	return nil
}

// update applies a new endpoint set. Discovery never calls it
// concurrently. Ids are assigned first, so ingestion and the scheduler get
// the same ones in one pass; a departed endpoint's id is released (and its
// index entries cleared) only after its subscriber has stopped and the
// scheduler has dropped it, so a late event cannot repopulate a freed id.
func (e *EPP) update(eps []endpoint.Endpoint) {
	targets := make([]scheduler.Target, 0, len(eps))
	sources := make([]ingest.Source, 0, len(eps))
	urls := make([]string, 0, len(eps)) // the scraper skips "" and repeats
	present := make(map[string]bool, len(eps))
	for _, ep := range eps {
		id, err := e.ids.Assign(ep.Addr)
		if err != nil {
			e.log.Error("cannot add endpoint", zap.String("addr", ep.Addr), zap.Error(err))
			continue
		}
		present[ep.Addr] = true
		targets = append(targets, scheduler.Target{Endpoint: ep, Replica: id})
		if ep.KVEvents != "" || ep.KVConnect {
			sources = append(sources, ingest.Source{Replica: id, Name: ep.Addr, Model: ep.Model,
				Endpoint: ep.KVEvents, Replay: ep.KVReplay, Connect: ep.KVConnect})
		}
		urls = append(urls, ep.MetricsURL)
	}
	e.ingest.Set(sources)
	e.xp.SetModelEngines(modelEngines(eps))
	e.sched.SetEndpoints(targets)
	e.scraper.SetTargets(urls)
	e.ids.Retain(func(addr string) bool { return present[addr] }, e.ix)
	e.mu.Lock()
	e.endpoints = eps
	e.mu.Unlock()
	e.log.Info("endpoints updated", zap.Int("endpoints", len(targets)), zap.Int("kv_event_sources", len(sources)))
}

// modelEngines is the engine families serving each model of eps (an
// endpoint of no named engine is vLLM, discovery's default).
func modelEngines(eps []endpoint.Endpoint) map[string]extproc.Engines {
	m := make(map[string]extproc.Engines, 1)
	for _, ep := range eps {
		e := extproc.EngineVLLM
		if ep.Engine == discovery.EngineSGLang {
			e = extproc.EngineSGLang
		}
		m[ep.Model] |= e
	}
	return m
}

func (e *EPP) adminMux() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+capacity.Path, func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, e.sched.Capacity())
	})
	mux.HandleFunc("GET "+kvindex.SnapshotPath, e.serveSnapshot)
	if !e.cfg.Admin.debug(e.cfg.AdminAddr) {
		return mux
	}
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	mux.HandleFunc("GET /debug/endpoints", func(w http.ResponseWriter, _ *http.Request) {
		e.mu.Lock()
		eps := e.endpoints
		e.mu.Unlock()
		type view struct {
			endpoint.Endpoint
			Replica  *kvindex.Replica `json:"replica,omitempty"`
			Resident int              `json:"resident_blocks"`
		}
		out := make([]view, 0, len(eps))
		for _, ep := range eps {
			v := view{Endpoint: ep}
			if id, ok := e.ids.Lookup(ep.Addr); ok {
				v.Replica = &id
				v.Resident = e.ix.Resident(id)
			}
			out = append(out, v)
		}
		writeJSON(w, out)
	})
	mux.HandleFunc("GET /debug/index", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, e.ix.Stats())
	})
	return mux
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

package quoter

import (
	"cmp"
	"context"
	"crypto/ecdsa"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"net/http"
	"sync"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/crypto"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"

	"github.com/omnious/provider-node/capacity"
	"github.com/omnious/provider-node/internal/opt"
	"github.com/omnious/provider-node/quoter/conformance"
)

// Config configures the quote loop. Defaults are applied by WithDefaults:
// zero means the default, a negative duration is refused by Validate (the
// rule of package opt).
type Config struct {
	// ProviderID is the market's provider identifier. Required.
	ProviderID string
	// Model is the served model id (as in /v1/models). Required.
	Model string
	// ModelClass is the market's model class. Required.
	ModelClass string
	// ServingURL is the exact public serving URL; its keccak256 is the
	// quote's endpointHash and conformance runs through it. Required.
	ServingURL string
	// ChainID is the EIP-712 domain chainId. Default 1.
	ChainID *big.Int
	// FloorIn and FloorOut are the input and output prices in integer
	// micro-units per million tokens (FLOOR_IN, FLOOR_OUT). Required.
	FloorIn, FloorOut *big.Int
	// CapacityURL is the EPP admin base URL serving capacity.Path. Required.
	CapacityURL string
	// StateFile persists the quote sequence. Required.
	StateFile string
	// MarketURL receives quotes by POST. Default "" (serve only).
	MarketURL string
	// Refresh is the signing interval. Default 10s.
	Refresh time.Duration
	// TTL is how long a quote is valid (whole seconds). Default 30s.
	TTL time.Duration
	// MaxSnapshotAge is the oldest capacity snapshot still trusted.
	// Default 30s.
	MaxSnapshotAge time.Duration
	// CanaryInterval is how often a closed breaker runs a canary. Default 30s.
	CanaryInterval time.Duration
	// SkipConformance disables the pre-quote gate (sign --once offline
	// only; the run loop refuses it). Default false.
	SkipConformance bool
	// Conformance tunes the gate and canary checks (URL and Model are
	// taken from ServingURL and Model).
	Conformance conformance.Config
	// Breaker tunes the health breaker.
	Breaker BreakerConfig
	// PublishBackoff and PublishMaxBackoff bound publish retries.
	// Defaults 500ms and 10s.
	PublishBackoff, PublishMaxBackoff time.Duration
	// Objectives are the latency objectives a quote's headroom must hold
	// (SLO_TTFT_P95, SLO_ITL_P95 set their TTFT and ITL). Zero fields take
	// capacity.DefaultObjectives: interactive chat.
	Objectives capacity.Objectives
	// CalibrationFile is a `quoter calibrate` document; the quote loop
	// re-reads it when it changes. An idle pool is quoted from it until
	// the replicas have measured their own curves. Default "" (none: only
	// what was measured online is sold).
	CalibrationFile string
}

// defaults are Config's defaults, written once: WithDefaults fills them
// and Validate's messages quote them.
var defaults = Config{Refresh: 10 * time.Second, TTL: 30 * time.Second, MaxSnapshotAge: 30 * time.Second,
	CanaryInterval: 30 * time.Second, PublishBackoff: 500 * time.Millisecond, PublishMaxBackoff: 10 * time.Second}

// WithDefaults fills unset (zero) fields. A negative one is kept for
// Validate to refuse.
func (c Config) WithDefaults() Config {
	if c.ChainID == nil {
		c.ChainID = big.NewInt(1)
	}
	opt.Zero(&c.Refresh, defaults.Refresh)
	opt.Zero(&c.TTL, defaults.TTL)
	opt.Zero(&c.MaxSnapshotAge, defaults.MaxSnapshotAge)
	opt.Zero(&c.CanaryInterval, defaults.CanaryInterval)
	opt.Zero(&c.PublishBackoff, defaults.PublishBackoff)
	opt.Zero(&c.PublishMaxBackoff, defaults.PublishMaxBackoff)
	c.Objectives = c.Objectives.WithDefaults()
	// The checks' own defaults are applied where they run
	// (conformance.Run), after New gives them the service's HTTP client.
	c.Conformance.URL, c.Conformance.Model = c.ServingURL, c.Model
	c.Breaker = c.Breaker.WithDefaults()
	return c
}

// Validate reports every problem with a defaulted config. Settings are
// named by the flags of cmd/quoter that set them (TestFlagsNegative).
func (c Config) Validate() error {
	var errs []error
	for name, v := range map[string]string{"provider id": c.ProviderID, "model": c.Model, "model class": c.ModelClass,
		"serving URL": c.ServingURL, "capacity URL": c.CapacityURL, "state file": c.StateFile} {
		if v == "" {
			errs = append(errs, fmt.Errorf("%s is required", name))
		}
	}
	if c.FloorIn == nil || c.FloorIn.Sign() < 0 || c.FloorIn.BitLen() > 256 {
		errs = append(errs, errors.New("input price floor (FLOOR_IN) must be a non-negative integer"))
	}
	if c.FloorOut == nil || c.FloorOut.Sign() < 0 || c.FloorOut.BitLen() > 256 {
		errs = append(errs, errors.New("output price floor (FLOOR_OUT) must be a non-negative integer"))
	}
	if c.ChainID.Sign() <= 0 {
		errs = append(errs, errors.New("chain id must be positive"))
	}
	errs = append(errs,
		opt.DefaultNonNegative("--refresh", c.Refresh, defaults.Refresh),
		opt.DefaultNonNegative("--ttl", c.TTL, defaults.TTL),
		opt.DefaultNonNegative("--max-snapshot-age", c.MaxSnapshotAge, defaults.MaxSnapshotAge),
		opt.DefaultNonNegative("--canary-interval", c.CanaryInterval, defaults.CanaryInterval),
		opt.DefaultNonNegative("PublishBackoff", c.PublishBackoff, defaults.PublishBackoff),
		opt.DefaultNonNegative("PublishMaxBackoff", c.PublishMaxBackoff, defaults.PublishMaxBackoff),
		opt.DefaultNonNegative("--slo-ttft-p95", c.Objectives.TTFT, capacity.DefaultObjectives.TTFT),
		opt.DefaultNonNegative("--slo-itl-p95", c.Objectives.ITL, capacity.DefaultObjectives.ITL),
		c.Conformance.WithDefaults().Validate(), c.Breaker.Validate())
	if c.Objectives.TTFT >= 0 && c.Objectives.ITL >= 0 {
		errs = append(errs, c.Objectives.Validate())
	}
	if c.TTL > 0 && (c.TTL < time.Second || c.TTL%time.Second != 0) {
		errs = append(errs, fmt.Errorf("--ttl %s must be a whole number of seconds, at least 1s", c.TTL))
	}
	if c.Refresh > 0 && c.Refresh >= c.TTL {
		errs = append(errs, fmt.Errorf("--refresh %s must be shorter than the --ttl %s, or quotes lapse between renewals", c.Refresh, c.TTL))
	}
	return errors.Join(errs...)
}

// Options are the service's injectable dependencies.
type Options struct {
	// Now is the clock. Default time.Now.
	Now func() time.Time
	// Registerer receives the metrics. Default: a private registry served
	// by Handler's /metrics.
	Registerer prometheus.Registerer
	// Gatherer serves /metrics when Registerer is set.
	Gatherer prometheus.Gatherer
	// HTTP is used for the EPP, the market and conformance. Default: a
	// client with a 30 s timeout.
	HTTP *http.Client
	// CapacityHTTP reads the EPP's admin port with its credentials
	// (internal/adminauth). Default: HTTP.
	CapacityHTTP *http.Client
	// OnSigned, when set, sees every quote right after signing (audit
	// logs, tests). It runs on the signing goroutine: keep it fast.
	OnSigned func(*SignedQuote)
	// OnBreaker, when set, sees every breaker transition (same caveat).
	OnBreaker func(from, to BreakerState, reason string)
}

// Service is the quote loop: health and capacity in, signed quotes out.
type Service struct {
	cfg      Config
	key      *ecdsa.PrivateKey
	addr     common.Address
	log      *zap.Logger
	now      func() time.Time
	seq      *SeqStore
	breaker  *Breaker
	capacity *CapacityClient
	m        *metrics
	gatherer prometheus.Gatherer
	pub      *publisher
	hc       *http.Client
	onSigned func(*SignedQuote)

	cal calibrationFile

	mu         sync.Mutex
	assessment Assessment
	current    *SignedQuote
	expiry     time.Time
	conformed  bool
	lastCanary time.Time
	lastTick   time.Time
}

// New builds a service; key is used only to sign and is never logged.
func New(cfg Config, key *ecdsa.PrivateKey, log *zap.Logger, opts Options) (*Service, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("invalid quoter config: %w", err)
	}
	if key == nil {
		return nil, errors.New("no signing key")
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.HTTP == nil {
		opts.HTTP = &http.Client{Timeout: 30 * time.Second}
	}
	gatherer := opts.Gatherer
	reg := opts.Registerer
	if reg == nil {
		r := prometheus.NewRegistry()
		reg, gatherer = r, r
	}
	seq, err := OpenSeqStore(cfg.StateFile)
	if err != nil {
		return nil, err
	}
	if cfg.Conformance.HTTP == nil {
		cfg.Conformance.HTTP = opts.HTTP
	}
	s := &Service{cfg: cfg, key: key, addr: crypto.PubkeyToAddress(key.PublicKey), log: log, now: opts.Now,
		seq: seq, capacity: &CapacityClient{URL: cfg.CapacityURL, HTTP: cmp.Or(opts.CapacityHTTP, opts.HTTP)}, m: newMetrics(reg),
		gatherer: gatherer, hc: opts.HTTP, onSigned: opts.OnSigned}
	s.cal = calibrationFile{path: cfg.CalibrationFile, model: cfg.Model, log: log, loaded: s.m.calibrated}
	s.breaker = NewBreaker(cfg.Breaker, opts.Now)
	s.breaker.onChange = func(from, to BreakerState, reason string) {
		s.m.breakerState.Set(float64(to))
		s.m.transitions.WithLabelValues(to.String()).Inc()
		if to != BreakerClosed && s.pub != nil {
			s.pub.clear()
		}
		log.Warn("breaker transition", zap.Stringer("from", from), zap.Stringer("to", to), zap.String("reason", reason))
		if opts.OnBreaker != nil {
			opts.OnBreaker(from, to, reason)
		}
	}
	if cfg.MarketURL != "" {
		s.pub = newPublisher(cfg.MarketURL, opts.HTTP, cfg.PublishBackoff, cfg.PublishMaxBackoff, opts.Now, s.m, log)
	}
	return s, nil
}

// Address is the provider address quotes are signed with.
func (s *Service) Address() common.Address { return s.addr }

// LastAssessment is how the last quote's headroom was reached.
func (s *Service) LastAssessment() Assessment {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.assessment
}

// Breaker exposes the health breaker (state, reason).
func (s *Service) Breaker() *Breaker { return s.breaker }

// Current returns the current quote while it is valid and the breaker is
// closed.
func (s *Service) Current() (*SignedQuote, bool) {
	s.mu.Lock()
	sq, exp := s.current, s.expiry
	s.mu.Unlock()
	if sq == nil || !s.now().Before(exp) || s.breaker.State() != BreakerClosed {
		return nil, false
	}
	return sq, true
}

// Run signs and publishes every Refresh until ctx ends.
func (s *Service) Run(ctx context.Context) error {
	if s.cfg.SkipConformance {
		return errors.New("the quote loop never runs without the conformance gate")
	}
	s.log.Info("quoter starting", zap.String("provider", s.addr.Hex()), zap.String("model", s.cfg.Model),
		zap.String("serving_url", s.cfg.ServingURL), zap.Duration("refresh", s.cfg.Refresh), zap.Duration("ttl", s.cfg.TTL))
	var wg sync.WaitGroup
	defer wg.Wait()
	if s.pub != nil {
		wg.Go(func() { s.pub.run(ctx) })
	}
	t := time.NewTicker(s.cfg.Refresh)
	defer t.Stop()
	for {
		s.Tick(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Tick runs one iteration: health check, breaker, gate, canary, sign.
func (s *Service) Tick(ctx context.Context) {
	now := s.now()
	s.mu.Lock()
	s.lastTick = now
	s.mu.Unlock()
	snap, healthErr := s.checkHealth(ctx, now)
	s.breaker.ReportHealth(healthErr)
	switch s.breaker.State() {
	case BreakerOpen:
		return
	case BreakerHalfOpen:
		if healthErr == nil {
			s.breaker.ReportCanary(s.canary(ctx))
		}
		if s.breaker.State() != BreakerClosed {
			return // half-open runs probes only
		}
	}
	if !s.gate(ctx) {
		return
	}
	if s.now().Sub(s.lastCanaryAt()) >= s.cfg.CanaryInterval {
		s.breaker.ReportCanary(s.canary(ctx))
	}
	if s.breaker.State() != BreakerClosed {
		return
	}
	if _, err := s.sign(snap); err != nil {
		s.log.Error("cannot sign quote", zap.Error(err))
	}
}

func (s *Service) lastCanaryAt() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lastCanary
}

func (s *Service) checkHealth(ctx context.Context, now time.Time) (capacity.Snapshot, error) {
	snap, err := s.capacity.Fetch(ctx)
	if err == nil {
		err = CheckSnapshot(snap, s.cfg.Model, now, s.cfg.MaxSnapshotAge)
	}
	if err != nil {
		reason := "other"
		switch {
		case errors.Is(err, ErrEPPUnreachable):
			reason = "epp_unreachable"
		case errors.Is(err, ErrNoHealthyReplica):
			reason = "no_healthy_replica"
		case errors.Is(err, ErrStaleMetrics):
			reason = "stale_metrics"
		}
		s.m.healthCheckFails.WithLabelValues(reason).Inc()
		s.log.Warn("health check failed", zap.String("reason", reason), zap.Error(err))
	}
	return snap, err
}

// gate runs the quick conformance suite until it has passed once.
func (s *Service) gate(ctx context.Context) bool {
	s.mu.Lock()
	ok := s.conformed || s.cfg.SkipConformance
	s.mu.Unlock()
	if ok {
		return true
	}
	rep := conformance.Run(ctx, s.cfg.Conformance, conformance.Quick)
	if err := rep.Err(); err != nil {
		s.log.Warn("conformance gate failed: not signing", zap.Strings("failed", rep.Failed()), zap.Error(err))
		return false
	}
	s.log.Info("conformance gate passed", zap.Int("checks", len(rep.Results)))
	s.mu.Lock()
	s.conformed = true
	s.lastCanary = s.now() // the gate is as good as a canary
	s.mu.Unlock()
	s.m.conformed.Set(1)
	return true
}

func (s *Service) canary(ctx context.Context) error {
	rep := conformance.Run(ctx, s.cfg.Conformance, conformance.Quick)
	err := rep.Err()
	s.mu.Lock()
	s.lastCanary = s.now()
	s.mu.Unlock()
	if err != nil {
		s.m.canary.WithLabelValues("fail").Inc()
		s.log.Warn("canary failed", zap.Strings("failed", rep.Failed()), zap.Error(err))
		return err
	}
	s.m.canary.WithLabelValues("pass").Inc()
	return nil
}

// SignOnce checks health and the conformance gate (unless skipped) and
// signs one quote regardless of breaker hysteresis (for `quoter sign`).
func (s *Service) SignOnce(ctx context.Context) (*SignedQuote, error) {
	snap, err := s.checkHealth(ctx, s.now())
	if err != nil {
		return nil, fmt.Errorf("not signing: %w", err)
	}
	if !s.gate(ctx) {
		return nil, errors.New("not signing: conformance gate failed (see log)")
	}
	return s.sign(snap)
}

func (s *Service) sign(snap capacity.Snapshot) (*SignedQuote, error) {
	m, _ := FindModel(snap, s.cfg.Model)
	h, a := ComputeHeadroom(m, s.cal.get(), s.cfg.Objectives)
	s.mu.Lock()
	s.assessment = a
	s.mu.Unlock()
	s.m.capacityConc.Set(a.Streams)
	s.m.capacityTPS.Set(a.OutputTokensPerSec)
	seq, err := s.seq.Next(s.addr, s.cfg.Model)
	if err != nil {
		s.m.failed.WithLabelValues("sign").Inc()
		return nil, fmt.Errorf("cannot reserve sequence number: %w", err)
	}
	nonce, err := NewNonce()
	if err != nil {
		s.m.failed.WithLabelValues("sign").Inc()
		return nil, err
	}
	now := s.now()
	issued := uint64(now.Unix())
	q := &Quote{ChainID: s.cfg.ChainID, Provider: s.addr, ProviderID: s.cfg.ProviderID, Model: s.cfg.Model,
		ModelClass: s.cfg.ModelClass, EndpointHash: EndpointHash(s.cfg.ServingURL),
		InputPricePerMTok: s.cfg.FloorIn, OutputPricePerMTok: s.cfg.FloorOut,
		HeadroomTokensPerSec: h.TokensPerSec, HeadroomConcurrency: h.Concurrency,
		Seq: seq, IssuedAt: issued, Expiry: issued + uint64(s.cfg.TTL/time.Second), Nonce: nonce}
	sq, err := Sign(q, s.key)
	if err != nil {
		s.m.failed.WithLabelValues("sign").Inc()
		return nil, err
	}
	expiry := time.Unix(int64(q.Expiry), 0)
	s.mu.Lock()
	s.current, s.expiry = sq, expiry
	s.mu.Unlock()
	s.m.signed.Inc()
	s.m.lastExpiry.Set(float64(q.Expiry))
	s.m.lastSeq.Set(float64(seq))
	s.m.headroomConc.Set(float64(h.Concurrency))
	s.m.headroomTPS.Set(float64(h.TokensPerSec))
	s.log.Debug("quote signed", zap.Uint64("seq", seq), zap.Uint64("expiry", q.Expiry),
		zap.Uint32("headroom_concurrency", h.Concurrency), zap.Uint64("headroom_tps", h.TokensPerSec))
	if s.onSigned != nil {
		s.onSigned(sq)
	}
	if s.pub != nil {
		s.pub.offer(sq, expiry)
	}
	return sq, nil
}

// Handler serves GET /v1/quote (the current quote; 503 with the breaker
// state when there is no valid one), /v1/headroom (how the last quote's
// headroom was reached, per replica), /metrics and /healthz (liveness of
// the loop, with breaker state and gate status).
func (s *Service) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/quote", func(w http.ResponseWriter, _ *http.Request) {
		sq, ok := s.Current()
		if !ok {
			writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": "no valid quote",
				"breaker": s.breaker.State().String(), "reason": s.breaker.Reason()})
			return
		}
		writeJSON(w, http.StatusOK, sq)
	})
	mux.HandleFunc("GET /v1/headroom", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, s.LastAssessment())
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.gatherer, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		// Liveness of the loop, not of the backend: an open breaker is
		// the quoter doing its job, not a reason to restart it.
		s.mu.Lock()
		last, conformed := s.lastTick, s.conformed
		s.mu.Unlock()
		status := http.StatusOK
		if last.IsZero() || s.now().Sub(last) > 3*s.cfg.Refresh+time.Minute {
			status = http.StatusServiceUnavailable
		}
		writeJSON(w, status, map[string]any{"breaker": s.breaker.State().String(), "conformed": conformed,
			"last_tick": last.UTC().Format(time.RFC3339Nano)})
	})
	return mux
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

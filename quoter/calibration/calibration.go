// Package calibration owns `quoter calibrate`: a closed-loop load
// generator that drives a serving URL up a ladder of concurrency levels
// with a fixed prompt/output mix, measures each level as a client sees it
// (p95 time to first token, p95 inter-token latency, output tokens/s), stops
// past the first level that breaks the latency objectives, measures its
// highest level within them again to confirm it, and then pools
// the curves the EPP learnt from the engines over the same traffic into
// the capacity.Calibration document the quoter reads when a pool is idle.
package calibration

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/omnious/provider-node/capacity"
	"github.com/omnious/provider-node/internal/opt"
	"github.com/omnious/provider-node/quoter"
)

// Header marks every calibration request, so gateways, logs and the EPP
// can tell the synthetic load from customers' traffic.
const Header = "x-omnious-calibration"

// TokenHeader carries the calibration secret (Config.TokenFile): an EPP
// with extproc.calibration_token_file counts a request as calibration only
// when it carries that secret, and gateways strip Header from clients.
const TokenHeader = "x-omnious-calibration-token"

// MaxErrorShare is the share of a level's requests that may fail before
// the run is a failure: a ladder that errors measures the errors, not the
// capacity. A repeated level that fails more broke (Config.Repeats).
const MaxErrorShare = capacity.MaxErrorShare

// Config configures one calibration run. Zero values take the defaults
// (WithDefaults); pointer fields are those where 0 is a setting.
type Config struct {
	// URL is the serving base URL requests are sent to (e.g.
	// "http://127.0.0.1:8080"; /v1/chat/completions is appended).
	// Required.
	URL string
	// Model is the model id sent and looked up in the snapshot. Required.
	Model string
	// CapacityURL is the EPP admin base URL serving capacity.Path.
	// Required.
	CapacityURL string
	// Objectives are the latency objectives the ladder stops at. TTFT
	// default 2s, ITL default 50ms, Quantile default 0.95.
	Objectives capacity.Objectives
	// Mix is the traffic. PromptTokens default 1000, OutputTokens default
	// 200, Groups default 1, SharedPrefixTokens default 0 (must not exceed
	// PromptTokens). A prompt is PromptTokens words: one token per word for
	// the engine simulator's stand-in tokenizer, somewhat more for a real
	// tokenizer (the engine's own counts are what the curve holds).
	Mix capacity.Mix
	// StartConcurrency is the first level. Default 1.
	StartConcurrency int
	// Factor grows the ladder: the next level is max(prev+1,
	// ceil(prev*Factor)). Default 1.25.
	Factor float64
	// PastBreak is how many levels are measured past the first that breaks
	// an objective. The quote never reads the curve beyond the loads it
	// measured, and a mean near the edge spreads above it, so a ladder
	// that stops at its first break holds an idle pool's quote well below
	// the edge. Default 1; 0 stops at the first break.
	PastBreak *int
	// Repeats is how many levels at most are measured again after the
	// climb: its highest level within the objectives, and while a repeat
	// breaks the next one below, until one holds twice. A level counts
	// only if every measurement of it held (capacity.Calibration.
	// HeldStreams): the highest of several one-shot levels that held is the
	// likeliest to be a lucky draw at the edge. A ladder that holds its top
	// again pays one level. Default 2; 0 is off (the highest level held
	// once is sold).
	Repeats *int
	// MaxConcurrency is the last level. Default (0): the sum over the
	// model's healthy replicas of their MaxRunning (the batch size the EPP
	// fills a replica to).
	MaxConcurrency int
	// LevelDuration is how long each level is measured, after its warmup.
	// Default 30s.
	LevelDuration time.Duration
	// Warmup is how long each level runs before it is measured; what
	// happens in it (the change of concurrency settling) is discarded.
	// Default 5s; 0s measures at once.
	Warmup *time.Duration
	// RequestTimeout bounds one request. Default 5m.
	RequestTimeout time.Duration
	// Seed seeds the prompts' words, so two runs send the same traffic.
	// Default 0 (a seed like any other).
	Seed int64
	// HTTP sends the load and reads the snapshot. Default: a client whose
	// connection pool keeps a connection per worker.
	HTTP *http.Client
	// CapacityHTTP reads the snapshot from the EPP's admin port with its
	// credentials (internal/adminauth). Default: HTTP.
	CapacityHTTP *http.Client
	// TokenFile holds the calibration secret sent in TokenHeader with
	// every request (a mounted Secret the EPP shares). Default "": none.
	TokenFile string
	// Log receives a line per level. Default: none.
	Log *zap.Logger

	token string // read from TokenFile by Run
}

// defaults are Config's plain defaults, written once: WithDefaults fills
// them and Validate's messages quote them. The objectives default through
// capacity.Objectives.
var defaults = Config{Mix: capacity.Mix{PromptTokens: 1000, OutputTokens: 200, Groups: 1}, StartConcurrency: 1,
	Factor: 1.25, LevelDuration: 30 * time.Second, RequestTimeout: 5 * time.Minute}

// WithDefaults returns c with every unset field at its default.
func (c Config) WithDefaults() Config {
	c.Objectives = c.Objectives.WithDefaults()
	d := defaults
	opt.Zero(&c.Mix.PromptTokens, d.Mix.PromptTokens)
	opt.Zero(&c.Mix.OutputTokens, d.Mix.OutputTokens)
	opt.Zero(&c.Mix.Groups, d.Mix.Groups)
	opt.Zero(&c.StartConcurrency, d.StartConcurrency)
	opt.Zero(&c.Factor, d.Factor)
	opt.Zero(&c.LevelDuration, d.LevelDuration)
	c.Warmup = opt.Or(c.Warmup, 5*time.Second)
	c.PastBreak = opt.Or(c.PastBreak, 1)
	c.Repeats = opt.Or(c.Repeats, 2)
	opt.Zero(&c.RequestTimeout, d.RequestTimeout)
	if c.Log == nil {
		c.Log = zap.NewNop()
	}
	return c
}

// Validate reports every unusable setting of a defaulted config.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if c.URL == "" {
		bad("no serving URL")
	}
	if c.Model == "" {
		bad("no model")
	}
	if c.CapacityURL == "" {
		bad("no EPP admin URL (the capacity snapshot)")
	}
	obj := capacity.DefaultObjectives
	errs = append(errs, opt.DefaultNonNegative("--slo-ttft-p95", c.Objectives.TTFT, obj.TTFT),
		opt.DefaultNonNegative("--slo-itl-p95", c.Objectives.ITL, obj.ITL))
	if !(c.Objectives.Quantile > 0 && c.Objectives.Quantile < 1) {
		bad("quantile %v is not in (0, 1)", c.Objectives.Quantile)
	}
	m := c.Mix
	errs = append(errs, opt.DefaultNonNegative("--prompt-tokens", m.PromptTokens, defaults.Mix.PromptTokens),
		opt.DefaultNonNegative("--output-tokens", m.OutputTokens, defaults.Mix.OutputTokens),
		opt.DefaultNonNegative("--groups", m.Groups, defaults.Mix.Groups),
		opt.NonNegative("--shared-prefix-tokens", m.SharedPrefixTokens),
		opt.DefaultNonNegative("--start-concurrency", c.StartConcurrency, defaults.StartConcurrency),
		opt.NonNegative("--max-concurrency", c.MaxConcurrency),
		opt.DefaultNonNegative("--level-duration", c.LevelDuration, defaults.LevelDuration),
		opt.NonNegative("--warmup", *c.Warmup),
		opt.NonNegative("--past-break", *c.PastBreak),
		opt.NonNegative("--repeats", *c.Repeats),
		opt.DefaultNonNegative("RequestTimeout", c.RequestTimeout, defaults.RequestTimeout))
	if m.SharedPrefixTokens > m.PromptTokens {
		bad("shared prefix of %d tokens is longer than the %d-token prompt", m.SharedPrefixTokens, m.PromptTokens)
	}
	if c.MaxConcurrency > 0 && c.StartConcurrency > c.MaxConcurrency {
		bad("start concurrency %d is above the maximum %d", c.StartConcurrency, c.MaxConcurrency)
	}
	if c.Factor < 0 {
		errs = append(errs, opt.DefaultNonNegative("--factor", c.Factor, defaults.Factor))
	} else if !(c.Factor > 1) || math.IsInf(c.Factor, 0) {
		bad("--factor %v: want > 1", c.Factor)
	}
	return errors.Join(errs...)
}

// next is the level after prev: max(prev+1, ceil(prev*factor)), and the
// maximum itself rather than a level past it.
func next(prev int, factor float64, maxC int) int {
	n := max(prev+1, int(math.Ceil(float64(prev)*factor)))
	return min(n, maxC)
}

// Run calibrates cfg.URL: it reads the EPP's snapshot, drives the ladder,
// and returns the calibration, or an error that says why none could be
// made. Nothing is written.
func Run(ctx context.Context, cfg Config) (*capacity.Calibration, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("bad calibration config: %w", err)
	}
	if cfg.TokenFile != "" {
		b, err := os.ReadFile(cfg.TokenFile)
		if err != nil {
			return nil, fmt.Errorf("cannot read the calibration token: %w", err)
		}
		if cfg.token = strings.TrimSpace(string(b)); cfg.token == "" {
			return nil, fmt.Errorf("calibration token file %s is empty", cfg.TokenFile)
		}
	}
	snapClient := quoter.CapacityClient{URL: cfg.CapacityURL, HTTP: cmp.Or(cfg.CapacityHTTP, cfg.HTTP)}
	healthy, maxRunning, err := healthyReplicas(ctx, &snapClient, cfg.Model)
	if err != nil {
		return nil, err
	}
	if cfg.MaxConcurrency == 0 {
		if maxRunning <= 0 {
			return nil, fmt.Errorf("the EPP reports no batch size for %q's replicas: set the maximum concurrency", cfg.Model)
		}
		cfg.MaxConcurrency = maxRunning
	}
	cfg.StartConcurrency = min(cfg.StartConcurrency, cfg.MaxConcurrency)
	if cfg.HTTP == nil {
		cfg.HTTP = loadClient(cfg.MaxConcurrency)
		defer cfg.HTTP.CloseIdleConnections()
	}
	cfg.Log.Info("calibrating", zap.String("url", cfg.URL), zap.String("model", cfg.Model), zap.Int("healthy_replicas", healthy),
		zap.Int("max_concurrency", cfg.MaxConcurrency))

	g := newGenerator(&cfg)
	if err := g.preflight(ctx); err != nil {
		return nil, err
	}
	levels, err := g.ladder(ctx)
	if err != nil {
		return nil, err
	}

	snap, err := snapClient.Fetch(ctx)
	if err != nil {
		return nil, fmt.Errorf("cannot read the engines' curves after the run: %w", err)
	}
	m, _ := quoter.FindModel(snap, cfg.Model)
	var curves []capacity.Curve
	for _, r := range m.ReplicaCapacity {
		if r.Healthy {
			curves = append(curves, r.Curve)
		}
	}
	if len(curves) != healthy {
		cfg.Log.Warn("healthy replicas changed during the run", zap.Int("before", healthy), zap.Int("after", len(curves)))
	}
	curve, skipped := capacity.Pool(curves)
	if skipped > 0 {
		cfg.Log.Warn("replicas with other histogram buckets left out of the curve", zap.Int("replicas", skipped))
	}
	if len(curve.Bins) == 0 {
		return nil, fmt.Errorf("the EPP learnt no curve for %q from the run (are its engines' latency histograms scraped?)", cfg.Model)
	}
	if _, err := curve.At(cfg.Objectives); err != nil {
		if errors.Is(err, capacity.ErrNoData) {
			return nil, fmt.Errorf("the engines' curve for %q is too thin to read (%w): lengthen the level duration", cfg.Model, err)
		}
		return nil, fmt.Errorf("cannot read the engines' curve at the objectives: %w", err)
	}
	return &capacity.Calibration{Version: capacity.CalibrationVersion, Model: cfg.Model, URL: cfg.URL,
		Taken: time.Now().UTC(), Replicas: healthy,
		Objectives: capacity.ObjectivesJSON{TTFTSeconds: cfg.Objectives.TTFT.Seconds(), ITLSeconds: cfg.Objectives.ITL.Seconds(),
			Quantile: cfg.Objectives.Quantile},
		Mix: cfg.Mix, PromptTokensMeasured: g.measured, Levels: levels, Curve: curve}, nil
}

// healthyReplicas reads the snapshot: the model's healthy replicas and the
// sum of their batch-size targets.
func healthyReplicas(ctx context.Context, c *quoter.CapacityClient, model string) (healthy, maxRunning int, err error) {
	snap, err := c.Fetch(ctx)
	if err != nil {
		return 0, 0, fmt.Errorf("cannot read the capacity snapshot: %w", err)
	}
	m, ok := quoter.FindModel(snap, model)
	if !ok {
		return 0, 0, fmt.Errorf("%w: model %q is not in the EPP's capacity snapshot", quoter.ErrNoHealthyReplica, model)
	}
	for _, r := range m.ReplicaCapacity {
		if r.Healthy {
			healthy++
			maxRunning += r.MaxRunning
		}
	}
	if healthy == 0 {
		return 0, 0, fmt.Errorf("%w: 0 of %d replicas of %q are healthy", quoter.ErrNoHealthyReplica, m.Replicas, model)
	}
	return healthy, maxRunning, nil
}

// loadClient is a client for n workers: a kept-alive connection each, so
// the ladder measures the server and not connection set-up.
func loadClient(n int) *http.Client {
	return &http.Client{Transport: &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:          n + 4,
		MaxIdleConnsPerHost:   n + 4,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: time.Second,
		ForceAttemptHTTP2:     true,
	}}
}

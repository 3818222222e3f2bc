package scheduler

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/omnious/provider-node/capacity"
	"github.com/omnious/provider-node/internal/opt"
)

// Routing policies (Config.Policy).
const (
	PolicyPrecise     = "precise"
	PolicyApproximate = "approximate"
	PolicyRandom      = "random"
	PolicyRoundRobin  = "round-robin"
	PolicyLeastQueue  = "least-queue"
	PolicyAgent       = "agent"
)

// maxSGLangPriority bounds sessions.sglang_priority within SGLang's
// int64 priority and the digits the EPP writes.
const maxSGLangPriority = 1 << 30

// Session admission settings (SessionsConfig.Admission).
const (
	SessionAdmissionAuto = "auto"
	SessionAdmissionOn   = "on"
	SessionAdmissionOff  = "off"
)

// sessionAdmission reports whether session admission is on for c.
func (c *Config) sessionAdmission() bool {
	return c.Sessions.Admission == SessionAdmissionOn || (c.Sessions.Admission == SessionAdmissionAuto && c.Policy == PolicyAgent)
}

// Config is the whole scheduler configuration, one YAML document. Unset
// fields take the defaults written in their comments, filled by
// WithDefaults, the one place they are set. A field whose zero is a legal
// setting is a pointer (nil = unset), so "fallbacks: 0" means no fallbacks;
// for the other fields zero means unset. Durations are YAML strings such as
// "2s" (a zero duration is "0s").
type Config struct {
	// Policy is "precise" (default: the scoring pipeline; approximate prefix
	// when a request has no tokens), "approximate" (never uses the index),
	// "random", "round-robin" or "least-queue" (baselines for the bench),
	// or "agent" (precise matching, and a session's calls stay on the
	// replica holding its history while that replica's pending prefill
	// work allows; see SessionsConfig).
	Policy string `yaml:"policy"`
	// PoolName labels the inference_pool_* metrics. Default "default".
	PoolName string `yaml:"pool_name"`
	// BlockSize is the engines' KV block size in tokens; prompts are keyed
	// with it, so it must equal the engines'. Default 16.
	BlockSize int `yaml:"block_size"`
	// Fallbacks is how many endpoints follow the primary in a decision,
	// 0..16; 0 sends the primary alone. Default 2.
	Fallbacks *int `yaml:"fallbacks"`
	// Adapters maps a LoRA adapter name to its base model, for adapters that
	// are not (yet) reported as loaded by any engine. Default none.
	Adapters map[string]string `yaml:"adapters"`
	// Seed seeds the tie-break/softmax random source; 0 seeds from the
	// clock, and any other value, negative too, is a seed. Default 0.
	Seed int64 `yaml:"seed"`

	Signals   SignalsConfig   `yaml:"signals"`
	Prefix    PrefixConfig    `yaml:"prefix"`
	Scoring   ScoringConfig   `yaml:"scoring"`
	Breaker   BreakerConfig   `yaml:"breaker"`
	Admission AdmissionConfig `yaml:"admission"`
	Sessions  SessionsConfig  `yaml:"sessions"`
}

// SessionsConfig is the agent policy's stay/move rule and session
// admission. A session is a chain of calls sharing one history (an agent
// calling tools), known by the session header or, without one, by the
// longest prefix a replica holds.
type SessionsConfig struct {
	// TTFTObjective bounds a session's stay: a call stays on the replica
	// holding its history while that replica's pending uncached prefill
	// work, this call's included, is at most its prefill rate times this.
	// Default 2s (capacity.DefaultObjectives.TTFT).
	TTFTObjective time.Duration `yaml:"ttft_objective"`
	// PrefillRate is the prefill rate, in new prompt tokens per second, of
	// a replica whose rate the capacity model has not measured yet.
	// Default 16000: the simulator's default step time (63µs per prompt
	// token), which reproduces published Qwen3-32B on 2×H100 figures.
	PrefillRate float64 `yaml:"prefill_rate"`
	// Admission holds new sessions back while the active sessions'
	// histories fill the replicas' KV caches: "on", "off", or "auto" (on
	// with policy agent, off otherwise). Default "auto". It is resolved
	// where the scheduler is built, so a policy set after WithDefaults
	// (a flag) still turns it on (TestSessionAdmissionAuto).
	Admission string `yaml:"admission"`
	// IdleTimeout: a session is active from its first call until this
	// long after its last call ended. Default 2m.
	IdleTimeout time.Duration `yaml:"idle_timeout"`
	// MaxSessions bounds the session table; a new session beyond it waits
	// as when the KV cache is full. Default 10000.
	MaxSessions int `yaml:"max_sessions"`
	// KVFraction is the share of a replica's KV capacity (the engine's
	// block size times blocks) the reservations of the active sessions
	// bound to it may take, and the KV usage below which it may have
	// compute to spare (SpareWork), (0, 1]. Default 0.9.
	KVFraction float64 `yaml:"kv_fraction"`
	// SpareWork lets a new session start past the KV budget onto a replica
	// with compute to spare: no engine queue in the fleet, KV usage below
	// kv_fraction, and pending prefill work, the session's prompt
	// included, at most this fraction of ttft_objective, on that replica
	// and over the fleet.
	// Evicting a history there costs only a recompute the replica has
	// time for. 0: never past the budget.
	// Default 0.5 (TestSessionSpareCompute).
	SpareWork *float64 `yaml:"spare_work"`
	// QueueTTL: a new session that waited this long gets 429
	// session_queue_expired. Default 2m: a session of minutes had rather
	// start late than not at all.
	QueueTTL time.Duration `yaml:"queue_ttl"`
	// QueueCapacity is how many new sessions may wait; beyond it 429
	// session_queue_full at once (0: never wait). Default 1000.
	QueueCapacity *int `yaml:"queue_capacity"`
	// SGLangPriority, when positive, is the request priority written into
	// the calls of admitted sessions (session admission on) routed to
	// SGLang replicas, so that SGLang's --radix-eviction-policy priority
	// keeps their histories through their tool gaps; every other call
	// routed to SGLang then carries priority 0, whatever the client sent
	// (Decision.Priority). For fleets whose SGLang replicas all run that
	// policy and not --abort-on-priority-when-disabled (which would abort
	// every such call); with --enable-priority-scheduling it also orders
	// their queue. A call with a fallback on another engine is left alone.
	// Default 0: off, the body is never touched.
	SGLangPriority int `yaml:"sglang_priority"`
}

// SignalsConfig is engine metric scraping.
type SignalsConfig struct {
	// ScrapeInterval between scrapes of one engine. Default 2s.
	ScrapeInterval time.Duration `yaml:"scrape_interval"`
	// ScrapeTimeout bounds one scrape. Default 1s.
	ScrapeTimeout time.Duration `yaml:"scrape_timeout"`
	// StaleAfter is how long a replica may go without a good scrape (since
	// its last one or, never scraped, since it joined) before it is scored
	// down. It is never dropped for staleness alone. Default 10s.
	StaleAfter time.Duration `yaml:"stale_after"`
	// ScrapeFailuresTrip makes scrape failures feed the breaker. Default
	// true.
	ScrapeFailuresTrip *bool `yaml:"scrape_failures_trip"`
	// CapacityHalfLife is how fast each replica's capacity curve (latency
	// against batch size, learnt from its scrapes) forgets, counted in busy
	// time so an idle replica keeps what it learnt; 0s never forgets.
	// Default 30m.
	CapacityHalfLife *time.Duration `yaml:"capacity_half_life"`
}

// PrefixConfig is prefix affinity and its imbalance guard.
type PrefixConfig struct {
	// MinMatch is the shortest precise match worth acting on, in tokens;
	// 0 acts on any match. Default 64.
	MinMatch *int `yaml:"min_match"`
	// MinMatchBytes is the same for approximate (text) matching. Default 256.
	MinMatchBytes *int `yaml:"min_match_bytes"`
	// MatchRatio is the share of the prompt that must match, 0..1; 0 drops
	// the ratio test. Default 0.3.
	MatchRatio *float64 `yaml:"match_ratio"`
	// BalanceAbs and BalanceRel are the imbalance guard: affinity to a
	// replica is abandoned only when its queued requests (the engine's
	// waiting queue plus what was routed since the last scrape) exceed
	// the least queued candidate's by at least BalanceAbs AND by a factor
	// of at least BalanceRel. Running requests do not count: a batching
	// engine serves them in one step. Defaults 4 and 1.25 (llmgw's are 8
	// and 1.5, whose engines run a few requests at once, so that their
	// load is mostly queue): on the Mooncake trace at 8 replicas they
	// measured max/mean load 1.12 (requests) and 1.18 (prompt tokens) at
	// 98% of the hit-rate bound when the guard still counted running
	// requests (bench sweep over {4,8} x {1.25,1.5}; README). BalanceAbs 0
	// leaves the relative test alone; BalanceRel is at least 1.
	BalanceAbs *float64 `yaml:"balance_abs"`
	BalanceRel float64  `yaml:"balance_rel"`
	// SpeculativeTTL is how long the chosen replica is credited with a
	// request's blocks before the engine's events confirm them; 0s gives
	// no speculative credit. Default 2s.
	SpeculativeTTL *time.Duration `yaml:"speculative_ttl"`
	// ChunkBytes is the approximate matcher's chunk size. Default 256.
	ChunkBytes int `yaml:"chunk_bytes"`
	// TTL is how long a routing record (the approximate matcher's, the
	// precise policy's routing memory) is trusted. Default 10m.
	TTL time.Duration `yaml:"ttl"`
	// MaxNodes bounds the records of the approximate matcher and, apart,
	// of the routing memory. Default 100000.
	MaxNodes int `yaml:"max_nodes"`
	// CPUWeight and StorageWeight value a block held off-GPU relative to a
	// GPU block, 0..1; 0 ignores that tier. Defaults 0.8 and 0.5.
	CPUWeight     *float64 `yaml:"cpu_weight"`
	StorageWeight *float64 `yaml:"storage_weight"`
}

// ScoringConfig is what the scorers normalise against and their weights.
type ScoringConfig struct {
	// TargetWaiting is the number of requests not started (the engine's
	// waiting queue plus what was routed since its last scrape) at which
	// the queue score is halved. Default 4.
	TargetWaiting float64 `yaml:"target_waiting"`
	// TargetInflight is the EPP in-flight count at which the in-flight score
	// is halved. Default 8. (Admission has its own, see
	// AdmissionConfig.TargetInflight.)
	TargetInflight float64 `yaml:"target_inflight"`
	// KVCeiling is the KV usage above which a replica is filtered out
	// (unless nothing is left) and at which the KV score reaches 0.
	// Default 0.9.
	KVCeiling float64 `yaml:"kv_ceiling"`
	// SessionLoadFactor: a session sticks to its replica while that
	// replica's load is at most this multiple of the mean. Default 1.25.
	SessionLoadFactor float64 `yaml:"session_load_factor"`
	// SessionTTL is how long a session's replica is remembered; 0s
	// remembers none. Default 10m.
	SessionTTL *time.Duration `yaml:"session_ttl"`
	// StaleFactor multiplies the score of a replica with stale metrics,
	// 0..1; 0 zeroes its score. Default 0.25.
	StaleFactor *float64 `yaml:"stale_factor"`
	// Temperature > 0 samples the primary with probability proportional to
	// exp(score/Temperature) instead of taking the best. Default 0.
	Temperature float64 `yaml:"temperature"`
	// Weights of the scorers. Defaults: prefix 3, queue 1, inflight 1,
	// kv 1, session 2, lora 1.
	Weights Weights `yaml:"weights"`
}

// Weights of the scorers; a negative weight is invalid, 0 disables one.
type Weights struct {
	Prefix   *float64 `yaml:"prefix"`
	Queue    *float64 `yaml:"queue"`
	Inflight *float64 `yaml:"inflight"`
	KV       *float64 `yaml:"kv"`
	Session  *float64 `yaml:"session"`
	LoRA     *float64 `yaml:"lora"`
}

// BreakerConfig is the per-replica circuit breaker.
type BreakerConfig struct {
	// FailureThreshold consecutive failures open the breaker. Default 3.
	FailureThreshold int `yaml:"failure_threshold"`
	// Cooldown is how long an open breaker keeps the replica out before one
	// probe request is let through. Default 15s.
	Cooldown time.Duration `yaml:"cooldown"`
}

// AdmissionConfig is flow control.
type AdmissionConfig struct {
	// Enabled turns flow control on. Default true.
	Enabled *bool `yaml:"enabled"`
	// DefaultBand is used when Request.Band is "" or unknown. Default "gold".
	DefaultBand string `yaml:"default_band"`
	// Bands default to platinum 400/1.00, gold 300/0.85, silver 200/0.60,
	// bronze 100/0.30. A band waits once pool saturation reaches its
	// ceiling; a ceiling above 1 never waits in practice.
	Bands []Band `yaml:"bands"`
	// TargetInflight is the EPP in-flight count at which one replica counts
	// as saturated. Default 256, vLLM's default max_num_seqs: a batching
	// engine runs that many at once, so the in-flight term only matters
	// while the engine's own signals (waiting, KV usage) lag behind a
	// burst. llmgw's 8 (scoring.target_inflight) suits llama.cpp's few
	// slots; on vLLM it held each replica to about 7 requests and starved
	// the GPU (bench llmd-73: 2.3 req/s from 8 replicas).
	TargetInflight float64 `yaml:"target_inflight"`
	// QueueTTL drops a request that waited this long (503). Default 30s.
	QueueTTL time.Duration `yaml:"queue_ttl"`
	// QueueCapacityPerBand rejects a request with 429 when its band already
	// has this many waiting; 0 never queues (saturation answers 429 at
	// once). Default 2000.
	QueueCapacityPerBand *int `yaml:"queue_capacity_per_band"`
	// Interval re-evaluates saturation for dispatch (besides every Done).
	// Default 10ms.
	Interval time.Duration `yaml:"interval"`
}

// Band is one priority band.
type Band struct {
	Name              string  `yaml:"name"`
	Priority          int     `yaml:"priority"`
	SaturationCeiling float64 `yaml:"saturation_ceiling"`
}

func ptr[T any](v T) *T { return &v }

// DefaultConfig returns Config{}.WithDefaults(): every field at the default
// its comment gives. Where a default differs from the llmgw router's (the
// imbalance guard, admission.target_inflight), the field comment says so
// and why.
func DefaultConfig() Config { return Config{}.WithDefaults() }

// WithDefaults returns c with every unset field at its default. Pointer
// fields of the result are fresh copies: changing c afterwards does not
// change it.
func (c Config) WithDefaults() Config {
	opt.Zero(&c.Policy, PolicyPrecise)
	opt.Zero(&c.PoolName, "default")
	opt.Zero(&c.BlockSize, 16)
	c.Fallbacks = opt.Or(c.Fallbacks, 2)

	sg := &c.Signals
	opt.Zero(&sg.ScrapeInterval, 2*time.Second)
	opt.Zero(&sg.ScrapeTimeout, time.Second)
	opt.Zero(&sg.StaleAfter, 10*time.Second)
	sg.ScrapeFailuresTrip = opt.Or(sg.ScrapeFailuresTrip, true)
	sg.CapacityHalfLife = opt.Or(sg.CapacityHalfLife, 30*time.Minute)

	p := &c.Prefix
	p.MinMatch = opt.Or(p.MinMatch, 64)
	p.MinMatchBytes = opt.Or(p.MinMatchBytes, 256)
	p.MatchRatio = opt.Or(p.MatchRatio, 0.3)
	p.BalanceAbs = opt.Or(p.BalanceAbs, 4)
	opt.Zero(&p.BalanceRel, 1.25)
	p.SpeculativeTTL = opt.Or(p.SpeculativeTTL, 2*time.Second)
	opt.Zero(&p.ChunkBytes, 256)
	opt.Zero(&p.TTL, 10*time.Minute)
	opt.Zero(&p.MaxNodes, 100000)
	p.CPUWeight = opt.Or(p.CPUWeight, 0.8)
	p.StorageWeight = opt.Or(p.StorageWeight, 0.5)

	s := &c.Scoring
	opt.Zero(&s.TargetWaiting, 4)
	opt.Zero(&s.TargetInflight, 8)
	opt.Zero(&s.KVCeiling, 0.9)
	opt.Zero(&s.SessionLoadFactor, 1.25)
	s.SessionTTL = opt.Or(s.SessionTTL, 10*time.Minute)
	s.StaleFactor = opt.Or(s.StaleFactor, 0.25)
	w := &s.Weights
	w.Prefix = opt.Or(w.Prefix, 3)
	w.Queue = opt.Or(w.Queue, 1)
	w.Inflight = opt.Or(w.Inflight, 1)
	w.KV = opt.Or(w.KV, 1)
	w.Session = opt.Or(w.Session, 2)
	w.LoRA = opt.Or(w.LoRA, 1)

	opt.Zero(&c.Breaker.FailureThreshold, 3)
	opt.Zero(&c.Breaker.Cooldown, 15*time.Second)

	a := &c.Admission
	a.Enabled = opt.Or(a.Enabled, true)
	opt.Zero(&a.DefaultBand, "gold")
	if len(a.Bands) == 0 {
		a.Bands = []Band{
			{Name: "platinum", Priority: 400, SaturationCeiling: 1.00},
			{Name: "gold", Priority: 300, SaturationCeiling: 0.85},
			{Name: "silver", Priority: 200, SaturationCeiling: 0.60},
			{Name: "bronze", Priority: 100, SaturationCeiling: 0.30},
		}
	}
	opt.Zero(&a.TargetInflight, 256)
	opt.Zero(&a.QueueTTL, 30*time.Second)
	a.QueueCapacityPerBand = opt.Or(a.QueueCapacityPerBand, 2000)
	opt.Zero(&a.Interval, 10*time.Millisecond)

	se := &c.Sessions
	opt.Zero(&se.TTFTObjective, capacity.DefaultObjectives.TTFT)
	opt.Zero(&se.PrefillRate, 16000)
	opt.Zero(&se.Admission, SessionAdmissionAuto)
	opt.Zero(&se.IdleTimeout, 2*time.Minute)
	opt.Zero(&se.MaxSessions, 10000)
	opt.Zero(&se.KVFraction, 0.9)
	opt.Zero(&se.QueueTTL, 2*time.Minute)
	se.QueueCapacity = opt.Or(se.QueueCapacity, 1000)
	se.SpareWork = opt.Or(se.SpareWork, 0.5)
	return c
}

// ParseConfig reads a YAML document, fills defaults and validates.
// Unknown fields are errors, so a misspelt knob is not silently ignored.
func ParseConfig(data []byte) (Config, error) {
	var c Config
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&c); err != nil && !errors.Is(err, io.EOF) {
		return Config{}, fmt.Errorf("cannot parse scheduler config: %w", err)
	}
	c = c.WithDefaults()
	if err := c.Validate(); err != nil {
		return Config{}, err
	}
	return c, nil
}

// Validate reports every invalid field of a defaulted config.
func (c *Config) Validate() error {
	if unset := c.unsetPointers(); len(unset) > 0 {
		return fmt.Errorf("invalid scheduler config: %s unset: Validate wants a config from WithDefaults", strings.Join(unset, ", "))
	}
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	switch c.Policy {
	case PolicyPrecise, PolicyApproximate, PolicyRandom, PolicyRoundRobin, PolicyLeastQueue, PolicyAgent:
	default:
		bad("policy %q: want precise, approximate, random, round-robin, least-queue or agent", c.Policy)
	}
	if c.BlockSize < 1 || c.BlockSize > 4096 {
		bad("block_size %d: want 1..4096", c.BlockSize)
	}
	if *c.Fallbacks < 0 || *c.Fallbacks > 16 {
		bad("fallbacks %d: want 0..16", *c.Fallbacks)
	}
	for a, m := range c.Adapters {
		if a == "" || m == "" {
			bad("adapters: empty adapter or model name (%q: %q)", a, m)
		}
	}
	if c.Signals.ScrapeInterval < time.Millisecond {
		bad("signals.scrape_interval %v: want >= 1ms", c.Signals.ScrapeInterval)
	}
	if c.Signals.ScrapeTimeout <= 0 {
		// A timeout longer than the interval is allowed: a target whose
		// scrape is still running is skipped, not scraped twice.
		bad("signals.scrape_timeout %v: want > 0", c.Signals.ScrapeTimeout)
	}
	if c.Signals.StaleAfter < c.Signals.ScrapeInterval {
		bad("signals.stale_after %v: want >= scrape_interval %v", c.Signals.StaleAfter, c.Signals.ScrapeInterval)
	}
	p := c.Prefix
	errs = append(errs, opt.NonNegative("prefix.min_match", *p.MinMatch), opt.NonNegative("prefix.min_match_bytes", *p.MinMatchBytes),
		opt.NonNegative("prefix.speculative_ttl", *p.SpeculativeTTL), opt.NonNegative("signals.capacity_half_life", *c.Signals.CapacityHalfLife))
	if *p.MatchRatio < 0 || *p.MatchRatio > 1 {
		bad("prefix.match_ratio %v: want 0..1", *p.MatchRatio)
	}
	if *p.BalanceAbs < 0 {
		bad("prefix.balance_abs %v: want >= 0", *p.BalanceAbs)
	}
	if p.BalanceRel < 1 {
		bad("prefix.balance_rel %v: want >= 1", p.BalanceRel)
	}
	if p.TTL <= 0 {
		bad("prefix.ttl %v: want > 0", p.TTL)
	}
	if p.ChunkBytes < 16 {
		bad("prefix.chunk_bytes %d: want >= 16", p.ChunkBytes)
	}
	if p.MaxNodes < 1 {
		bad("prefix.max_nodes %d: want >= 1", p.MaxNodes)
	}
	if *p.CPUWeight < 0 || *p.CPUWeight > 1 {
		bad("prefix.cpu_weight %v: want 0..1", *p.CPUWeight)
	}
	if *p.StorageWeight < 0 || *p.StorageWeight > 1 {
		bad("prefix.storage_weight %v: want 0..1", *p.StorageWeight)
	}
	s := c.Scoring
	if s.TargetWaiting <= 0 {
		bad("scoring.target_waiting %v: want > 0", s.TargetWaiting)
	}
	if s.TargetInflight <= 0 {
		bad("scoring.target_inflight %v: want > 0", s.TargetInflight)
	}
	if s.KVCeiling <= 0 || s.KVCeiling > 1 {
		bad("scoring.kv_ceiling %v: want (0, 1]", s.KVCeiling)
	}
	if s.SessionLoadFactor < 1 {
		bad("scoring.session_load_factor %v: want >= 1", s.SessionLoadFactor)
	}
	if *s.SessionTTL < 0 {
		bad("scoring.session_ttl %v: want >= 0", *s.SessionTTL)
	}
	if *s.StaleFactor < 0 || *s.StaleFactor > 1 {
		bad("scoring.stale_factor %v: want 0..1", *s.StaleFactor)
	}
	if s.Temperature < 0 {
		bad("scoring.temperature %v: want >= 0", s.Temperature)
	}
	for _, w := range []struct {
		name string
		v    *float64
	}{
		{"prefix", s.Weights.Prefix}, {"queue", s.Weights.Queue}, {"inflight", s.Weights.Inflight},
		{"kv", s.Weights.KV}, {"session", s.Weights.Session}, {"lora", s.Weights.LoRA},
	} {
		errs = append(errs, opt.NonNegative("scoring.weights."+w.name, *w.v))
	}
	if c.Breaker.FailureThreshold < 1 {
		bad("breaker.failure_threshold %d: want >= 1", c.Breaker.FailureThreshold)
	}
	if c.Breaker.Cooldown <= 0 {
		bad("breaker.cooldown %v: want > 0", c.Breaker.Cooldown)
	}
	a := c.Admission
	seen := map[string]bool{}
	for _, b := range a.Bands {
		switch {
		case b.Name == "":
			bad("admission.bands: a band has no name")
		case seen[b.Name]:
			bad("admission.bands: band %q appears twice", b.Name)
		case b.SaturationCeiling <= 0:
			bad("admission.bands: band %q saturation_ceiling %v: want > 0", b.Name, b.SaturationCeiling)
		}
		seen[b.Name] = true
	}
	if !seen[a.DefaultBand] {
		bad("admission.default_band %q is not one of the bands", a.DefaultBand)
	}
	if a.TargetInflight <= 0 {
		bad("admission.target_inflight %v: want > 0", a.TargetInflight)
	}
	if a.QueueTTL <= 0 {
		bad("admission.queue_ttl %v: want > 0", a.QueueTTL)
	}
	if *a.QueueCapacityPerBand < 0 {
		bad("admission.queue_capacity_per_band %d: want >= 0", *a.QueueCapacityPerBand)
	}
	if a.Interval < time.Millisecond {
		bad("admission.interval %v: want >= 1ms", a.Interval)
	}
	se := c.Sessions
	switch se.Admission {
	case SessionAdmissionAuto, SessionAdmissionOn, SessionAdmissionOff:
	default:
		bad("sessions.admission %q: want auto, on or off", se.Admission)
	}
	if se.TTFTObjective <= 0 {
		bad("sessions.ttft_objective %v: want > 0", se.TTFTObjective)
	}
	if !(se.PrefillRate > 0) {
		bad("sessions.prefill_rate %v: want > 0", se.PrefillRate)
	}
	if se.IdleTimeout <= 0 {
		bad("sessions.idle_timeout %v: want > 0", se.IdleTimeout)
	}
	if se.MaxSessions < 1 || se.MaxSessions > maxSessionsLimit {
		bad("sessions.max_sessions %d: want 1..%d", se.MaxSessions, maxSessionsLimit)
	}
	if !(se.KVFraction > 0 && se.KVFraction <= 1) {
		bad("sessions.kv_fraction %v: want (0, 1]", se.KVFraction)
	}
	if f := *se.SpareWork; !(f >= 0 && f <= 1) {
		bad("sessions.spare_work %v: want 0 (off) ..1", f)
	}
	if se.QueueTTL <= 0 {
		bad("sessions.queue_ttl %v: want > 0", se.QueueTTL)
	}
	if *se.QueueCapacity < 0 || *se.QueueCapacity > maxSessionsLimit {
		bad("sessions.queue_capacity %d: want 0..%d", *se.QueueCapacity, maxSessionsLimit)
	}
	if se.SGLangPriority < 0 || se.SGLangPriority > maxSGLangPriority {
		bad("sessions.sglang_priority %d: want 0 (off) ..%d", se.SGLangPriority, maxSGLangPriority)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("invalid scheduler config: %w", err)
	}
	return nil
}

// unsetPointers names the pointer fields that are nil, which only a config
// that skipped WithDefaults has. The weights are checked with their range.
func (c *Config) unsetPointers() []string {
	var unset []string
	for _, f := range []struct {
		name string
		nil  bool
	}{
		{"fallbacks", c.Fallbacks == nil},
		{"signals.scrape_failures_trip", c.Signals.ScrapeFailuresTrip == nil},
		{"prefix.min_match", c.Prefix.MinMatch == nil},
		{"prefix.min_match_bytes", c.Prefix.MinMatchBytes == nil},
		{"prefix.match_ratio", c.Prefix.MatchRatio == nil},
		{"prefix.balance_abs", c.Prefix.BalanceAbs == nil},
		{"prefix.speculative_ttl", c.Prefix.SpeculativeTTL == nil},
		{"prefix.cpu_weight", c.Prefix.CPUWeight == nil},
		{"prefix.storage_weight", c.Prefix.StorageWeight == nil},
		{"scoring.session_ttl", c.Scoring.SessionTTL == nil},
		{"scoring.stale_factor", c.Scoring.StaleFactor == nil},
		{"admission.enabled", c.Admission.Enabled == nil},
		{"admission.queue_capacity_per_band", c.Admission.QueueCapacityPerBand == nil},
		{"sessions.queue_capacity", c.Sessions.QueueCapacity == nil},
		{"sessions.spare_work", c.Sessions.SpareWork == nil},
	} {
		if f.nil {
			unset = append(unset, f.name)
		}
	}
	return unset
}

package metrics

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/omnious/provider-node/internal/opt"
)

// Sample is the scraper's view of one target. Samples are immutable once
// published: a new scrape publishes a new Sample.
type Sample struct {
	URL string
	// Signals are from the last good scrape, taken at At (zero At: never
	// scraped successfully).
	Signals Signals
	At      time.Time
	// Err is the last scrape's error (nil when it succeeded) and Failures
	// the number of consecutive failed scrapes.
	Err      error
	Failures int
	// Rates are per second over the window between the last two good
	// scrapes (0 until there are two, or after a counter reset).
	PromptTokensPerSec, GenerationTokensPerSec float64
	PrefixQueriesPerSec, PrefixHitsPerSec      float64
	// Window is what the engine did between the last two good scrapes,
	// the capacity model's input.
	Window Window
}

// Window is one scrape interval of one engine: the gauges averaged over
// its two ends and the latency observations made in it. A window across an
// engine restart (counters went down) has Seconds 0 and says nothing.
type Window struct {
	Seconds                   float64
	Running, Waiting, KVUsage float64
	// WaitingMin is the smaller of the two ends' waiting counts: requests
	// were queued when the window began and when it ended.
	WaitingMin float64
	// TTFT and ITL hold only the observations made in the window.
	TTFT, ITL Histogram
}

// ScraperConfig configures a Scraper.
type ScraperConfig struct {
	// Interval between scrapes of one target. Default 2s.
	Interval time.Duration
	// Timeout bounds one scrape. Default 1s.
	Timeout time.Duration
	// MaxBody bounds the exposition size read. Default 8 MiB.
	MaxBody int64
	// Client is shared by all scrapes. Default: a client with keep-alive
	// and no overall timeout (Timeout applies per request).
	Client *http.Client
	// OnSample, when set, is called after every scrape (good or failed) with
	// the new sample, from the scraping goroutine.
	OnSample func(*Sample)
}

// WithDefaults returns c with every unset (zero) field at its default.
func (c ScraperConfig) WithDefaults() ScraperConfig {
	opt.Zero(&c.Interval, 2*time.Second)
	opt.Zero(&c.Timeout, time.Second)
	opt.Zero(&c.MaxBody, 8<<20)
	if c.Client == nil {
		c.Client = &http.Client{Transport: &http.Transport{
			MaxIdleConnsPerHost: 2,
			IdleConnTimeout:     90 * time.Second,
			DisableCompression:  true,
		}}
	}
	return c
}

// Scraper polls a set of metrics URLs. It is safe for concurrent use.
type Scraper struct {
	cfg ScraperConfig
	log *zap.Logger

	mu      sync.Mutex
	targets map[string]*target
}

// target is one URL's state. buf and the scrape itself are owned by the one
// goroutine scraping it; last is guarded by Scraper.mu. slot is where in
// each interval Run scrapes it, fixed by its URL.
type target struct {
	url  string
	slot int
	buf  bytes.Buffer
	last *Sample
	busy bool
}

// spreadSlots is how many parts Run divides the interval into: each target
// is scraped in the part its URL hashes to, so a large pool's scrapes are
// spread over the interval (1,024 targets: about 16 every 31 ms at the
// default 2 s) rather than landing together, and every target is still
// scraped once an interval. TestScraperSpreadsScrapes keeps it.
const spreadSlots = 64

// slotOf is url's part of the interval (FNV-1a): stable while the pool
// changes, so a target keeps its spacing from its own previous scrape.
func slotOf(url string) int {
	h := uint32(2166136261)
	for i := 0; i < len(url); i++ {
		h = (h ^ uint32(url[i])) * 16777619
	}
	return int(h % spreadSlots)
}

// Validate refuses a negative field of a defaulted config.
func (c ScraperConfig) Validate() error {
	return errors.Join(opt.NonNegative("Interval", c.Interval), opt.NonNegative("Timeout", c.Timeout),
		opt.NonNegative("MaxBody", c.MaxBody))
}

// NewScraper returns a Scraper with no targets. It panics on a config
// Validate refuses: callers validate theirs first (the scheduler's
// signals.scrape_interval and scrape_timeout).
func NewScraper(cfg ScraperConfig, log *zap.Logger) *Scraper {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		panic("metrics.NewScraper: " + err.Error())
	}
	if log == nil {
		log = zap.NewNop()
	}
	return &Scraper{cfg: cfg, log: log, targets: make(map[string]*target)}
}

// SetTargets replaces the set of URLs; known URLs keep their state.
func (s *Scraper) SetTargets(urls []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	keep := make(map[string]*target, len(urls))
	for _, u := range urls {
		if u == "" {
			continue
		}
		if t, ok := s.targets[u]; ok {
			keep[u] = t
		} else {
			keep[u] = &target{url: u, slot: slotOf(u)}
		}
	}
	s.targets = keep
}

// Get returns the last sample of url.
func (s *Scraper) Get(url string) (*Sample, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t, ok := s.targets[url]
	if !ok || t.last == nil {
		return nil, false
	}
	return t.last, true
}

// Run scrapes every target at once, so that signals exist from the start,
// then each target once every Interval, in its own part of the interval
// (spreadSlots), until ctx is done. A part that a late wake-up passed is
// scraped at once, not skipped. A target added later is first scraped at
// the next part, not in its own part up to an Interval later
// (TestScraperScrapesNewTargetAtOnce).
func (s *Scraper) Run(ctx context.Context) {
	var wg sync.WaitGroup
	defer wg.Wait()
	s.ScrapeAll(ctx)
	part := s.cfg.Interval / spreadSlots
	start := time.Now()
	tick := time.NewTicker(max(part, time.Millisecond))
	defer tick.Stop()
	done := 0 // parts of the intervals since start that have been scraped
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tick.C:
			due := int(now.Sub(start) / max(part, 1))
			// A whole interval behind (a stalled process, an interval
			// of a few ns) scrapes each target once, not once per part.
			done = max(done, due-spreadSlots)
			for ; done < due; done++ {
				s.startSlot(ctx, (done+1)%spreadSlots, &wg)
			}
		}
	}
}

// startSlot starts the scrapes of the targets in one part of the interval,
// and of the targets never scraped, and returns; wg counts them.
func (s *Scraper) startSlot(ctx context.Context, slot int, wg *sync.WaitGroup) {
	for _, t := range s.claim(func(t *target) bool { return t.slot == slot || t.last == nil }) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.scrape(ctx, t)
		}()
	}
}

// claim marks busy and returns the targets pick selects whose previous
// scrape has ended.
func (s *Scraper) claim(pick func(*target) bool) []*target {
	s.mu.Lock()
	defer s.mu.Unlock()
	var todo []*target
	for _, t := range s.targets {
		if !t.busy && pick(t) {
			t.busy = true
			todo = append(todo, t)
		}
	}
	return todo
}

// ScrapeAll scrapes every target concurrently and waits for all of them. A
// target whose previous scrape is still running is skipped.
func (s *Scraper) ScrapeAll(ctx context.Context) {
	todo := s.claim(func(*target) bool { return true })
	var wg sync.WaitGroup
	for _, t := range todo {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.scrape(ctx, t)
		}()
	}
	wg.Wait()
}

func (s *Scraper) scrape(ctx context.Context, t *target) {
	now := time.Now()
	var sig Signals
	err := s.fetch(ctx, t, &sig)

	s.mu.Lock()
	prev := t.last
	next := &Sample{URL: t.url}
	if err != nil {
		if prev != nil {
			*next = *prev
			next.Failures = prev.Failures + 1
		} else {
			next.Failures = 1
		}
		next.Err = err
	} else {
		next.Signals, next.At = sig, now
		if prev != nil && !prev.At.IsZero() {
			next.DeriveFrom(prev)
		}
	}
	t.last, t.busy = next, false
	s.mu.Unlock()

	if err != nil && s.log.Core().Enabled(zap.DebugLevel) {
		s.log.Debug("metrics scrape failed", zap.String("url", t.url), zap.Error(err))
	}
	if s.cfg.OnSample != nil {
		s.cfg.OnSample(next)
	}
}

// DeriveFrom sets next's rates and Window from prev, the previous good
// sample of the same target (both with Signals and At set), as the scraper
// does after every good scrape; a replay of recorded expositions calls it
// to build the same windows. A counter that went down (engine restart)
// yields 0 for the window, and histograms that went down or changed
// buckets leave the Window empty. It must be called before next is
// published.
func (next *Sample) DeriveFrom(prev *Sample) {
	dt := next.At.Sub(prev.At).Seconds()
	if dt <= 0 {
		return
	}
	rate := func(a, b float64) float64 {
		if a < b {
			return 0
		}
		return (a - b) / dt
	}
	n, p := &next.Signals, &prev.Signals
	next.PromptTokensPerSec = rate(n.PromptTokens, p.PromptTokens)
	next.GenerationTokensPerSec = rate(n.GenerationTokens, p.GenerationTokens)
	next.PrefixQueriesPerSec = rate(n.PrefixQueries, p.PrefixQueries)
	next.PrefixHitsPerSec = rate(n.PrefixHits, p.PrefixHits)
	ttft, ok1 := n.TTFT.Delta(&p.TTFT)
	itl, ok2 := n.ITL.Delta(&p.ITL)
	if !ok1 || !ok2 || n.GenerationTokens < p.GenerationTokens {
		return
	}
	next.Window = Window{Seconds: dt, Running: (n.Running + p.Running) / 2, Waiting: (n.Waiting + p.Waiting) / 2,
		KVUsage: (n.KVUsage + p.KVUsage) / 2, WaitingMin: min(n.Waiting, p.Waiting), TTFT: ttft, ITL: itl}
}

func (s *Scraper) fetch(ctx context.Context, t *target, sig *Signals) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, t.url, nil)
	if err != nil {
		return fmt.Errorf("cannot build scrape request: %w", err)
	}
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	resp, err := s.cfg.Client.Do(req)
	if err != nil {
		return fmt.Errorf("cannot scrape %s: %w", t.url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
		return fmt.Errorf("cannot scrape %s: status %d", t.url, resp.StatusCode)
	}
	t.buf.Reset()
	n, err := t.buf.ReadFrom(io.LimitReader(resp.Body, s.cfg.MaxBody+1))
	if err != nil {
		return fmt.Errorf("cannot read %s: %w", t.url, err)
	}
	if n > s.cfg.MaxBody {
		return fmt.Errorf("cannot read %s: exposition larger than %d bytes", t.url, s.cfg.MaxBody)
	}
	if err := Parse(t.buf.Bytes(), sig); err != nil {
		if errors.Is(err, ErrNoSignals) {
			return fmt.Errorf("cannot use %s: %w", t.url, err)
		}
		return fmt.Errorf("cannot parse %s: %w", t.url, err)
	}
	return nil
}

package metrics

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
)

func TestScraper(t *testing.T) {
	var prompt atomic.Int64
	prompt.Store(1000)
	good := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte("vllm:num_requests_running 2\nvllm:prompt_tokens_total " +
			strconv.FormatInt(prompt.Load(), 10) + "\n"))
	}))
	defer good.Close()
	release := make(chan struct{})
	hanging := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer hanging.Close()
	defer close(release)
	bad := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "nope", http.StatusInternalServerError)
	}))
	defer bad.Close()

	var samples atomic.Int64
	s := NewScraper(ScraperConfig{Timeout: 200 * time.Millisecond, OnSample: func(*Sample) { samples.Add(1) }}, nil)
	s.SetTargets([]string{good.URL, hanging.URL, bad.URL, ""})

	ctx := context.Background()
	start := time.Now()
	s.ScrapeAll(ctx)
	require.Less(t, time.Since(start), 2*time.Second, "a hanging target must be bounded by the timeout")
	require.Equal(t, int64(3), samples.Load())

	g, ok := s.Get(good.URL)
	require.True(t, ok)
	require.NoError(t, g.Err)
	require.InDelta(t, 2.0, g.Signals.Running, 0)
	require.False(t, g.At.IsZero())

	h, ok := s.Get(hanging.URL)
	require.True(t, ok)
	require.Error(t, h.Err)
	require.Equal(t, 1, h.Failures)
	require.True(t, h.At.IsZero())

	b, ok := s.Get(bad.URL)
	require.True(t, ok)
	require.ErrorContains(t, b.Err, "status 500")

	// Second round: rates appear for the good target, failures accumulate.
	time.Sleep(20 * time.Millisecond)
	prompt.Store(3000)
	s.ScrapeAll(ctx)
	g2, _ := s.Get(good.URL)
	require.Greater(t, g2.PromptTokensPerSec, 0.0)
	dt := g2.At.Sub(g.At).Seconds()
	require.InDelta(t, 2000/dt, g2.PromptTokensPerSec, 1e-6)
	h2, _ := s.Get(hanging.URL)
	require.Equal(t, 2, h2.Failures)

	// A counter reset yields a zero rate rather than a negative one.
	prompt.Store(10)
	s.ScrapeAll(ctx)
	g3, _ := s.Get(good.URL)
	require.Equal(t, 0.0, g3.PromptTokensPerSec)

	// Removing a target forgets it.
	s.SetTargets([]string{good.URL})
	_, ok = s.Get(bad.URL)
	require.False(t, ok)
	_, ok = s.Get(good.URL)
	require.True(t, ok)
}

func TestScraperRunStops(t *testing.T) {
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		_, _ = w.Write([]byte("sglang:num_queue_reqs 1\n"))
	}))
	defer srv.Close()
	s := NewScraper(ScraperConfig{Interval: 10 * time.Millisecond}, nil)
	s.SetTargets([]string{srv.URL})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	require.Eventually(t, func() bool { return hits.Load() >= 3 }, 2*time.Second, 5*time.Millisecond)
	cancel()
	select {
	case <-done:
	case <-time.After(2 * time.Second):
		t.Fatal("Run did not stop")
	}
}

// TestScraperSpreadsScrapes runs a pool of 256 targets and fails if Run
// scrapes them in a burst instead of spread over the interval, or misses a
// target in an interval: after the first round (every target at once), no
// eighth of an interval may hold more than twice its even share of the
// scrapes, and each target is scraped every interval.
// roundTrip is an http.RoundTripper of a function.
type roundTrip func(*http.Request) (*http.Response, error)

func (f roundTrip) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// TestScraperSpreadsScrapes: 256 targets are scraped once an interval
// each, spread over the interval rather than in one burst. The clock is
// synctest's, so the check is exact whatever the machine's load.
func TestScraperSpreadsScrapes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const targets, interval, rounds = 256, time.Second, 3
		var mu sync.Mutex
		at := map[string][]time.Time{}
		client := recordingClient(&mu, at)
		s := NewScraper(ScraperConfig{Interval: interval, Client: client}, nil)
		urls := make([]string, targets)
		for i := range urls {
			urls[i] = "http://engine.test/metrics?r=" + strconv.Itoa(i)
		}
		s.SetTargets(urls)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		start := time.Now()
		go func() { s.Run(ctx); close(done) }()
		time.Sleep(interval/2 + rounds*interval)
		cancel()
		<-done

		mu.Lock()
		defer mu.Unlock()
		require.Equal(t, targets, len(at), "targets scraped")
		const parts = 8
		var hist [rounds * parts]int
		for q, ts := range at {
			// The first scrape is the initial round; then one per interval.
			require.GreaterOrEqual(t, len(ts), rounds, "target %s scraped %d times in %d intervals", q, len(ts), rounds)
			for k := 1; k < len(ts); k++ {
				if k >= 2 { // the first spread scrape may come up to an interval after the initial round ends
					require.Less(t, ts[k].Sub(ts[k-1]), interval+interval/4, "target %s: a scrape interval missed", q)
				}
				if i := int(ts[k].Sub(start) * parts / interval); i < len(hist) {
					hist[i]++
				}
			}
		}
		for i, n := range hist[:(rounds-1)*parts] { // whole intervals only
			require.LessOrEqual(t, n, 2*targets/parts, "%d scrapes in eighth %d of the interval (even share %d): a burst; all: %v", n, i, targets/parts, hist)
		}
	})
}

// recordingClient answers every scrape with one running request and
// records, under mu, when each target (its URL's query) was scraped.
func recordingClient(mu *sync.Mutex, at map[string][]time.Time) *http.Client {
	return &http.Client{Transport: roundTrip(func(r *http.Request) (*http.Response, error) {
		mu.Lock()
		at[r.URL.RawQuery] = append(at[r.URL.RawQuery], time.Now())
		mu.Unlock()
		return &http.Response{StatusCode: http.StatusOK, Header: http.Header{},
			Body: io.NopCloser(strings.NewReader("vllm:num_requests_running 1\n")), Request: r}, nil
	})}
}

// TestScraperScrapesNewTargetAtOnce: a target added while Run runs is
// scraped at the next part of the interval, not in its own part up to an
// interval later, so a replica that just joined has signals before it is
// judged stale or idle; then it keeps to its own part.
func TestScraperScrapesNewTargetAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const interval = 2 * time.Second
		var mu sync.Mutex
		at := map[string][]time.Time{}
		client := recordingClient(&mu, at)
		s := NewScraper(ScraperConfig{Interval: interval, Client: client}, nil)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { s.Run(ctx); close(done) }()
		time.Sleep(interval / 3)
		urls := make([]string, 16)
		for i := range urls {
			urls[i] = "http://engine.test/metrics?r=" + strconv.Itoa(i)
		}
		added := time.Now()
		s.SetTargets(urls)
		time.Sleep(2 * interval)
		cancel()
		<-done

		mu.Lock()
		defer mu.Unlock()
		require.Len(t, at, len(urls))
		part := interval / spreadSlots
		for q, ts := range at {
			require.LessOrEqual(t, ts[0].Sub(added), part, "target %s: first scrape %v after it was added", q, ts[0].Sub(added))
			require.GreaterOrEqual(t, len(ts), 2, "target %s: scraped again in its own part", q)
		}
	})
}

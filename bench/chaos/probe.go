package chaos

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"time"
)

// waitFor polls cond every 20ms until it holds, returning how long that
// took, or fails after limit.
func waitFor(ctx context.Context, limit time.Duration, cond func() (bool, error)) (time.Duration, error) {
	start := time.Now()
	deadline := start.Add(limit)
	var lastErr error
	for {
		ok, err := cond()
		if ok && err == nil {
			return time.Since(start), nil
		}
		lastErr = err
		if time.Now().After(deadline) {
			if lastErr != nil {
				return time.Since(start), fmt.Errorf("not within %v: %w", limit, lastErr)
			}
			return time.Since(start), fmt.Errorf("not within %v", limit)
		}
		select {
		case <-ctx.Done():
			return time.Since(start), ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// probe is one request of a background probe loop.
type probe struct {
	at, end time.Time
	status  int
	err     error
}

func (p probe) ok() bool { return p.err == nil && p.status == http.StatusOK }

// prober sends a fresh unpinned request every interval until stopped.
type prober struct {
	mu     sync.Mutex
	probes []probe
	cancel context.CancelFunc
	done   chan struct{}
}

// startProber sends requests from workers goroutines, one every interval
// each; prompt gives worker w's i-th prompt (nil: a fresh 60-word prompt).
func (env *world) startProber(ctx context.Context, tag string, every time.Duration, workers int, prompt func(w, i int) string) *prober {
	if prompt == nil {
		prompt = func(w, i int) string { return promptOf(fmt.Sprintf("%s-%d-%d", tag, w, i), 60) }
	}
	pctx, cancel := context.WithCancel(ctx)
	pr := &prober{cancel: cancel, done: make(chan struct{})}
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; pctx.Err() == nil; i++ {
				at := time.Now()
				rctx, rcancel := context.WithTimeout(pctx, 10*time.Second)
				status, err := env.complete(rctx, prompt(w, i), 4, "")
				rcancel()
				if pctx.Err() != nil {
					return
				}
				pr.mu.Lock()
				pr.probes = append(pr.probes, probe{at: at, end: time.Now(), status: status, err: err})
				pr.mu.Unlock()
				select {
				case <-pctx.Done():
				case <-time.After(time.Until(at.Add(every))):
				}
			}
		}()
	}
	go func() { wg.Wait(); close(pr.done) }()
	return pr
}

func (pr *prober) stop() []probe {
	pr.cancel()
	<-pr.done
	return pr.snapshot()
}

func (pr *prober) snapshot() []probe {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	return append([]probe(nil), pr.probes...)
}

// failures counts failed probes sent at or after from (zero time: all).
func failures(ps []probe, from time.Time) (failed, total int) {
	for _, p := range ps {
		if p.at.Before(from) {
			continue
		}
		total++
		if !p.ok() {
			failed++
		}
	}
	return failed, total
}

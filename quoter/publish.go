package quoter

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"sync"
	"time"

	"go.uber.org/zap"
)

// publisher POSTs quotes to the market in its own goroutine. It holds only
// the newest quote: signing never waits for it, and a quote superseded or
// expired while the market is unreachable is dropped instead of queued.
type publisher struct {
	url      string
	hc       *http.Client
	log      *zap.Logger
	m        *metrics
	now      func() time.Time
	base     time.Duration
	maxDelay time.Duration

	mu      sync.Mutex
	pending *SignedQuote
	expiry  time.Time
	wake    chan struct{}
}

func newPublisher(url string, hc *http.Client, base, maxDelay time.Duration, now func() time.Time, m *metrics, log *zap.Logger) *publisher {
	return &publisher{url: url, hc: hc, log: log, m: m, now: now, base: base, maxDelay: maxDelay,
		wake: make(chan struct{}, 1)}
}

// offer replaces the pending quote; it never blocks.
func (p *publisher) offer(sq *SignedQuote, expiry time.Time) {
	p.mu.Lock()
	if p.pending != nil {
		p.m.failed.WithLabelValues("dropped").Inc()
	}
	p.pending, p.expiry = sq, expiry
	p.mu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// clear drops the pending quote (the breaker opened).
func (p *publisher) clear() {
	p.mu.Lock()
	if p.pending != nil {
		p.m.failed.WithLabelValues("dropped").Inc()
	}
	p.pending = nil
	p.mu.Unlock()
}

func (p *publisher) take() (*SignedQuote, time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	sq, exp := p.pending, p.expiry
	p.pending = nil
	return sq, exp
}

// putBack re-queues a failed quote unless a newer one arrived meanwhile.
func (p *publisher) putBack(sq *SignedQuote, exp time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.pending == nil {
		p.pending, p.expiry = sq, exp
	} else {
		p.m.failed.WithLabelValues("dropped").Inc()
	}
}

func (p *publisher) run(ctx context.Context) {
	delay := p.base
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.wake:
		}
		for {
			sq, exp := p.take()
			if sq == nil {
				break
			}
			if !p.now().Before(exp) {
				p.m.failed.WithLabelValues("dropped").Inc()
				continue
			}
			retry, err := p.post(ctx, sq)
			if err == nil {
				p.m.published.Inc()
				delay = p.base
				continue
			}
			p.m.failed.WithLabelValues("publish").Inc()
			if !retry {
				p.log.Warn("market rejected quote", zap.String("seq", sq.Message.Seq), zap.Error(err))
				continue
			}
			p.log.Warn("cannot publish quote, retrying", zap.String("seq", sq.Message.Seq),
				zap.Duration("backoff", delay), zap.Error(err))
			p.putBack(sq, exp)
			// Jitter spreads retries of many providers after a market outage.
			wait := delay/2 + rand.N(delay/2+1)
			delay = min(delay*2, p.maxDelay)
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			case <-p.wake: // a newer quote: try it now
				t.Stop()
			}
		}
	}
}

// post sends one quote; retry says whether a failure is worth retrying.
func (p *publisher) post(ctx context.Context, sq *SignedQuote) (retry bool, err error) {
	body, err := json.Marshal(sq)
	if err != nil {
		return false, fmt.Errorf("cannot encode quote: %w", err)
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(cctx, http.MethodPost, p.url, bytes.NewReader(body))
	if err != nil {
		return false, fmt.Errorf("cannot build publish request: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := p.hc.Do(req)
	if err != nil {
		return true, fmt.Errorf("cannot reach market: %w", err)
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
	switch {
	case resp.StatusCode/100 == 2:
		return false, nil
	case resp.StatusCode == http.StatusRequestTimeout || resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode >= 500:
		return true, fmt.Errorf("market answered %d: %s", resp.StatusCode, bytes.TrimSpace(msg))
	}
	return false, fmt.Errorf("market answered %d: %s", resp.StatusCode, bytes.TrimSpace(msg))
}

package chaos

import (
	"context"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/ethereum/go-ethereum/crypto"

	"github.com/omnious/provider-node/bench/internal/loopback"
	"github.com/omnious/provider-node/quoter"
)

// quoterLog records what the quoter did and what the EPP reported, with
// wall-clock times.
type quoterLog struct {
	mu        sync.Mutex
	signed    []signedAt
	published []time.Time
	moves     []breakerMove
	health    []healthSample
}

type signedAt struct {
	at     time.Time
	expiry time.Time
}

type breakerMove struct {
	at time.Time
	to quoter.BreakerState
}

// healthSample is one poll of the EPP's capacity (healthy replicas) and of
// the quote the quoter would serve at that moment.
type healthSample struct {
	at      time.Time
	healthy bool
	serving bool
}

func (l *quoterLog) onSigned(sq *quoter.SignedQuote) {
	exp, _ := strconv.ParseInt(sq.Message.Expiry, 10, 64)
	l.mu.Lock()
	l.signed = append(l.signed, signedAt{at: time.Now(), expiry: time.Unix(exp, 0)})
	l.mu.Unlock()
}

// onBreaker runs with the quoter's breaker lock held: record only.
func (l *quoterLog) onBreaker(_, to quoter.BreakerState, _ string) {
	l.mu.Lock()
	l.moves = append(l.moves, breakerMove{at: time.Now(), to: to})
	l.mu.Unlock()
}

func (l *quoterLog) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	if _, err := quoter.ParseSignedQuote(b); err != nil {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	l.mu.Lock()
	l.published = append(l.published, time.Now())
	l.mu.Unlock()
	w.WriteHeader(http.StatusAccepted)
}

func (l *quoterLog) copy() quoterLog {
	l.mu.Lock()
	defer l.mu.Unlock()
	return quoterLog{signed: append([]signedAt(nil), l.signed...), published: append([]time.Time(nil), l.published...),
		moves: append([]breakerMove(nil), l.moves...), health: append([]healthSample(nil), l.health...)}
}

// The quoter's timings in this scenario: short, so that the flapping spans
// several hold-downs within seconds.
const (
	flapRefresh  = 200 * time.Millisecond
	flapTTL      = 2 * time.Second
	flapHoldDown = time.Second
	flapMaxHold  = 4 * time.Second
	flapDown     = 700 * time.Millisecond
	flapUp       = 700 * time.Millisecond
	flapCycles   = 6
)

// runQuoterFlap drives quoter.Service in process against the real EPP and
// an enginesim process whose health flaps (connections refused for 0.7 s,
// then served for 0.7 s). A light request stream keeps the EPP's breaker
// honest: its half-open probes are real requests.
func runQuoterFlap(ctx context.Context, env *world, o *outcome) error {
	log := &quoterLog{}
	market := httptest.NewServer(log)
	defer market.Close()
	key, err := crypto.GenerateKey()
	if err != nil {
		return fmt.Errorf("cannot generate a key: %w", err)
	}
	cfg := quoter.Config{ProviderID: "chaos", Model: model, ModelClass: "qwen3-32b", ServingURL: env.gw.URL(),
		CapacityURL: env.epp.AdminURL(), MarketURL: market.URL, StateFile: filepath.Join(env.dir, "quoter-state.json"),
		FloorIn: big.NewInt(210000), FloorOut: big.NewInt(680000), ChainID: big.NewInt(8453),
		Refresh: flapRefresh, TTL: flapTTL, CanaryInterval: 500 * time.Millisecond, MaxSnapshotAge: 2 * time.Second,
		PublishBackoff: 20 * time.Millisecond, PublishMaxBackoff: 100 * time.Millisecond,
		Breaker: quoter.BreakerConfig{ConsecutiveFailures: 2, CloseAfter: 2, HoldDown: flapHoldDown, MaxHoldDown: flapMaxHold,
			ResetAfter: time.Minute}}
	svc, err := quoter.New(cfg, key, env.log.Named("quoter"), quoter.Options{OnSigned: log.onSigned, OnBreaker: log.onBreaker,
		HTTP: loopback.Client(10 * time.Second), CapacityHTTP: env.epp.AdminClient()})
	if err != nil {
		return fmt.Errorf("cannot start the quoter: %w", err)
	}
	qctx, qcancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer qcancel() // runs before wg.Wait: the goroutines end on it
	wg.Add(2)
	go func() { defer wg.Done(); _ = svc.Run(qctx) }()
	go func() { // the monitor: EPP health and the quote served, every 25ms
		defer wg.Done()
		for qctx.Err() == nil {
			// A snapshot that cannot be read (the monitor is being
			// cancelled) is no sample: it would read as a health loss.
			if snap, err := env.epp.Capacity(qctx); err == nil {
				healthy := false
				for _, m := range snap.Models {
					healthy = healthy || (m.Model == model && m.Healthy > 0)
				}
				_, serving := svc.Current()
				log.mu.Lock()
				log.health = append(log.health, healthSample{at: time.Now(), healthy: healthy, serving: serving})
				log.mu.Unlock()
			}
			select {
			case <-qctx.Done():
			case <-time.After(25 * time.Millisecond):
			}
		}
	}()
	pr := env.startProber(ctx, "flap-probe", 100*time.Millisecond, 1, nil)
	defer pr.stop()

	// Healthy first: the conformance gate passes, quotes are published.
	if _, err := waitFor(ctx, 60*time.Second, func() (bool, error) { return len(log.copy().published) >= 2, nil }); err != nil {
		return fmt.Errorf("no quotes published before the flapping: %w", err)
	}
	p := env.sims[0]
	tFlap := time.Now()
	for i := 0; i < flapCycles; i++ {
		down := time.Now()
		if err := env.post(ctx, p.URL()+"/admin/refuse", fmt.Sprintf(`{"for":%q}`, flapDown.String())); err != nil {
			return err
		}
		time.Sleep(time.Until(down.Add(flapDown + flapUp)))
	}
	tStable := time.Now()
	recovered, err := waitFor(ctx, 30*time.Second, func() (bool, error) {
		for _, s := range log.copy().signed {
			if s.at.After(tStable) {
				return true, nil
			}
		}
		return false, nil
	})
	qcancel()
	wg.Wait()
	l := log.copy()

	// Health loss → breaker open.
	var firstLoss, firstOpen time.Time
	for _, h := range l.health {
		if h.at.After(tFlap) && !h.healthy {
			firstLoss = h.at
			break
		}
	}
	for _, m := range l.moves {
		if m.at.After(tFlap) && m.to == quoter.BreakerOpen {
			firstOpen = m.at
			break
		}
	}
	if firstLoss.IsZero() || firstOpen.IsZero() {
		o.check(false, "the EPP never reported the replica unhealthy, or the quoter's breaker never opened")
		return nil
	}
	o.see("EPP unhealthy %d ms after the first refusal; quoter breaker open %d ms after that",
		firstLoss.Sub(tFlap).Milliseconds(), firstOpen.Sub(firstLoss).Milliseconds())
	o.check(firstOpen.Sub(firstLoss) <= flapRefresh+500*time.Millisecond, "breaker opened %v after health loss (bound refresh + 0.5s)", firstOpen.Sub(firstLoss))

	// Nothing signed or served while the EPP reports no healthy replica,
	// beyond one refresh of lag (a tick may have read the snapshot just
	// before the loss).
	lag := flapRefresh + 300*time.Millisecond
	var lossStart time.Time
	servedUnhealthy, signedUnhealthy := 0, 0
	var unhealthy [][2]time.Time
	for _, h := range l.health {
		switch {
		case !h.healthy && lossStart.IsZero():
			lossStart = h.at
		case h.healthy && !lossStart.IsZero():
			unhealthy = append(unhealthy, [2]time.Time{lossStart, h.at})
			lossStart = time.Time{}
		}
		if !h.healthy && !lossStart.IsZero() && h.serving && h.at.Sub(lossStart) > lag {
			servedUnhealthy++
		}
	}
	for _, s := range l.signed {
		for _, u := range unhealthy {
			if s.at.After(u[0].Add(lag)) && s.at.Before(u[1]) {
				signedUnhealthy++
			}
		}
	}
	// Every quote signed before a loss has expired within TTL (+1 s of
	// whole-second rounding) of it.
	outlived := 0
	for _, u := range unhealthy {
		for _, s := range l.signed {
			if s.at.Before(u[0]) && s.expiry.After(u[0].Add(flapTTL+time.Second)) {
				outlived++
			}
		}
	}
	o.check(servedUnhealthy == 0, "a quote was served %d times while the EPP reported no healthy replica", servedUnhealthy)
	o.check(signedUnhealthy == 0, "%d quotes were signed while the EPP reported no healthy replica", signedUnhealthy)
	o.check(outlived == 0, "%d quotes outlived their TTL after a health loss", outlived)

	// Hold-down: count how often the breaker closed during the flapping,
	// and check each close came at least a hold-down after its open.
	closes, early, opens := 0, 0, 0
	var lastOpen time.Time
	for _, m := range l.moves {
		if m.at.Before(tFlap) || m.at.After(tStable) {
			continue
		}
		switch m.to {
		case quoter.BreakerOpen:
			opens++
			lastOpen = m.at
		case quoter.BreakerClosed:
			closes++
			if !lastOpen.IsZero() && m.at.Sub(lastOpen) < flapHoldDown {
				early++
			}
		}
	}
	published := 0
	for _, t := range l.published {
		if t.After(tFlap) && t.Before(tStable) {
			published++
		}
	}
	o.see("%d health losses in %.1f s of flapping: breaker opened %d times, closed %d times, %d quotes published; %d signed and %d served while unhealthy",
		len(unhealthy), tStable.Sub(tFlap).Seconds(), opens, closes, published, signedUnhealthy, servedUnhealthy)
	o.check(early == 0, "%d closes came sooner than the hold-down after an open", early)
	o.check(closes < flapCycles, "the breaker closed in %d of %d healthy windows: the hold-down did not damp the flapping", closes, flapCycles)
	if err != nil {
		o.check(false, "no quote signed within 30 s of stable health: %v", err)
		return nil
	}
	o.see("signing again %.1f s after health stabilised", recovered.Seconds())
	o.check(recovered <= flapMaxHold+3*time.Second, "signing resumed %v after health stabilised (bound max hold-down + 3s)", recovered)
	o.recovery, o.recoveryOf = recovered, "stable health → quote signed"
	return nil
}

package quoter

import (
	"context"
	"encoding/json"
	"io"
	"math/big"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/crypto"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/omnious/provider-node/capacity"
	"github.com/omnious/provider-node/deploy/metricscheck"
	"github.com/omnious/provider-node/engines/sim/simtest"
)

const simModel = "Qwen/Qwen3-32B"

// fakeEPP serves a capacity snapshot whose shape the test controls.
type fakeEPP struct {
	status  atomic.Int32
	healthy atomic.Int32
	age     atomic.Int64 // snapshot age in ns
}

func (e *fakeEPP) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != capacity.Path {
		http.NotFound(w, r)
		return
	}
	if s := int(e.status.Load()); s != http.StatusOK {
		w.WriteHeader(s)
		return
	}
	h := int(e.healthy.Load())
	_ = json.NewEncoder(w).Encode(capacity.Snapshot{Taken: time.Now().Add(-time.Duration(e.age.Load())),
		Models: []capacity.Model{{Model: simModel, Replicas: 1, Healthy: h, MaxConcurrency: 8 * h, Running: 2,
			OutputTokensPerSec: 100, ReplicaCapacity: []capacity.Replica{{Addr: "r", Healthy: h > 0, Running: 2,
				OutputTokensPerSec: 100, MaxRunning: 256, Curve: testCurve}}}}})
}

// testCurve holds about 20 running requests within the default
// objectives.
var testCurve = curve(curveBin(4, 1, 1, 40), curveBin(10, 0.99, 1, 100), curveBin(20, 0.97, 1, 180), curveBin(30, 0.93, 1, 240),
	curveBin(40, 0.8, 1, 280))

func startEPP(t *testing.T) (*fakeEPP, string) {
	e := &fakeEPP{}
	e.status.Store(http.StatusOK)
	e.healthy.Store(1)
	srv := httptest.NewServer(e)
	t.Cleanup(srv.Close)
	return e, srv.URL
}

// market records published quotes.
type market struct {
	mu       sync.Mutex
	quotes   []*SignedQuote
	received []time.Time
	fail     atomic.Bool
}

func (m *market) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if m.fail.Load() {
		w.WriteHeader(http.StatusBadGateway)
		return
	}
	b, _ := io.ReadAll(r.Body)
	sq, err := ParseSignedQuote(b)
	if err != nil {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	m.mu.Lock()
	m.quotes = append(m.quotes, sq)
	m.received = append(m.received, time.Now())
	m.mu.Unlock()
	w.WriteHeader(http.StatusAccepted)
}

func (m *market) count() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.quotes)
}

// recorder collects what the service signs and how the breaker moves.
type recorder struct {
	mu     sync.Mutex
	quotes []*SignedQuote
	opens  []time.Time
	states []BreakerState
}

func (r *recorder) signed(sq *SignedQuote) {
	r.mu.Lock()
	r.quotes = append(r.quotes, sq)
	r.mu.Unlock()
}

func (r *recorder) breaker(_, to BreakerState, _ string) {
	r.mu.Lock()
	r.states = append(r.states, to)
	if to == BreakerOpen {
		r.opens = append(r.opens, time.Now())
	}
	r.mu.Unlock()
}

func (r *recorder) snapshot() ([]*SignedQuote, []time.Time, []BreakerState) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*SignedQuote(nil), r.quotes...), append([]time.Time(nil), r.opens...), append([]BreakerState(nil), r.states...)
}

func seqOf(t *testing.T, sq *SignedQuote) uint64 {
	t.Helper()
	n, ok := new(big.Int).SetString(sq.Message.Seq, 10)
	require.True(t, ok)
	return n.Uint64()
}

type testEnv struct {
	sim, epp, servingURL, state string
	eppCtl                      *fakeEPP
	mkt                         *market
	mktURL                      string
}

func newEnv(t *testing.T) *testEnv {
	e := &testEnv{sim: simtest.URL(t, "vllm"), state: filepath.Join(t.TempDir(), "state.json"), mkt: &market{}}
	e.servingURL = e.sim
	e.eppCtl, e.epp = startEPP(t)
	msrv := httptest.NewServer(e.mkt)
	t.Cleanup(msrv.Close)
	e.mktURL = msrv.URL
	return e
}

func (e *testEnv) config() Config {
	return Config{ProviderID: "acme", Model: simModel, ModelClass: "qwen3-32b", ServingURL: e.servingURL,
		CapacityURL: e.epp, MarketURL: e.mktURL, StateFile: e.state, FloorIn: big.NewInt(210000), FloorOut: big.NewInt(680000),
		ChainID: big.NewInt(8453), Refresh: 100 * time.Millisecond, TTL: 2 * time.Second, CanaryInterval: 100 * time.Millisecond,
		MaxSnapshotAge: 5 * time.Second, PublishBackoff: 20 * time.Millisecond, PublishMaxBackoff: 100 * time.Millisecond,
		Breaker: BreakerConfig{ConsecutiveFailures: 2, CloseAfter: 2, HoldDown: 300 * time.Millisecond, MaxHoldDown: time.Second}}
}

func getStatus(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

// TestBreakerAgainstSimulator is the acceptance scenario: the gate holds
// signing until conformance passes; faults open the breaker; nothing is
// signed after that; the last quote lapses within one TTL; recovery
// resumes signing with a higher seq, also after a restart.
func TestBreakerAgainstSimulator(t *testing.T) {
	env := newEnv(t)
	key := newKey(t)
	rec := &recorder{}
	simtest.SetFaults(t, env.sim, `{"reject_auto_tool_choice":true}`)
	svc, err := New(env.config(), key, zaptest.NewLogger(t, zaptest.Level(zap.ErrorLevel)),
		Options{OnSigned: rec.signed, OnBreaker: rec.breaker})
	require.NoError(t, err)
	api := httptest.NewServer(svc.Handler())
	defer api.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx) }()
	defer func() {
		cancel()
		require.NoError(t, <-done)
	}()

	// Conformance gate: nothing signed while tool_choice auto is rejected.
	time.Sleep(500 * time.Millisecond)
	quotes, _, _ := rec.snapshot()
	require.Empty(t, quotes, "signed before conformance passed")
	code, body := getStatus(t, api.URL+"/metrics")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, "omnious_quoter_conformance_passed 0")
	simtest.SetFaults(t, env.sim, `{}`)

	require.Eventually(t, func() bool { q, _, _ := rec.snapshot(); return len(q) >= 3 }, 10*time.Second, 20*time.Millisecond)
	require.Eventually(t, func() bool { return env.mkt.count() >= 2 }, 5*time.Second, 20*time.Millisecond)
	// Seconds-granular expiry leaves a quote valid for TTL-1s..TTL, so a
	// loaded machine may briefly have none: poll rather than sample once.
	var served *SignedQuote
	require.Eventually(t, func() bool {
		code, body = getStatus(t, api.URL+"/v1/quote")
		if code != http.StatusOK {
			return false
		}
		if served, err = ParseSignedQuote([]byte(body)); err != nil {
			return false
		}
		_, err = Verify(served, VerifyOptions{Signer: crypto.PubkeyToAddress(key.PublicKey), ChainID: big.NewInt(8453)})
		return err == nil
	}, 5*time.Second, 20*time.Millisecond, "no valid quote served: %s", body)
	at, err := testCurve.Clone().At(Config{}.WithDefaults().Objectives)
	require.NoError(t, err)
	// What the curve holds within the objectives minus the 2 running and
	// the 100 tokens/s the snapshot shows.
	require.Equal(t, strconv.Itoa(int(at.Streams-2)), served.Message.HeadroomConcurrency)
	require.Equal(t, strconv.Itoa(int(min(at.OutputTokensPerSec-100, at.OutputTokensPerSec*(at.Streams-2)/at.Streams))),
		served.Message.HeadroomTokensPerSec)
	require.Equal(t, EndpointHash(env.servingURL).Hex(), served.Message.EndpointHash)
	require.Equal(t, "210000", served.Message.InputPricePerMTok)
	// The live exposition carries what the dashboards and alerts use.
	code, body = getStatus(t, api.URL+"/metrics")
	require.Equal(t, http.StatusOK, code)
	metricscheck.Check(t, []byte(body), "quoter")

	// Faults: canaries fail, the breaker opens, signing stops.
	simtest.SetFaults(t, env.sim, `{"error_rate":1,"error_status":503}`)
	require.Eventually(t, func() bool { _, o, _ := rec.snapshot(); return len(o) >= 1 }, 10*time.Second, 10*time.Millisecond)
	require.Equal(t, BreakerOpen, svc.Breaker().State())
	require.Contains(t, svc.Breaker().Reason(), "canary failed 2 times in a row")
	quotes, opens, _ := rec.snapshot()
	openedAt, signedBeforeOpen := opens[0], len(quotes)
	last := quotes[len(quotes)-1]
	lastExpiry := time.Unix(int64(mustUint(t, last.Message.Expiry)), 0)
	require.LessOrEqual(t, lastExpiry.Sub(openedAt), env.config().TTL, "the last quote must lapse within one TTL of the trip")

	code, _ = getStatus(t, api.URL+"/v1/quote")
	require.Equal(t, http.StatusServiceUnavailable, code, "an open breaker serves no quote")

	// Wait past the last expiry (plus half-open probes that keep failing).
	time.Sleep(time.Until(lastExpiry) + 600*time.Millisecond)
	quotes, opens, states := rec.snapshot()
	require.Len(t, quotes, signedBeforeOpen, "a quote was signed after the breaker opened")
	require.GreaterOrEqual(t, len(opens), 2, "half-open probes against a faulty backend re-open the breaker")
	require.Contains(t, states, BreakerHalfOpen)
	_, err = Verify(last, VerifyOptions{})
	require.ErrorIs(t, err, ErrExpired)
	code, _ = getStatus(t, api.URL+"/metrics")
	require.Equal(t, http.StatusOK, code)

	// Recovery: clear faults; half-open probes pass; signing resumes.
	simtest.SetFaults(t, env.sim, `{}`)
	lastSeq := seqOf(t, last)
	require.Eventually(t, func() bool { q, _, _ := rec.snapshot(); return len(q) > signedBeforeOpen }, 10*time.Second, 20*time.Millisecond)
	quotes, _, _ = rec.snapshot()
	resumed := quotes[signedBeforeOpen]
	require.Greater(t, seqOf(t, resumed), lastSeq)
	_, err = Verify(resumed, atIssue(resumed))
	require.NoError(t, err)
	require.Equal(t, BreakerClosed, svc.Breaker().State())
	for i := 1; i < len(quotes); i++ {
		require.Greater(t, seqOf(t, quotes[i]), seqOf(t, quotes[i-1]), "seq must strictly increase")
	}
	require.NotEqual(t, quotes[0].Message.Nonce, quotes[1].Message.Nonce)

	_, body = getStatus(t, api.URL+"/metrics")
	for _, series := range []string{"omnious_quoter_breaker_state 0", "omnious_quoter_quotes_signed_total",
		"omnious_quoter_quotes_published_total", `omnious_quoter_quotes_failed_total{stage="publish"}`,
		"omnious_quoter_last_quote_expiry_timestamp_seconds", `omnious_quoter_breaker_transitions_total{to="open"}`,
		`omnious_quoter_canary_probes_total{result="fail"}`, "omnious_quoter_conformance_passed 1"} {
		require.Contains(t, body, series)
	}
	code, body = getStatus(t, api.URL+"/healthz")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, `"breaker": "closed"`)

	// A restart continues the sequence from the state file.
	cancel()
	require.NoError(t, <-done)
	done <- nil // the deferred cleanup reads it again
	quotes, _, _ = rec.snapshot()
	svc2, err := New(env.config(), key, zap.NewNop(), Options{})
	require.NoError(t, err)
	sq, err := svc2.SignOnce(context.Background())
	require.NoError(t, err)
	require.Equal(t, seqOf(t, quotes[len(quotes)-1])+1, seqOf(t, sq))
}

// atIssue verifies as of the quote's own issue time, so a short test TTL
// cannot lapse between signing and the assertion.
func atIssue(sq *SignedQuote) VerifyOptions {
	return VerifyOptions{Now: func() time.Time { return time.Unix(int64(mustUintNoT(sq.Message.IssuedAt)), 0) }}
}

func mustUintNoT(s string) uint64 {
	n, _ := new(big.Int).SetString(s, 10)
	if n == nil {
		return 0
	}
	return n.Uint64()
}

func mustUint(t *testing.T, s string) uint64 {
	t.Helper()
	n, ok := new(big.Int).SetString(s, 10)
	require.True(t, ok)
	return n.Uint64()
}

// TestHealthSignalsOpenBreaker covers the three health trips through the
// EPP snapshot, with no canary involved.
func TestHealthSignalsOpenBreaker(t *testing.T) {
	env := newEnv(t)
	for _, tc := range []struct {
		name   string
		break_ func(*fakeEPP)
		reason string
	}{
		{"epp unreachable", func(e *fakeEPP) { e.status.Store(http.StatusBadGateway) }, "EPP capacity endpoint unreachable"},
		{"no healthy replica", func(e *fakeEPP) { e.healthy.Store(0) }, "no healthy replica"},
		{"stale metrics", func(e *fakeEPP) { e.age.Store(int64(time.Minute)) }, "stale metrics"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env.eppCtl.status.Store(http.StatusOK)
			env.eppCtl.healthy.Store(1)
			env.eppCtl.age.Store(0)
			cfg := env.config()
			cfg.StateFile = filepath.Join(t.TempDir(), "state.json")
			cfg.CanaryInterval = time.Hour
			clk := &fakeClock{t: time.Now()}
			rec := &recorder{}
			svc, err := New(cfg, newKey(t), zap.NewNop(), Options{Now: clk.Now, OnSigned: rec.signed})
			require.NoError(t, err)
			svc.Tick(context.Background())
			q, _, _ := rec.snapshot()
			require.Len(t, q, 1)

			tc.break_(env.eppCtl)
			svc.Tick(context.Background())
			require.Equal(t, BreakerOpen, svc.Breaker().State())
			require.Contains(t, svc.Breaker().Reason(), tc.reason)
			q, _, _ = rec.snapshot()
			require.Len(t, q, 1, "signed while the breaker is open")

			// Hold-down elapses but the problem persists: half-open re-trips.
			clk.Advance(300 * time.Millisecond)
			svc.Tick(context.Background())
			require.Equal(t, BreakerOpen, svc.Breaker().State())
			require.Equal(t, clk.Now().Add(600*time.Millisecond), svc.Breaker().OpenUntil(), "hold-down doubles")

			// Healed: two good half-open probes close it and signing resumes.
			env.eppCtl.status.Store(http.StatusOK)
			env.eppCtl.healthy.Store(1)
			env.eppCtl.age.Store(0)
			clk.Advance(600 * time.Millisecond)
			svc.Tick(context.Background())
			require.Equal(t, BreakerHalfOpen, svc.Breaker().State())
			q, _, _ = rec.snapshot()
			require.Len(t, q, 1, "half-open signs nothing")
			svc.Tick(context.Background())
			require.Equal(t, BreakerClosed, svc.Breaker().State())
			q, _, _ = rec.snapshot()
			require.Len(t, q, 2)
			require.Equal(t, uint64(2), seqOf(t, q[1]))
		})
	}
}

func TestPublisherRetriesWithoutBlockingSigning(t *testing.T) {
	env := newEnv(t)
	env.mkt.fail.Store(true)
	cfg := env.config()
	cfg.CanaryInterval = time.Hour
	rec := &recorder{}
	svc, err := New(cfg, newKey(t), zap.NewNop(), Options{OnSigned: rec.signed})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx) }()
	defer func() {
		cancel()
		require.NoError(t, <-done)
	}()
	// Signing keeps its cadence while every publish fails.
	require.Eventually(t, func() bool { q, _, _ := rec.snapshot(); return len(q) >= 5 }, 10*time.Second, 20*time.Millisecond)
	require.Zero(t, env.mkt.count())
	env.mkt.fail.Store(false)
	require.Eventually(t, func() bool { return env.mkt.count() >= 1 }, 5*time.Second, 20*time.Millisecond)
	env.mkt.mu.Lock()
	got, receivedAt := env.mkt.quotes[0], env.mkt.received[0]
	env.mkt.mu.Unlock()
	_, err = Verify(got, VerifyOptions{Now: func() time.Time { return receivedAt }})
	require.NoError(t, err, "only unexpired quotes are published after an outage")
}

func TestConfigValidate(t *testing.T) {
	err := Config{}.WithDefaults().Validate()
	for _, want := range []string{"provider id is required", "model is required", "serving URL is required",
		"capacity URL is required", "state file is required", "FLOOR_IN", "FLOOR_OUT"} {
		require.ErrorContains(t, err, want)
	}
	c := (&testEnv{}).config()
	c.ProviderID, c.Model, c.ModelClass, c.ServingURL, c.CapacityURL, c.StateFile = "p", "m", "c", "u", "e", "s"
	c.TTL = 1500 * time.Millisecond
	require.ErrorContains(t, c.WithDefaults().Validate(), "whole number of seconds")
	c.TTL, c.Refresh = time.Second, 2*time.Second
	require.ErrorContains(t, c.WithDefaults().Validate(), "must be shorter than the --ttl")
}

func TestSignOnceRefusesUnhealthyOrNonConformant(t *testing.T) {
	env := newEnv(t)
	cfg := env.config()
	svc, err := New(cfg, newKey(t), zap.NewNop(), Options{})
	require.NoError(t, err)

	env.eppCtl.status.Store(http.StatusBadGateway)
	_, err = svc.SignOnce(context.Background())
	require.ErrorIs(t, err, ErrEPPUnreachable)
	require.ErrorContains(t, err, "not signing")
	env.eppCtl.status.Store(http.StatusOK)

	simtest.SetFaults(t, env.sim, `{"reject_auto_tool_choice":true}`)
	_, err = svc.SignOnce(context.Background())
	require.ErrorContains(t, err, "conformance gate failed")

	simtest.SetFaults(t, env.sim, `{}`)
	sq, err := svc.SignOnce(context.Background())
	require.NoError(t, err)
	require.Equal(t, "1", sq.Message.Seq, "refused attempts consume no sequence numbers")

	cfg.SkipConformance = true
	svc, err = New(cfg, newKey(t), zap.NewNop(), Options{})
	require.NoError(t, err)
	require.ErrorContains(t, svc.Run(context.Background()), "never runs without the conformance gate")
}

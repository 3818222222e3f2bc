package envoy

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// TestServedEndpointReported: Envoy names the replica it connected to in
// the response phase (response_attributes: upstream.address), and the EPP
// reports it to the scheduler as the served endpoint: for every request
// the EPP's "finished" record names the replica whose front saw it.
func TestServedEndpointReported(t *testing.T) {
	core, logs := observer.New(zap.DebugLevel)
	s := startStack(t, "envoy.yaml", opts{log: zap.New(core)})
	for i := range 12 {
		code, _, got, err := s.post(context.Background(), "/v1/chat/completions", chat(words(i%4, 300), i%2 == 0, 4), nil)
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, code, "%s", got)
	}
	served := map[string]string{}
	for _, e := range logs.FilterMessage("finished").All() {
		f := e.ContextMap()
		served[f["id"].(string)] = f["served"].(string)
	}
	all := s.allSeen()
	require.Len(t, all, 12)
	for _, q := range all {
		require.NotEmpty(t, q.requestID)
		require.Equal(t, q.dest, served[q.requestID], "request %s: the EPP was told it was served by %q", q.requestID, served[q.requestID])
	}
}

// TestEPPDownFailsClosed: with the EPP gone Envoy refuses every request
// itself (failure_mode_allow: false: 500) and no replica sees one; once
// the EPP is back on its ports, Envoy's health checks find it and requests
// are routed again.
func TestEPPDownFailsClosed(t *testing.T) {
	s := startStack(t, "envoy.yaml", opts{})
	ctx := context.Background()
	code, _, _, err := s.post(ctx, "/v1/chat/completions", chat("before", false, 4), nil)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, code)

	s.epps[0].stop()
	before := len(s.allSeen())
	for range 5 {
		code, _, got, err := s.post(ctx, "/v1/chat/completions", chat("while down", false, 4), nil)
		require.NoError(t, err)
		require.Equal(t, http.StatusInternalServerError, code, "%s", got)
	}
	require.Len(t, s.allSeen(), before, "no request reached a replica without the EPP")

	down := time.Now()
	s.epps[0].start()
	s.epps[0].waitReady(len(s.replicas))
	require.Eventually(t, func() bool {
		code, _, _, err := s.post(ctx, "/v1/chat/completions", chat("after", false, 4), nil)
		return err == nil && code == http.StatusOK
	}, 15*time.Second, 100*time.Millisecond, "Envoy never routed through the restarted EPP")
	t.Logf("routed again %v after the EPP's restart", time.Since(down).Round(time.Millisecond))
}

// outcome is one request of a load loop.
type outcome struct {
	start, end time.Time
	ok         bool
	err        string
}

// loop sends streamed chats from workers until stop closes and returns
// every request's outcome. A request is ok when it got 200 and the
// stream's [DONE].
func loop(s *stack, workers, maxTokens int, stop <-chan struct{}) []outcome {
	var mu sync.Mutex
	var out []outcome
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				o := outcome{start: time.Now()}
				code, _, got, err := s.post(context.Background(), "/v1/chat/completions", chat(words(w*1000+i%5, 400), true, maxTokens), nil)
				o.end = time.Now()
				switch {
				case err != nil:
					o.err = err.Error()
				case code != http.StatusOK:
					o.err = http.StatusText(code) + ": " + string(got)
				case !strings.Contains(string(got), "data: [DONE]"):
					o.err = "truncated stream"
				default:
					o.ok = true
				}
				mu.Lock()
				out = append(out, o)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return out
}

// TestTwoEPPsOneKilled (envoy-two-epps.yaml): under a steady load one of
// the two EPPs is cut off at once; only requests open at that moment may
// fail, every request started after it succeeds through the other EPP.
func TestTwoEPPsOneKilled(t *testing.T) {
	s := startStack(t, "envoy-two-epps.yaml", opts{timeScale: 10})
	stop := make(chan struct{})
	res := make(chan []outcome, 1)
	go func() { res <- loop(s, 6, 200, stop) }()
	time.Sleep(1500 * time.Millisecond)
	kill := time.Now()
	s.epps[1].stop()
	killed := time.Since(kill)
	time.Sleep(3 * time.Second)
	close(stop)
	outs := <-res

	var failedOpen, failedAfter, okAfter int
	for _, o := range outs {
		switch {
		case o.ok && o.start.After(kill):
			okAfter++
		case !o.ok && o.start.Before(kill) && o.end.After(kill):
			failedOpen++
		case !o.ok:
			failedAfter++
			t.Logf("failed, started %v after the kill: %s", o.start.Sub(kill).Round(time.Millisecond), o.err)
		}
	}
	t.Logf("%d requests, %d failed while open on the killed EPP (stop took %v), %d succeeded after it", len(outs), failedOpen, killed, okAfter)
	require.Zero(t, failedAfter, "requests started after the kill failed")
	require.LessOrEqual(t, failedOpen, 6, "only the streams open at the kill may fail")
	require.Positive(t, okAfter)
}

// TestCancelMidStreamNoBreaker: clients that go away mid-stream are no
// evidence against the replica: no breaker opens, no failure is counted,
// and every replica still serves afterwards.
func TestCancelMidStreamNoBreaker(t *testing.T) {
	s := startStack(t, "envoy.yaml", opts{timeScale: 10})
	e := s.epps[0]
	for i := range 12 {
		ctx, cancel := context.WithCancel(context.Background())
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.envoy.URL()+"/v1/chat/completions",
			strings.NewReader(string(chat(words(i%3, 300), true, 2000))))
		require.NoError(t, err)
		resp, err := s.client.Do(req)
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		line, err := bufio.NewReader(resp.Body).ReadString('\n')
		require.NoError(t, err)
		require.True(t, strings.HasPrefix(line, "data: "), line)
		cancel()
		resp.Body.Close()
	}
	// Every cancelled stream ends at the EPP: outcomes counted, nothing
	// in flight.
	require.Eventually(t, func() bool {
		n := 0.0
		for _, m := range e.metric("omnious_epp_request_outcomes_total") {
			n += m.GetCounter().GetValue()
		}
		return n == 12
	}, 10*time.Second, 50*time.Millisecond, "the EPP did not see every cancelled stream end")
	for _, m := range e.metric("omnious_epp_request_outcomes_total") {
		if label(m.GetLabel(), "outcome") == "failure" {
			require.Zero(t, m.GetCounter().GetValue(), "a client's cancel counted against a replica")
		}
	}
	for _, m := range e.metric("omnious_epp_breaker_state") {
		require.Zero(t, m.GetGauge().GetValue(), "breaker of %s opened", label(m.GetLabel(), "endpoint"))
	}
	before := len(s.allSeen())
	for i := range 8 {
		code, _, got, err := s.post(context.Background(), "/v1/chat/completions", chat(words(100+i, 300), false, 4), nil)
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, code, "%s", got)
	}
	require.Len(t, s.allSeen(), before+8)
}

// TestReplica503Retried: a replica answering 503 is retried by Envoy's
// route retry policy, and the retry goes where the EPP's answer says: the
// one endpoint it names (extproc.max_endpoints 1), re-read from the same
// header by ORIGINAL_DST. Three 503s in a row exhaust num_retries 2 and
// the client gets the 503, which the EPP counts against that replica.
func TestReplica503Retried(t *testing.T) {
	tests := []struct {
		name     string
		fail     int32
		wantCode int
		attempts int
	}{
		{"one 503 then served", 1, http.StatusOK, 2},
		{"503 past the retries", 3, http.StatusServiceUnavailable, 3},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := startStack(t, "envoy.yaml", opts{})
			for _, r := range s.replicas {
				r.fail.Store(tc.fail)
			}
			code, _, got, err := s.post(context.Background(), "/v1/chat/completions", chat("retry me", false, 4), nil)
			require.NoError(t, err)
			require.Equal(t, tc.wantCode, code, "%s", got)
			all := s.allSeen()
			require.Len(t, all, tc.attempts, "the first try and Envoy's retries")
			for _, q := range all {
				require.Equal(t, all[0].dest, q.dest, "every attempt went to the endpoint the EPP named")
				require.NotNil(t, s.replicaAt(q.dest))
				require.Equal(t, all[0].requestID, q.requestID)
			}
			require.Equal(t, tc.attempts-1, countAnswered(all, http.StatusServiceUnavailable)-boolInt(tc.wantCode != http.StatusOK))
			retries, err := s.envoy.Stat(context.Background(), "cluster.inference_pool.upstream_rq_retry")
			require.NoError(t, err)
			require.EqualValues(t, tc.attempts-1, retries)
			want := "success"
			if tc.wantCode != http.StatusOK {
				want = "failure"
			}
			require.Eventually(t, func() bool {
				for _, m := range s.epps[0].metric("omnious_epp_request_outcomes_total") {
					if label(m.GetLabel(), "outcome") == want && m.GetCounter().GetValue() == 1 {
						return true
					}
				}
				return false
			}, 5*time.Second, 20*time.Millisecond, "the EPP did not count the request's %s", want)
		})
	}
}

func countAnswered(ss []seen, code int) int {
	n := 0
	for _, s := range ss {
		if s.answered == code {
			n++
		}
	}
	return n
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// TestFlowControlReleased: with one replica saturated by one request
// (admission.target_inflight 1), the next request waits in the EPP's flow
// control, Envoy holding it open within its ext_proc message_timeout, and
// is released and served when the first ends.
func TestFlowControlReleased(t *testing.T) {
	s := startStack(t, "envoy.yaml", opts{replicas: 1, timeScale: 10, sched: "  admission:\n    target_inflight: 1\n"})
	ctx := context.Background()
	type result struct {
		code int
		body string
		end  time.Time
		err  error
	}
	first := make(chan result, 1)
	go func() {
		code, _, got, err := s.post(ctx, "/v1/chat/completions", chat(words(1, 300), true, 600), nil)
		first <- result{code, string(got), time.Now(), err}
	}()
	time.Sleep(200 * time.Millisecond)
	sent := time.Now()
	code, _, got, err := s.post(ctx, "/v1/chat/completions", chat(words(2, 300), false, 4), nil)
	secondEnd := time.Now()
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, code, "%s", got)
	f := <-first
	require.NoError(t, f.err)
	require.Equal(t, http.StatusOK, f.code, f.body)
	require.True(t, secondEnd.After(f.end), "the second request was held until the first ended")
	t.Logf("second request held %v", secondEnd.Sub(sent).Round(time.Millisecond))
	waits := 0.0
	for _, m := range s.epps[0].metric("omnious_epp_flow_queue_wait_seconds") {
		waits += float64(m.GetHistogram().GetSampleCount())
	}
	require.Positive(t, waits, "a request waited in flow control")
	var ans map[string]any
	require.NoError(t, json.Unmarshal(got, &ans))
	to, err := s.envoy.Stat(ctx, "http.inference.ext_proc.message_timeouts")
	require.NoError(t, err)
	require.Zero(t, to, "Envoy timed out waiting on the EPP")
}

package scheduler

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/omnious/provider-node/endpoint"
	"github.com/omnious/provider-node/engines/metrics"
	"github.com/omnious/provider-node/kvindex"
)

// sessionEnv is a 2-replica agent scheduler whose engines report
// kvTokens of KV capacity each and one request queued (no compute to
// spare: the KV budget binds), with session admission on and the given
// changes.
func sessionEnv(t *testing.T, kvTokens int64, mut func(*Config)) *testEnv {
	e := newEnv(t, 2, func(c *Config) {
		c.Policy = PolicyAgent
		c.Sessions.Admission = SessionAdmissionOn
		c.Sessions.KVFraction = 1
		if mut != nil {
			mut(c)
		}
	})
	for i := range 2 {
		e.setSignals(i, metrics.Signals{Engine: metrics.EngineVLLM, BlockSize: 16, NumGPUBlocks: kvTokens / 16, Waiting: 1})
	}
	return e
}

// admitAsync runs Admit in a goroutine and returns where its error lands.
func admitAsync(s *Scheduler, ctx context.Context, req *Request) <-chan error {
	ch := make(chan error, 1)
	go func() {
		_, err := s.Admit(ctx, req)
		ch <- err
	}()
	return ch
}

func sessReq(key string, n int) *Request {
	return &Request{Model: testModel, SessionKey: key, Tokens: tokens(n, 3)}
}

// TestSessionTableBound: the table never holds more than max_sessions
// sessions and the queue never more than queue_capacity, however many
// distinct (and however long) keys clients send; the rest get 429
// session_queue_full at once.
func TestSessionTableBound(t *testing.T) {
	for _, tc := range []struct {
		name                  string
		maxSessions, capacity int
		keys                  int
		keyLen                int
	}{
		{"short keys", 3, 2, 50, 8},
		{"1 MiB keys", 2, 1, 10, 1 << 20},
		{"no queue", 4, 0, 20, 16},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				e := sessionEnv(t, 0, func(c *Config) {
					c.Sessions.MaxSessions = tc.maxSessions
					c.Sessions.QueueCapacity = new(tc.capacity)
				})
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				var waiting []<-chan error
				full := 0
				for k := range tc.keys {
					key := fmt.Sprintf("%d-%s", k, strings.Repeat("k", tc.keyLen))
					ch := admitAsync(e.s, ctx, sessReq(key, 64))
					synctest.Wait()
					select {
					case err := <-ch:
						if err != nil {
							require.ErrorIs(t, err, ErrSessionQueueFull)
							require.Equal(t, http.StatusTooManyRequests, statusOf(err))
							full++
						}
					default:
						waiting = append(waiting, ch)
					}
					active, queued := e.s.stab.counts()
					require.LessOrEqual(t, active, tc.maxSessions)
					require.LessOrEqual(t, queued, tc.capacity)
				}
				active, queued := e.s.stab.counts()
				require.Equal(t, tc.maxSessions, active)
				require.Equal(t, tc.capacity, queued)
				require.Len(t, waiting, tc.capacity)
				require.Equal(t, tc.keys-tc.maxSessions-tc.capacity, full)
				require.Equal(t, float64(full), testutil.ToFloat64(e.s.m.sessionRefused.WithLabelValues("session_queue_full")))
				cancel()
				for _, ch := range waiting {
					require.ErrorIs(t, <-ch, ErrClientGone)
				}
			})
		})
	}
}

// TestSessionQueue: a new session that would push the active sessions'
// reservations past every replica's KV, on a fleet with no compute to
// spare, waits while calls of the admitted sessions go through; past the
// queue TTL it gets 429 session_queue_expired. It is admitted into the
// room an admitted session leaves: at the idle timeout, or once that
// session has been idle for longer than the tool gaps observed (their
// mean plus three standard deviations).
func TestSessionQueue(t *testing.T) {
	for _, tc := range []struct {
		name   string
		ttl    time.Duration
		aCalls bool // a calls every 2s (gaps of 2s); else its first call stays in flight
		bCalls bool // b calls every 2s too; else its only call ends at once
		want   error
		waited time.Duration // c's wait, within a second
	}{
		{"expires", 10 * time.Second, true, true, ErrSessionQueueExpired, 10 * time.Second},
		{"admitted at the idle timeout", time.Minute, false, false, nil, 12 * time.Second},
		// gaps of 2s: b reserves nothing once idle past 2s + 3 x 0s, at a's second gap.
		{"admitted past the observed gaps", time.Minute, true, false, nil, 4 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				// 2 replicas x 4096 tokens of KV, each with a queue.
				e := sessionEnv(t, 4096, func(c *Config) {
					c.Sessions.QueueTTL = tc.ttl
					c.Sessions.IdleTimeout = 12 * time.Second
				})
				e.s.now = time.Now // the bubble's clock
				for i := range 2 {
					e.setSignals(i, metrics.Signals{Engine: metrics.EngineVLLM, BlockSize: 16, NumGPUBlocks: 4096 / 16, Waiting: 1})
				}
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				go func() { _ = e.s.Run(ctx) }()

				// a fills one replica, b most of the other.
				a, err := e.s.admitPick(ctx, sessReq("a", 3000))
				require.NoError(t, err)
				if tc.aCalls {
					a.Done(DoneInfo{Status: 200, PromptTokens: 3000, CompletionTokens: 200})
				}
				b0, err := e.s.admitPick(ctx, sessReq("b", 2200))
				require.NoError(t, err)
				require.NotEqual(t, primary(a), primary(b0), "b is bound to the replica with room")
				b0.Done(DoneInfo{Status: 200, PromptTokens: 2200, CompletionTokens: 100})

				// c needs 2000: a holds 3200, b 2300 of 4096 each, no
				// replica has the room and none has compute to spare (an
				// engine queue), it waits.
				start := time.Now()
				var waited time.Duration
				c := make(chan error, 1)
				go func() {
					_, err := e.s.Admit(ctx, &Request{Model: testModel, SessionKey: "c", Tokens: tokens(2000, 3), Arrived: start})
					waited = time.Since(start)
					c <- err
				}()
				synctest.Wait()
				_, queued := e.s.stab.counts()
				require.Equal(t, 1, queued)

				// Admitted sessions' calls go first: straight through while c waits.
				for i := range 7 {
					time.Sleep(2 * time.Second)
					for _, k := range []struct {
						key   string
						on    bool
						n, to int
					}{{"a", tc.aCalls, 3300 + 100*i, 100}, {"b", tc.bCalls, 2300 + 100*i, 100}} {
						if !k.on {
							continue
						}
						d, err := e.s.admitPick(ctx, sessReq(k.key, k.n))
						require.NoError(t, err)
						d.Done(DoneInfo{Status: 200, PromptTokens: k.n, CompletionTokens: k.to})
					}
					if time.Since(start) < tc.waited-time.Second {
						_, queued := e.s.stab.counts()
						require.Equal(t, 1, queued, "c still waits at %v", time.Since(start))
					}
				}
				err = <-c
				require.InDelta(t, tc.waited.Seconds(), waited.Seconds(), 1)
				active, queued := e.s.stab.counts()
				require.Zero(t, queued)
				if tc.want != nil {
					require.ErrorIs(t, err, tc.want)
					require.Equal(t, http.StatusTooManyRequests, statusOf(err))
					require.Equal(t, 1.0, testutil.ToFloat64(e.s.m.sessionRefused.WithLabelValues(tc.want.(*Error).Reason)))
					require.Equal(t, 2, active)
					return
				}
				require.NoError(t, err)
				require.Equal(t, 1.0, testutil.ToFloat64(e.s.m.sessionAdmitted.WithLabelValues(admitRoom))-2)
				// c is bound where b was: its first call goes there.
				d, err := e.s.Pick(&Request{Model: testModel, SessionKey: "c", Tokens: tokens(2000, 3)}, nil)
				require.NoError(t, err)
				require.Equal(t, primary(b0), primary(d))
				d.Done(DoneInfo{Status: 200})
			})
		})
	}
}

// TestSessionPerReplica: new sessions are bound to the replica with the
// most room, a replica's working set leaves out the shared prefix it held
// at the session's first call, and a call that moves takes its history's
// tokens to the new replica.
func TestSessionPerReplica(t *testing.T) {
	e := sessionEnv(t, 100000, nil)
	system := tokens(1024, 7)
	for i := range 2 {
		e.store(i, system)
	}
	perRep := func() map[kvindex.Replica]int64 {
		e.s.stab.mu.Lock()
		defer e.s.stab.mu.Unlock()
		e.s.stab.recountLocked(e.s.now())
		return maps.Clone(e.s.stab.perRep)
	}
	var placed []string
	for i, n := range []int{3000, 1000, 1000} {
		prompt := append(append([]uint32{}, system...), tokens(n, uint32(20+i))...)
		d, err := e.s.admitPick(ctx, &Request{Model: testModel, SessionKey: fmt.Sprint("s", i), Tokens: prompt})
		require.NoError(t, err)
		placed = append(placed, primary(d))
		d.Done(DoneInfo{Status: 200}) // no usage: the history stays the prompt
	}
	// s0 on one replica (3000 beyond the shared 1024), s1 and s2 on the other.
	require.NotEqual(t, placed[0], placed[1])
	require.Equal(t, placed[1], placed[2])
	r0, r1 := e.s.snap.Load().byAddr[placed[0]].id, e.s.snap.Load().byAddr[placed[1]].id
	require.Equal(t, map[kvindex.Replica]int64{r0: 3000, r1: 2000}, perRep())

	// s0's replica is over the prefill bound: its next call moves, and
	// its history's tokens with it.
	e.s.snap.Load().byAddr[placed[0]].pending.Add(1 << 30)
	prompt := append(append([]uint32{}, system...), tokens(3100, 20)...)
	d, err := e.s.admitPick(ctx, &Request{Model: testModel, SessionKey: "s0", Tokens: prompt})
	require.NoError(t, err)
	require.Equal(t, ReasonSessionMove, d.Reason)
	require.Equal(t, placed[1], primary(d))
	// s0 grew by 100 tokens a call: each session now reserves 100 more.
	require.Equal(t, map[kvindex.Replica]int64{r1: 2000 + 3100 + 3*100}, perRep())
	d.Done(DoneInfo{Status: 200})
}

// TestSessionReserve: an active session reserves what it holds and will
// need at its next call: its history, or its last prompt plus the mean
// growth from one call's prompt to the next, whichever is more. Once
// sessions are seen to grow by 800 tokens a call, a new session of 1500
// does not fit beside them in 2 x 4096 tokens, though its prompt would;
// before any growth is seen it does.
func TestSessionReserve(t *testing.T) {
	for _, tc := range []struct {
		name    string
		aCalls  []int // a's prompts, each answered in 100 tokens
		reserve []int64
		waits   bool
	}{
		{"no growth seen", []int{1000}, []int64{1100, 1000}, false},
		{"growth reserved", []int{1000, 1800}, []int64{2600, 1800}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				e := sessionEnv(t, 4096, nil)
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				var a *Decision
				for _, n := range tc.aCalls {
					d, err := e.s.admitPick(ctx, sessReq("a", n))
					require.NoError(t, err)
					d.Done(DoneInfo{Status: 200, PromptTokens: n, CompletionTokens: 100})
					a = d
				}
				b, err := e.s.admitPick(ctx, sessReq("b", 1000))
				require.NoError(t, err)
				require.NotEqual(t, primary(a), primary(b))
				b.Done(DoneInfo{Status: 200})
				snap := e.s.snap.Load()
				e.s.stab.mu.Lock()
				e.s.stab.recountLocked(e.s.now())
				got := maps.Clone(e.s.stab.perRep)
				e.s.stab.mu.Unlock()
				require.Equal(t, map[kvindex.Replica]int64{
					snap.byAddr[primary(a)].id: tc.reserve[0], snap.byAddr[primary(b)].id: tc.reserve[1]}, got)

				c := admitAsync(e.s, ctx, sessReq("c", 1500))
				synctest.Wait()
				active, queued := e.s.stab.counts()
				if !tc.waits {
					require.NoError(t, <-c)
					require.Equal(t, 3, active)
					return
				}
				require.Equal(t, 2, active)
				require.Equal(t, 1, queued, "c would not leave room for a's and b's next calls")
				cancel()
				require.ErrorIs(t, <-c, ErrClientGone)
			})
		})
	}
}

// TestSessionSpareCompute: past the KV budget a new session is admitted
// onto the replica of least work among those with compute to spare (no
// engine queue, KV usage below kv_fraction, pending prefill work with
// its prompt within spare_work x ttft_objective), counting the prompts of
// sessions admitted there whose first call has not come, so that one
// idle moment admits only what fits in it, and only while no engine of
// the fleet has a queue at its last fresh scrape; otherwise it waits.
func TestSessionSpareCompute(t *testing.T) {
	for _, tc := range []struct {
		name    string
		waiting [2]float64 // engine queues at the last scrape
		stale   bool       // replica 1's scrape is older than stale_after
		kvUsage float64
		pending [2]int64 // on each replica, tokens
		spare   float64
		want    int // of the 3 new sessions, admitted past the budget
	}{
		// The limit is 0.5 x 2s x 3000 tokens/s = 3000 tokens a
		// replica, 6000 the fleet: one new session of 2000 per replica.
		{"idle fleet", [2]float64{0, 0}, false, 0.2, [2]int64{0, 0}, 0.5, 2},
		{"pending work", [2]float64{0, 0}, false, 0.2, [2]int64{1500, 1500}, 0.5, 0},
		{"engine queue", [2]float64{1, 1}, false, 0.2, [2]int64{0, 0}, 0.5, 0},
		{"kv full", [2]float64{0, 0}, false, 0.95, [2]int64{0, 0}, 0.5, 0},
		{"off", [2]float64{0, 0}, false, 0.2, [2]int64{0, 0}, 0, 0},
		// One replica busy, the fleet not: the idle one takes one.
		{"one replica busy", [2]float64{0, 0}, false, 0.2, [2]int64{0, 2000}, 0.5, 1},
		// The fleet's pending work (6000 + 2000 of 6000 a second) is
		// past the bound: the idle replica is where moved calls go.
		{"fleet recompute-bound", [2]float64{0, 0}, false, 0.2, [2]int64{0, 6000}, 0.5, 0},
		// A call waits for KV on replica 1: the fleet is short of KV
		// for the calls it serves, and idle replica 0 takes nothing.
		{"one replica queueing", [2]float64{0, 1}, false, 0.2, [2]int64{0, 0}, 0.5, 0},
		// The same queue seen at a stale scrape is no evidence of one
		// now: replica 0 takes one.
		{"queue at a stale scrape", [2]float64{0, 1}, true, 0.2, [2]int64{0, 0}, 0.5, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				e := sessionEnv(t, 4096, func(c *Config) {
					c.Sessions.KVFraction = 0.9
					c.Sessions.PrefillRate = 3000
					c.Sessions.SpareWork = new(tc.spare)
				})
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				// s0 and s1 fill the budget (3686 tokens each).
				for i := range 2 {
					d, err := e.s.admitPick(ctx, sessReq(fmt.Sprint("s", i), 3500))
					require.NoError(t, err)
					d.Done(DoneInfo{Status: 200, PromptTokens: 3500, CompletionTokens: 100})
				}
				for _, i := range []int{1, 0} {
					e.setSignals(i, metrics.Signals{Engine: metrics.EngineVLLM, BlockSize: 16, NumGPUBlocks: 4096 / 16,
						Waiting: tc.waiting[i], KVUsage: tc.kvUsage})
					e.rep(i).pending.Store(tc.pending[i])
					if i == 1 && tc.stale {
						e.clock.Add(e.s.cfg.Signals.StaleAfter + time.Second)
					}
				}
				var chs []<-chan error
				for i := range 3 {
					chs = append(chs, admitAsync(e.s, ctx, sessReq(fmt.Sprint("n", i), 2000)))
					synctest.Wait()
				}
				active, queued := e.s.stab.counts()
				require.Equal(t, 2+tc.want, active)
				require.Equal(t, 3-tc.want, queued)
				require.Equal(t, float64(tc.want), testutil.ToFloat64(e.s.m.sessionAdmitted.WithLabelValues(admitSpare)))
				for _, ch := range chs[:tc.want] {
					require.NoError(t, <-ch)
				}
				if tc.want > 1 {
					// one each: the second went where the first was not.
					r0, _ := e.s.sess.get("n0", e.s.now())
					r1, _ := e.s.sess.get("n1", e.s.now())
					require.NotEqual(t, r0, r1)
				}
				cancel()
				for _, ch := range chs[tc.want:] {
					require.ErrorIs(t, <-ch, ErrClientGone)
				}
			})
		})
	}
}

// TestSessionAdmissionAuto: "auto" turns session admission on with the
// agent policy even when the policy is set after the defaults (a flag
// over a config file), and "on" and "off" are what they say.
func TestSessionAdmissionAuto(t *testing.T) {
	for _, tc := range []struct {
		policy, admission string
		on                bool
	}{
		{PolicyAgent, "", true},
		{PolicyAgent, SessionAdmissionAuto, true},
		{PolicyAgent, SessionAdmissionOff, false},
		{PolicyPrecise, "", false},
		{PolicyPrecise, SessionAdmissionOn, true},
	} {
		t.Run(tc.policy+"/"+tc.admission, func(t *testing.T) {
			c := DefaultConfig()
			if tc.admission != "" {
				c.Sessions.Admission = tc.admission
			}
			c.Policy = tc.policy // after the defaults
			s, err := New(c, nil, nil, nil)
			require.NoError(t, err)
			require.Equal(t, tc.on, s.stab.enabled)
		})
	}
	c := DefaultConfig()
	c.Sessions.Admission = "maybe"
	require.ErrorContains(t, c.Validate(), "sessions.admission")
}

// TestSGLangPriority: with sessions.sglang_priority on, a call of an
// admitted session routed to SGLang replicas carries that priority and
// every other call to them priority 0; off, with session admission off,
// or with any endpoint not SGLang, the decision leaves the body alone.
// Nothing the client sends but its session key enters the rule.
func TestSGLangPriority(t *testing.T) {
	sglang := func(i int) *endpoint.Endpoint {
		return &endpoint.Endpoint{Addr: addr(i), Model: testModel, Engine: "sglang"}
	}
	vllm := &endpoint.Endpoint{Addr: addr(1), Model: testModel, Engine: "vllm"}
	for _, tc := range []struct {
		name      string
		priority  int
		admission string
		key       string // the call's session key ("" none)
		admitted  bool   // the session was admitted first
		eps       []*endpoint.Endpoint
		want      *int
	}{
		{"off", 0, SessionAdmissionOn, "a", true, []*endpoint.Endpoint{sglang(0)}, nil},
		{"admitted session", 7, SessionAdmissionOn, "a", true, []*endpoint.Endpoint{sglang(0), sglang(1)}, new(7)},
		{"no session", 7, SessionAdmissionOn, "", false, []*endpoint.Endpoint{sglang(0)}, new(0)},
		{"session not admitted", 7, SessionAdmissionOn, "b", false, []*endpoint.Endpoint{sglang(0)}, new(0)},
		{"fallback on vllm", 7, SessionAdmissionOn, "a", true, []*endpoint.Endpoint{sglang(0), vllm}, nil},
		{"vllm", 7, SessionAdmissionOn, "a", true, []*endpoint.Endpoint{vllm}, nil},
		{"admission off", 7, SessionAdmissionOff, "a", true, []*endpoint.Endpoint{sglang(0)}, new(0)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := sessionEnv(t, 1<<20, func(c *Config) {
				c.Sessions.SGLangPriority = tc.priority
				c.Sessions.Admission = tc.admission
			})
			req := sessReq(tc.key, 64)
			if tc.admitted {
				_, err := e.s.Admit(context.Background(), sessReq(tc.key, 64))
				require.NoError(t, err)
			}
			require.Equal(t, tc.want, e.s.stab.retention(req, tc.eps))
		})
	}

	// Through Admit and Pick: the decision carries it.
	e := sessionEnv(t, 1<<20, func(c *Config) { c.Sessions.SGLangPriority = 9 })
	eps := endpoints(2, testModel)
	for i := range eps {
		eps[i].Endpoint.Engine = "sglang"
	}
	e.s.SetEndpoints(eps)
	for i := range 2 {
		e.setSignals(i, metrics.Signals{Engine: metrics.EngineSGLang, BlockSize: 16, NumGPUBlocks: 1 << 16})
	}
	for _, tc := range []struct {
		key  string
		want int
	}{{"s1", 9}, {"", 0}} {
		req := sessReq(tc.key, 64)
		tk, err := e.s.Admit(context.Background(), req)
		require.NoError(t, err)
		d, err := e.s.Pick(req, tk)
		require.NoError(t, err)
		require.NotNil(t, d.Priority)
		require.Equal(t, tc.want, *d.Priority, "key %q", tc.key)
		d.Done(DoneInfo{Status: 200})
	}
}

// TestSGLangPriorityValidate: a negative or oversized priority is refused.
func TestSGLangPriorityValidate(t *testing.T) {
	for _, p := range []int{-1, maxSGLangPriority + 1} {
		c := Config{}.WithDefaults()
		c.Sessions.SGLangPriority = p
		require.ErrorContains(t, c.Validate(), "sessions.sglang_priority")
	}
}

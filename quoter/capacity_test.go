package quoter

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omnious/provider-node/capacity"
)

// curveBin is a capacity bin at running whose shares within 50 ms ITL
// and 2 s TTFT are itl and ttft.
func curveBin(running, itl, ttft, tps float64) capacity.Bin {
	const n = 1000
	return capacity.Bin{Concurrency: running, Running: running, Seconds: 10, Windows: 5, OutputTokensPerSec: tps,
		ITL:  capacity.Histogram{Counts: []float64{0, itl * n, n}, Count: n},
		TTFT: capacity.Histogram{Counts: []float64{0, ttft * n, n}, Count: n}}
}

func curve(bins ...capacity.Bin) capacity.Curve {
	return capacity.Curve{ITLBounds: []float64{0.025, 0.05, 0.1}, TTFTBounds: []float64{1, 2, 4}, Bins: bins}
}

func TestComputeHeadroom(t *testing.T) {
	obj := capacity.Objectives{TTFT: 2 * time.Second, ITL: 50 * time.Millisecond, Quantile: 0.95}
	// Within the objectives up to about 25 running requests.
	full := curve(curveBin(4, 1, 1, 40), curveBin(10, 0.99, 1, 100), curveBin(20, 0.97, 1, 180), curveBin(30, 0.93, 1, 240),
		curveBin(40, 0.8, 1, 280))
	at, err := full.At(obj)
	require.NoError(t, err)
	require.Greater(t, at.Concurrency, 10.0)
	// A client's streams hold the load they are, read alone; arrivals
	// bunch (Concurrency).
	require.Greater(t, at.Streams, at.Concurrency)
	c, s, v := at.Concurrency, at.Streams, at.OutputTokensPerSec
	cal := &capacity.Calibration{Curve: full}
	rep := func(healthy bool, running, waiting, inflight int, tps float64, c capacity.Curve) capacity.Replica {
		return capacity.Replica{Addr: "r", Healthy: healthy, Running: running, Waiting: waiting, InFlight: inflight,
			OutputTokensPerSec: tps, MaxRunning: 256, Curve: c}
	}
	// withLoad gives a replica the mean of its requests over the last
	// 30 s, as the EPP reports it beside one scrape's counts.
	withLoad := func(r capacity.Replica, load float64) capacity.Replica { r.Load = load; return r }
	// withKV gives a replica its KV cache now.
	withKV := func(r capacity.Replica, free, total int64) capacity.Replica {
		r.FreeKVTokens, r.TotalKVTokens = free, total
		return r
	}
	// mixed is full with a mix of 1,000 KV tokens a request (990 new
	// prompt tokens and 10 output) and no prefill rate, so that only the
	// KV cache bounds it.
	mixed := full.Clone()
	mixed.Prefill = capacity.Prefill{Requests: 100, NewTokens: 100 * 990, OutputTokens: 100 * 10}
	const kvLoad = 30.0
	h := func(conc, tps float64) Headroom {
		return Headroom{Concurrency: uint32(math.Floor(conc)), TokensPerSec: uint64(math.Floor(tps))}
	}
	// bounded is full with a prefill rate and mix that allow half its
	// capacity's tokens/s: requests of 1,000 new prompt tokens and 10
	// output tokens, prefilled at the rate that leaves v/20 requests a
	// second within the TTFT objective.
	bounded := full.Clone()
	lambda := v / 2 / 10
	bounded.Prefill = capacity.Prefill{QueuedSeconds: 10, QueuedWindows: 5, QueuedTokens: 10 * 1000 * (lambda + math.Log(20)/obj.TTFT.Seconds()),
		Requests: 100, NewTokens: 100 * 1000, OutputTokens: 100 * 10}
	calBounded := &capacity.Calibration{Curve: bounded}
	// Two bins of one load: Validate refuses it.
	malformed := curve(curveBin(10, 1, 1, 100), curveBin(10, 1, 1, 100))
	small := curve(curveBin(8, 1, 1, 80), curveBin(16, 1, 1, 160))
	// The pool is sold: a replica past its capacity takes its excess out
	// of the others' room, and the per-stream bound reads the pool's
	// concurrency. scattered is full read at half the load: a like
	// replica whose estimate of the load at the same rate came out low.
	require.Greater(t, c, 17.0)
	over := float64(30 + 4)
	scattered := full.Clone()
	for i := range scattered.Bins {
		scattered.Bins[i].Concurrency /= 2
		scattered.Bins[i].Running /= 2
	}
	atS, err := scattered.At(obj)
	require.NoError(t, err)
	busyS := int(atS.Streams) - 1
	require.Positive(t, busyS)
	cs, vs := s+atS.Streams, v+atS.OutputTokensPerSec
	freeS := cs - float64(busyS)
	atSmall, err := small.At(obj)
	require.NoError(t, err)
	require.Equal(t, capacity.LimitMeasured, atSmall.Limit)
	for _, tc := range []struct {
		name string
		reps []capacity.Replica
		cal  *capacity.Calibration
		want Headroom
	}{
		{"idle, live curves", []capacity.Replica{rep(true, 0, 0, 0, 0, full), rep(true, 0, 0, 0, 0, full)}, nil, h(2*s, 2*v)},
		{"idle, calibration only", []capacity.Replica{rep(true, 0, 0, 0, 0, capacity.Curve{})}, cal, h(s, v)},
		{"nothing measured, no calibration: nothing sold", []capacity.Replica{rep(true, 0, 0, 0, 0, capacity.Curve{})}, nil, Headroom{}},
		{"live curve never broke: sold below the largest batch measured", []capacity.Replica{rep(true, 0, 0, 0, 0, small)}, nil,
			h(atSmall.Streams, atSmall.OutputTokensPerSec)},
		{"half loaded", []capacity.Replica{rep(true, 6, 1, 3, 60, full)}, nil, h(s-7, min(v-60, v*(s-7)/s))},
		{"in flight beyond the engine's view", []capacity.Replica{rep(true, 2, 0, 9, 20, full)}, nil, h(s-9, min(v-20, v*(s-9)/s))},
		{"a burst above the sustained load: the load is subtracted", []capacity.Replica{withLoad(rep(true, 9, 1, 10, 60, full), 6.5)}, nil,
			h(s-6.5, min(v-60, v*(s-6.5)/s))},
		{"a lull below the sustained load: the load is subtracted", []capacity.Replica{withLoad(rep(true, 2, 0, 2, 60, full), 6.5)}, nil,
			h(s-6.5, min(v-60, v*(s-6.5)/s))},
		{"requests the engine has not counted add to its sustained load", []capacity.Replica{withLoad(rep(true, 2, 0, 9, 20, full), 3)}, nil,
			h(s-10, min(v-20, v*(s-10)/s))},
		{"a replica empty now counts its 30 s mean (between requests, or for 30 s after a load ends)",
			[]capacity.Replica{withLoad(rep(true, 0, 0, 0, v/4, full), 2.5)}, nil, h(s-2.5, min(v-v/4, v*(s-2.5)/s))},
		{"a mean that is not a number: the requests now", []capacity.Replica{withLoad(rep(true, 4, 0, 0, 20, full), math.Inf(1))}, nil,
			h(s-4, min(v-20, v*(s-4)/s))},
		{"overloaded clamps at zero", []capacity.Replica{rep(true, 30, 4, 0, 260, full)}, nil, Headroom{}},
		{"a replica past its capacity takes its excess out of the pool's room", []capacity.Replica{rep(true, 30, 4, 0, 260, full),
			rep(true, 0, 0, 0, 0, full)}, nil, h(2*s-over, min(2*v-260, 2*v*(2*s-over)/(2*s)))},
		{"the per-stream bound reads the pool's concurrency", []capacity.Replica{rep(true, busyS, 0, 0, 20, scattered),
			rep(true, 0, 0, 0, 0, full)}, nil, h(freeS, min(vs-20, vs*freeS/cs))},
		{"capacity below the load", []capacity.Replica{rep(true, 0, 0, 40, 0, full)}, nil, Headroom{}},
		{"unhealthy replica contributes nothing", []capacity.Replica{rep(true, 0, 0, 0, 0, full), rep(false, 0, 0, 0, 0, full)}, cal, h(s, v)},
		{"prefill bound: the rate, not a client's streams", []capacity.Replica{rep(true, 0, 0, 0, 0, bounded)}, nil, h(s, v/2)},
		{"prefill bound, half loaded", []capacity.Replica{rep(true, 3, 0, 0, v/4, bounded)}, nil, h(s-3, v/4)},
		{"the calibration's prefill bounds a live curve that never queued", []capacity.Replica{rep(true, 0, 0, 0, 0, full)}, calBounded, h(s, v/2)},
		{"capped at max_running", []capacity.Replica{{Healthy: true, MaxRunning: 5, Curve: full}}, nil, h(5, v*5/c)},
		{"free KV with room for more than the curve sells", []capacity.Replica{withKV(rep(true, 0, 0, 0, 0, mixed), 100_000, 100_000)}, nil,
			h(s, v)},
		{"free KV bounds capacity and streams: busy + free / KV a request", []capacity.Replica{withKV(rep(true, 3, 0, 0, kvLoad, mixed), 5_000, 100_000)},
			nil, h(8-3, min(v*8/c-kvLoad, v*8/c*5/8))},
		{"no KV bound without the mix", []capacity.Replica{withKV(rep(true, 3, 0, 0, kvLoad, full), 5_000, 100_000)}, nil,
			h(s-3, min(v-kvLoad, v*(s-3)/s))},
		{"no KV bound without the cache's size", []capacity.Replica{withKV(rep(true, 3, 0, 0, kvLoad, mixed), 0, 0)}, nil,
			h(s-3, min(v-kvLoad, v*(s-3)/s))},
		{"a rate without a mean of requests (an older EPP) is still subtracted", []capacity.Replica{rep(true, 0, 0, 0, 2*v, full)}, nil, h(s, 0)},
		{"a load's rate while it holds one request", []capacity.Replica{rep(true, 1, 0, 0, v/2, full)}, nil, h(s-1, min(v/2, v*(s-1)/s))},
		{"negative and NaN counts", []capacity.Replica{rep(true, -3, 0, 0, math.NaN(), full)}, nil, h(s, v)},
		{"a malformed curve contributes nothing, calibration or not", []capacity.Replica{rep(true, 0, 0, 0, 0, full),
			rep(true, 0, 0, 0, 0, malformed)}, cal, h(s, v)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, a := ComputeHeadroom(capacity.Model{ReplicaCapacity: tc.reps}, tc.cal, obj)
			require.Equal(t, tc.want.Concurrency, got.Concurrency)
			require.InDelta(t, float64(tc.want.TokensPerSec), float64(got.TokensPerSec), 1)
			require.Len(t, a.Replicas, len(tc.reps))
		})
	}

	got, a := ComputeHeadroom(capacity.Model{ReplicaCapacity: []capacity.Replica{
		rep(true, 0, 0, 0, 0, malformed)}}, cal, obj)
	require.Equal(t, "curve from the EPP is malformed: bin 1: concurrencies are not ascending", a.Replicas[0].Why)
	require.Zero(t, a.Replicas[0].Capacity)
	require.Zero(t, got)

	// With flow control on, the EPP queues once the pool's mean queue
	// reaches the ceiling (3.4 of a target of 4, at 10 requests a replica),
	// however well the engines' own latencies hold there: the capacity
	// stops where the healthy replicas together reach that load at most 5%
	// of the time (an unhealthy one is not in the pool). Off, the curve
	// alone.
	queued := full.Clone()
	for i := range queued.Bins {
		queued.Bins[i].Waiting = 0.34 * queued.Bins[i].Concurrency
	}
	m := capacity.Model{ReplicaCapacity: []capacity.Replica{rep(true, 0, 0, 0, 0, queued), rep(true, 0, 0, 0, 0, queued),
		rep(false, 0, 0, 0, 0, queued)}, Admission: &capacity.Admission{TargetWaiting: 4, KVCeiling: 0.9, Ceiling: 0.85}}
	got, a = ComputeHeadroom(m, nil, obj)
	mean := capacity.AdmittedLoad(10, 2, obj.Quantile)
	require.Greater(t, mean, 4.0)
	require.Less(t, mean, 10.0)
	// Between the bins at 4 and 10 requests the engine serves 10 tok/s a
	// request.
	require.InDelta(t, 2*10*mean, float64(got.TokensPerSec), 1)
	// Streams held open meet the queue only at the crossing itself.
	require.Equal(t, uint32(2*10), got.Concurrency)
	require.InDelta(t, 2*mean, a.Concurrency, 1e-6)
	require.Equal(t, capacity.LimitAdmission, a.Replicas[0].Capacity.Limit)
	require.InDelta(t, 10, a.Replicas[0].Capacity.AdmissionBoundConcurrency, 1e-6)
	require.InDelta(t, 100, a.Replicas[0].Capacity.AdmissionBoundTokensPerSec, 1e-6)
	m.Admission = nil
	got, _ = ComputeHeadroom(m, nil, obj)
	require.Equal(t, h(2*s, 2*v), got)
}

func TestCheckSnapshot(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	good := capacity.Model{Model: "m", Replicas: 2, Healthy: 2}
	for _, tc := range []struct {
		name string
		snap capacity.Snapshot
		want error
	}{
		{"healthy", capacity.Snapshot{Taken: now.Add(-time.Second), Models: []capacity.Model{good}}, nil},
		{"old snapshot", capacity.Snapshot{Taken: now.Add(-time.Minute), Models: []capacity.Model{good}}, ErrStaleMetrics},
		{"no timestamp", capacity.Snapshot{Models: []capacity.Model{good}}, ErrStaleMetrics},
		{"all replicas stale", capacity.Snapshot{Taken: now, Models: []capacity.Model{{Model: "m", Replicas: 2, Stale: 2}}}, ErrStaleMetrics},
		{"model missing", capacity.Snapshot{Taken: now, Models: []capacity.Model{{Model: "other", Replicas: 1, Healthy: 1}}}, ErrNoHealthyReplica},
		{"none healthy", capacity.Snapshot{Taken: now, Models: []capacity.Model{{Model: "m", Replicas: 2, Stale: 1}}}, ErrNoHealthyReplica},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := CheckSnapshot(tc.snap, "m", now, 30*time.Second)
			if tc.want == nil {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, tc.want)
		})
	}
}

func TestCapacityClientFetch(t *testing.T) {
	taken := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	want := capacity.Snapshot{Taken: taken, Models: []capacity.Model{{Model: "Qwen/Qwen3-32B", Replicas: 2, Healthy: 2,
		FreeKVBlocks: 100, FreeKVTokens: 1600, TotalKVTokens: 3200, Running: 3, Waiting: 1, InFlight: 4,
		MaxConcurrency: 32, OutputTokensPerSec: 512.5, PromptTokensPerSec: 2000, PrefixHitRate: 0.4}}}
	status := http.StatusOK
	body := func(w http.ResponseWriter) { require.NoError(t, json.NewEncoder(w).Encode(want)) }
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != capacity.Path || r.Method != http.MethodGet {
			http.NotFound(w, r)
			return
		}
		w.WriteHeader(status)
		body(w)
	}))
	defer srv.Close()
	c := &CapacityClient{URL: srv.URL + "/"}

	got, err := c.Fetch(context.Background())
	require.NoError(t, err)
	require.True(t, want.Taken.Equal(got.Taken))
	got.Taken = want.Taken
	require.Equal(t, want, got)

	status = http.StatusServiceUnavailable
	_, err = c.Fetch(context.Background())
	require.ErrorIs(t, err, ErrEPPUnreachable)
	require.ErrorContains(t, err, "status 503")

	status = http.StatusOK
	body = func(w http.ResponseWriter) { _, _ = w.Write([]byte("{garbage")) }
	_, err = c.Fetch(context.Background())
	require.ErrorIs(t, err, ErrEPPUnreachable)
	require.ErrorContains(t, err, "cannot decode snapshot")

	srv.Close()
	_, err = c.Fetch(context.Background())
	require.ErrorIs(t, err, ErrEPPUnreachable)
}

// A pool of 64 replicas whose curves are as large as an engine can build
// (bins at every load to 1,024 requests and every new-token rate to
// 100,000 tokens/s, histograms with the EPP's buckets, full-precision
// counts) is read whole.
func TestCapacityClientFetchLargePool(t *testing.T) {
	hist := func(n int) capacity.Histogram {
		h := capacity.Histogram{Counts: make([]float64, n), Count: 1000.0 / 3, Sum: 100.0 / 7}
		for i := range h.Counts {
			h.Counts[i] = float64(i) * 100.0 / 3
		}
		return h
	}
	curve := capacity.Curve{TTFTBounds: make([]float64, 22), ITLBounds: make([]float64, 19)}
	for c := 1.0 / 3; c < 1024; c *= 1.0625 {
		curve.Bins = append(curve.Bins, capacity.Bin{Concurrency: c, Running: c, Seconds: 100.0 / 3, Windows: 100.0 / 7,
			Waiting: 1.0 / 3, KVUsage: 2.0 / 3, OutputTokensPerSec: 1000.0 / 3, PromptTokensPerSec: 10000.0 / 3,
			TTFT: hist(22), ITL: hist(19)})
	}
	for r := 1.0 / 3; r < 100_000; r *= 1.0625 {
		curve.Stall = append(curve.Stall, capacity.StallBin{NewTokensPerSec: r, Seconds: 100.0 / 3, Windows: 100.0 / 7, ITL: hist(19)})
	}
	m := capacity.Model{Model: "Qwen/Qwen3-32B", Replicas: 64, Healthy: 64}
	for i := range 64 {
		m.ReplicaCapacity = append(m.ReplicaCapacity, capacity.Replica{Addr: fmt.Sprintf("10.0.0.%d:8000", i), Healthy: true, Curve: curve})
	}
	body, err := json.Marshal(capacity.Snapshot{Taken: time.Now(), Models: []capacity.Model{m}})
	require.NoError(t, err)
	require.Greater(t, len(body), 4<<20, "larger than the bound that stopped such a pool")
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write(body) }))
	defer srv.Close()

	got, err := (&CapacityClient{URL: srv.URL}).Fetch(context.Background())
	require.NoError(t, err)
	require.Len(t, got.Models, 1)
	require.Len(t, got.Models[0].ReplicaCapacity, 64)
	require.Len(t, got.Models[0].ReplicaCapacity[63].Curve.Bins, len(curve.Bins))
}

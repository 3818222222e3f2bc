package quoter

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strings"
	"time"

	"github.com/omnious/provider-node/capacity"
)

// CapacityClient reads the EPP's capacity snapshot.
type CapacityClient struct {
	// URL is the EPP admin base URL (e.g. "http://127.0.0.1:9003"); the
	// snapshot is fetched from URL + capacity.Path.
	URL string
	// HTTP is the client used. Default: a client with a 5 s timeout.
	HTTP *http.Client
}

// ErrEPPUnreachable marks failures to obtain a snapshot at all.
var ErrEPPUnreachable = errors.New("EPP capacity endpoint unreachable")

// maxSnapshotBytes bounds the snapshot body. It carries every replica's
// curve, its histograms in every bin: a replica with a bin at every load
// to 1,024 requests and a stall bin at every new-token rate to 100,000
// tokens/s sends about 210 KB, and 64 MiB holds about 300 of those; a
// pool of 64 of them is read whole (TestCapacityClientFetchLargePool).
const maxSnapshotBytes = 64 << 20

// Fetch returns the current snapshot.
func (c *CapacityClient) Fetch(ctx context.Context) (capacity.Snapshot, error) {
	var snap capacity.Snapshot
	hc := c.HTTP
	if hc == nil {
		hc = &http.Client{Timeout: 5 * time.Second}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(c.URL, "/")+capacity.Path, nil)
	if err != nil {
		return snap, fmt.Errorf("cannot build capacity request: %w", err)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return snap, fmt.Errorf("%w: %w", ErrEPPUnreachable, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
		return snap, fmt.Errorf("%w: status %d", ErrEPPUnreachable, resp.StatusCode)
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxSnapshotBytes)).Decode(&snap); err != nil {
		return snap, fmt.Errorf("%w: cannot decode snapshot: %w", ErrEPPUnreachable, err)
	}
	return snap, nil
}

// Headroom is the spare capacity a quote promises for one model.
type Headroom struct {
	TokensPerSec uint64
	Concurrency  uint32
}

// Assessment is how a headroom was reached, for the log, /v1/capacity of
// the quoter and the bench.
type Assessment struct {
	// Replicas has one entry per replica of the model.
	Replicas []ReplicaAssessment `json:"replicas"`
	// Concurrency and OutputTokensPerSec are the pool's capacity within
	// the objectives (healthy replicas only); Busy and BusyTokensPerSec its
	// load now.
	Concurrency        float64 `json:"concurrency"`
	OutputTokensPerSec float64 `json:"output_tokens_per_sec"`
	// Streams is the sum of the replicas' capacity.AtObjectives.Streams,
	// at most CalibratedStreams: the requests a client may keep in flight
	// within the objectives.
	Streams float64 `json:"streams"`
	// CalibratedStreams is the most streams the calibration's ladder held
	// with the whole fleet loaded, scaled to the replicas with a
	// capacity, where the ladder bounds the sum
	// (capacity.Calibration.StreamsBound); nil where it does not (no
	// calibration used, its levels at another quantile, or a ladder that
	// held what its own curve claimed).
	CalibratedStreams *float64 `json:"calibrated_streams,omitempty"`
	// CalibratedTokensPerSec is the rate the calibration's ladder measured
	// at the pool's concurrency, scaled to the replicas with a capacity,
	// when the ladder bounds the streams: OutputTokensPerSec is at most
	// that (capacity.Calibration.RateBound). nil when it does not.
	CalibratedTokensPerSec *float64 `json:"calibrated_tokens_per_sec,omitempty"`
	Busy                   float64  `json:"busy"`
	BusyTokensPerSec       float64  `json:"busy_tokens_per_sec"`
}

// ReplicaAssessment is one replica's share of an Assessment.
type ReplicaAssessment struct {
	Addr string `json:"addr"`
	// Capacity is its curve read at the objectives (zero when it has
	// none to sell) and Source where the curve came from: "live",
	// "live+calibration", "calibration" or "" (nothing).
	Capacity capacity.AtObjectives `json:"capacity"`
	Source   string                `json:"source"`
	// Busy is its load: the mean requests in the engine over the last 30 s
	// plus those this EPP routed that the engine has not counted yet (see
	// ComputeHeadroom).
	Busy float64 `json:"busy"`
	// Why is set when the replica contributes nothing.
	Why string `json:"why,omitempty"`
}

// ComputeHeadroom is what the model's pool can take on top of its load
// while the objectives hold. Per healthy replica:
//
//	capacity     = its curve (live, over the calibration where live has
//	               too little) read at the objectives, within its prefill
//	               bound for the current mix and the load at which the
//	               healthy replicas seldom meet the EPP's queue, capped
//	               at max_running
//	streams      = the requests a client may keep in flight: the load
//	               at which its curve, read at that load alone, stops
//	               holding the objectives, at most the load at which the
//	               EPP starts to queue (AtObjectives.Streams), capped at
//	               max_running
//	kv           = busy + free KV tokens / (new prompt + output tokens
//	               a request of the mix): capacity and streams are at
//	               most that, the rates scaled down with the capacity
//	               (AtObjectives.BoundKV)
//	busy         = requests in the engine, mean of the last 30 s,
//	               + max(0, in_flight - running - waiting)
//	load         = output tokens/s of the last 30 s
//
// and over the replicas with a capacity, S, T, B and L the sums of
// streams, capacity.tokens/s, busy and load:
//
//	concurrency  = max(0, S - B)
//	tokens/s     = max(0, min(T - L, T * concurrency / S))
//
// where, with a calibration read into a replica's curve, S is at most
// the calibration's held streams (the highest level of its ladder within
// the objectives, the whole fleet loaded at once) times the replicas with
// a capacity over the replicas it ran on, unless the ladder vouches for
// the curves (capacity.Calibration.StreamsBound). A replica's curve is
// keyed by its own load, learnt while the others ran whatever they ran;
// summed, the replicas' streams assume each holds its latency whatever
// the others run, true of replicas on their own accelerators and false of
// replicas sharing cores, where the sum promised loads the fleet never
// held. The ladder tells them apart on its own traffic: where the
// calibration's curve, summed over its replicas, claims no more than the
// levels measured and no level up to the claim broke, the replicas added
// up to what the fleet did and their sum stands
// (TestComputeHeadroomCalibratedStreams, TestComputeHeadroomReplaysRuns).
// Where the ladder bounds S it bounds T too: the replicas' rates, each read
// at its own share of the concurrency, add up to a claim of the same kind,
// so T is at most the rate the ladder measured at the pool's concurrency
// scaled the same way (capacity.Calibration.RateBound).
//
// The concurrency is what a client holding its requests open may hold;
// arrivals from many independent clients at the quoted rate hold fewer
// (capacity.concurrency, the load the engines held at that rate), and
// the rate is what bounds them.
//
// rounded down. A replica with an open breaker or stale metrics
// contributes nothing; one with no curve either (nothing measured, no
// calibration) or a malformed one, and the curve is never read beyond the
// largest load measured. The pool is what is sold, not each replica: the
// EPP sends a new request where there is room, so a replica past its
// capacity takes its excess out of the others' room instead of counting
// as none left. The per-stream bound reads the pool's concurrency, not
// each replica's: a pool's replicas are alike (one model server on one
// kind of accelerator), and each one's estimate of the load that goes
// with its rate scatters where their sum does not (TestComputeHeadroom,
// "the per-stream bound reads the pool's concurrency").
// The load is its sustained one, as a quote holds for minutes: one
// scrape's rate swings by half or more on long prompts, and one scrape's
// count of requests by as much as the arrivals bunch, while the requests
// the EPP routed and the engine has not counted yet are added as they
// are (TestComputeHeadroom, "a burst above the sustained load"). A
// replica holding no request now still counts its mean: at a light load
// an engine is empty between requests, and read as a load that has
// ended it would sell again the rate it is serving (TestComputeHeadroom,
// "a replica empty now counts its 30 s mean"). A load that has
// ended is counted for up to 30 s more, the side a promise errs on. A
// replica whose EPP reports no mean (an older EPP) counts its requests
// now. The second bound on tokens/s keeps the promise per stream: a
// stream at capacity runs at the capacity's per-stream rate, slower than
// one at today's lighter load.
func ComputeHeadroom(m capacity.Model, cal *capacity.Calibration, o capacity.Objectives) (Headroom, Assessment) {
	var a Assessment
	pool, selling, calibrated := 0, 0, false
	for _, r := range m.ReplicaCapacity {
		if r.Healthy {
			pool++
		}
	}
	for _, r := range m.ReplicaCapacity {
		ra := ReplicaAssessment{Addr: r.Addr, Busy: busy(r)}
		switch {
		case !r.Healthy:
			ra.Why = "not healthy (breaker not closed or metrics stale)"
		default:
			// A curve that breaks its own invariants is a fault upstream
			// (a corrupt body, an EPP of another version); read anyway, it
			// would promise what nothing measured.
			if err := r.Curve.Validate(); err != nil {
				ra.Why = "curve from the EPP is malformed: " + err.Error()
				break
			}
			curve, source := r.Curve, "live"
			if cal != nil {
				merged, err := r.Curve.Merge(cal.Curve)
				switch {
				case err != nil:
					ra.Why = "calibration not used: " + err.Error()
				case len(r.Curve.Bins) == 0:
					curve, source = merged, "calibration"
				default:
					curve, source = merged, "live+calibration"
				}
			}
			at, err := curve.AtAdmitted(o, m.Admission, pool)
			if err != nil {
				ra.Why = "no capacity measured: " + err.Error()
				break
			}
			if m := float64(r.MaxRunning); m > 0 {
				at.CapConcurrency(m)
				at.Streams = min(at.Streams, m)
			}
			at.BoundKV(ra.Busy, r.FreeKVTokens, r.TotalKVTokens, curve.Prefill)
			ra.Capacity, ra.Source = at, source
			selling++
			calibrated = calibrated || source != "live"
			a.Concurrency += at.Concurrency
			a.Streams += at.Streams
			a.OutputTokensPerSec += at.OutputTokensPerSec
			a.Busy += ra.Busy
			a.BusyTokensPerSec += finite(r.OutputTokensPerSec)
		}
		a.Replicas = append(a.Replicas, ra)
	}
	if calibrated && cal.Replicas > 0 {
		scale := float64(selling) / float64(cal.Replicas)
		if bound, ok := cal.StreamsBound(o); ok {
			fleet := bound * scale
			a.CalibratedStreams = &fleet
			a.Streams = min(a.Streams, fleet)
		}
		if rate, ok := cal.RateBound(o, a.Concurrency/scale); ok {
			fleet := rate * scale
			a.CalibratedTokensPerSec = &fleet
			a.OutputTokensPerSec = min(a.OutputTokensPerSec, fleet)
		}
	}
	conc, tps := finite(a.Streams-a.Busy), 0.0
	if conc > 0 {
		tps = finite(min(a.OutputTokensPerSec-a.BusyTokensPerSec, a.OutputTokensPerSec*conc/a.Streams))
	}
	return Headroom{Concurrency: uint32(min(math.Floor(conc), math.MaxUint32)),
		TokensPerSec: uint64(min(math.Floor(tps), float64(math.MaxInt64)))}, a
}

// busy is a replica's load in requests (ComputeHeadroom).
func busy(r capacity.Replica) float64 {
	engine := max(r.Running+r.Waiting, 0)
	load := finite(r.Load)
	if load == 0 {
		return float64(max(engine, r.InFlight))
	}
	return load + float64(max(r.InFlight-engine, 0))
}

func finite(v float64) float64 {
	if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
		return 0
	}
	return v
}

// FindModel returns the snapshot entry for model.
func FindModel(snap capacity.Snapshot, model string) (capacity.Model, bool) {
	for _, m := range snap.Models {
		if m.Model == model {
			return m, true
		}
	}
	return capacity.Model{}, false
}

// Health problems read from a snapshot; they trip the breaker.
var (
	ErrNoHealthyReplica = errors.New("no healthy replica")
	ErrStaleMetrics     = errors.New("stale metrics")
)

// CheckSnapshot reports why the snapshot makes the model unsellable, or
// nil. A snapshot older than maxAge, or a model whose replicas all have
// stale metrics, is stale; a missing model or zero healthy replicas means
// no healthy replica.
func CheckSnapshot(snap capacity.Snapshot, model string, now time.Time, maxAge time.Duration) error {
	if snap.Taken.IsZero() {
		return fmt.Errorf("%w: snapshot has no timestamp", ErrStaleMetrics)
	}
	if age := now.Sub(snap.Taken); age > maxAge {
		return fmt.Errorf("%w: snapshot is %s old (limit %s)", ErrStaleMetrics, age.Round(time.Millisecond), maxAge)
	}
	m, ok := FindModel(snap, model)
	if !ok {
		return fmt.Errorf("%w: model %q is not in the capacity snapshot", ErrNoHealthyReplica, model)
	}
	if m.Replicas > 0 && m.Stale >= m.Replicas {
		return fmt.Errorf("%w: all %d replicas of %q have stale metrics", ErrStaleMetrics, m.Replicas, model)
	}
	if m.Healthy <= 0 {
		return fmt.Errorf("%w: 0 of %d replicas of %q are healthy", ErrNoHealthyReplica, m.Replicas, model)
	}
	return nil
}

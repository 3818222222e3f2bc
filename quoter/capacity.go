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

// maxSnapshotBytes bounds the snapshot body; it is a few hundred bytes per
// model.
const maxSnapshotBytes = 4 << 20

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

// ComputeHeadroom derives quote headroom from one model's snapshot entry,
// conservatively:
//
//	busy        = max(Running+Waiting, InFlight)
//	concurrency = max(0, MaxConcurrency - busy)
//	tokens/s    = floor(OutputTokensPerSec * concurrency / MaxConcurrency)
//
// Queued requests count as busy because they take the next free slot.
// InFlight (what the EPP routed but has not seen finish) covers requests
// the engines have not reported yet. Tokens/s is the free share of the
// output rate actually measured over the last window: it never
// extrapolates beyond observed throughput (per-request decode speed falls
// as batches grow, so scaling the per-slot rate up would over-promise). An
// idle pool therefore quotes 0 tokens/s until load has been measured.
func ComputeHeadroom(m capacity.Model) Headroom {
	if m.Healthy <= 0 || m.MaxConcurrency <= 0 {
		return Headroom{}
	}
	busy := max(m.Running+m.Waiting, m.InFlight, 0)
	free := max(m.MaxConcurrency-busy, 0)
	h := Headroom{Concurrency: uint32(min(free, math.MaxUint32))}
	rate := m.OutputTokensPerSec
	if rate > 0 && !math.IsInf(rate, 0) && !math.IsNaN(rate) && free > 0 {
		tps := math.Floor(rate * float64(free) / float64(m.MaxConcurrency))
		h.TokensPerSec = uint64(min(tps, float64(math.MaxInt64)))
	}
	return h
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

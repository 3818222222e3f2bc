package quoter

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omnious/provider-node/capacity"
)

// TestComputeHeadroomCalibratedStreams: with a calibration in the curves,
// the pool's streams are at most the highest level of its ladder held
// within the objectives, scaled from the replicas it ran on to those
// selling now, unless the ladder vouches for its own curve (measured up
// to what that curve claims, every level up to the claim held), as
// independent replicas' ladders do.
func TestComputeHeadroomCalibratedStreams(t *testing.T) {
	obj := capacity.Objectives{TTFT: 2 * time.Second, ITL: 50 * time.Millisecond, Quantile: 0.95}
	full := curve(curveBin(4, 1, 1, 40), curveBin(10, 0.99, 1, 100), curveBin(20, 0.97, 1, 180), curveBin(30, 0.93, 1, 240),
		curveBin(40, 0.8, 1, 280))
	at, err := full.At(obj)
	require.NoError(t, err)
	s, v := at.Streams, at.OutputTokensPerSec
	require.Greater(t, s, 12.0)
	// heavy is full's loads under a heavier mix: the same bins (so a
	// live curve at full's loads wins every one in the merge), fewer
	// within.
	heavy := curve(curveBin(4, 1, 1, 40), curveBin(10, 0.97, 1, 100), curveBin(20, 0.9, 1, 180), curveBin(30, 0.8, 1, 240),
		curveBin(40, 0.7, 1, 280))
	atHeavy, err := heavy.At(obj)
	require.NoError(t, err)
	claimHeavy := 2 * atHeavy.Streams
	require.Less(t, claimHeavy, 2*s-2)
	rep := func(healthy bool, load float64) capacity.Replica {
		return capacity.Replica{Addr: "r", Healthy: healthy, Running: int(load), Load: load, MaxRunning: 256, Curve: full}
	}
	// lvr is a level at c streams, within 50 ms ITL p95 or not, that
	// served tps; lv one whose rate is far above what the curves claim,
	// so that only the streams are bounded.
	lvr := func(c int, within bool, tps float64) capacity.Level {
		itl := 0.04
		if !within {
			itl = 0.07
		}
		return capacity.Level{Concurrency: c, Requests: 100, TTFTP95Seconds: 0.5, ITLP95Seconds: itl, OutputTokensPerSec: tps}
	}
	lv := func(c int, within bool) capacity.Level { return lvr(c, within, 1e6*float64(c)) }
	// rateAt is a ladder's rate read at load, for held levels 6 and 12
	// that served r6 and r12 tokens/s (capacity.Calibration.RateBound).
	rateAt := func(load, r6, r12 float64) float64 {
		switch {
		case load < 6:
			return r6 * load / 6
		case load < 12:
			return r6 + (r12-r6)*(load-6)/6
		}
		return r12
	}
	conc := 2 * at.Concurrency // the pool's, 2 replicas
	ladderRate := rateAt(conc, 50, 80)
	require.Less(t, ladderRate, 2*v)
	// cal is a calibration over n replicas at quantile q, with curve c
	// and the levels.
	cal := func(n int, q float64, c capacity.Curve, levels ...capacity.Level) *capacity.Calibration {
		return &capacity.Calibration{Replicas: n, Objectives: capacity.ObjectivesJSON{TTFTSeconds: 2, ITLSeconds: 0.05, Quantile: q},
			Levels: levels, Curve: c}
	}
	// shared is the ladder of replicas sharing cores: each curve holds s,
	// the fleet held 12 and broke at 15.
	shared := []capacity.Level{lv(6, true), lv(12, true), lv(15, false)}
	// other is a curve of another engine (other buckets): not merged.
	other := full.Clone()
	other.ITLBounds = []float64{0.02, 0.05, 0.1}
	sum := int(math.Ceil(2 * s))
	h := func(conc, tps float64) Headroom {
		return Headroom{Concurrency: uint32(math.Floor(conc)), TokensPerSec: uint64(math.Floor(tps))}
	}
	for _, tc := range []struct {
		name  string
		reps  []capacity.Replica
		cal   *capacity.Calibration
		want  Headroom
		bound *float64
	}{
		{"replicas sharing cores: the curves claim 2s, the fleet held 12", []capacity.Replica{rep(true, 0), rep(true, 0)},
			cal(2, 0.95, full, shared...), h(12, 2*v), ptr(12)},
		{"independent replicas: the ladder held what its curve claimed, nothing bounded", []capacity.Replica{rep(true, 0), rep(true, 0)},
			cal(2, 0.95, full, lv(sum/2, true), lv(sum, true), lv(sum+sum/4, false)), h(2*s, 2*v), nil},
		{"the ladder vouched for its curve: a live sum past its break (a lighter mix) stands", []capacity.Replica{rep(true, 0), rep(true, 0)},
			cal(2, 0.95, heavy, lv(int(claimHeavy/2), true), lv(int(claimHeavy), true), lv(int(claimHeavy)+1, false)), h(2*s, 2*v), nil},
		{"a level up to the claim broke: bounded by the highest held", []capacity.Replica{rep(true, 0), rep(true, 0)},
			cal(2, 0.95, full, lv(20, true), lv(30, false), lv(40, true), lv(60, false)), h(40, 2*v), ptr(40)},
		{"the load is subtracted from the bounded sum", []capacity.Replica{rep(true, 2), rep(true, 1)},
			cal(2, 0.95, full, shared...), h(12-3, 2*v*9/12), ptr(12)},
		{"scaled out since the calibration: the bound scales with the replicas", []capacity.Replica{rep(true, 0), rep(true, 0)},
			cal(1, 0.95, full, shared...), h(24, 2*v), ptr(24)},
		{"a replica lost: the bound scales down with it", []capacity.Replica{rep(true, 0), rep(false, 0)},
			cal(2, 0.95, full, shared...), h(6, v), ptr(6)},
		{"no calibration: the sum", []capacity.Replica{rep(true, 0), rep(true, 0)}, nil, h(2*s, 2*v), nil},
		{"a calibration of another engine is not read, nor its ladder", []capacity.Replica{rep(true, 0), rep(true, 0)},
			cal(2, 0.95, other, shared...), h(2*s, 2*v), nil},
		{"a ladder at another quantile says nothing of this one", []capacity.Replica{rep(true, 0), rep(true, 0)},
			cal(2, 0.99, full, shared...), h(2*s, 2*v), nil},
		{"no level held at these objectives: nothing sold", []capacity.Replica{rep(true, 0), rep(true, 0)},
			cal(2, 0.95, full, lv(2, false)), Headroom{}, ptr(0)},
		{"the ladder bounds the streams: its rate at the pool's concurrency bounds the rate", []capacity.Replica{rep(true, 0), rep(true, 0)},
			cal(2, 0.95, full, lvr(6, true, 50), lvr(12, true, 80), lvr(15, false, 90)), h(12, ladderRate), ptr(12)},
		{"scaled out since the calibration: the rate bound scales with the replicas", []capacity.Replica{rep(true, 0), rep(true, 0)},
			cal(1, 0.95, full, lvr(6, true, 25), lvr(12, true, 40), lvr(15, false, 45)), h(24, min(2*v, 2*rateAt(conc/2, 25, 40))), ptr(24)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, a := ComputeHeadroom(capacity.Model{ReplicaCapacity: tc.reps}, tc.cal, obj)
			require.Equal(t, tc.want.Concurrency, got.Concurrency)
			require.InDelta(t, float64(tc.want.TokensPerSec), float64(got.TokensPerSec), 1)
			require.Equal(t, tc.bound, a.CalibratedStreams)
			if tc.bound != nil {
				require.LessOrEqual(t, a.Streams, *tc.bound)
			}
		})
	}
}

// TestComputeHeadroomReplaysRuns reads the EPP's snapshot and the
// calibration at the idle quote of saved proof runs, at their objectives
// (testdata/proof-runs; docs/notebook/2026-12-07-streams says where each
// came from): without the ladder the quote is the replicas' sum; with it,
// where the ladder does not vouch for its own curve's claim (the CPU vLLM
// replicas sharing two cores), the streams are at most its highest held
// level and the rate at most its rate at the pool's concurrency; where it
// vouches (the simulated demo fleet, independent replicas) nothing
// changes. A repeat appends to the ladder its proof's first closed-loop
// check at the streams it sold, as the ladder's repeat of that level
// (quoter/calibration, Repeats): attempt 9's 5 held again, attempt 10's 7
// broke, and 7 is no longer sold.
func TestComputeHeadroomReplaysRuns(t *testing.T) {
	strict := capacity.Objectives{TTFT: 2 * time.Second, ITL: 50 * time.Millisecond, Quantile: 0.95}
	loose := capacity.Objectives{TTFT: 3 * time.Second, ITL: 300 * time.Millisecond, Quantile: 0.95}
	check9 := &capacity.Level{Concurrency: 5, Requests: 224, TTFTP95Seconds: 0.675, ITLP95Seconds: 0.0358, OutputTokensPerSec: 224, Within: true}
	check10 := &capacity.Level{Concurrency: 7, Requests: 243, TTFTP95Seconds: 0.453, ITLP95Seconds: 0.0920, OutputTokensPerSec: 243}
	for _, tc := range []struct {
		dir                 string
		o                   capacity.Objectives
		sum                 float64
		tokens, tokensAfter uint64
		before, after       uint32
		bound               *float64
		rateBound           float64 // 0: none
		repeat              *capacity.Level
	}{
		{"demo", strict, 79.73, 2530, 2530, 79, 79, nil, 0, nil},
		{"vllm-notebook", strict, 13.35, 349, 349, 13, 13, nil, 0, nil},
		{"vllm-attempt-7", strict, 8.17, 185, 130, 8, 5, ptr(5), 130.1, nil},
		{"vllm-attempt-8", strict, 8.40, 143, 99, 8, 5, ptr(5), 99.7, nil},
		{"vllm-attempt-9", strict, 8.76, 241, 185, 8, 5, ptr(5), 185.1, nil},
		{"vllm-attempt-9", strict, 8.76, 241, 185, 8, 5, ptr(5), 185.1, check9},
		{"vllm-attempt-10", strict, 11.70, 283, 196, 11, 7, ptr(7), 196.6, nil},
		{"vllm-attempt-10", strict, 11.70, 283, 196, 11, 5, ptr(5), 196.6, check10},
		{"vllm-loose", loose, 19.45, 240, 228, 19, 19, ptr(24), 228.8, nil},
	} {
		name := tc.dir
		if tc.repeat != nil {
			name += fmt.Sprintf(" with %d repeated", tc.repeat.Concurrency)
		}
		t.Run(name, func(t *testing.T) {
			dir := filepath.Join("testdata", "proof-runs", tc.dir)
			var snap capacity.Snapshot
			require.NoError(t, json.Unmarshal(gunzip(t, filepath.Join(dir, "snapshot.json.gz")), &snap))
			require.Len(t, snap.Models, 1)
			m := snap.Models[0]
			cal, err := capacity.ReadCalibration(bytes.NewReader(gunzip(t, filepath.Join(dir, "calibration.json.gz"))))
			require.NoError(t, err)
			if tc.repeat != nil {
				cal.Levels = append(cal.Levels, *tc.repeat)
			}

			// Without the ladder: the replicas' sum, as quoted then.
			noLadder := *cal
			noLadder.Levels = nil
			got, a := ComputeHeadroom(m, &noLadder, tc.o)
			require.Nil(t, a.CalibratedStreams)
			require.InDelta(t, tc.sum, a.Streams, 0.01)
			require.Equal(t, Headroom{TokensPerSec: tc.tokens, Concurrency: tc.before}, got)

			got, a = ComputeHeadroom(m, cal, tc.o)
			require.Equal(t, tc.bound, a.CalibratedStreams)
			if tc.rateBound > 0 {
				require.NotNil(t, a.CalibratedTokensPerSec)
				require.InDelta(t, tc.rateBound, *a.CalibratedTokensPerSec, 0.05)
			} else {
				require.Nil(t, a.CalibratedTokensPerSec)
			}
			require.Equal(t, Headroom{TokensPerSec: tc.tokensAfter, Concurrency: tc.after}, got)
		})
	}
}

func ptr(f float64) *float64 { return &f }

// gunzip returns the decompressed file.
func gunzip(t *testing.T, path string) []byte {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	zr, err := gzip.NewReader(f)
	require.NoError(t, err)
	b, err := io.ReadAll(zr)
	require.NoError(t, err)
	return b
}

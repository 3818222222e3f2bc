package quoter

import (
	"encoding/json"
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
// selling now; replicas whose ladder held their sum lose nothing.
func TestComputeHeadroomCalibratedStreams(t *testing.T) {
	obj := capacity.Objectives{TTFT: 2 * time.Second, ITL: 50 * time.Millisecond, Quantile: 0.95}
	full := curve(curveBin(4, 1, 1, 40), curveBin(10, 0.99, 1, 100), curveBin(20, 0.97, 1, 180), curveBin(30, 0.93, 1, 240),
		curveBin(40, 0.8, 1, 280))
	at, err := full.At(obj)
	require.NoError(t, err)
	s, v := at.Streams, at.OutputTokensPerSec
	require.Greater(t, s, 12.0)
	rep := func(healthy bool, load float64) capacity.Replica {
		return capacity.Replica{Addr: "r", Healthy: healthy, Running: int(load), Load: load, MaxRunning: 256, Curve: full}
	}
	// cal is a calibration over n replicas whose ladder held up to held
	// streams and broke one step past it (at its quantile q).
	cal := func(n int, held int, q float64, c capacity.Curve) *capacity.Calibration {
		lv := func(c int, itl float64) capacity.Level {
			return capacity.Level{Concurrency: c, Requests: 100, TTFTP95Seconds: 0.5, ITLP95Seconds: itl}
		}
		return &capacity.Calibration{Replicas: n, Objectives: capacity.ObjectivesJSON{TTFTSeconds: 2, ITLSeconds: 0.05, Quantile: q},
			Levels: []capacity.Level{lv(held/2, 0.03), lv(held, 0.045), lv(held+held/4, 0.07)}, Curve: c}
	}
	// other is a curve of another engine (other buckets): not merged.
	other := full.Clone()
	other.ITLBounds = []float64{0.02, 0.05, 0.1}
	sum := int(math.Ceil(2 * s))
	h := func(conc, tps float64) Headroom {
		return Headroom{Concurrency: uint32(math.Floor(conc)), TokensPerSec: uint64(math.Floor(tps))}
	}
	ptr := func(f float64) *float64 { return &f }
	for _, tc := range []struct {
		name  string
		reps  []capacity.Replica
		cal   *capacity.Calibration
		want  Headroom
		bound *float64
	}{
		{"replicas sharing cores: each curve held s, the fleet only 12", []capacity.Replica{rep(true, 0), rep(true, 0)},
			cal(2, 12, 0.95, full), h(12, 2*v), ptr(12)},
		{"independent replicas: the ladder held their sum, nothing lost", []capacity.Replica{rep(true, 0), rep(true, 0)},
			cal(2, sum, 0.95, full), h(2*s, 2*v), ptr(float64(sum))},
		{"the load is subtracted from the bounded sum", []capacity.Replica{rep(true, 2), rep(true, 1)},
			cal(2, 12, 0.95, full), h(12-3, 2*v*9/12), ptr(12)},
		{"scaled out since the calibration: the bound scales with the replicas", []capacity.Replica{rep(true, 0), rep(true, 0)},
			cal(1, 12, 0.95, full), h(24, 2*v), ptr(24)},
		{"a replica lost: the bound scales down with it", []capacity.Replica{rep(true, 0), rep(false, 0)},
			cal(2, 12, 0.95, full), h(6, v), ptr(6)},
		{"no calibration: the sum", []capacity.Replica{rep(true, 0), rep(true, 0)}, nil, h(2*s, 2*v), nil},
		{"a calibration of another engine is not read, nor its ladder", []capacity.Replica{rep(true, 0), rep(true, 0)},
			cal(2, 12, 0.95, other), h(2*s, 2*v), nil},
		{"a ladder at another quantile says nothing of this one", []capacity.Replica{rep(true, 0), rep(true, 0)},
			cal(2, 12, 0.99, full), h(2*s, 2*v), nil},
		{"no level held at these objectives: nothing sold", []capacity.Replica{rep(true, 0), rep(true, 0)},
			&capacity.Calibration{Replicas: 2, Objectives: capacity.ObjectivesJSON{Quantile: 0.95}, Curve: full,
				Levels: []capacity.Level{{Concurrency: 2, Requests: 50, TTFTP95Seconds: 0.5, ITLP95Seconds: 0.06}}}, Headroom{}, ptr(0)},
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

// TestComputeHeadroomReplaysRealVLLM reads the EPP's snapshot and the
// calibration at the idle quote of two proof runs against two CPU vLLM
// replicas sharing two cores (docs/notebook/2026-12-06-vllm/proof,
// attempt 7 and attempt 8 in precise/), at their objectives: each
// replica's curve held about 4 streams, summed to 8, which broke ITL p95
// in both of attempt 8's checks at 8 streams; the ladder held at most 5
// with the whole fleet loaded, and that is now the figure. The rate is
// untouched.
func TestComputeHeadroomReplaysRealVLLM(t *testing.T) {
	obj := capacity.Objectives{TTFT: 2 * time.Second, ITL: 50 * time.Millisecond, Quantile: 0.95}
	for _, tc := range []struct {
		dir               string
		sumStreams        float64
		tokens            uint64
		before, after     uint32
		calibratedStreams float64
	}{
		{"precise", 8.40, 143, 8, 5, 5},
		{"attempt-7", 8.17, 185, 8, 5, 5},
	} {
		t.Run(tc.dir, func(t *testing.T) {
			dir := filepath.Join("testdata", "vllm-cpu-proof", tc.dir)
			b, err := os.ReadFile(filepath.Join(dir, "snapshot.json"))
			require.NoError(t, err)
			var snap capacity.Snapshot
			require.NoError(t, json.Unmarshal(b, &snap))
			m, ok := FindModel(snap, "qwen3-test")
			require.True(t, ok)
			cal, err := capacity.LoadCalibration(filepath.Join(dir, "calibration.json"))
			require.NoError(t, err)

			// Without the ladder: the replicas' sum, as quoted then.
			noLadder := *cal
			noLadder.Levels = nil
			got, a := ComputeHeadroom(m, &noLadder, obj)
			require.Nil(t, a.CalibratedStreams)
			require.InDelta(t, tc.sumStreams, a.Streams, 0.01)
			require.Equal(t, Headroom{TokensPerSec: tc.tokens, Concurrency: tc.before}, got)

			got, a = ComputeHeadroom(m, cal, obj)
			require.NotNil(t, a.CalibratedStreams)
			require.InDelta(t, tc.calibratedStreams, *a.CalibratedStreams, 1e-9)
			require.Equal(t, Headroom{TokensPerSec: tc.tokens, Concurrency: tc.after}, got)
		})
	}
}

package quoter

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omnious/provider-node/capacity"
)

func TestComputeHeadroom(t *testing.T) {
	for _, tc := range []struct {
		name string
		m    capacity.Model
		want Headroom
	}{
		{"idle pool: slots free, no measured rate", capacity.Model{Healthy: 2, MaxConcurrency: 64}, Headroom{Concurrency: 64}},
		{"half busy", capacity.Model{Healthy: 2, MaxConcurrency: 64, Running: 30, Waiting: 2, OutputTokensPerSec: 1000},
			Headroom{Concurrency: 32, TokensPerSec: 500}},
		{"in-flight exceeds engine view", capacity.Model{Healthy: 1, MaxConcurrency: 10, Running: 2, InFlight: 6, OutputTokensPerSec: 100},
			Headroom{Concurrency: 4, TokensPerSec: 40}},
		{"overloaded clamps at zero", capacity.Model{Healthy: 1, MaxConcurrency: 8, Running: 8, Waiting: 5, OutputTokensPerSec: 900},
			Headroom{}},
		{"rounds down", capacity.Model{Healthy: 1, MaxConcurrency: 3, Running: 1, OutputTokensPerSec: 100},
			Headroom{Concurrency: 2, TokensPerSec: 66}},
		{"no healthy replica", capacity.Model{Healthy: 0, MaxConcurrency: 8, OutputTokensPerSec: 100}, Headroom{}},
		{"negative counts", capacity.Model{Healthy: 1, MaxConcurrency: 4, Running: -3, OutputTokensPerSec: -5}, Headroom{Concurrency: 4}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, ComputeHeadroom(tc.m))
		})
	}
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

package main

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omnious/provider-node/capacity"
	"github.com/omnious/provider-node/internal/adminauth"
	"github.com/omnious/provider-node/internal/testutil/certtest"
	"github.com/omnious/provider-node/quoter"
)

func TestHeadroomCommand(t *testing.T) {
	bin := func(load, itl, tps float64) capacity.Bin {
		const n = 1000
		return capacity.Bin{Concurrency: load, Running: load, Seconds: 10, Windows: 5, OutputTokensPerSec: tps,
			ITL:  capacity.Histogram{Counts: []float64{0, itl * n, n}, Count: n},
			TTFT: capacity.Histogram{Counts: []float64{0, n, n}, Count: n}}
	}
	curve := capacity.Curve{ITLBounds: []float64{0.025, 0.05, 0.1}, TTFTBounds: []float64{1, 2, 4},
		Bins: []capacity.Bin{bin(4, 1, 40), bin(10, 0.99, 100), bin(20, 0.97, 180), bin(30, 0.93, 240), bin(40, 0.8, 280)}}
	replica := func(addr string, busy int) capacity.Replica {
		return capacity.Replica{Addr: addr, Healthy: true, Running: busy, Curve: curve}
	}
	snap := capacity.Snapshot{Taken: time.Now(), Models: []capacity.Model{
		{Model: "a", Replicas: 2, Healthy: 2, ReplicaCapacity: []capacity.Replica{replica("10.0.0.1:8000", 0), replica("10.0.0.2:8000", 5)}},
		{Model: "b", Replicas: 1, Healthy: 1, ReplicaCapacity: []capacity.Replica{replica("10.0.0.3:8000", 0)}},
	}}
	dir := t.TempDir()
	write := func(name string, v any) string { return writeJSON(t, dir, name, v) }
	file := write("snapshot.json", snap)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != capacity.Path {
			http.NotFound(w, r)
			return
		}
		_ = json.NewEncoder(w).Encode(snap)
	}))
	defer srv.Close()
	cal := write("cal.json", capacity.Calibration{Version: capacity.CalibrationVersion, Model: "b", Replicas: 1,
		Objectives: capacity.ObjectivesJSON{TTFTSeconds: 2, ITLSeconds: 0.05, Quantile: 0.95}, Curve: curve})
	// What the quote loop would offer, from the quoter's own computation.
	obj := quoter.Config{}.WithDefaults().Objectives
	want := func(i int) headroomReport {
		h, a := quoter.ComputeHeadroom(snap.Models[i], nil, obj)
		return headroomReport{Model: snap.Models[i].Model, TokensPerSec: h.TokensPerSec, Concurrency: h.Concurrency, Assessment: a}
	}

	for _, tc := range []struct {
		name    string
		args    []string
		code    int
		want    []headroomReport
		errText string
	}{
		{"snapshot file, every model", []string{"--snapshot", file}, exitOK, []headroomReport{want(0), want(1)}, ""},
		{"one model", []string{"--snapshot", file, "--model", "a"}, exitOK, []headroomReport{want(0)}, ""},
		{"from the EPP", []string{"--capacity-url", srv.URL, "--model", "a"}, exitOK, []headroomReport{want(0)}, ""},
		{"calibration of another model", []string{"--snapshot", file, "--model", "a", "--calibration-file", cal}, exitOK,
			[]headroomReport{want(0)}, `calibration is for model "b", not "a"`},
		{"unknown model", []string{"--snapshot", file, "--model", "c"}, exitFail, nil, `model "c" is not in the snapshot`},
		{"not a snapshot", []string{"--snapshot", write("bad.json", "text")}, exitFail, nil, "bad.json"},
		{"missing file", []string{"--snapshot", filepath.Join(dir, "none.json")}, exitFail, nil, "none.json"},
		{"both sources", []string{"--snapshot", file, "--capacity-url", srv.URL}, exitUsage, nil, "one of --capacity-url or --snapshot"},
		{"no source", []string{"--capacity-url", ""}, exitUsage, nil, "one of --capacity-url or --snapshot"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := invoke(context.Background(), append([]string{"headroom"}, tc.args...)...)
			require.Equal(t, tc.code, code, out+errOut)
			require.Contains(t, errOut, tc.errText)
			if tc.want == nil {
				return
			}
			var got []headroomReport
			require.NoError(t, json.Unmarshal([]byte(out), &got))
			require.Equal(t, tc.want, got)
			require.NotZero(t, got[0].TokensPerSec)
		})
	}

	// The calibration of the model read lets an idle replica with nothing
	// measured be quoted from it.
	empty := capacity.Snapshot{Taken: time.Now(), Models: []capacity.Model{{Model: "b", Replicas: 1, Healthy: 1,
		ReplicaCapacity: []capacity.Replica{{Addr: "10.0.0.3:8000", Healthy: true}}}}}
	code, out, errOut := invoke(context.Background(), "headroom", "--snapshot", write("empty.json", empty))
	require.Equal(t, exitOK, code, out+errOut)
	var got []headroomReport
	require.NoError(t, json.Unmarshal([]byte(out), &got))
	require.Zero(t, got[0].TokensPerSec)
	code, out, errOut = invoke(context.Background(), "headroom", "--snapshot", write("empty.json", empty), "--calibration-file", cal)
	require.Equal(t, exitOK, code, out+errOut)
	require.NoError(t, json.Unmarshal([]byte(out), &got))
	require.True(t, got[0].Calibration)
	require.NotZero(t, got[0].TokensPerSec)
}

// TestHeadroomAdminCredentials: the quoter reads an EPP admin port that
// asks for mutual TLS and a bearer token with the credential files it is
// given, and is refused without them.
func TestHeadroomAdminCredentials(t *testing.T) {
	ca := certtest.NewCA(t, "admin")
	srvCert, srvKey := ca.Issue(t, "epp", "epp.admin")
	cliCert, cliKey := ca.Issue(t, "quoter", "quoter")
	tok := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(tok, []byte("admin-secret\n"), 0o600))
	auth := adminauth.Config{TokenFile: tok, CertFile: srvCert, KeyFile: srvKey, ClientCAFile: ca.CertFile}
	snap := capacity.Snapshot{Taken: time.Now(), Models: []capacity.Model{{Model: "a", Replicas: 1, Healthy: 1,
		ReplicaCapacity: []capacity.Replica{{Addr: "10.0.0.1:8000", Healthy: true}}}}}
	h, err := auth.Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _ = json.NewEncoder(w).Encode(snap) }))
	require.NoError(t, err)
	srv := httptest.NewUnstartedServer(h)
	srv.TLS, err = auth.ServerTLS()
	require.NoError(t, err)
	srv.StartTLS()
	defer srv.Close()
	creds := []string{"--capacity-ca-file", ca.CertFile, "--capacity-cert-file", cliCert, "--capacity-key-file", cliKey, "--capacity-server-name", "epp.admin"}
	for _, tc := range []struct {
		name string
		args []string
		code int
	}{
		{"certificate and token", append([]string{"--capacity-token-file", tok}, creds...), exitOK},
		{"certificate only", creds, exitFail},
		{"token only", []string{"--capacity-token-file", tok, "--capacity-ca-file", ca.CertFile}, exitFail},
		{"nothing", nil, exitFail},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := invoke(context.Background(), append([]string{"headroom", "--capacity-url", srv.URL}, tc.args...)...)
			require.Equal(t, tc.code, code, out+errOut)
			require.NotContains(t, out+errOut, "admin-secret", "the token is never printed")
		})
	}
}

package epp

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/omnious/provider-node/capacity"
	"github.com/omnious/provider-node/discovery"
	"github.com/omnious/provider-node/internal/adminauth"
	"github.com/omnious/provider-node/internal/testutil/certtest"
	"github.com/omnious/provider-node/kvindex"
)

// tokenFile writes a token file into t's directory.
func tokenFile(t *testing.T, tok string) string {
	p := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(p, []byte(tok+"\n"), 0o600))
	return p
}

// status is the status of GET url through rt, or -1 when the connection
// (the TLS handshake) failed.
func status(t *testing.T, rt http.RoundTripper, url string) int {
	t.Helper()
	c := &http.Client{Transport: rt, Timeout: 10 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}

func transport(t *testing.T, c adminauth.Client) http.RoundTripper {
	t.Helper()
	rt, err := c.Transport(nil)
	require.NoError(t, err)
	return rt
}

// TestAdminAuth: with a token or mutual TLS, the admin port refuses an
// unauthenticated read of the index snapshot, pprof and the capacity
// snapshot and serves an authenticated one; debug views are off unless
// enabled.
func TestAdminAuth(t *testing.T) {
	ca, other := certtest.NewCA(t, "admin"), certtest.NewCA(t, "other")
	srvCert, srvKey := ca.Issue(t, "epp", "epp.admin")
	cliCert, cliKey := ca.Issue(t, "quoter", "quoter")
	badCert, badKey := other.Issue(t, "intruder", "intruder")
	tok := tokenFile(t, "s3cret-admin-token")
	wrong := tokenFile(t, "not-the-token")

	type probe struct {
		name   string
		client adminauth.Client
		want   map[string]int // path -> status
	}
	paths := []string{kvindex.SnapshotPath, "/debug/pprof/", capacity.Path, "/debug/index"}
	all := func(code int) map[string]int {
		m := map[string]int{}
		for _, p := range paths {
			m[p] = code
		}
		return m
	}
	served := func(debug bool) map[string]int {
		m := map[string]int{kvindex.SnapshotPath: 200, capacity.Path: 200, "/debug/pprof/": 404, "/debug/index": 404}
		if debug {
			m["/debug/pprof/"], m["/debug/index"] = 200, 200
		}
		return m
	}
	for _, tt := range []struct {
		name   string
		admin  adminauth.Config
		debug  bool
		probes []probe
	}{
		{name: "token, debug off", admin: adminauth.Config{TokenFile: tok}, probes: []probe{
			{"no token", adminauth.Client{}, all(401)},
			{"wrong token", adminauth.Client{TokenFile: wrong}, all(401)},
			{"token", adminauth.Client{TokenFile: tok}, served(false)},
		}},
		{name: "token, debug on", admin: adminauth.Config{TokenFile: tok}, debug: true, probes: []probe{
			{"no token", adminauth.Client{}, all(401)},
			{"token", adminauth.Client{TokenFile: tok}, served(true)},
		}},
		{name: "mutual TLS", admin: adminauth.Config{CertFile: srvCert, KeyFile: srvKey, ClientCAFile: ca.CertFile}, probes: []probe{
			{"no client certificate", adminauth.Client{CAFile: ca.CertFile}, all(-1)},
			{"certificate of another CA", adminauth.Client{CAFile: ca.CertFile, CertFile: badCert, KeyFile: badKey}, all(-1)},
			{"client certificate", adminauth.Client{CAFile: ca.CertFile, CertFile: cliCert, KeyFile: cliKey}, served(false)},
		}},
		{name: "mutual TLS and token", admin: adminauth.Config{CertFile: srvCert, KeyFile: srvKey, ClientCAFile: ca.CertFile, TokenFile: tok}, probes: []probe{
			{"certificate without token", adminauth.Client{CAFile: ca.CertFile, CertFile: cliCert, KeyFile: cliKey}, all(401)},
			{"token without certificate", adminauth.Client{CAFile: ca.CertFile, TokenFile: tok}, all(-1)},
			{"both", adminauth.Client{CAFile: ca.CertFile, CertFile: cliCert, KeyFile: cliKey, TokenFile: tok}, served(false)},
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testConfig(t, "drain_delay: 0s\n")
			cfg.Admin.TokenFile, cfg.Admin.CertFile, cfg.Admin.KeyFile, cfg.Admin.ClientCAFile = tt.admin.TokenFile, tt.admin.CertFile, tt.admin.KeyFile, tt.admin.ClientCAFile
			cfg.Admin.Debug = &tt.debug
			e, err := New(cfg, discovery.Fixed(nil), zap.NewNop())
			require.NoError(t, err)
			run(t, e)
			for _, p := range tt.probes {
				rt := transport(t, p.client)
				for path, want := range p.want {
					require.Equal(t, want, status(t, rt, p.client.Scheme()+"://"+e.AdminAddr()+path), "%s: %s", p.name, path)
				}
			}
		})
	}
}

// TestAdminOffLoopback: an admin address off loopback needs
// authentication, or an explicit unauthenticated; its debug views are off
// by default there and on on loopback.
func TestAdminOffLoopback(t *testing.T) {
	tok := tokenFile(t, "t")
	on := true
	for _, tt := range []struct {
		name  string
		addr  string
		admin AdminConfig
		err   string
		debug bool
	}{
		{name: "loopback", addr: "127.0.0.1:9091", debug: true},
		{name: "localhost", addr: "localhost:9091", debug: true},
		{name: "every interface, no auth", addr: ":9091", err: "admin_addr :9091 is off loopback"},
		{name: "pod IP, no auth", addr: "10.0.0.5:9091", err: "is off loopback"},
		{name: "token", addr: ":9091", admin: AdminConfig{TokenFile: tok}},
		{name: "token, debug on", addr: ":9091", admin: AdminConfig{TokenFile: tok, Debug: &on}, debug: true},
		{name: "client CA", addr: ":9091", admin: AdminConfig{ClientCAFile: "ca.crt", CertFile: "c", KeyFile: "k"}},
		{name: "client CA without TLS", addr: ":9091", admin: AdminConfig{ClientCAFile: "ca.crt"}, err: "admin.client_ca_file needs admin.tls_cert_file"},
		{name: "key without certificate", addr: "127.0.0.1:9091", admin: AdminConfig{KeyFile: "k"}, err: "go together", debug: true},
		{name: "explicitly unauthenticated", addr: ":9091", admin: AdminConfig{Unauthenticated: true}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := Config{AdminAddr: tt.addr, Admin: tt.admin}.WithDefaults()
			err := cfg.Validate()
			if tt.err == "" {
				require.NoError(t, err)
			} else {
				require.ErrorContains(t, err, tt.err)
			}
			require.Equal(t, tt.debug, cfg.Admin.debug(cfg.AdminAddr))
		})
	}
}

// TestWarmStartWithAdminAuth: a starting EPP presents its admin
// credentials (token and client certificate) to its sibling and takes its
// index; without them the sibling refuses and it starts cold.
func TestWarmStartWithAdminAuth(t *testing.T) {
	eps, bases := startSims(t, 1)
	for j := 0; j < 4; j++ {
		p := make([]uint32, 64+16*j)
		for k := range p {
			p[k] = uint32(100*j + k + 1)
		}
		complete(t, bases[0], p)
	}
	ca := certtest.NewCA(t, "admin")
	cert, key := ca.Issue(t, "epp", "epp-peers.llm.svc")
	admin := fmt.Sprintf("admin:\n  token_file: %s\n  tls_cert_file: %s\n  tls_key_file: %s\n  client_ca_file: %s\n  server_name: epp-peers.llm.svc\n",
		tokenFile(t, "sibling-token"), cert, key, ca.CertFile)
	a, err := New(testConfig(t, admin+"drain_delay: 0s\n"), discovery.Fixed(eps), zap.NewNop())
	require.NoError(t, err)
	run(t, a)
	rt := transport(t, a.cfg.Admin.auth().Client())
	require.Eventually(t, func() bool {
		c := &http.Client{Transport: rt}
		resp, err := c.Get("https://" + a.AdminAddr() + "/debug/index")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		var st kvindex.Stats
		return resp.StatusCode == 200 && json.NewDecoder(resp.Body).Decode(&st) == nil && st.Keys > 0
	}, 10*time.Second, 10*time.Millisecond, "A follows the engine")

	for _, tt := range []struct {
		name, extra string
		loaded      bool
	}{
		{"same credentials", admin, true},
		{"no credentials", "", false},
		{"token only", fmt.Sprintf("admin:\n  token_file: %s\n", tokenFile(t, "sibling-token")), false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			core, logs := observer.New(zapcore.InfoLevel)
			b, err := New(testConfig(t, tt.extra+fmt.Sprintf("warm_start:\n  peers: [%q]\n", a.AdminAddr())), discovery.Fixed(eps), zap.New(core))
			require.NoError(t, err)
			require.Equal(t, tt.loaded, logs.FilterMessage("warm start: index loaded from a sibling").Len() == 1, "%v", logs.All())
			require.Equal(t, !tt.loaded, logs.FilterMessage("warm start: index snapshot refused").Len() == 1, "%v", logs.All())
			b.ingest.Close()
			b.closeListeners()
		})
	}
}

package launch

import (
	"context"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/go-zeromq/zmq4"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
	"google.golang.org/grpc"

	"github.com/omnious/provider-node/bench/internal/loopback"
	"github.com/omnious/provider-node/discovery"
	"github.com/omnious/provider-node/endpoint"
	"github.com/omnious/provider-node/engines/kvevents"
	"github.com/omnious/provider-node/engines/sim/simtest"
	"github.com/omnious/provider-node/extproc/testgw"
)

var twoEndpoints = []endpoint.Endpoint{
	{Addr: "127.0.0.1:8000", Model: "m", Engine: "vllm", MetricsURL: "http://127.0.0.1:8000/metrics",
		KVEvents: "tcp://127.0.0.1:5557", KVReplay: "tcp://127.0.0.1:5600", Labels: map[string]string{"zone": "a"}},
	{Addr: "localhost:8001", Model: "m", Engine: "vllm", MetricsURL: "http://localhost:8001/metrics"},
}

func TestExpandPlaceholders(t *testing.T) {
	dir := t.TempDir()
	tmpl := filepath.Join(t.TempDir(), "cfg.yaml")
	require.NoError(t, os.WriteFile(tmpl, []byte("path: {gie_endpoints_file}\nport: {metrics_port}\n"), 0o644))
	other := filepath.Join(t.TempDir(), "cfg.yaml") // same base name
	require.NoError(t, os.WriteFile(other, []byte("model: {model}\n"), 0o644))
	nested := filepath.Join(t.TempDir(), "nested.yaml")
	require.NoError(t, os.WriteFile(nested, []byte("x: {file:"+tmpl+"}\n"), 0o644))

	x, err := newExpander(dir, twoEndpoints)
	require.NoError(t, err)
	port := regexp.MustCompile(`^[0-9]+$`)
	for _, name := range []string{"grpc", "metrics", "health", "admin"} {
		require.Regexp(t, port, x.vars[name+"_port"])
		require.Equal(t, "127.0.0.1:"+x.vars[name+"_port"], x.vars[name+"_addr"])
	}
	ports := map[string]bool{}
	for _, name := range []string{"grpc", "metrics", "health", "admin"} {
		ports[x.vars[name+"_port"]] = true
	}
	require.Len(t, ports, 4, "four distinct ports")

	tests := []struct {
		name, in, want, err string
	}{
		{name: "ports and files", in: "epp --grpc-port {grpc_port} -f {endpoints_file} -g {gie_endpoints_file} -m {metrics_addr} -d {dir}",
			want: "epp --grpc-port " + x.vars["grpc_port"] + " -f " + dir + "/endpoints.yaml -g " + dir + "/gie-endpoints.yaml -m " +
				x.vars["metrics_addr"] + " -d " + dir},
		{name: "model and engine", in: "{model} {engine_url}", want: "m http://127.0.0.1:8000"},
		{name: "shell and JSON braces are left alone", in: `FOO=${HOME} x --json '{"a":1}' {a,b} {}`, want: `FOO=${HOME} x --json '{"a":1}' {a,b} {}`},
		{name: "a misspelt placeholder is an error", in: "x {grpc_adr}", err: "unknown placeholder {grpc_adr}"},
		{name: "a template is rendered into the directory", in: "x --config-file {file:" + tmpl + "} --again {file:" + tmpl + "}",
			want: "x --config-file " + dir + "/cfg.yaml --again " + dir + "/cfg.yaml"},
		{name: "templates sharing a name are numbered", in: "{file:" + other + "}", want: dir + "/2-cfg.yaml"},
		{name: "a template cannot name another", in: "{file:" + nested + "}", err: "a template cannot name another"},
		{name: "a missing template", in: "{file:/nonexistent/t.yaml}", err: "cannot read template"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := x.expand(tc.in, true)
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
	rendered, err := os.ReadFile(filepath.Join(dir, "cfg.yaml"))
	require.NoError(t, err)
	require.Equal(t, "path: "+dir+"/gie-endpoints.yaml\nport: "+x.vars["metrics_port"]+"\n", string(rendered))
	require.True(t, x.used["metrics_port"], "a placeholder named in a template counts as used")

	// The endpoint file is this project's format: discovery reads it back.
	data, err := os.ReadFile(filepath.Join(dir, "endpoints.yaml"))
	require.NoError(t, err)
	eps, err := discovery.ParseFile(data)
	require.NoError(t, err)
	require.Len(t, eps, 2)
	require.Equal(t, "tcp://127.0.0.1:5557", eps[0].KVEvents)
	require.Equal(t, "tcp://127.0.0.1:5600", eps[0].KVReplay)
}

// TestGIEEndpointFile: the Inference Extension's file discovery wants an
// IPv4 literal and the port as a string (its YAML goes through JSON into a
// string field, so an unquoted number would not decode).
func TestGIEEndpointFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "gie.yaml")
	require.NoError(t, WriteGIEEndpointFile(path, twoEndpoints))
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Contains(t, string(data), `port: "8000"`)
	var doc struct {
		Endpoints []map[string]any `yaml:"endpoints"`
	}
	require.NoError(t, yaml.Unmarshal(data, &doc))
	require.Equal(t, []map[string]any{
		{"name": "replica-0", "address": "127.0.0.1", "port": "8000", "labels": map[string]any{"zone": "a"}},
		{"name": "replica-1", "address": "127.0.0.1", "port": "8001"},
	}, doc.Endpoints)

	err = WriteGIEEndpointFile(path, []endpoint.Endpoint{{Addr: "[::1]:8000"}})
	require.ErrorContains(t, err, "IPv4 addresses only")
}

// alive reports whether pid is a process that has not been reaped.
func alive(pid int) bool { return syscall.Kill(pid, 0) == nil }

// waitGone waits until pid is no more (a zombie is reaped by init soon).
func waitGone(t *testing.T, pid int) {
	t.Helper()
	require.Eventually(t, func() bool { return !alive(pid) }, 5*time.Second, 10*time.Millisecond, "pid %d still alive", pid)
}

// readPID waits for a pid file the command writes.
func readPID(t *testing.T, path string) int {
	t.Helper()
	var pid int
	require.Eventually(t, func() bool {
		b, err := os.ReadFile(path)
		if err != nil || !strings.HasSuffix(string(b), "\n") {
			return false
		}
		pid, err = strconv.Atoi(strings.TrimSpace(string(b)))
		return err == nil
	}, 10*time.Second, 10*time.Millisecond)
	return pid
}

// TestExternalStopsItsGroup: a shell command that leaves a child behind
// (a background job) is stopped whole, by the group its own PID leads.
func TestExternalStopsItsGroup(t *testing.T) {
	dir := t.TempDir()
	e, err := StartExternal(ExternalConfig{Command: "sleep 60 & echo $! > {dir}/bg.pid; sleep 60", Dir: dir, Endpoints: twoEndpoints})
	require.NoError(t, err)
	bg := readPID(t, filepath.Join(dir, "bg.pid"))
	require.True(t, alive(bg))
	require.NoError(t, e.Stop())
	waitGone(t, bg)
	cmd, err := os.ReadFile(filepath.Join(dir, "command"))
	require.NoError(t, err)
	require.Equal(t, "sleep 60 & echo $! > "+dir+"/bg.pid; sleep 60\n", string(cmd), "the command as run is kept")
}

// TestExternalKilledAfterGrace: a command that ignores SIGTERM is killed,
// its whole group, and the stop says so.
func TestExternalKilledAfterGrace(t *testing.T) {
	dir := t.TempDir()
	e, err := StartExternal(ExternalConfig{Command: "trap '' TERM; sleep 60 & echo $! > {dir}/bg.pid; wait", Dir: dir,
		Endpoints: twoEndpoints, Grace: 200 * time.Millisecond})
	require.NoError(t, err)
	bg := readPID(t, filepath.Join(dir, "bg.pid"))
	err = e.Stop()
	require.ErrorContains(t, err, "did not exit within 200ms of SIGTERM: killed")
	waitGone(t, bg)
}

// TestExternalExitsEarly: a command that fails at once ends the wait for
// its health with its output.
func TestExternalExitsEarly(t *testing.T) {
	e, err := StartExternal(ExternalConfig{Command: "echo cannot bind {grpc_addr} >&2; exit 3", Dir: t.TempDir(), Endpoints: twoEndpoints})
	require.NoError(t, err)
	err = e.WaitServing(context.Background(), 30*time.Second)
	require.ErrorContains(t, err, "exited during start-up")
	require.ErrorContains(t, err, "cannot bind "+e.GRPCAddr())
	require.Empty(t, e.MetricsURL(), "no metrics placeholder, no metrics URL")
	require.ErrorContains(t, e.Stop(), "exited badly")
}

func TestExternalBadInput(t *testing.T) {
	_, err := StartExternal(ExternalConfig{Command: "  ", Dir: t.TempDir()})
	require.ErrorContains(t, err, "empty command")
	_, err = StartExternal(ExternalConfig{Command: "x", Dir: filepath.Join(t.TempDir(), "a b")})
	require.ErrorContains(t, err, "a shell would split")
	_, err = StartExternal(ExternalConfig{Command: "x {nope}", Dir: t.TempDir()})
	require.ErrorContains(t, err, "unknown placeholder {nope}")
}

// TestPlaceholdersInREADME keeps bench/README.md's placeholder table the
// one users read: every placeholder has its row, with its description.
func TestPlaceholdersInREADME(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	require.NoError(t, err)
	for _, p := range Placeholders {
		row := "| `{" + p.Name + "}` | " + p.Value + " |"
		require.True(t, strings.Contains(string(readme), row), "bench/README.md lacks the row\n%s", row)
	}
}

// FuzzExpand: any command expands or fails with an error; an expansion
// leaves no known placeholder behind and does not touch text without
// placeholders.
func FuzzExpand(f *testing.F) {
	x, err := newExpander(f.TempDir(), twoEndpoints)
	require.NoError(f, err)
	for _, s := range []string{"epp --grpc-port {grpc_port}", "{file:/nonexistent}", "${HOME} {a,b} {}", "{{grpc_addr}}", "{nope}", "{file:{dir}}"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, cmd string) {
		out, err := x.expand(cmd, false)
		if err != nil {
			return
		}
		if !placeholderRE.MatchString(cmd) && out != cmd {
			t.Fatalf("%q changed to %q without a placeholder", cmd, out)
		}
		for _, p := range Placeholders {
			if !strings.HasPrefix(p.Name, "file:") && strings.Contains(out, "{"+p.Name+"}") && !strings.Contains(cmd, "{{"+p.Name+"}") {
				t.Fatalf("%q: %q left in %q", cmd, p.Name, out)
			}
		}
	})
}

// TestExternalWithoutHealth: an ext_proc server without gRPC health is
// refused at once, not after the whole wait.
func TestExternalWithoutHealth(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := grpc.NewServer()
	extprocv3.RegisterExternalProcessorServer(srv, &testgw.Floor{Dests: []string{"127.0.0.1:1"}})
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()
	start := time.Now()
	err = Attach("peer", lis.Addr().String(), "").WaitServing(context.Background(), time.Minute)
	require.ErrorContains(t, err, "peer serves no gRPC health (grpc.health.v1) on its ext_proc port")
	require.Less(t, time.Since(start), 30*time.Second)
}

// TestKVRelay: a replica's events reach a router's bound socket under the
// replica's topic, sequence and payload unchanged; the fleet as the
// router sees it publishes by connecting.
func TestKVRelay(t *testing.T) {
	r := simtest.Start(t, nil)
	pub, _ := r.KVEndpoints()
	ep := endpoint.Endpoint{Addr: r.Addr(), Model: "Qwen/Qwen3-32B", KVEvents: pub}
	ports, err := loopback.FreePorts(1)
	require.NoError(t, err)
	router := "tcp://127.0.0.1:" + strconv.Itoa(ports[0])
	sub := zmq4.NewSub(context.Background())
	defer sub.Close()
	require.NoError(t, sub.Listen(router))
	require.NoError(t, sub.SetOption(zmq4.OptionSubscribe, "kv@"))

	relay, err := StartKVRelay([]endpoint.Endpoint{ep, {Addr: "127.0.0.1:1"}}, router)
	require.NoError(t, err)
	got := make(chan zmq4.Msg, 1)
	go func() {
		if m, err := sub.Recv(); err == nil {
			got <- m
		}
	}()
	var msg zmq4.Msg
	require.Eventually(t, func() bool {
		// Until the subscriptions are through, a prompt's events are lost;
		// each try caches a new prompt.
		resp, err := http.Post("http://"+r.Addr()+"/v1/completions", "application/json",
			strings.NewReader(`{"model":"Qwen/Qwen3-32B","prompt":"`+strings.Repeat("relay "+time.Now().String()+" ", 20)+`","max_tokens":1}`))
		if err == nil {
			resp.Body.Close()
		}
		select {
		case msg = <-got:
			return true
		case <-time.After(100 * time.Millisecond):
			return false
		}
	}, 10*time.Second, 10*time.Millisecond)
	topic, _, payload, err := kvevents.ParseMessage(msg.Frames)
	require.NoError(t, err)
	require.Equal(t, "kv@"+r.Addr()+"@Qwen/Qwen3-32B", string(topic))
	require.NotEmpty(t, payload)
	require.NoError(t, relay.Close())
	require.Positive(t, relay.Relayed())

	view := ConnectView([]endpoint.Endpoint{ep, {Addr: "127.0.0.1:1"}})
	require.Equal(t, endpoint.Endpoint{Addr: r.Addr(), Model: "Qwen/Qwen3-32B", KVConnect: true}, view[0])
	require.False(t, view[1].KVConnect, "a replica without KV events has none to relay")
}

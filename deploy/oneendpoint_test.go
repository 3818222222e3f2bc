package deploy_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"go.yaml.in/yaml/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/omnious/provider-node/discovery"
	"github.com/omnious/provider-node/epp"
	"github.com/omnious/provider-node/extproc"
	"github.com/omnious/provider-node/internal/testutil/freeport"
)

// The shipped Envoy config routes through an ORIGINAL_DST cluster, which
// takes exactly one ip:port from x-gateway-destination-endpoint; a list
// there fails every request. These tests start the EPP as each deployment
// starts it, with two endpoints, and check the routing reply names one.

const oneModel = "Qwen/Qwen3-32B"

// TestEnvoyNeedsOneDestination: the reason the others exist.
func TestEnvoyNeedsOneDestination(t *testing.T) {
	for _, path := range []string{"envoy/envoy.yaml", "envoy/envoy-two-epps.yaml", "helm/provider-node/files/envoy.yaml"} {
		t.Run(path, func(t *testing.T) {
			raw, err := os.ReadFile(path)
			require.NoError(t, err)
			var doc struct {
				StaticResources struct {
					Clusters []struct {
						Name                string `yaml:"name"`
						Type                string `yaml:"type"`
						OriginalDstLbConfig struct {
							UseHTTPHeader  bool   `yaml:"use_http_header"`
							HTTPHeaderName string `yaml:"http_header_name"`
						} `yaml:"original_dst_lb_config"`
					} `yaml:"clusters"`
				} `yaml:"static_resources"`
			}
			require.NoError(t, yaml.Unmarshal(raw, &doc))
			var found bool
			for _, c := range doc.StaticResources.Clusters {
				if c.Name == "inference_pool" {
					found = true
					require.Equal(t, "ORIGINAL_DST", c.Type)
					require.True(t, c.OriginalDstLbConfig.UseHTTPHeader)
					require.Equal(t, extproc.HeaderDestination, c.OriginalDstLbConfig.HTTPHeaderName)
				}
			}
			require.True(t, found, "no inference_pool cluster")
		})
	}
}

// TestHelmEPPRoutesToOneEndpoint renders the chart's EPP config (the
// shipped values, and values with no config at all) and runs the EPP with
// it over two endpoints.
func TestHelmEPPRoutesToOneEndpoint(t *testing.T) {
	helm := tool(t, "helm")
	tests := []struct {
		name       string
		args       []string
		wantConfig bool
	}{
		{"shipped values", nil, true},
		{"no epp.config", []string{"--set", "epp.config=null"}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := append([]string{"template", "pn", "helm/provider-node", "--kube-version", "1.33.0",
				"--namespace", "omnious-ci", "-f", "helm/ci/base.yaml"}, tt.args...)
			out, err := exec.Command(helm, args...).CombinedOutput()
			require.NoError(t, err, string(out))
			config, eppArgs := renderedEPP(t, out)
			require.Equal(t, tt.wantConfig, config != "", "EPP ConfigMap rendered")
			require.Equal(t, tt.wantConfig, slices.Contains(eppArgs, "--config=/etc/epp/config.yaml"), "EPP reads the ConfigMap")

			cfg, err := epp.Parse([]byte(config))
			require.NoError(t, err, config)
			require.Equal(t, 1, *cfg.ExtProc.MaxEndpoints)
			cfg.GRPCAddr, cfg.HealthAddr, cfg.MetricsAddr, cfg.AdminAddr = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
			eps := discovery.Fixed{
				{Addr: "127.0.0.1:18001", Model: oneModel, Engine: "vllm"},
				{Addr: "127.0.0.1:18002", Model: oneModel, Engine: "vllm"},
			}
			e, err := epp.New(cfg, eps, zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)))
			require.NoError(t, err)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- e.Run(ctx) }()
			t.Cleanup(func() { cancel(); require.NoError(t, <-done) })
			requireOneDestination(t, e.GRPCAddr(), "127.0.0.1:18001", "127.0.0.1:18002")
		})
	}
}

// TestSystemdEPPRoutesToOneEndpoint runs cmd/epp with the unit's
// ExecStart (variables from the example environment file, an endpoints file
// listing two engines, free ports for the listeners).
func TestSystemdEPPRoutesToOneEndpoint(t *testing.T) {
	if testing.Short() {
		t.Skip("builds cmd/epp")
	}
	dir := t.TempDir()
	bin := buildEPP(t, dir)
	endpoints := twoEngines(t, dir)
	env := envFile(t, "systemd/provider-node.env.example")
	env["EPP_ENDPOINTS_FILE"] = endpoints
	argv := execStart(t, "systemd/omnious-epp.service", env)
	require.Equal(t, "/usr/local/bin/epp", argv[0])
	require.False(t, slices.Contains(argv, "--config"), "the unit passes no config: the EPP's defaults apply")
	addrs := map[string]string{}
	for i := 1; i < len(argv)-1; i++ {
		switch argv[i] {
		case "--grpc-addr", "--health-addr", "--metrics-addr", "--admin-addr":
			argv[i+1] = freeAddr(t)
			addrs[argv[i]] = argv[i+1]
		}
	}
	require.Len(t, addrs, 4, "the unit sets every listener address")

	startEPP(t, bin, argv)
	requireOneDestination(t, addrs["--grpc-addr"], "127.0.0.1:18001", "127.0.0.1:18002")
}

// TestSystemdTwoEPPs: the template unit's instances a and b listen where
// envoy-two-epps.yaml's ext_proc cluster looks for them, and both route.
func TestSystemdTwoEPPs(t *testing.T) {
	if testing.Short() {
		t.Skip("builds cmd/epp")
	}
	dir := t.TempDir()
	bin := buildEPP(t, dir)
	endpoints := twoEngines(t, dir)
	envoy, err := os.ReadFile("envoy/envoy-two-epps.yaml")
	require.NoError(t, err)
	seen := map[string]bool{}
	for _, inst := range []string{"a", "b"} {
		env := envFile(t, "systemd/provider-node.env.example")
		maps.Copy(env, envFile(t, "systemd/epp-"+inst+".env.example"))
		env["EPP_ENDPOINTS_FILE"] = endpoints
		argv := execStart(t, "systemd/omnious-epp@.service", env)
		var grpcAddr string
		for i := 1; i < len(argv)-1; i++ {
			switch argv[i] {
			case "--grpc-addr", "--health-addr":
				_, port, err := net.SplitHostPort(argv[i+1])
				require.NoError(t, err)
				require.Contains(t, string(envoy), "port_value: "+port, "instance %s's %s is not in envoy-two-epps.yaml", inst, argv[i])
				fallthrough
			case "--metrics-addr", "--admin-addr":
				require.False(t, seen[argv[i+1]], "instances share %s", argv[i+1])
				seen[argv[i+1]] = true
				argv[i+1] = freeAddr(t)
				if argv[i] == "--grpc-addr" {
					grpcAddr = argv[i+1]
				}
			}
		}
		startEPP(t, bin, argv)
		requireOneDestination(t, grpcAddr, "127.0.0.1:18001", "127.0.0.1:18002")
	}
	require.Len(t, seen, 8, "every listener of both instances set, none shared")
}

// twoEngines writes an endpoints file listing two engines into dir.
func twoEngines(t *testing.T, dir string) string {
	t.Helper()
	path := filepath.Join(dir, "endpoints.yaml")
	require.NoError(t, os.WriteFile(path, []byte("defaults:\n  model: "+oneModel+"\n  engine: vllm\n"+
		"endpoints:\n  - {ip: 127.0.0.1, port: 18001}\n  - {ip: 127.0.0.1, port: 18002}\n"), 0o600))
	return path
}

// buildEPP builds cmd/epp into dir.
func buildEPP(t *testing.T, dir string) string {
	t.Helper()
	bin := filepath.Join(dir, "epp")
	out, err := exec.Command("go", "build", "-o", bin, "../cmd/epp").CombinedOutput()
	require.NoError(t, err, string(out))
	return bin
}

// startEPP runs argv (a unit's ExecStart) with bin in its place until the
// test ends, and stops it by its own PID.
func startEPP(t *testing.T, bin string, argv []string) {
	t.Helper()
	cmd := exec.Command(bin, append(argv[1:], "--log-level", "warn")...)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
}

// requireOneDestination routes chat requests through the ext_proc server
// at addr, as Envoy would, until the EPP knows its endpoints, and requires
// the destination header to hold exactly one of them.
func requireOneDestination(t *testing.T, addr string, endpoints ...string) {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	client := extprocv3.NewExternalProcessorClient(conn)
	body := []byte(`{"model":"` + oneModel + `","max_tokens":1,"messages":[{"role":"user","content":"hi"}]}`)
	var dest, last string
	for deadline := time.Now().Add(30 * time.Second); dest == "" && time.Now().Before(deadline); {
		if dest, last = route(client, body); dest == "" {
			time.Sleep(100 * time.Millisecond)
		}
	}
	require.NotEmpty(t, dest, "no routing reply; the last answer: %s", last)
	require.NotContains(t, dest, ",", "one ip:port, not a fallback list")
	require.Contains(t, endpoints, dest)
}

// route sends one request's headers and body; it returns the destination
// of the routing reply, or "" and what came instead.
func route(client extprocv3.ExternalProcessorClient, body []byte) (dest, got string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := client.Process(ctx)
	if err != nil {
		return "", err.Error()
	}
	hv := func(k, v string) *corev3.HeaderValue { return &corev3.HeaderValue{Key: k, RawValue: []byte(v)} }
	headers := &extprocv3.ProcessingRequest{
		ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED,
			ResponseBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED},
		Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{
			Headers: []*corev3.HeaderValue{hv(":method", "POST"), hv(":path", "/v1/chat/completions"), hv(":authority", "llm"),
				hv(":scheme", "http"), hv("content-type", "application/json"), hv("content-length", fmt.Sprint(len(body)))}}}},
	}
	bodyReq := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
		RequestBody: &extprocv3.HttpBody{Body: body, EndOfStream: true}}}
	for _, m := range []*extprocv3.ProcessingRequest{headers, bodyReq} {
		if err := st.Send(m); err != nil {
			return "", err.Error()
		}
	}
	resp, err := st.Recv()
	if err != nil {
		return "", err.Error()
	}
	for _, h := range resp.GetRequestHeaders().GetResponse().GetHeaderMutation().GetSetHeaders() {
		if h.GetHeader().GetKey() == extproc.HeaderDestination {
			return string(h.GetHeader().GetRawValue()), ""
		}
	}
	return "", resp.String()
}

// renderedEPP returns the EPP ConfigMap's config.yaml ("" without one) and
// the EPP container's args from a helm template output.
func renderedEPP(t *testing.T, out []byte) (config string, args []string) {
	t.Helper()
	dec := yaml.NewDecoder(bytes.NewReader(out))
	for {
		var obj struct {
			Kind     string                `yaml:"kind"`
			Metadata struct{ Name string } `yaml:"metadata"`
			Data     map[string]string     `yaml:"data"`
			Spec     struct {
				Template struct {
					Spec struct {
						Containers []struct {
							Name string   `yaml:"name"`
							Args []string `yaml:"args"`
						} `yaml:"containers"`
					} `yaml:"spec"`
				} `yaml:"template"`
			} `yaml:"spec"`
		}
		if err := dec.Decode(&obj); err != nil {
			break
		}
		switch {
		case obj.Kind == "ConfigMap" && obj.Metadata.Name == "pn-provider-node-epp":
			config = obj.Data["config.yaml"]
		case obj.Kind == "Deployment" && obj.Metadata.Name == "pn-provider-node-epp":
			for _, c := range obj.Spec.Template.Spec.Containers {
				if c.Name == "epp" {
					args = c.Args
				}
			}
		}
	}
	require.NotEmpty(t, args, "no EPP Deployment rendered")
	return config, args
}

// execStart is a unit's ExecStart command line with ${VAR}s from env.
func execStart(t *testing.T, unit string, env map[string]string) []string {
	t.Helper()
	raw, err := os.ReadFile(unit)
	require.NoError(t, err)
	var line string
	for _, l := range strings.Split(strings.ReplaceAll(string(raw), "\\\n", " "), "\n") {
		if v, ok := strings.CutPrefix(l, "ExecStart="); ok {
			line = v
		}
	}
	require.NotEmpty(t, line, "%s has no ExecStart", unit)
	line = regexp.MustCompile(`\$\{(\w+)\}`).ReplaceAllStringFunc(line, func(m string) string {
		v, ok := env[m[2:len(m)-1]]
		require.True(t, ok, "%s uses %s, which the environment file does not set", unit, m)
		return v
	})
	return strings.Fields(line)
}

// envFile reads KEY=VALUE lines.
func envFile(t *testing.T, path string) map[string]string {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	env := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), "="); ok && !strings.HasPrefix(k, "#") {
			env[strings.TrimSpace(k)] = strings.TrimSpace(v)
		}
	}
	require.NoError(t, sc.Err())
	return env
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ports, err := freeport.Take(1)
	require.NoError(t, err)
	return fmt.Sprintf("127.0.0.1:%d", ports[0])
}

// tool finds a binary deploy/tools.sh installs, or skips.
func tool(t *testing.T, name string) string {
	t.Helper()
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	out, err := exec.Command("go", "env", "GOPATH").Output()
	if err == nil {
		p := filepath.Join(strings.TrimSpace(string(out)), "bin", name)
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	t.Skipf("%s is not installed: run deploy/tools.sh", name)
	return ""
}

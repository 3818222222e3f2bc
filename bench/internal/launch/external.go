package launch

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/omnious/provider-node/bench/internal/loopback"
	"github.com/omnious/provider-node/endpoint"
)

// ExternalConfig is an EndpointPicker the bench does not assemble (another
// project's, or bin/epp as a user runs it): a shell command, run under
// /bin/sh -c as the leader of its own process group, with the fleet
// written for it into Dir and the placeholders of Placeholders substituted.
type ExternalConfig struct {
	// Command is the shell command, with placeholders.
	Command string
	// Dir receives the endpoint files, rendered {file:PATH} templates, the
	// command as run and its output (epp.log); it is created when missing.
	Dir string
	// Name names it in errors. Default "the external EPP".
	Name string
	// Endpoints are the fleet it routes to.
	Endpoints []endpoint.Endpoint
	// Grace is how long a stop waits after SIGTERM before it kills the
	// group (and reports that). Default 15s.
	Grace time.Duration
}

// Placeholders are what an external EPP's command (and its {file:PATH}
// templates) may name; each is replaced by the value described. Ports are
// free loopback ports the bench reserved; the addresses are 127.0.0.1 on
// them.
var Placeholders = []struct{ Name, Value string }{
	{"endpoints_file", "the fleet as an endpoint file of this project (discovery's format)"},
	{"gie_endpoints_file", "the fleet in the Inference Extension EPP's file-discovery format (llm-d-router's file-discovery plugin)"},
	{"grpc_addr", "the ext_proc address the gateway connects to (it also health-checks it there)"},
	{"grpc_port", "its port"},
	{"metrics_addr", "an address for Prometheus /metrics, scraped before and after the run"},
	{"metrics_port", "its port"},
	{"health_addr", "a spare address for a separate health port"},
	{"health_port", "its port"},
	{"admin_addr", "a spare address for an admin or debug port"},
	{"admin_port", "its port"},
	{"kv_events_bind", "a ZMQ endpoint (tcp://127.0.0.1:port) for the EPP to bind: named, the bench relays every replica's KV events to it, as engines in vLLM's centralized mode publish them (topic kv@ip:port@model), and the endpoint files say so"},
	{"model", "the served model name"},
	{"engine_url", "the first replica's base URL (a tokenizer endpoint: every replica serves the same model)"},
	{"dir", "the EPP's directory"},
	{"file:PATH", "PATH (relative to the working directory) with these placeholders substituted, written into the EPP's directory; its path there"},
}

// placeholderRE matches what the command's placeholders look like:
// lower-case words and {file:...}. Other braces (a shell's ${VAR}, JSON)
// are left alone.
var placeholderRE = regexp.MustCompile(`\{(file:[^{}]+|[a-z_]+)\}`)

// shellSafeRE is what a path the bench substitutes into a shell command
// may hold, so that it stays one word whether the command quotes it or not.
var shellSafeRE = regexp.MustCompile(`^[A-Za-z0-9._/+@=:,-]+$`)

// StartExternal writes the fleet files, substitutes the placeholders and
// runs the command, its output in Dir's epp.log. It does not wait for
// anything (WaitServing). The metrics URL is set only when the command or
// a template names a metrics placeholder.
func StartExternal(c ExternalConfig) (*EPP, error) {
	if c.Name == "" {
		c.Name = "the external EPP"
	}
	if c.Grace == 0 {
		c.Grace = 15 * time.Second
	}
	if strings.TrimSpace(c.Command) == "" {
		return nil, errors.New("external EPP: empty command")
	}
	dir, err := filepath.Abs(c.Dir)
	if err != nil {
		return nil, fmt.Errorf("bad directory for %s: %w", c.Name, err)
	}
	if !shellSafeRE.MatchString(dir) {
		return nil, fmt.Errorf("directory %q of %s holds characters a shell would split or expand; choose another", dir, c.Name)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("cannot create the directory of %s: %w", c.Name, err)
	}
	eps := c.Endpoints
	relayed := NamesPlaceholder(c.Command, "kv_events_bind")
	if relayed {
		eps = ConnectView(eps)
	}
	x, err := newExpander(dir, eps)
	if err != nil {
		return nil, err
	}
	cmd, err := x.expand(c.Command, true)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", c.Name, err)
	}
	if err := os.WriteFile(filepath.Join(dir, "command"), []byte(cmd+"\n"), 0o644); err != nil {
		return nil, fmt.Errorf("cannot write the command of %s: %w", c.Name, err)
	}
	e := startChildEPP(c.Name, dir, startGroup, "/bin/sh", []string{"-c", cmd}, c.Grace)
	metrics := ""
	if x.used["metrics_addr"] || x.used["metrics_port"] {
		metrics = x.vars["metrics_addr"]
	}
	e.setAddrs(x.vars["grpc_addr"], metrics, "")
	if relayed {
		e.kvBind = x.vars["kv_events_bind"]
	}
	if err := e.Start(); err != nil {
		return nil, err
	}
	return e, nil
}

// expander substitutes the placeholders of one external EPP's command and
// templates.
type expander struct {
	dir  string
	vars map[string]string
	used map[string]bool
	// rendered maps each template's source path to its output path, so
	// that a template named twice is rendered once.
	rendered map[string]string
	outputs  map[string]bool
}

// newExpander reserves the ports and writes both endpoint files into dir.
func newExpander(dir string, eps []endpoint.Endpoint) (*expander, error) {
	ports, err := loopback.FreePorts(5)
	if err != nil {
		return nil, err
	}
	x := &expander{dir: dir, vars: map[string]string{"dir": dir}, used: map[string]bool{},
		rendered: map[string]string{}, outputs: map[string]bool{}}
	for i, name := range []string{"grpc", "metrics", "health", "admin"} {
		x.vars[name+"_port"] = strconv.Itoa(ports[i])
		x.vars[name+"_addr"] = "127.0.0.1:" + strconv.Itoa(ports[i])
	}
	x.vars["kv_events_bind"] = "tcp://127.0.0.1:" + strconv.Itoa(ports[4])
	if len(eps) > 0 {
		x.vars["model"] = eps[0].Model
		x.vars["engine_url"] = "http://" + eps[0].Addr
	}
	x.vars["endpoints_file"] = filepath.Join(dir, "endpoints.yaml")
	if err := writeEndpointFile(x.vars["endpoints_file"], eps); err != nil {
		return nil, err
	}
	x.vars["gie_endpoints_file"] = filepath.Join(dir, "gie-endpoints.yaml")
	if err := WriteGIEEndpointFile(x.vars["gie_endpoints_file"], eps); err != nil {
		return nil, err
	}
	return x, nil
}

// expand substitutes the placeholders of s; {file:PATH} only where
// templates is true (a template cannot name another). An unknown
// placeholder is an error, so that a misspelt one cannot reach the EPP.
func (x *expander) expand(s string, templates bool) (string, error) {
	var errs []error
	out := placeholderRE.ReplaceAllStringFunc(s, func(m string) string {
		name := m[1 : len(m)-1]
		if path, ok := strings.CutPrefix(name, "file:"); ok {
			if !templates {
				errs = append(errs, fmt.Errorf("%s: a template cannot name another", m))
				return m
			}
			p, err := x.render(path)
			if err != nil {
				errs = append(errs, err)
			}
			return p
		}
		v, ok := x.vars[name]
		if !ok {
			errs = append(errs, fmt.Errorf("unknown placeholder %s (known: %s)", m, knownPlaceholders()))
		}
		x.used[name] = true
		return v
	})
	return out, errors.Join(errs...)
}

func knownPlaceholders() string {
	var names []string
	for _, p := range Placeholders {
		names = append(names, "{"+p.Name+"}")
	}
	return strings.Join(names, " ")
}

// render writes the template at path, its placeholders substituted, into
// the EPP's directory under its base name (numbered when two templates
// share one) and returns where.
func (x *expander) render(path string) (string, error) {
	if out, ok := x.rendered[path]; ok {
		return out, nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("cannot read template: %w", err)
	}
	text, err := x.expand(string(data), false)
	if err != nil {
		return "", fmt.Errorf("template %s: %w", path, err)
	}
	base := filepath.Base(path)
	out := filepath.Join(x.dir, base)
	for i := 2; x.outputs[out]; i++ {
		out = filepath.Join(x.dir, strconv.Itoa(i)+"-"+base)
	}
	if !shellSafeRE.MatchString(out) {
		return "", fmt.Errorf("template name %q holds characters a shell would split or expand", base)
	}
	if err := os.WriteFile(out, []byte(text), 0o644); err != nil {
		return "", fmt.Errorf("cannot write template %s: %w", out, err)
	}
	x.rendered[path], x.outputs[out] = out, true
	return out, nil
}

// WriteGIEEndpointFile writes eps in the file-discovery format of the
// Inference Extension's EPP (now llm-d-router's file-discovery plugin): a
// list of name, address (an IPv4 literal), port (a string) and labels.
// Names are replica-0, replica-1, ... in fleet order.
func WriteGIEEndpointFile(path string, eps []endpoint.Endpoint) error {
	type entry struct {
		Name    string            `yaml:"name"`
		Address string            `yaml:"address"`
		Port    string            `yaml:"port"`
		Labels  map[string]string `yaml:"labels,omitempty"`
	}
	entries := make([]entry, 0, len(eps))
	for i, ep := range eps {
		host, port, err := splitPort(ep.Addr)
		if err != nil {
			return err
		}
		host = loopbackIP(host)
		if ip := net.ParseIP(host); ip == nil || ip.To4() == nil {
			return fmt.Errorf("endpoint %s: the Inference Extension's file discovery takes IPv4 addresses only", ep.Addr)
		}
		entries = append(entries, entry{Name: "replica-" + strconv.Itoa(i), Address: host, Port: strconv.Itoa(port), Labels: ep.Labels})
	}
	return writeYAML(path, map[string]any{"endpoints": entries})
}

// Attach is an EndpointPicker already running at grpcAddr that the bench
// did not start (metricsAddr "" when its metrics are not known): it can be
// waited for and scraped, and its Stop does nothing.
func Attach(name, grpcAddr, metricsAddr string) *EPP {
	e := &EPP{name: name, http: loopback.Client(10 * time.Second),
		start: func() (*run, error) { return nil, fmt.Errorf("%s runs on its own: the bench cannot start it", name) }}
	e.setAddrs(grpcAddr, metricsAddr, "")
	return e
}

// NamesPlaceholder reports whether command, or a {file:PATH} template it
// names, names the placeholder {name}. A template that cannot be read
// does not (expanding it reports why).
func NamesPlaceholder(command, name string) bool {
	want := "{" + name + "}"
	if strings.Contains(command, want) {
		return true
	}
	for _, m := range placeholderRE.FindAllStringSubmatch(command, -1) {
		if path, ok := strings.CutPrefix(m[1], "file:"); ok {
			if data, err := os.ReadFile(path); err == nil && strings.Contains(string(data), want) {
				return true
			}
		}
	}
	return false
}

// KVEventsBind is the endpoint an external EPP's command bound for KV
// events ({kv_events_bind}), "" when it names none: the caller relays the
// fleet's events to it (StartKVRelay) once the EPP listens.
func (e *EPP) KVEventsBind() string { return e.kvBind }

// LogPath is a child EPP's log file ("" in this process or attached).
func (e *EPP) LogPath() string { return e.logPath }

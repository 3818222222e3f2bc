// Package envoytest runs the real Envoy on a shipped config for tests and
// the bench: it rewrites the config's addresses onto 127.0.0.1 free ports
// (the listener and the admin port always; every cluster endpoint from a
// substitution map, so nothing is ever sent to an address the caller did
// not name), starts the pinned binary with a dynamic base id so several
// Envoys run at once, waits until its admin /ready says LIVE, and stops it
// by its own PID. Its log is kept in the run's directory and quoted in
// every error about it.
//
// The process part (Start, Find) takes no testing.TB, so the bench can
// run Envoy too; MustStart is the test form.
package envoytest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/omnious/provider-node/internal/testutil/freeport"
	"github.com/omnious/provider-node/internal/testutil/pyenv"
)

// Config is one Envoy run.
type Config struct {
	// Bin is the envoy binary (Find).
	Bin string
	// File is the shipped bootstrap config (YAML).
	File string
	// Subst maps each cluster endpoint address of File, "host:port" as
	// written there, to the 127.0.0.1 address it becomes. A health check
	// port (health_check_config.port_value) is keyed by the endpoint's
	// host and that port. An endpoint address missing from the map is an
	// error. Listener and admin addresses are always moved to free
	// 127.0.0.1 ports, unless named here.
	Subst map[string]string
	// Dir receives the rewritten config and envoy.log. Default: a new
	// temporary directory, removed by Stop when the run ended cleanly.
	Dir string
	// Uncomment names blocks File carries commented out (Uncomment), each
	// turned on before the rewrite: a shipped example, run as written.
	Uncomment []string
	// Edit, when set, changes the rewritten config (the YAML document as
	// generic maps and lists) before it is written: a test's variant of
	// the shipped file, stated in the test (RouteHeader, ClusterTLS).
	Edit func(doc map[string]any) error
	// Concurrency is Envoy's worker threads (--concurrency). Default 2.
	Concurrency int
	// LogLevel is Envoy's --log-level. Default "warn".
	LogLevel string
	// Ready bounds the wait for /ready. Default 30s.
	Ready time.Duration
}

// Envoy is a running Envoy.
type Envoy struct {
	cfgPath, logPath, dir string
	ownDir                bool
	listen, admin         string // 127.0.0.1:port
	cmd                   *exec.Cmd
	exited                chan struct{}
	err                   error // why it exited, set before exited closes
	http                  *http.Client
	stopped               bool // Stop returned once
}

// Find is the Envoy binary: flag when set, else $ENVOY, else envoy on
// PATH, else the pinned one scripts/pyenv.sh envoy installs under the
// module root. The error names that command.
func Find(flag string) (string, error) {
	for _, p := range []string{flag, os.Getenv("ENVOY")} {
		if p != "" {
			if _, err := os.Stat(p); err != nil {
				return "", fmt.Errorf("envoy binary %s: %w", p, err)
			}
			return p, nil
		}
	}
	if p, err := exec.LookPath("envoy"); err == nil {
		return p, nil
	}
	p, err := pyenv.Envoy()
	if err != nil {
		return "", fmt.Errorf("no envoy binary (-envoy, $ENVOY, PATH, .cache/py/envoy): %w", err)
	}
	return p, nil
}

// Start rewrites c.File and runs Envoy on it until Stop; it returns once
// Envoy's admin /ready answers LIVE.
func Start(ctx context.Context, c Config) (*Envoy, error) {
	if c.Concurrency == 0 {
		c.Concurrency = 2
	}
	if c.LogLevel == "" {
		c.LogLevel = "warn"
	}
	if c.Ready == 0 {
		c.Ready = 30 * time.Second
	}
	if c.Bin == "" {
		return nil, errors.New("envoytest: no envoy binary")
	}
	e := &Envoy{dir: c.Dir, exited: make(chan struct{}), http: &http.Client{
		Transport: &http.Transport{Proxy: nil}, Timeout: 5 * time.Second}}
	if e.dir == "" {
		d, err := os.MkdirTemp("", "envoytest-")
		if err != nil {
			return nil, fmt.Errorf("envoytest: %w", err)
		}
		e.dir, e.ownDir = d, true
	} else if err := os.MkdirAll(e.dir, 0o755); err != nil {
		return nil, fmt.Errorf("envoytest: %w", err)
	}
	raw, err := os.ReadFile(c.File)
	if err != nil {
		return nil, fmt.Errorf("envoytest: cannot read the config: %w", err)
	}
	for _, key := range c.Uncomment {
		if raw, err = Uncomment(raw, key); err != nil {
			return nil, fmt.Errorf("envoytest: %s: %w", c.File, err)
		}
	}
	out, listen, admin, err := Rewrite(raw, c.Subst, c.Edit)
	if err != nil {
		return nil, fmt.Errorf("envoytest: %s: %w", c.File, err)
	}
	e.listen, e.admin = listen, admin
	e.cfgPath = filepath.Join(e.dir, "envoy.yaml")
	e.logPath = filepath.Join(e.dir, "envoy.log")
	if err := os.WriteFile(e.cfgPath, out, 0o644); err != nil {
		return nil, fmt.Errorf("envoytest: %w", err)
	}
	logf, err := os.Create(e.logPath)
	if err != nil {
		return nil, fmt.Errorf("envoytest: %w", err)
	}
	// A dynamic base id keeps the shared-memory names of several Envoys
	// apart; hot restart is of no use to a test.
	e.cmd = exec.Command(c.Bin, "-c", e.cfgPath, "--use-dynamic-base-id", "--disable-hot-restart",
		"--concurrency", strconv.Itoa(c.Concurrency), "--log-level", c.LogLevel)
	e.cmd.Stdout, e.cmd.Stderr = logf, logf
	// Envoy dies with the process that started it (a test binary killed
	// by its timeout leaves no Envoy behind).
	e.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := e.cmd.Start(); err != nil {
		_ = logf.Close()
		return nil, fmt.Errorf("envoytest: cannot start %s: %w", c.Bin, err)
	}
	go func() {
		e.err = e.cmd.Wait()
		_ = logf.Close()
		close(e.exited)
	}()
	if err := e.waitReady(ctx, c.Ready); err != nil {
		_ = e.Stop()
		return nil, err
	}
	return e, nil
}

func (e *Envoy) waitReady(ctx context.Context, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	state := "no answer"
	for {
		if body, code, err := e.get(ctx, "/ready"); err == nil {
			state = fmt.Sprintf("%d %s", code, strings.TrimSpace(body))
			if code == http.StatusOK && strings.TrimSpace(body) == "LIVE" {
				return nil
			}
		}
		select {
		case <-e.exited:
			return fmt.Errorf("envoytest: envoy exited during start-up (%v); log:\n%s", e.err, e.LogTail())
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("envoytest: /ready said %q after %v; log:\n%s", state, limit, e.LogTail())
		}
	}
}

// URL is the listener's base URL, http://127.0.0.1:port.
func (e *Envoy) URL() string { return "http://" + e.listen }

// AdminURL is the admin port's base URL.
func (e *Envoy) AdminURL() string { return "http://" + e.admin }

// ConfigPath is the rewritten config Envoy runs.
func (e *Envoy) ConfigPath() string { return e.cfgPath }

// Done is closed once Envoy has exited.
func (e *Envoy) Done() <-chan struct{} { return e.exited }

// PID is Envoy's process id.
func (e *Envoy) PID() int { return e.cmd.Process.Pid }

// Stats are Envoy's counters and gauges (/stats, text form), by name.
func (e *Envoy) Stats(ctx context.Context) (map[string]int64, error) {
	body, code, err := e.get(ctx, "/stats")
	if err != nil {
		return nil, err
	}
	if code != http.StatusOK {
		return nil, fmt.Errorf("envoytest: /stats answered %d", code)
	}
	out := map[string]int64{}
	for line := range strings.Lines(body) {
		name, v, ok := strings.Cut(strings.TrimSpace(line), ": ")
		if !ok {
			continue
		}
		if n, err := strconv.ParseInt(v, 10, 64); err == nil {
			out[name] = n
		}
	}
	return out, nil
}

// Stat is one counter or gauge; a name Envoy does not report is 0.
func (e *Envoy) Stat(ctx context.Context, name string) (int64, error) {
	s, err := e.Stats(ctx)
	if err != nil {
		return 0, err
	}
	return s[name], nil
}

// Admin GETs path on the admin port and returns its body.
func (e *Envoy) Admin(ctx context.Context, path string) (string, error) {
	body, code, err := e.get(ctx, path)
	if err == nil && code != http.StatusOK {
		err = fmt.Errorf("envoytest: %s answered %d: %s", path, code, body)
	}
	return body, err
}

func (e *Envoy) get(ctx context.Context, path string) (string, int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, e.AdminURL()+path, nil)
	if err != nil {
		return "", 0, err
	}
	resp, err := e.http.Do(req)
	if err != nil {
		return "", 0, fmt.Errorf("envoytest: admin %s: %w", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 32<<20))
	return string(b), resp.StatusCode, err
}

// LogTail is the last 4 KiB of Envoy's log.
func (e *Envoy) LogTail() string {
	b, err := os.ReadFile(e.logPath)
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	if len(b) > 4096 {
		b = b[len(b)-4096:]
	}
	return string(b)
}

// Log is Envoy's whole log so far.
func (e *Envoy) Log() string {
	b, _ := os.ReadFile(e.logPath)
	return string(b)
}

// Stop sends SIGTERM to Envoy's PID and, past 10 s, SIGKILL. It returns
// an error quoting the log when Envoy had exited on its own before; a
// later Stop does nothing.
func (e *Envoy) Stop() error {
	if e.stopped {
		return nil
	}
	e.stopped = true
	select {
	case <-e.exited:
		return fmt.Errorf("envoytest: envoy had exited (%v); log:\n%s", e.err, e.LogTail())
	default:
	}
	_ = e.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-e.exited:
	case <-time.After(10 * time.Second):
		_ = e.cmd.Process.Kill()
		<-e.exited
		return fmt.Errorf("envoytest: envoy (pid %d) ignored SIGTERM for 10 s and was killed", e.PID())
	}
	if e.ownDir {
		_ = os.RemoveAll(e.dir)
	}
	return nil
}

// Rewrite is Start's rewrite of a bootstrap config: every listener and the
// admin address move to 127.0.0.1 free ports (unless subst names them),
// every endpoint address and health-check port to subst's. It returns the
// new config and the first listener's and the admin's address.
func Rewrite(raw []byte, subst map[string]string, edit func(map[string]any) error) (out []byte, listen, admin string, err error) {
	var doc map[string]any
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		return nil, "", "", fmt.Errorf("not YAML: %w", err)
	}
	free := func(sa map[string]any) (string, error) {
		key := addrOf(sa)
		if to, ok := subst[key]; ok {
			return to, setAddr(sa, to)
		}
		p, err := freeport.Take(1)
		if err != nil {
			return "", err
		}
		to := "127.0.0.1:" + strconv.Itoa(p[0])
		return to, setAddr(sa, to)
	}
	if sa := dig(doc, "admin", "address", "socket_address"); sa != nil {
		if admin, err = free(sa); err != nil {
			return nil, "", "", err
		}
	}
	sr, _ := doc["static_resources"].(map[string]any)
	lis, _ := sr["listeners"].([]any)
	for _, l := range lis {
		sa := dig(l, "address", "socket_address")
		if sa == nil {
			continue
		}
		a, err := free(sa)
		if err != nil {
			return nil, "", "", err
		}
		if listen == "" {
			listen = a
		}
	}
	if listen == "" || admin == "" {
		return nil, "", "", errors.New("no listener or no admin address")
	}
	clusters, _ := sr["clusters"].([]any)
	for _, c := range clusters {
		for _, ep := range endpoints(c) {
			sa := dig(ep, "address", "socket_address")
			if sa == nil {
				continue
			}
			host, from := sa["address"], addrOf(sa)
			to, ok := subst[from]
			if !ok {
				return nil, "", "", fmt.Errorf("cluster %v: endpoint %s has no substitution", dig(c)["name"], from)
			}
			if err := setAddr(sa, to); err != nil {
				return nil, "", "", err
			}
			if hc := dig(ep, "health_check_config"); hc != nil && hc["port_value"] != nil {
				hfrom := net.JoinHostPort(fmt.Sprint(host), fmt.Sprint(hc["port_value"]))
				hto, ok := subst[hfrom]
				if !ok {
					return nil, "", "", fmt.Errorf("cluster %v: health check port %s has no substitution", dig(c)["name"], hfrom)
				}
				_, p, err := net.SplitHostPort(hto)
				if err != nil {
					return nil, "", "", err
				}
				n, _ := strconv.Atoi(p)
				hc["port_value"] = n
			}
		}
	}
	if edit != nil {
		if err := edit(doc); err != nil {
			return nil, "", "", err
		}
	}
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(doc); err != nil {
		return nil, "", "", err
	}
	return buf.Bytes(), listen, admin, nil
}

// dig walks maps by key; nil when a step is missing.
func dig(v any, keys ...string) map[string]any {
	m, _ := v.(map[string]any)
	for _, k := range keys {
		if m == nil {
			return nil
		}
		m, _ = m[k].(map[string]any)
	}
	return m
}

// endpoints are a cluster's endpoint maps (load_assignment's
// lb_endpoints[].endpoint), in order.
func endpoints(cluster any) []map[string]any {
	var out []map[string]any
	groups, _ := dig(cluster, "load_assignment")["endpoints"].([]any)
	for _, g := range groups {
		lbs, _ := dig(g)["lb_endpoints"].([]any)
		for _, lb := range lbs {
			if ep := dig(lb, "endpoint"); ep != nil {
				out = append(out, ep)
			}
		}
	}
	return out
}

func addrOf(sa map[string]any) string {
	return net.JoinHostPort(fmt.Sprint(sa["address"]), fmt.Sprint(sa["port_value"]))
}

func setAddr(sa map[string]any, to string) error {
	h, p, err := net.SplitHostPort(to)
	if err != nil {
		return fmt.Errorf("substitution %q: %w", to, err)
	}
	n, err := strconv.Atoi(p)
	if err != nil {
		return fmt.Errorf("substitution %q: %w", to, err)
	}
	sa["address"], sa["port_value"] = h, n
	return nil
}

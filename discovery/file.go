package discovery

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/omnious/provider-node/endpoint"
	"github.com/omnious/provider-node/internal/opt"
	"github.com/omnious/provider-node/rules"
	"go.uber.org/zap"
	"go.yaml.in/yaml/v3"
)

// MaxFileSize bounds the endpoint file: anything larger is certainly not a
// hand-written endpoint list and is rejected rather than parsed.
const MaxFileSize = 4 << 20

// fileDoc is the endpoint file. Endpoints is a pointer so that a missing key
// (a truncated or mistyped file) is told apart from an explicit empty list.
// The model rules (objectives, rewrites, models) sit beside the endpoints.
type fileDoc struct {
	Defaults   fileFields   `yaml:"defaults"`
	Endpoints  *[]fileEntry `yaml:"endpoints"`
	rules.Spec `yaml:",inline"`
}

// fileFields are the settings an entry may take from the defaults block.
// Pointers tell "absent" from an explicit 0, which means "none".
type fileFields struct {
	Model        string            `yaml:"model"`
	Engine       string            `yaml:"engine"`
	KVEventsPort *int              `yaml:"kv_events_port"`
	ReplayPort   *int              `yaml:"replay_port"`
	KVConnect    *bool             `yaml:"kv_events_connect"`
	MetricsPort  *int              `yaml:"metrics_port"`
	MetricsPath  *string           `yaml:"metrics_path"`
	Labels       map[string]string `yaml:"labels"`
}

type fileEntry struct {
	IP         string `yaml:"ip"`
	Port       int    `yaml:"port"`
	fileFields `yaml:",inline"`
}

// ParseFile parses and validates an endpoint file (format in README.md) and
// returns its endpoints sorted by Addr. Errors name the offending entry by
// index, address and line.
func ParseFile(data []byte) ([]endpoint.Endpoint, error) {
	eps, _, err := parseFile(data)
	return eps, err
}

// ParseFileRules parses and validates an endpoint file as ParseFile does
// and returns its model rules (nil when it has none).
func ParseFileRules(data []byte) (*rules.Spec, error) {
	_, spec, err := parseFile(data)
	return spec, err
}

// parseFile returns the file's endpoints and its model rules, or an error
// for the whole file: a file is applied entirely or not at all.
func parseFile(data []byte) (eps []endpoint.Endpoint, spec *rules.Spec, err error) {
	// The YAML decoder is third-party code fed with operator input; a panic
	// inside it must not take the EPP down on a bad edit.
	defer func() {
		if r := recover(); r != nil {
			eps, spec, err = nil, nil, fmt.Errorf("cannot parse endpoint file: yaml decoder panic: %v", r)
		}
	}()
	if len(data) > MaxFileSize {
		return nil, nil, fmt.Errorf("endpoint file is %d bytes, over the %d byte limit", len(data), MaxFileSize)
	}
	var doc fileDoc
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, nil, errors.New("endpoint file is empty")
		}
		return nil, nil, fmt.Errorf("cannot parse endpoint file: %w", err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return nil, nil, errors.New("endpoint file holds more than one YAML document")
	}
	if doc.Endpoints == nil {
		return nil, nil, errors.New("endpoint file has no \"endpoints\" list")
	}
	lines := entryLines(data)
	d := doc.Defaults
	if err := checkFields(&d); err != nil {
		return nil, nil, fmt.Errorf("defaults: %w", err)
	}
	entries := *doc.Endpoints
	eps = make([]endpoint.Endpoint, 0, len(entries))
	addrs := make(map[string]int, len(entries))
	zmq := make(map[string]int, len(entries))
	for i := range entries {
		e := &entries[i]
		name := fmt.Sprintf("endpoints[%d]", i)
		if i < len(lines) && lines[i] > 0 {
			name += fmt.Sprintf(" (line %d)", lines[i])
		}
		ep, err := buildEntry(e, &d)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", name, err)
		}
		if j, dup := addrs[ep.Addr]; dup {
			return nil, nil, fmt.Errorf("%s: duplicate address %s (also endpoints[%d])", name, ep.Addr, j)
		}
		addrs[ep.Addr] = i
		// Two engines cannot bind the same ZMQ port on one host; a shared
		// value almost always means a default that a data-parallel rank
		// forgot to override.
		for _, z := range []string{ep.KVEvents, ep.KVReplay} {
			if z == "" {
				continue
			}
			if j, dup := zmq[z]; dup {
				return nil, nil, fmt.Errorf("%s (%s): ZMQ endpoint %s already used by endpoints[%d]", name, ep.Addr, z, j)
			}
			zmq[z] = i
		}
		eps = append(eps, ep)
	}
	sortEndpoints(eps)
	if err := doc.Spec.Validate(); err != nil {
		return nil, nil, err
	}
	if !doc.Spec.Empty() {
		spec = &doc.Spec
	}
	return eps, spec, nil
}

// entryLines returns the source line of each endpoints entry, for error
// messages. It is best effort: a failure just means no line numbers.
func entryLines(data []byte) []int {
	var doc struct {
		Endpoints []yaml.Node `yaml:"endpoints"`
	}
	if yaml.Unmarshal(data, &doc) != nil {
		return nil
	}
	lines := make([]int, len(doc.Endpoints))
	for i := range doc.Endpoints {
		lines[i] = doc.Endpoints[i].Line
	}
	return lines
}

// checkFields validates the fields an entry and the defaults share.
func checkFields(f *fileFields) error {
	if f.Engine != "" && !validEngine(f.Engine) {
		return fmt.Errorf("unknown engine %q (want %s or %s)", f.Engine, EngineVLLM, EngineSGLang)
	}
	for _, p := range []struct {
		name string
		v    *int
	}{{"kv_events_port", f.KVEventsPort}, {"replay_port", f.ReplayPort}, {"metrics_port", f.MetricsPort}} {
		if p.v != nil && (*p.v < 0 || *p.v > 65535) {
			return fmt.Errorf("%s %d out of range (0 = none, else 1-65535)", p.name, *p.v)
		}
	}
	if f.KVConnect != nil && *f.KVConnect {
		for _, p := range []struct {
			name string
			v    *int
		}{{"kv_events_port", f.KVEventsPort}, {"replay_port", f.ReplayPort}} {
			if p.v != nil && *p.v != 0 {
				return fmt.Errorf("kv_events_connect and %s exclude each other: a connecting engine publishes to the EPP's ingest.bind socket, which is not replayed", p.name)
			}
		}
	}
	if f.MetricsPath != nil && !strings.HasPrefix(*f.MetricsPath, "/") {
		return fmt.Errorf("metrics_path %q must start with /", *f.MetricsPath)
	}
	for k := range f.Labels {
		if k == "" {
			return errors.New("empty label key")
		}
	}
	return nil
}

func buildEntry(e *fileEntry, d *fileFields) (endpoint.Endpoint, error) {
	ip, err := netip.ParseAddr(e.IP)
	switch {
	case e.IP == "":
		return endpoint.Endpoint{}, errors.New("missing ip")
	case err != nil:
		return endpoint.Endpoint{}, fmt.Errorf("bad ip %q: want an IPv4 or IPv6 address, not a host name", e.IP)
	case ip.Zone() != "" || ip.IsUnspecified() || ip.IsMulticast():
		return endpoint.Endpoint{}, fmt.Errorf("bad ip %q: not a unicast address", e.IP)
	}
	if e.Port < 1 || e.Port > 65535 {
		return endpoint.Endpoint{}, fmt.Errorf("ip %s: port %d out of range 1-65535", e.IP, e.Port)
	}
	host := ip.Unmap().String()
	addr := net.JoinHostPort(host, strconv.Itoa(e.Port))
	if err := checkFields(&e.fileFields); err != nil {
		return endpoint.Endpoint{}, fmt.Errorf("%s: %w", addr, err)
	}
	ep := endpoint.Endpoint{
		Addr:   addr,
		Model:  pick(e.Model, d.Model),
		Engine: pick(e.Engine, d.Engine, EngineVLLM),
	}
	if ep.Model == "" {
		return endpoint.Endpoint{}, fmt.Errorf("%s: missing model (set it on the entry or in defaults)", addr)
	}
	// The entry's own choice (kv_events_connect, or a kv_events_port)
	// wins over the defaults'; checkFields refused both on one level.
	connect := d.KVConnect != nil && *d.KVConnect
	if e.KVConnect != nil {
		connect = *e.KVConnect
	} else if e.KVEventsPort != nil {
		connect = false
	}
	if connect {
		if e.ReplayPort != nil && *e.ReplayPort != 0 {
			return endpoint.Endpoint{}, fmt.Errorf("%s: replay_port with kv_events_connect: a connecting engine's events are not replayed", addr)
		}
		ep.KVConnect = true
	} else {
		if p := pickPort(e.KVEventsPort, d.KVEventsPort, 0); p != 0 {
			ep.KVEvents = "tcp://" + net.JoinHostPort(host, strconv.Itoa(p))
		}
		if p := pickPort(e.ReplayPort, d.ReplayPort, 0); p != 0 {
			ep.KVReplay = "tcp://" + net.JoinHostPort(host, strconv.Itoa(p))
		}
	}
	if p := pickPort(e.MetricsPort, d.MetricsPort, e.Port); p != 0 {
		path := "/metrics"
		if e.MetricsPath != nil {
			path = *e.MetricsPath
		} else if d.MetricsPath != nil {
			path = *d.MetricsPath
		}
		ep.MetricsURL = "http://" + net.JoinHostPort(host, strconv.Itoa(p)) + path
	}
	if len(d.Labels)+len(e.Labels) > 0 {
		ep.Labels = make(map[string]string, len(d.Labels)+len(e.Labels))
		for k, v := range d.Labels {
			ep.Labels[k] = v
		}
		for k, v := range e.Labels {
			ep.Labels[k] = v
		}
	}
	return ep, nil
}

func pick(vals ...string) string {
	for _, v := range vals {
		if v != "" {
			return v
		}
	}
	return ""
}

func pickPort(entry, def *int, fallback int) int {
	if entry != nil {
		return *entry
	}
	if def != nil {
		return *def
	}
	return fallback
}

func readLimited(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("cannot open endpoint file: %w", err)
	}
	defer f.Close()
	// One byte over the limit is enough for ParseFile to reject it.
	data, err := io.ReadAll(io.LimitReader(f, MaxFileSize+1))
	if err != nil {
		return nil, fmt.Errorf("cannot read endpoint file %s: %w", path, err)
	}
	return data, nil
}

// FileConfig configures a File source.
type FileConfig struct {
	// Path is the endpoint file. Required.
	Path string
	// PollInterval is how often the file's content hash is checked for a
	// change; zero takes the default, negative is refused. Default 1s. Polling the content (not the mtime or inotify) also
	// catches ConfigMap symlink swaps and edits within one second.
	PollInterval time.Duration
	// Rules receives the file's model rules (objectives, rewrites,
	// models) as source "file" whenever the file is loaded. Default none:
	// the rules are validated with the file but applied nowhere.
	Rules *rules.Store
}

// WithDefaults returns c with every unset field at its default.
func (c FileConfig) WithDefaults() FileConfig {
	opt.Zero(&c.PollInterval, defaultPollInterval)
	return c
}

// defaultPollInterval is FileConfig.PollInterval's default.
const defaultPollInterval = time.Second

// Validate refuses a negative field of a defaulted config.
func (c FileConfig) Validate() error {
	return opt.DefaultNonNegative("PollInterval", c.PollInterval, defaultPollInterval)
}

// File is the static endpoint file source.
type File struct {
	cfg FileConfig
	log *zap.Logger
}

var _ Source = (*File)(nil)

// NewFile returns a File source; log may be nil.
func NewFile(cfg FileConfig, log *zap.Logger) (*File, error) {
	if cfg.Path == "" {
		return nil, errors.New("endpoint file path is empty")
	}
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = zap.NewNop()
	}
	return &File{cfg: cfg, log: log.With(zap.String("endpoint_file", cfg.Path))}, nil
}

// Run loads the file, calls update with its endpoints, then polls it and
// calls update again whenever the parsed set changes. An initial load
// failure is returned; later failures (a bad edit, a missing file) are
// logged once per distinct content or error and keep the last good set.
//
// The file's model rules go to FileConfig.Rules each time its content
// changes and it is valid: an edit that only changes the rules applies
// them without an endpoint update.
func (f *File) Run(ctx context.Context, update func([]endpoint.Endpoint)) error {
	data, err := readLimited(f.cfg.Path)
	if err != nil {
		return err
	}
	last, spec, err := parseFile(data)
	if err == nil {
		err = f.setRules(spec)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", f.cfg.Path, err)
	}
	lastHash := sha256.Sum256(data)
	f.log.Info("endpoint file loaded", zap.Int("endpoints", len(last)), zap.Bool("rules", spec != nil))
	update(last)

	var lastReadErr string
	t := time.NewTicker(f.cfg.PollInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		data, err := readLimited(f.cfg.Path)
		if err != nil {
			if msg := err.Error(); msg != lastReadErr {
				lastReadErr = msg
				f.log.Warn("endpoint file unreadable, keeping the last good set", zap.Error(err))
			}
			continue
		}
		lastReadErr = ""
		h := sha256.Sum256(data)
		if h == lastHash {
			continue
		}
		lastHash = h
		eps, spec, err := parseFile(data)
		if err != nil {
			f.log.Error("endpoint file invalid, keeping the last good set", zap.Error(err))
			continue
		}
		if err := f.setRules(spec); err != nil {
			// Valid alone but in conflict with the rules of another source
			// (the EPP config's models): the endpoints still apply.
			f.log.Error("endpoint file rules refused, keeping the last good rules", zap.Error(err))
		}
		if equalEndpoints(eps, last) {
			continue
		}
		last = eps
		f.log.Info("endpoint file reloaded", zap.Int("endpoints", len(eps)))
		update(eps)
	}
}

func (f *File) setRules(spec *rules.Spec) error {
	if f.cfg.Rules == nil {
		return nil
	}
	return f.cfg.Rules.Set("file", spec)
}

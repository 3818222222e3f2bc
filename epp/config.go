// Package epp assembles the EndpointPicker: endpoint discovery, KV-event
// ingestion into the index (warm-started from a sibling EPP's snapshot when
// one answers), the scheduler, the ext_proc gRPC server, gRPC health,
// Prometheus metrics and the admin server (pprof, JSON views, the capacity
// snapshot, the index snapshot for siblings). cmd/epp runs it from flags and a config file; the
// bench runs it in process.
package epp

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/omnious/provider-node/extproc"
	"github.com/omnious/provider-node/internal/adminauth"
	"github.com/omnious/provider-node/internal/opt"
	"github.com/omnious/provider-node/kvindex"
	"github.com/omnious/provider-node/kvindex/ingest"
	"github.com/omnious/provider-node/rules"
	"github.com/omnious/provider-node/scheduler"
)

// Config is the whole EPP configuration, as one YAML file. Every default,
// the sections' included, is applied in WithDefaults (Load and Parse call
// it). A field whose zero is a legal setting is a pointer (nil = unset);
// for the other fields zero means unset.
type Config struct {
	// GRPCAddr serves ext_proc (and gRPC health). Default ":9002".
	GRPCAddr string `yaml:"grpc_addr"`
	// HealthAddr serves gRPC health alone, for kubelet probes. Default ":9003".
	HealthAddr string `yaml:"health_addr"`
	// MetricsAddr serves /metrics. Default ":9090".
	MetricsAddr string `yaml:"metrics_addr"`
	// AdminAddr serves pprof, JSON views and the capacity snapshot; keep it
	// private. Default "127.0.0.1:9091".
	AdminAddr string `yaml:"admin_addr"`
	// Admin authenticates the admin port and says what it serves; off
	// loopback it must authenticate (AdminConfig).
	Admin AdminConfig `yaml:"admin"`
	// TLSCertFile and TLSKeyFile enable TLS on the gRPC port. Default off.
	TLSCertFile string `yaml:"tls_cert_file"`
	TLSKeyFile  string `yaml:"tls_key_file"`
	// DrainDelay is how long, after SIGTERM has turned health NOT_SERVING,
	// the EPP still accepts new streams: Envoy's health checks (2s apart,
	// 2 failures), a Gateway's and the kubelet's readiness probes need that
	// long to move new streams away, and a listener closed sooner would fail
	// them. 0s stops accepting at once. Default 5s.
	DrainDelay *time.Duration `yaml:"drain_delay"`
	// DrainTimeout bounds a graceful stop: after the drain delay, open
	// streams get this long to finish; 0s closes them at once.
	// Default 30s.
	DrainTimeout *time.Duration `yaml:"drain_timeout"`

	// EndpointsFile is a static endpoint file (bare metal). cmd/epp needs
	// exactly one of EndpointsFile and PoolName.
	EndpointsFile string `yaml:"endpoints_file"`
	// PoolName and PoolNamespace select an InferencePool to watch.
	PoolName      string `yaml:"pool_name"`
	PoolNamespace string `yaml:"pool_namespace"`

	// Tokenizers maps a model to a directory holding its tokenizer.json
	// and tokenizer_config.json; requests for it get exact prompt tokens.
	// Other models are routed in approximate mode. Default none.
	Tokenizers map[string]string `yaml:"tokenizers"`
	// StandInTokenizer tokenizes every model as the engine simulator does.
	// For simulated fleets only. Default false.
	StandInTokenizer bool `yaml:"standin_tokenizer"`

	// Models are llmgw's per-model aliases and fallbacks (rules.Model), in
	// force beside the endpoint file's or the API server's rules (source
	// "config"). Default none.
	Models []rules.Model `yaml:"models"`

	Tracing TracingConfig `yaml:"tracing"`

	// WarmStart is where a starting EPP asks a sibling for its index.
	WarmStart WarmStartConfig `yaml:"warm_start"`

	Index IndexConfig `yaml:"index"`
	// Ingest has no block size of its own: ingestion takes the
	// scheduler's, so the two cannot disagree.
	Ingest    ingest.Config    `yaml:"ingest"`
	ExtProc   extproc.Config   `yaml:"extproc"`
	Scheduler scheduler.Config `yaml:"scheduler"`
}

// AdminConfig is the admin port's authentication and what it serves. The
// port holds customers' prompts (the index snapshot's token ids): off
// loopback a reader must present the bearer token of TokenFile or a client
// certificate of ClientCAFile, or Unauthenticated must say otherwise
// (TestAdminAuth). Siblings present the same credentials for warm start.
type AdminConfig struct {
	// TokenFile holds the bearer token every request must carry
	// (Authorization: Bearer), a mounted Secret. Default "" (none).
	TokenFile string `yaml:"token_file"`
	// CertFile and KeyFile serve the port over TLS; siblings present the
	// same pair as their client certificate. Default "" (plain HTTP).
	CertFile string `yaml:"tls_cert_file"`
	KeyFile  string `yaml:"tls_key_file"`
	// ClientCAFile requires client certificates signed by it (mutual
	// TLS); siblings verify each other against it. Default "" (none).
	ClientCAFile string `yaml:"client_ca_file"`
	// ServerName is verified in a sibling's certificate (siblings are
	// dialed by IP). Default "": the address dialed.
	ServerName string `yaml:"server_name"`
	// Debug serves pprof, /debug/endpoints and /debug/index. nil (the
	// default): on when AdminAddr is loopback, off otherwise. The index
	// snapshot and /v1/capacity are always served (to authenticated
	// readers).
	Debug *bool `yaml:"debug"`
	// Unauthenticated lets an admin port off loopback serve without
	// authentication: anyone who reaches it reads the prompts in the
	// index. Default false (such a config is refused).
	Unauthenticated bool `yaml:"unauthenticated"`
}

// auth is the port's authentication.
func (c AdminConfig) auth() adminauth.Config {
	return adminauth.Config{TokenFile: c.TokenFile, CertFile: c.CertFile, KeyFile: c.KeyFile, ClientCAFile: c.ClientCAFile, ServerName: c.ServerName}
}

// debug says whether the debug views are served on addr.
func (c AdminConfig) debug(addr string) bool {
	if c.Debug != nil {
		return *c.Debug
	}
	return adminauth.Loopback(addr)
}

// IndexConfig sizes the KV index.
type IndexConfig struct {
	// MemoryBudget bounds the index's accounted bytes; 0 is not a legal
	// budget and means the default. Default 256 MiB.
	MemoryBudget int64 `yaml:"memory_budget"`
}

// WithDefaults returns c with every unset field at its default.
func (c IndexConfig) WithDefaults() IndexConfig {
	c.MemoryBudget = c.kvindex().WithDefaults().MemoryBudget
	return c
}

func (c IndexConfig) kvindex() kvindex.Config { return kvindex.Config{MemoryBudget: c.MemoryBudget} }

// Load reads a YAML config file; unknown keys are errors. An empty path
// gives the defaults.
func Load(path string) (Config, error) {
	var data []byte
	if path != "" {
		var err error
		if data, err = os.ReadFile(path); err != nil {
			return Config{}, fmt.Errorf("cannot read EPP config: %w", err)
		}
	}
	return Parse(data)
}

// Parse decodes a YAML config, unknown keys at any level being errors, and
// applies defaults. The scheduler section is validated here, so a bad one
// fails at load; the rest is validated by Validate (New calls it), after
// flags had their say.
func Parse(data []byte) (Config, error) {
	var c Config
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&c); err != nil && len(bytes.TrimSpace(data)) > 0 {
		return Config{}, fmt.Errorf("cannot parse EPP config: %w", err)
	}
	c = c.WithDefaults()
	if err := c.Scheduler.Validate(); err != nil {
		return Config{}, err
	}
	return c, nil
}

// WithDefaults returns c with every unset field at its default, every
// section's included.
func (c Config) WithDefaults() Config {
	opt.Zero(&c.GRPCAddr, ":9002")
	opt.Zero(&c.HealthAddr, ":9003")
	opt.Zero(&c.MetricsAddr, ":9090")
	opt.Zero(&c.AdminAddr, "127.0.0.1:9091")
	c.DrainDelay = opt.Or(c.DrainDelay, 5*time.Second)
	c.DrainTimeout = opt.Or(c.DrainTimeout, 30*time.Second)
	c.Tracing = c.Tracing.WithDefaults()
	c.WarmStart = c.WarmStart.WithDefaults()
	c.Index = c.Index.WithDefaults()
	c.Ingest = c.Ingest.WithDefaults()
	c.ExtProc = c.ExtProc.WithDefaults()
	c.Scheduler = c.Scheduler.WithDefaults()
	return c
}

// Validate reports every problem.
func (c Config) Validate() error {
	var errs []error
	for _, d := range []struct {
		name string
		v    *time.Duration
	}{{"drain_delay", c.DrainDelay}, {"drain_timeout", c.DrainTimeout}} {
		if d.v == nil {
			errs = append(errs, fmt.Errorf("%s unset: Validate wants a config from WithDefaults", d.name))
		} else {
			errs = append(errs, opt.NonNegative(d.name, *d.v))
		}
	}
	if c.EndpointsFile != "" && c.PoolName != "" {
		errs = append(errs, errors.New("endpoints_file and pool_name exclude each other"))
	}
	if c.PoolName != "" && c.PoolNamespace == "" {
		errs = append(errs, errors.New("pool_namespace is required with pool_name"))
	}
	if err := c.Admin.auth().Validate("admin"); err != nil {
		errs = append(errs, err)
	}
	if !adminauth.Loopback(c.AdminAddr) && !c.Admin.auth().Enabled() && !c.Admin.Unauthenticated {
		errs = append(errs, fmt.Errorf("admin_addr %s is off loopback: set admin.token_file or admin.client_ca_file (or admin.unauthenticated: true)", c.AdminAddr))
	}
	if (c.TLSCertFile == "") != (c.TLSKeyFile == "") {
		errs = append(errs, errors.New("tls_cert_file and tls_key_file go together"))
	}
	if c.StandInTokenizer && len(c.Tokenizers) > 0 {
		errs = append(errs, errors.New("standin_tokenizer and tokenizers exclude each other"))
	}
	if len(c.Models) > 0 {
		spec := rules.Spec{Models: c.Models}
		if err := spec.Validate(); err != nil {
			errs = append(errs, err)
		}
	}
	if err := c.Tracing.validate(); err != nil {
		errs = append(errs, err)
	}
	if err := c.WarmStart.validate(); err != nil {
		errs = append(errs, err)
	}
	errs = append(errs, c.Index.kvindex().Validate(), c.Ingest.Validate())
	if err := c.ExtProc.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("extproc: %w", err))
	}
	if err := c.Scheduler.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("scheduler: %w", err))
	}
	return errors.Join(errs...)
}

// Package epp assembles the EndpointPicker: endpoint discovery, KV-event
// ingestion into the index, the scheduler, the ext_proc gRPC server, gRPC
// health, Prometheus metrics and the admin server (pprof, JSON views, the
// capacity snapshot). cmd/epp runs it from flags and a config file; the
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
	"github.com/omnious/provider-node/kvindex"
	"github.com/omnious/provider-node/kvindex/ingest"
	"github.com/omnious/provider-node/scheduler"
)

// Config is the whole EPP configuration, as one YAML file. Every default is
// applied in Load / WithDefaults.
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
	// TLSCertFile and TLSKeyFile enable TLS on the gRPC port. Default off.
	TLSCertFile string `yaml:"tls_cert_file"`
	TLSKeyFile  string `yaml:"tls_key_file"`
	// DrainTimeout bounds a graceful stop: health turns NOT_SERVING, then
	// in-flight streams get this long to finish. Default 30s.
	DrainTimeout time.Duration `yaml:"drain_timeout"`

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

	Tracing TracingConfig `yaml:"tracing"`

	Index     IndexConfig      `yaml:"index"`
	Ingest    ingest.Config    `yaml:"ingest"`
	ExtProc   extproc.Config   `yaml:"extproc"`
	Scheduler scheduler.Config `yaml:"-"`
	// scheduler is kept as YAML until defaults apply: the scheduler fills
	// and validates its own section.
	SchedulerYAML yaml.Node `yaml:"scheduler"`
}

// IndexConfig sizes the KV index.
type IndexConfig struct {
	// MemoryBudget bounds the index's accounted bytes. Default 256 MiB.
	MemoryBudget int64 `yaml:"memory_budget"`
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

// Parse decodes a YAML config and applies defaults.
func Parse(data []byte) (Config, error) {
	var c Config
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&c); err != nil && len(bytes.TrimSpace(data)) > 0 {
		return Config{}, fmt.Errorf("cannot parse EPP config: %w", err)
	}
	var sched []byte
	if !c.SchedulerYAML.IsZero() {
		var err error
		if sched, err = yaml.Marshal(&c.SchedulerYAML); err != nil {
			return Config{}, fmt.Errorf("cannot read scheduler section: %w", err)
		}
	}
	sc, err := scheduler.ParseConfig(sched)
	if err != nil {
		return Config{}, err
	}
	c.Scheduler = sc
	return c.WithDefaults(), nil
}

// WithDefaults fills every unset field (the scheduler section is filled by
// Parse).
func (c Config) WithDefaults() Config {
	def := func(s *string, v string) {
		if *s == "" {
			*s = v
		}
	}
	def(&c.GRPCAddr, ":9002")
	def(&c.HealthAddr, ":9003")
	def(&c.MetricsAddr, ":9090")
	def(&c.AdminAddr, "127.0.0.1:9091")
	if c.DrainTimeout == 0 {
		c.DrainTimeout = 30 * time.Second
	}
	if c.Ingest.BlockSize == 0 {
		c.Ingest.BlockSize = c.Scheduler.BlockSize
	}
	c.ExtProc = c.ExtProc.WithDefaults()
	c.Tracing = c.Tracing.withDefaults()
	return c
}

// Validate reports every problem.
func (c Config) Validate() error {
	var errs []error
	if c.EndpointsFile != "" && c.PoolName != "" {
		errs = append(errs, errors.New("endpoints_file and pool_name exclude each other"))
	}
	if c.PoolName != "" && c.PoolNamespace == "" {
		errs = append(errs, errors.New("pool_namespace is required with pool_name"))
	}
	if (c.TLSCertFile == "") != (c.TLSKeyFile == "") {
		errs = append(errs, errors.New("tls_cert_file and tls_key_file go together"))
	}
	if c.Ingest.BlockSize != c.Scheduler.BlockSize {
		errs = append(errs, fmt.Errorf("ingest.block_size %d differs from scheduler.block_size %d: prompts would never match",
			c.Ingest.BlockSize, c.Scheduler.BlockSize))
	}
	if c.StandInTokenizer && len(c.Tokenizers) > 0 {
		errs = append(errs, errors.New("standin_tokenizer and tokenizers exclude each other"))
	}
	if err := c.Tracing.validate(); err != nil {
		errs = append(errs, err)
	}
	if err := c.ExtProc.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("extproc: %w", err))
	}
	if err := c.Scheduler.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("scheduler: %w", err))
	}
	return errors.Join(errs...)
}

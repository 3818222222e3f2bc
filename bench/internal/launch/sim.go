package launch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/omnious/provider-node/bench/internal/loopback"
	"github.com/omnious/provider-node/endpoint"
	"github.com/omnious/provider-node/engines/sim"
)

// SimsConfig is a set of enginesim processes, one replica each.
type SimsConfig struct {
	// Bin is the enginesim binary (a path, or a name on PATH).
	Bin string
	// Dir holds the replicas' config files; the caller owns it.
	Dir string
	// Replicas is how many processes.
	Replicas int
	// Config is every replica's configuration; each gets its own loopback
	// ports for HTTP, KV events and replay.
	Config sim.Config
	// LogLevel is the processes' -log-level.
	LogLevel string
}

// Sim is one enginesim process serving one replica. Its ports are fixed
// when StartSims creates it, so that a replica killed and started again
// comes back at the same address.
type Sim struct {
	// Config is the replica's configuration, as written to its file.
	Config sim.Config
	index  int
	bin    string
	path   string
	level  string
	http   *http.Client
	proc   *child // nil while stopped
}

// FindEnginesim resolves the enginesim binary, failing with a hint when it
// is not built.
func FindEnginesim(bin string) (string, error) {
	path, err := exec.LookPath(bin)
	if err != nil {
		return "", fmt.Errorf("cannot find enginesim binary %q (run make build, or pass its path): %w", bin, err)
	}
	return path, nil
}

// StartSims starts c.Replicas enginesim processes on 127.0.0.1, one after
// another, each answering /health before the next starts. On error every
// process it started is stopped.
func StartSims(ctx context.Context, c SimsConfig) (sims []*Sim, err error) {
	bin, err := FindEnginesim(c.Bin)
	if err != nil {
		return nil, err
	}
	client := loopback.Client(10 * time.Second)
	defer func() {
		if err != nil {
			err = errors.Join(err, StopSims(sims))
			sims = nil
		}
	}()
	for i := 0; i < c.Replicas; i++ {
		s, err := newSim(i, bin, c, client)
		if err != nil {
			return sims, err
		}
		sims = append(sims, s)
		if err := s.Start(ctx); err != nil {
			return sims, err
		}
	}
	return sims, nil
}

func newSim(i int, bin string, c SimsConfig, client *http.Client) (*Sim, error) {
	ports, err := loopback.FreePorts(3)
	if err != nil {
		return nil, err
	}
	cfg := c.Config
	cfg.Listen = fmt.Sprintf("127.0.0.1:%d", ports[0])
	cfg.KVEvents.Endpoint = fmt.Sprintf("tcp://127.0.0.1:%d", ports[1])
	cfg.KVEvents.ReplayEndpoint = fmt.Sprintf("tcp://127.0.0.1:%d", ports[2])
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("invalid replica config: %w", err)
	}
	b, err := yaml.Marshal(cfg)
	if err != nil {
		return nil, fmt.Errorf("cannot encode replica config: %w", err)
	}
	path := filepath.Join(c.Dir, fmt.Sprintf("replica-%d.yaml", i))
	if err := os.WriteFile(path, b, 0o600); err != nil {
		return nil, fmt.Errorf("cannot write replica config: %w", err)
	}
	return &Sim{Config: cfg, index: i, bin: bin, path: path, level: c.LogLevel, http: client}, nil
}

// Addr is the replica's HTTP address, ip:port.
func (s *Sim) Addr() string { return s.Config.Listen }

// URL is the replica's base URL.
func (s *Sim) URL() string { return "http://" + s.Config.Listen }

// Endpoint describes the replica as the EPP discovers it.
func (s *Sim) Endpoint() endpoint.Endpoint {
	return endpoint.Endpoint{Addr: s.Addr(), Model: s.Config.Model, Engine: s.Config.Engine.Flavour, MetricsURL: s.URL() + "/metrics",
		KVEvents: s.Config.KVEvents.Endpoint, KVReplay: s.Config.KVEvents.ReplayEndpoint}
}

// Start runs the process (again) and waits until it answers /health.
func (s *Sim) Start(ctx context.Context) error {
	if s.proc != nil {
		select {
		case <-s.proc.exited: // ended on its own: start it again
		default:
			return nil
		}
	}
	p, err := startChild(s.bin, []string{"-config", s.path, "-log-level", s.level}, io.Discard, os.Stderr)
	if err != nil {
		return fmt.Errorf("cannot start enginesim %d: %w", s.index, err)
	}
	s.proc = p
	err = poll(ctx, 15*time.Second, p.running, func() (bool, string) {
		_, err := loopback.Get(ctx, s.http, s.URL()+"/health")
		return err == nil, "not healthy"
	})
	if err != nil {
		return fmt.Errorf("enginesim %d: %w", s.index, err)
	}
	return nil
}

// Kill ends the process with SIGKILL, as a crash: no clean shutdown.
func (s *Sim) Kill() error {
	if s.proc == nil {
		return nil
	}
	if err := s.proc.kill(); err != nil {
		return fmt.Errorf("cannot kill enginesim %d: %w", s.index, err)
	}
	s.proc = nil
	return nil
}

// Stop ends the process with SIGTERM, killing it after 10 s.
func (s *Sim) Stop() error {
	p := s.proc
	if p == nil {
		return nil
	}
	s.proc = nil
	s.http.CloseIdleConnections()
	if p.stop(10 * time.Second) {
		return fmt.Errorf("enginesim %d did not stop in 10s: killed", s.index)
	}
	if err := p.waitErr(); err != nil {
		return fmt.Errorf("enginesim %d: %w", s.index, err)
	}
	return nil
}

// StopSims stops every process, in order.
func StopSims(sims []*Sim) error {
	var errs []error
	for _, s := range sims {
		errs = append(errs, s.Stop())
	}
	return errors.Join(errs...)
}

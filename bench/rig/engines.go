package rig

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/omnious/provider-node/bench/internal/launch"
	"github.com/omnious/provider-node/bench/internal/loopback"
	"github.com/omnious/provider-node/discovery"
	"github.com/omnious/provider-node/endpoint"
	"github.com/omnious/provider-node/engines/metrics"
)

// ExternalScrapeTimeout is EngineOptions.ScrapeTimeout's default: the
// bench's EPPs' bound on one scrape of a running engine. The simulated
// fleets' (ScrapeInterval, 250 ms) is too short for a CPU vLLM under
// load: it answered /metrics more slowly, its breaker opened and the EPP
// counted no healthy replica mid-calibration. e2e/vllm scrapes with 2 s.
const ExternalScrapeTimeout = 2 * time.Second

// TokenizerNone is EngineOptions.Tokenizer for no tokenizer: the EPPs
// route running engines in approximate mode.
const TokenizerNone = "none"

// EngineOptions are what the bench's EPPs are told of a fleet of running
// engines (mode urls) beyond each endpoint's addresses, as an operator
// configures a real EPP. Resolve fills what is left out from the engines.
type EngineOptions struct {
	// BlockSize is the engines' KV block size in tokens, which the EPPs
	// key prompts with (scheduler block_size). 0 (default): each
	// engine's cache_config_info metric (vLLM's block_size label,
	// SGLang's page_size); engines that disagree are refused, and
	// engines that report none leave the scheduler's default (16).
	BlockSize int
	// Tokenizer is how the EPPs get exact prompt tokens: a directory with
	// the served model's tokenizer.json (and its tokenizer_config.json's
	// chat template), which makes the precise policy precise; "standin":
	// the engine simulator's (exact for enginesim only); "" or
	// TokenizerNone (default): none, prompts are routed in approximate
	// mode.
	Tokenizer string
	// ScrapeTimeout bounds the EPPs' scrape of one engine. Default
	// ExternalScrapeTimeout.
	ScrapeTimeout time.Duration
}

// WithDefaults fills the defaults that need no engine.
func (e EngineOptions) WithDefaults() EngineOptions {
	def(&e.ScrapeTimeout, ExternalScrapeTimeout)
	def(&e.Tokenizer, TokenizerNone)
	return e
}

// Validate reports every problem with defaulted options.
func (e EngineOptions) Validate() error {
	var errs []error
	if e.BlockSize < 0 || e.BlockSize > 4096 {
		errs = append(errs, fmt.Errorf("engine block size %d: want 1..4096, or 0 to read it from the engines", e.BlockSize))
	}
	if e.ScrapeTimeout <= 0 {
		errs = append(errs, fmt.Errorf("scrape timeout %v: want > 0", e.ScrapeTimeout))
	}
	if e.Tokenizer != TokenizerNone && e.Tokenizer != launch.TokenizerStandIn {
		if _, err := os.Stat(filepath.Join(e.Tokenizer, "tokenizer.json")); err != nil {
			errs = append(errs, fmt.Errorf("tokenizer %q: want none, standin or a directory with the model's tokenizer.json: %w", e.Tokenizer, err))
		}
	}
	return errors.Join(errs...)
}

// Resolve is e defaulted, with the block size read from the fleet's
// engines when it is not given (TestURLFleetRoutesPrecise).
func (e EngineOptions) Resolve(ctx context.Context, fleet []endpoint.Endpoint) (EngineOptions, error) {
	e = e.WithDefaults()
	if err := e.Validate(); err != nil {
		return e, err
	}
	if e.BlockSize != 0 {
		return e, nil
	}
	client := loopback.Client(e.ScrapeTimeout)
	defer client.CloseIdleConnections()
	from := ""
	for _, ep := range fleet {
		if ep.MetricsURL == "" {
			continue
		}
		body, err := loopback.Get(ctx, client, ep.MetricsURL)
		if err != nil {
			return e, fmt.Errorf("cannot read the block size of %s (pass it): %w", ep.Addr, err)
		}
		var s metrics.Signals
		if err := metrics.Parse(body, &s); err != nil || s.Has&metrics.HasCacheConfig == 0 || s.BlockSize <= 0 {
			continue
		}
		switch {
		case e.BlockSize == 0:
			e.BlockSize, from = s.BlockSize, ep.Addr
		case s.BlockSize != e.BlockSize:
			return e, fmt.Errorf("engines disagree on the KV block size: %s reports %d, %s %d; one EPP keys prompts with one block size",
				from, e.BlockSize, ep.Addr, s.BlockSize)
		}
	}
	return e, nil
}

// readEndpointsFile reads the EPP's static endpoint file (discovery's
// format) as a fleet of running engines; every address, KV-event
// endpoint included, must be on loopback.
func readEndpointsFile(path string) ([]endpoint.Endpoint, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("cannot read the endpoint file: %w", err)
	}
	eps, err := discovery.ParseFile(data)
	if err != nil {
		return nil, fmt.Errorf("endpoint file %s: %w", path, err)
	}
	if len(eps) == 0 {
		return nil, fmt.Errorf("endpoint file %s lists no endpoint", path)
	}
	for _, ep := range eps {
		for _, a := range []string{ep.Addr, strings.TrimPrefix(ep.KVEvents, "tcp://"), strings.TrimPrefix(ep.KVReplay, "tcp://")} {
			if a == "" {
				continue
			}
			host, _, err := net.SplitHostPort(a)
			if err != nil || !isLoopbackHost(host) {
				return nil, fmt.Errorf("endpoint file %s: %s is not on loopback", path, a)
			}
		}
		if ep.KVConnect {
			return nil, fmt.Errorf("endpoint file %s: %s: kv_events_connect needs the EPP's ingest bind, which the bench's EPPs do not open; give the engine's kv_events_port", path, ep.Addr)
		}
	}
	return eps, nil
}

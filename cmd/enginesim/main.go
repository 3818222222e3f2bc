// Command enginesim runs a simulated vLLM or SGLang replica (one process, one
// or more data-parallel ranks): the OpenAI API, a prefix-caching KV cache
// with continuous-batching timing, real metric names and the real KV-event
// wire format. See engines/sim for the configuration.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"github.com/omnious/provider-node/engines/sim"
	"github.com/omnious/provider-node/internal/cli"
)

func main() {
	if err := run(os.Args[1:]); cli.Failed(err) {
		fmt.Fprintln(os.Stderr, "enginesim:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	// The config file is read first so that flags, whose defaults are the
	// file's values, override only what they set.
	var c sim.Config
	configPath := cli.ConfigFlag(args)
	if configPath != "" {
		var err error
		if c, err = sim.LoadConfig(configPath); err != nil {
			return err
		}
	}
	fs, f := newFlags(&c, configPath)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := cli.NonNegative(fs); err != nil {
		return err
	}
	logLevel, flavour, noEvents := f.logLevel, f.flavour, f.noEvents
	c.Engine.Flavour = *flavour
	if *noEvents {
		off := false
		c.KVEvents.Enabled = &off
	}
	c = c.WithDefaults()
	if err := c.Validate(); err != nil {
		return fmt.Errorf("invalid configuration: %w", err)
	}
	log, err := cli.NewLogger(*logLevel)
	if err != nil {
		return err
	}
	defer func() { _ = log.Sync() }()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	replicas := make([]*sim.Replica, 0, c.DataParallelSize)
	for rank := 0; rank < c.DataParallelSize; rank++ {
		r, err := sim.NewReplica(c, rank, log)
		if err != nil {
			stop()
			return errors.Join(fmt.Errorf("rank %d: %w", rank, err), runAll(ctx, replicas))
		}
		replicas = append(replicas, r)
	}
	return runAll(ctx, replicas)
}

// flagValues are the flags that are not fields of sim.Config.
type flagValues struct {
	logLevel, flavour *string
	noEvents          *bool
}

// newFlags defines enginesim's flags over c, their defaults its values
// (the config file's; zero ones take the defaults after parsing).
func newFlags(c *sim.Config, configPath string) (*flag.FlagSet, flagValues) {
	fs := flag.NewFlagSet("enginesim", flag.ContinueOnError)
	var f flagValues
	fs.String("config", configPath, "YAML config file (flags override it)")
	f.logLevel = fs.String("log-level", "info", "debug, info, warn or error")
	fs.StringVar(&c.Listen, "listen", c.Listen, "HTTP address of rank 0 (default 127.0.0.1:8000)")
	fs.StringVar(&c.Model, "model", c.Model, "served model name (default Qwen/Qwen3-32B)")
	fs.IntVar(&c.MaxModelLen, "max-model-len", c.MaxModelLen, "maximum prompt+output tokens (0: the default, 40960)")
	fs.IntVar(&c.DataParallelSize, "data-parallel-size", c.DataParallelSize, "ranks on consecutive ports (0: the default, 1)")
	fs.Int64Var(&c.Seed, "seed", c.Seed, "seed for deterministic outputs (0: a seed like any other; negative: a seed too)")
	f.flavour = fs.String("engine", c.Engine.Flavour, "engine flavour: vllm or sglang (default vllm)")
	fs.IntVar(&c.Engine.BlockSize, "block-size", c.Engine.BlockSize, "KV block (SGLang: page) size in tokens (0: the default, 16)")
	fs.IntVar(&c.Engine.NumGPUBlocks, "num-gpu-blocks", c.Engine.NumGPUBlocks, "KV blocks on the GPU tier (0: the default, 281600 tokens' worth)")
	fs.IntVar(&c.Engine.NumCPUBlocks, "num-cpu-blocks", c.Engine.NumCPUBlocks, "KV blocks on the CPU tier (0: no CPU tier)")
	fs.IntVar(&c.Engine.MaxNumBatchedTokens, "max-num-batched-tokens", c.Engine.MaxNumBatchedTokens, "token budget per step (0: the default, 8192)")
	fs.IntVar(&c.Engine.MaxNumSeqs, "max-num-seqs", c.Engine.MaxNumSeqs, "maximum running requests (0: the default, 256)")
	fs.Float64Var(&c.Engine.TimeScale, "time-scale", c.Engine.TimeScale, "run this many times faster than real time (0: the default, 1)")
	fs.StringVar(&c.KVEvents.Endpoint, "kv-events-endpoint", c.KVEvents.Endpoint, "ZMQ PUB endpoint of rank 0 (default tcp://127.0.0.1:5557)")
	fs.StringVar(&c.KVEvents.ReplayEndpoint, "kv-events-replay-endpoint", c.KVEvents.ReplayEndpoint, "ZMQ ROUTER replay endpoint of rank 0 (default off)")
	fs.StringVar(&c.KVEvents.Topic, "kv-events-topic", c.KVEvents.Topic, "ZMQ topic (default \"\")")
	fs.BoolVar(&c.KVEvents.Connect, "kv-events-connect", c.KVEvents.Connect, "connect the PUB socket to -kv-events-endpoint (a router's bound socket) instead of binding it")
	fs.StringVar(&c.KVEvents.Format, "kv-events-format", c.KVEvents.Format, "event encoding: map (vLLM), array (vLLM legacy), sglang (SGLang 0.5.23 maps) or sglang-array (SGLang 0.4.8 to 0.5.16)")
	fs.StringVar(&c.KVEvents.Hashes, "kv-events-hashes", c.KVEvents.Hashes, "block hash encoding: uint64, int64 or bytes")
	f.noEvents = fs.Bool("no-kv-events", false, "do not publish KV events")
	fs.Float64Var(&c.Faults.ErrorRate, "error-rate", c.Faults.ErrorRate, "share of requests answered with an injected error, 0..1 (0: none)")
	fs.IntVar(&c.Faults.ErrorStatus, "error-status", c.Faults.ErrorStatus, "HTTP status of injected errors (0: the default, 500)")
	fs.DurationVar(&c.Faults.Latency, "added-latency", c.Faults.Latency, "latency added before each request (0s: none)")
	fs.BoolVar(&c.Faults.RejectAutoToolChoice, "reject-auto-tool-choice", c.Faults.RejectAutoToolChoice, "answer tool_choice auto with vLLM's 400")
	return fs, f
}

func runAll(ctx context.Context, replicas []*sim.Replica) error {
	var wg sync.WaitGroup
	errs := make([]error, len(replicas))
	for i, r := range replicas {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = r.Run(ctx) }()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// Command epp is the EndpointPicker: an Envoy ext_proc v3 server that picks
// the vLLM or SGLang replica for each OpenAI request from a KV-block index
// fed by the engines' KV events, their metrics and flow control. It runs as
// an InferencePool's endpoint picker (--pool-name) or next to Envoy on bare
// metal (--endpoints-file). Configuration: a YAML file (--config) with flags
// on top; see epp.Config and deploy/README.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/go-logr/zapr"
	"go.uber.org/zap"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/omnious/provider-node/discovery"
	"github.com/omnious/provider-node/epp"
	"github.com/omnious/provider-node/internal/cli"
	"github.com/omnious/provider-node/rules"
)

func main() {
	if err := run(os.Args[1:]); cli.Failed(err) {
		fmt.Fprintln(os.Stderr, "epp:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	// The config file is read first, so flags (whose defaults are the
	// file's values) override only what they set.
	cfg, err := epp.Load(cli.ConfigFlag(args))
	if err != nil {
		return err
	}
	fs, f := newFlags(&cfg)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := cli.NonNegative(fs); err != nil {
		return err
	}
	// A flag set to 0 asks for the default, as a zero in the file does.
	cfg = cfg.WithDefaults()
	peers, tokenizers, logLevel, kubeconfig := f.peers, f.tokenizers, f.logLevel, f.kubeconfig
	cfg.WarmStart.Peers = nil
	for _, p := range strings.Split(*peers, ",") {
		if p = strings.TrimSpace(p); p != "" {
			cfg.WarmStart.Peers = append(cfg.WarmStart.Peers, p)
		}
	}
	if *tokenizers != "" {
		cfg.Tokenizers = map[string]string{}
		for _, kv := range strings.Split(*tokenizers, ",") {
			model, dir, ok := strings.Cut(kv, "=")
			if !ok || model == "" || dir == "" {
				return fmt.Errorf("-tokenizers: %q is not model=dir", kv)
			}
			cfg.Tokenizers[model] = dir
		}
	}
	if err := cfg.Validate(); err != nil {
		return err
	}
	log, err := cli.NewLogger(*logLevel)
	if err != nil {
		return err
	}
	defer func() { _ = log.Sync() }()

	rs, err := epp.NewRules(cfg)
	if err != nil {
		return err
	}
	src, err := source(cfg, rs, *kubeconfig, log)
	if err != nil {
		return err
	}
	e, err := epp.New(cfg, src, log, epp.WithRules(rs))
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return e.Run(ctx)
}

// flagValues are the flags that are not fields of epp.Config.
type flagValues struct {
	logLevel, kubeconfig, tokenizers, peers *string
}

// newFlags defines epp's flags over cfg, their defaults its values (the
// config file's, defaulted).
func newFlags(cfg *epp.Config) (*flag.FlagSet, flagValues) {
	fs := flag.NewFlagSet("epp", flag.ContinueOnError)
	var f flagValues
	fs.String("config", "", "YAML config file; flags override it")
	f.logLevel = fs.String("log-level", "info", "debug, info, warn or error")
	fs.StringVar(&cfg.GRPCAddr, "grpc-addr", cfg.GRPCAddr, "ext_proc gRPC address (also serves gRPC health)")
	fs.StringVar(&cfg.HealthAddr, "health-addr", cfg.HealthAddr, "gRPC health address for probes")
	fs.StringVar(&cfg.MetricsAddr, "metrics-addr", cfg.MetricsAddr, "Prometheus /metrics address")
	fs.StringVar(&cfg.AdminAddr, "admin-addr", cfg.AdminAddr, "admin address: pprof, /debug/*, /v1/capacity (keep private)")
	fs.StringVar(&cfg.Admin.TokenFile, "admin-token-file", cfg.Admin.TokenFile, "file holding the bearer token every admin request must carry (empty: none)")
	fs.StringVar(&cfg.Admin.CertFile, "admin-tls-cert-file", cfg.Admin.CertFile, "TLS certificate of the admin port, also presented to siblings (empty: plain HTTP)")
	fs.StringVar(&cfg.Admin.KeyFile, "admin-tls-key-file", cfg.Admin.KeyFile, "TLS key of the admin port")
	fs.StringVar(&cfg.Admin.ClientCAFile, "admin-client-ca-file", cfg.Admin.ClientCAFile, "CA admin clients' certificates must be signed by (mutual TLS; empty: none)")
	fs.StringVar(&cfg.Admin.ServerName, "admin-server-name", cfg.Admin.ServerName, "name verified in a sibling's admin certificate (empty: the address dialed)")
	fs.BoolVar(&cfg.Admin.Unauthenticated, "admin-unauthenticated", cfg.Admin.Unauthenticated, "serve an admin port off loopback without authentication (anyone reaching it reads the index's prompts)")
	fs.BoolVar(&cfg.ExtProc.GatewayHeaders, "gateway-headers", cfg.ExtProc.GatewayHeaders,
		"take the band and tenant only from the gateway's omnious.gateway ext_proc metadata, never from request headers; a client's session key is scoped to that tenant")
	fs.StringVar(&cfg.ExtProc.CalibrationTokenFile, "calibration-token-file", cfg.ExtProc.CalibrationTokenFile,
		"file holding the secret x-omnious-calibration-token must carry to mark calibration (empty: x-omnious-calibration: 1 marks it)")
	fs.StringVar(&cfg.TLSCertFile, "tls-cert-file", cfg.TLSCertFile, "TLS certificate for the gRPC port")
	fs.StringVar(&cfg.TLSKeyFile, "tls-key-file", cfg.TLSKeyFile, "TLS key for the gRPC port")
	fs.DurationVar(cfg.DrainDelay, "drain-delay", *cfg.DrainDelay, "on SIGTERM, how long new streams are still served after health turns NOT_SERVING (0s: stop at once)")
	fs.DurationVar(cfg.DrainTimeout, "drain-timeout", *cfg.DrainTimeout, "graceful drain on SIGTERM: how long open streams get to finish (0s: close them at once)")
	fs.StringVar(&cfg.EndpointsFile, "endpoints-file", cfg.EndpointsFile, "static endpoint file (bare metal), hot-reloaded")
	fs.StringVar(&cfg.PoolName, "pool-name", cfg.PoolName, "InferencePool to serve (Kubernetes)")
	fs.StringVar(&cfg.PoolNamespace, "pool-namespace", cfg.PoolNamespace, "namespace of the InferencePool")
	f.kubeconfig = fs.String("kubeconfig", "", "kubeconfig file outside a cluster (default: in-cluster service account)")
	fs.BoolVar(&cfg.StandInTokenizer, "standin-tokenizer", cfg.StandInTokenizer, "tokenize as enginesim does (simulated fleets only)")
	f.tokenizers = fs.String("tokenizers", "", "model=dir[,model=dir...]: tokenizer.json directories for exact prompt tokens")
	fs.StringVar(&cfg.Scheduler.Policy, "policy", cfg.Scheduler.Policy, "precise, approximate, random, round-robin, least-queue or agent")
	fs.IntVar(&cfg.Scheduler.BlockSize, "block-size", cfg.Scheduler.BlockSize, "engines' KV block size in tokens (0: the default, 16)")
	fs.Int64Var(&cfg.Index.MemoryBudget, "index-memory-budget", cfg.Index.MemoryBudget, "KV index memory budget in bytes (0: 256 MiB)")
	f.peers = fs.String("peers", strings.Join(cfg.WarmStart.Peers, ","), "host:port[,host:port...]: sibling EPPs' admin addresses to take the KV index from at start")
	fs.StringVar(&cfg.WarmStart.PeerService, "peer-service", cfg.WarmStart.PeerService,
		"host:port of the EPPs' headless Service (admin port): its addresses are the siblings to take the KV index from at start")
	fs.StringVar(&cfg.Ingest.Bind, "kv-events-bind", cfg.Ingest.Bind, "ZMQ endpoint to bind for engines that publish KV events by connecting (tcp://*:5557)")
	fs.IntVar(&cfg.ExtProc.MaxRecvMsgSize, "grpc-max-recv-msg-size", cfg.ExtProc.MaxRecvMsgSize, "largest gRPC message accepted (0: the default, 64 MiB)")
	fs.DurationVar(&cfg.ExtProc.RequestIdleTimeout, "request-idle-timeout", cfg.ExtProc.RequestIdleTimeout,
		"close an ext_proc stream (408) when the proxy sends nothing for this long while the request is gathered (0: the default, 30s; negative: never)")
	fs.DurationVar(&cfg.ExtProc.ResponseIdleTimeout, "response-idle-timeout", cfg.ExtProc.ResponseIdleTimeout,
		"close an ext_proc stream when the proxy sends nothing for this long after routing (0: the default, 1h; negative: never)")
	fs.StringVar(&cfg.Tracing.OTLPEndpoint, "otlp-endpoint", cfg.Tracing.OTLPEndpoint,
		"OTLP/gRPC collector host:port: a span per request, carried to the engine in traceparent (empty: no tracing)")
	fs.BoolVar(&cfg.Tracing.Insecure, "otlp-insecure", cfg.Tracing.Insecure, "send spans to the collector without TLS")
	fs.Float64Var(cfg.Tracing.SampleRatio, "trace-sample-ratio", *cfg.Tracing.SampleRatio,
		"share of traces started by the EPP that are recorded, 0..1; a client's sampled trace is always followed (0: only those)")
	return fs, f
}

// source picks the discovery source the config names; it feeds rs the
// model rules it finds (the endpoint file's, or the API server's CRDs).
func source(cfg epp.Config, rs *rules.Store, kubeconfig string, log *zap.Logger) (discovery.Source, error) {
	switch {
	case cfg.EndpointsFile != "" && cfg.PoolName != "":
		return nil, errors.New("-endpoints-file and -pool-name exclude each other")
	case cfg.EndpointsFile != "":
		return discovery.NewFile(discovery.FileConfig{Path: cfg.EndpointsFile, Rules: rs}, log.Named("discovery"))
	case cfg.PoolName != "":
		rc, err := kubeConfig(kubeconfig)
		if err != nil {
			return nil, err
		}
		// client-go logs through klog (reflector and watch errors); send
		// them to the same structured log instead of klog's stderr format.
		klog.SetLogger(zapr.NewLogger(log.Named("client-go")))
		return discovery.NewPoolForConfig(discovery.PoolConfig{Name: cfg.PoolName, Namespace: cfg.PoolNamespace, Rules: rs}, rc, log.Named("discovery"))
	}
	return nil, errors.New("one of -endpoints-file and -pool-name is required")
}

// kubeConfig is the in-cluster config, or the kubeconfig file when given.
func kubeConfig(path string) (*rest.Config, error) {
	if path != "" {
		rc, err := clientcmd.BuildConfigFromFlags("", path)
		if err != nil {
			return nil, fmt.Errorf("cannot load kubeconfig %s: %w", path, err)
		}
		return rc, nil
	}
	rc, err := rest.InClusterConfig()
	if err != nil {
		return nil, fmt.Errorf("not in a cluster (use -kubeconfig): %w", err)
	}
	return rc, nil
}

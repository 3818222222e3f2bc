// Command quoter signs, verifies and publishes Omnious capacity quotes, runs
// the serving-path conformance suite, and resolves tool-call parser
// profiles for the installer.
//
//	quoter sign --once [flags]         print one signed quote
//	quoter verify [flags] FILE         verify a quote ("-" reads stdin)
//	quoter run [flags]                 the quote loop with /v1/quote, /metrics, /healthz
//	quoter conformance --url URL --model ID [--quick] [--json]
//	quoter calibrate --url URL --model ID --capacity-url URL (--out FILE | --configmap NAME)
//	                                   measure the fleet's latency against load into a calibration
//	quoter tool-profile [flags]        resolve TOOL_PROFILE for MODEL_ID
//	quoter tool-profiles-json [--check] regenerate deploy/config/omnious-model-tool-profiles.json
//
// Keys are read from files only (--key-file, or --keystore-file with
// --password-file); key material is never accepted on the command line
// and never printed or logged.
package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/omnious/provider-node/capacity"
	"github.com/omnious/provider-node/internal/adminauth"
	"github.com/omnious/provider-node/internal/opt"
	"github.com/omnious/provider-node/quoter"
	"github.com/omnious/provider-node/quoter/conformance"
	"github.com/omnious/provider-node/quoter/toolprofile"
)

const (
	exitOK    = 0
	exitFail  = 1
	exitUsage = 2
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

const usage = `usage: quoter <command> [flags]

commands:
  sign --once          sign one quote and print it
  verify FILE          verify a quote (signature, signer, expiry, skew)
  run                  sign every refresh, publish, serve /v1/quote /metrics /healthz
  conformance          check a serving URL (--url URL --model ID)
  calibrate            drive a serving URL up a concurrency ladder to its latency
                       objectives; write the calibration (--out FILE | --configmap NAME)
  headroom             read the EPP's capacity (--capacity-url) or a saved snapshot
                       (--snapshot FILE) at the objectives: what a quote would offer, and why
  tool-profile         resolve the tool-call parser (TOOL_PROFILE, MODEL_ID, ENGINE)
  tool-profiles-json   regenerate the tool contract JSON from tool-profiles.tsv

run "quoter <command> -h" for its flags.
`

// run is main without process globals, so tests can capture every byte
// the command writes.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return exitUsage
	}
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "sign":
		return cmdSign(ctx, rest, stdout, stderr)
	case "verify":
		return cmdVerify(rest, stdout, stderr)
	case "run":
		return cmdRun(ctx, rest, stderr)
	case "conformance":
		return cmdConformance(ctx, rest, stdout, stderr)
	case "calibrate":
		return cmdCalibrate(ctx, rest, stdout, stderr)
	case "headroom":
		return cmdHeadroom(ctx, rest, stdout, stderr)
	case "tool-profile":
		return cmdToolProfile(rest, stdout, stderr)
	case "tool-profiles-json":
		return cmdToolProfilesJSON(rest, stdout, stderr)
	case "-h", "--help", "help":
		fmt.Fprint(stdout, usage)
		return exitOK
	}
	fmt.Fprintf(stderr, "quoter: unknown command %q\n\n%s", cmd, usage)
	return exitUsage
}

// printJSON writes v indented to stdout: exitOK, or exitFail with the
// error on stderr after cmd.
func printJSON(stdout, stderr io.Writer, cmd string, v any) int {
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", cmd, err)
		return exitFail
	}
	return exitOK
}

func env(name, def string) string {
	if v, ok := os.LookupEnv(name); ok && v != "" {
		return v
	}
	return def
}

// envDuration is the duration in the environment variable name, or def
// when it is unset or empty. One that does not parse is def here and an
// error of envDurationErrors, which the commands check with their flags.
func envDuration(name string, def time.Duration) time.Duration {
	if v := os.Getenv(name); v != "" {
		if d, err := time.ParseDuration(v); err == nil {
			return d
		}
	}
	return def
}

// durationEnv are the environment variables the commands read as
// durations.
var durationEnv = []string{"SLO_TTFT_P95", "SLO_ITL_P95", "QUOTER_REFRESH", "QUOTER_TTL", "QUOTER_CANARY_INTERVAL", "QUOTER_MAX_SNAPSHOT_AGE"}

// envDurationErrors refuses each set durationEnv variable that is not a
// duration, rather than leaving its flag at the default.
func envDurationErrors() error {
	var errs []error
	for _, name := range durationEnv {
		if v := os.Getenv(name); v != "" {
			if _, err := time.ParseDuration(v); err != nil {
				errs = append(errs, fmt.Errorf("%s %q is not a duration such as 10s", name, v))
			}
		}
	}
	return errors.Join(errs...)
}

// newFlagSet is every command's flag set, writing its errors and help to
// stderr. Tests replace it to see each command's flags (TestFlagsNegative).
var newFlagSet = func(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	return fs
}

func newLogger(w io.Writer, level string) (*zap.Logger, error) {
	lvl, err := zapcore.ParseLevel(level)
	if err != nil {
		return nil, fmt.Errorf("bad log level %q: %w", level, err)
	}
	enc := zap.NewProductionEncoderConfig()
	enc.EncodeTime = zapcore.ISO8601TimeEncoder
	core := zapcore.NewCore(zapcore.NewJSONEncoder(enc), zapcore.AddSync(w), lvl)
	return zap.New(core), nil
}

// serviceFlags are shared by sign and run. Each defaults to the installer's
// environment variable; secrets are file paths only.
type serviceFlags struct {
	providerID, model, modelClass, servingURL, marketURL string
	floorIn, floorOut, chainID, stateFile                string
	keyFile, keystoreFile, passwordFile                  string
	refresh, ttl, canaryInterval, maxSnapshotAge         time.Duration
	logLevel                                             string
	capacityFlags
}

// capacityFlags are what a quote's headroom is read from: the EPP's
// capacity, the objectives and the calibration. sign, run and headroom
// share them, so they read the same environment.
type capacityFlags struct {
	capacityURL, calibrationFile string
	// admin are the credentials the EPP's admin port asks for.
	admin           adminauth.Client
	sloTTFT, sloITL time.Duration
}

func (f *capacityFlags) register(fs *flag.FlagSet, def quoter.Config) {
	fs.StringVar(&f.capacityURL, "capacity-url", env("EPP_ADMIN_URL", ""), "EPP admin base URL serving /v1/capacity (env EPP_ADMIN_URL)")
	registerAdmin(fs, &f.admin)
	fs.DurationVar(&f.sloTTFT, "slo-ttft-p95", envDuration("SLO_TTFT_P95", def.Objectives.TTFT), "objective for the 95th percentile of time to first token (env SLO_TTFT_P95; 0: the default)")
	fs.DurationVar(&f.sloITL, "slo-itl-p95", envDuration("SLO_ITL_P95", def.Objectives.ITL), "objective for the 95th percentile of inter-token latency (env SLO_ITL_P95; 0: the default)")
	fs.StringVar(&f.calibrationFile, "calibration-file", env("QUOTER_CALIBRATION_FILE", ""), "quoter calibrate output to quote an idle pool from (env QUOTER_CALIBRATION_FILE)")
}

// registerAdmin defines the flags of the EPP admin port's credentials:
// files only, so no secret is in argv or the environment.
func registerAdmin(fs *flag.FlagSet, c *adminauth.Client) {
	fs.StringVar(&c.TokenFile, "capacity-token-file", env("EPP_ADMIN_TOKEN_FILE", ""), "file holding the EPP admin port's bearer token (env EPP_ADMIN_TOKEN_FILE; empty: none)")
	fs.StringVar(&c.CAFile, "capacity-ca-file", env("EPP_ADMIN_CA_FILE", ""), "CA verifying the EPP admin port's certificate (env EPP_ADMIN_CA_FILE; empty: system roots)")
	fs.StringVar(&c.CertFile, "capacity-cert-file", env("EPP_ADMIN_CERT_FILE", ""), "client certificate for the EPP admin port (env EPP_ADMIN_CERT_FILE; empty: none)")
	fs.StringVar(&c.KeyFile, "capacity-key-file", env("EPP_ADMIN_KEY_FILE", ""), "client key for the EPP admin port (env EPP_ADMIN_KEY_FILE)")
	fs.StringVar(&c.ServerName, "capacity-server-name", env("EPP_ADMIN_SERVER_NAME", ""), "name verified in the EPP admin port's certificate (env EPP_ADMIN_SERVER_NAME; empty: the URL's host)")
}

// adminClient is the HTTP client reading the EPP's admin port with c's
// credentials.
func adminClient(c adminauth.Client, timeout time.Duration) (*http.Client, error) {
	rt, err := c.Transport(nil)
	if err != nil {
		return nil, fmt.Errorf("EPP admin credentials: %w", err)
	}
	return &http.Client{Transport: rt, Timeout: timeout}, nil
}

// objectives are the flags' objectives, zero fields to be defaulted.
func (f *capacityFlags) objectives() capacity.Objectives {
	return capacity.Objectives{TTFT: f.sloTTFT, ITL: f.sloITL}
}

func (f *serviceFlags) register(fs *flag.FlagSet) {
	// The durations' defaults are the service's own, so there is one place
	// they are set.
	def := quoter.Config{}.WithDefaults()
	fs.StringVar(&f.providerID, "provider-id", env("PROVIDER_ID", ""), "market provider id (env PROVIDER_ID)")
	fs.StringVar(&f.model, "model", env("MODEL_ID", ""), "served model id (env MODEL_ID)")
	fs.StringVar(&f.modelClass, "model-class", env("MODEL_CLASS", ""), "market model class (env MODEL_CLASS)")
	fs.StringVar(&f.servingURL, "serving-url", env("SERVING_URL", ""), "exact public serving URL; hashed into endpointHash (env SERVING_URL)")
	f.capacityFlags.register(fs, def)
	fs.StringVar(&f.marketURL, "market-url", env("MARKET_URL", ""), "URL quotes are POSTed to (env MARKET_URL; empty = serve only)")
	fs.StringVar(&f.floorIn, "floor-in", env("FLOOR_IN", ""), "input price floor, integer micro-units per million tokens (env FLOOR_IN)")
	fs.StringVar(&f.floorOut, "floor-out", env("FLOOR_OUT", ""), "output price floor, integer micro-units per million tokens (env FLOOR_OUT)")
	fs.StringVar(&f.chainID, "chain-id", env("CHAIN_ID", def.ChainID.String()), "EIP-712 domain chainId (env CHAIN_ID)")
	fs.StringVar(&f.stateFile, "state-file", env("QUOTER_STATE_FILE", "/var/lib/omnious-quoter/state.json"), "sequence state file (env QUOTER_STATE_FILE)")
	fs.StringVar(&f.keyFile, "key-file", env("QUOTER_KEY_FILE", ""), "PATH of a hex private key file, mode 0600/0400 (env QUOTER_KEY_FILE)")
	fs.StringVar(&f.keystoreFile, "keystore-file", env("QUOTER_KEYSTORE_FILE", ""), "PATH of a keystore JSON file (env QUOTER_KEYSTORE_FILE)")
	fs.StringVar(&f.passwordFile, "password-file", env("QUOTER_PASSWORD_FILE", ""), "PATH of the keystore password file (env QUOTER_PASSWORD_FILE)")
	fs.DurationVar(&f.refresh, "refresh", envDuration("QUOTER_REFRESH", def.Refresh), "signing interval (env QUOTER_REFRESH; 0: the default)")
	fs.DurationVar(&f.ttl, "ttl", envDuration("QUOTER_TTL", def.TTL), "quote validity, whole seconds (env QUOTER_TTL; 0: the default)")
	fs.DurationVar(&f.canaryInterval, "canary-interval", envDuration("QUOTER_CANARY_INTERVAL", def.CanaryInterval),
		"canary probe interval while healthy (env QUOTER_CANARY_INTERVAL; 0: the default)")
	fs.DurationVar(&f.maxSnapshotAge, "max-snapshot-age", envDuration("QUOTER_MAX_SNAPSHOT_AGE", def.MaxSnapshotAge),
		"oldest trusted capacity snapshot (env QUOTER_MAX_SNAPSHOT_AGE; 0: the default)")
	fs.StringVar(&f.logLevel, "log-level", env("LOG_LEVEL", "info"), "debug, info, warn or error")
}

func parseUint256(name, s string) (*big.Int, error) {
	v, ok := new(big.Int).SetString(strings.TrimSpace(s), 10)
	if !ok || v.Sign() < 0 || v.BitLen() > 256 {
		return nil, fmt.Errorf("%s %q is not a non-negative decimal integer", name, s)
	}
	return v, nil
}

// config is the flags' config, and the errors of the flags that do not
// parse (their fields left nil).
func (f *serviceFlags) config() (quoter.Config, error) {
	var errs []error
	in, err := parseUint256("--floor-in", f.floorIn)
	errs = append(errs, err)
	out, err := parseUint256("--floor-out", f.floorOut)
	errs = append(errs, err)
	chain, err := parseUint256("--chain-id", f.chainID)
	errs = append(errs, err)
	return quoter.Config{ProviderID: f.providerID, Model: f.model, ModelClass: f.modelClass, ServingURL: f.servingURL,
		CapacityURL: f.capacityURL, MarketURL: f.marketURL, FloorIn: in, FloorOut: out, ChainID: chain,
		StateFile: f.stateFile, Refresh: f.refresh, TTL: f.ttl, CanaryInterval: f.canaryInterval,
		MaxSnapshotAge: f.maxSnapshotAge, Objectives: f.objectives(), CalibrationFile: f.calibrationFile}, errors.Join(errs...)
}

// validate refuses what the quote loop's config would: a negative
// duration, a missing setting; before any key is read.
func (f *serviceFlags) validate() error {
	cfg, err := f.config()
	if err != nil {
		// Every other setting is still checked; the ones that did not
		// parse are reported once, as flags.
		zero := new(big.Int)
		cfg.FloorIn, cfg.FloorOut, cfg.ChainID = cmp.Or(cfg.FloorIn, zero), cmp.Or(cfg.FloorOut, zero), cmp.Or(cfg.ChainID, big.NewInt(1))
	}
	return errors.Join(envDurationErrors(), err, cfg.WithDefaults().Validate())
}

func (f *serviceFlags) service(log *zap.Logger, skipConformance bool) (*quoter.Service, error) {
	cfg, err := f.config()
	if err != nil {
		return nil, err
	}
	cfg.SkipConformance = skipConformance
	key, err := quoter.LoadKey(quoter.KeySource{KeyFile: f.keyFile, KeystoreFile: f.keystoreFile, PasswordFile: f.passwordFile})
	if err != nil {
		return nil, err
	}
	hc, err := adminClient(f.admin, 30*time.Second)
	if err != nil {
		return nil, err
	}
	return quoter.New(cfg, key, log, quoter.Options{CapacityHTTP: hc})
}

func cmdSign(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("sign", stderr)
	var f serviceFlags
	f.register(fs)
	once := fs.Bool("once", false, "sign one quote and exit (required)")
	skip := fs.Bool("skip-conformance", false, "skip the conformance gate (offline test vectors only)")
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	if !*once || fs.NArg() > 0 {
		fmt.Fprintln(stderr, "quoter sign: use --once (the loop is `quoter run`)")
		return exitUsage
	}
	if err := f.validate(); err != nil {
		fmt.Fprintln(stderr, "quoter sign:", err)
		return exitUsage
	}
	log, err := newLogger(stderr, f.logLevel)
	if err != nil {
		fmt.Fprintln(stderr, "quoter sign:", err)
		return exitUsage
	}
	defer func() { _ = log.Sync() }()
	svc, err := f.service(log, *skip)
	if err != nil {
		fmt.Fprintln(stderr, "quoter sign:", err)
		return exitFail
	}
	sq, err := svc.SignOnce(ctx)
	if err != nil {
		fmt.Fprintln(stderr, "quoter sign:", err)
		return exitFail
	}
	return printJSON(stdout, stderr, "quoter sign", sq)
}

func cmdVerify(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("verify", stderr)
	maxSkew := fs.Duration("max-skew", 5*time.Second, "how far in the future issuedAt may be (0: the default)")
	maxTTL := fs.Duration("max-ttl", 0, "reject quotes valid longer than this (0: no limit)")
	chainID := fs.String("chain-id", "", "required domain chainId (empty = any)")
	signer := fs.String("signer", "", "required signer address (empty = any)")
	at := fs.String("at", "", "verify as of this RFC 3339 time instead of now")
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	if err := errors.Join(opt.DefaultNonNegative("--max-skew", *maxSkew, 5*time.Second), opt.NonNegative("--max-ttl", *maxTTL)); err != nil {
		fmt.Fprintln(stderr, "quoter verify:", err)
		return exitUsage
	}
	if fs.NArg() != 1 {
		fmt.Fprintln(stderr, "usage: quoter verify [flags] FILE")
		return exitUsage
	}
	opts := quoter.VerifyOptions{MaxSkew: *maxSkew, MaxTTL: *maxTTL}
	if *chainID != "" {
		c, err := parseUint256("--chain-id", *chainID)
		if err != nil {
			fmt.Fprintln(stderr, "quoter verify:", err)
			return exitUsage
		}
		opts.ChainID = c
	}
	if *signer != "" {
		if !common.IsHexAddress(*signer) {
			fmt.Fprintf(stderr, "quoter verify: --signer %q is not an address\n", *signer)
			return exitUsage
		}
		opts.Signer = common.HexToAddress(*signer)
	}
	if *at != "" {
		t, err := time.Parse(time.RFC3339, *at)
		if err != nil {
			fmt.Fprintln(stderr, "quoter verify: --at:", err)
			return exitUsage
		}
		opts.Now = func() time.Time { return t }
	}
	var data []byte
	var err error
	if fs.Arg(0) == "-" {
		data, err = io.ReadAll(io.LimitReader(os.Stdin, 1<<20))
	} else {
		data, err = os.ReadFile(fs.Arg(0))
	}
	if err != nil {
		fmt.Fprintln(stderr, "quoter verify: cannot read quote:", err)
		return exitFail
	}
	sq, err := quoter.ParseSignedQuote(data)
	if err != nil {
		fmt.Fprintln(stderr, "quoter verify: INVALID:", err)
		return exitFail
	}
	v, err := quoter.Verify(sq, opts)
	if err != nil {
		fmt.Fprintln(stderr, "quoter verify: INVALID:", err)
		return exitFail
	}
	fmt.Fprintf(stdout, "VALID signer=%s provider=%s model=%s seq=%d issuedAt=%s expiry=%s\n", v.Signer.Hex(),
		sq.Message.ProviderID, sq.Message.Model, v.Seq, v.IssuedAt.UTC().Format(time.RFC3339), v.Expiry.UTC().Format(time.RFC3339))
	return exitOK
}

func cmdRun(ctx context.Context, args []string, stderr io.Writer) int {
	fs := newFlagSet("run", stderr)
	var f serviceFlags
	f.register(fs)
	listen := fs.String("listen", env("QUOTER_LISTEN", ":9464"), "address serving /v1/quote, /metrics, /healthz")
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	if err := f.validate(); err != nil {
		fmt.Fprintln(stderr, "quoter run:", err)
		return exitUsage
	}
	log, err := newLogger(stderr, f.logLevel)
	if err != nil {
		fmt.Fprintln(stderr, "quoter run:", err)
		return exitUsage
	}
	defer func() { _ = log.Sync() }()
	svc, err := f.service(log, false)
	if err != nil {
		log.Error("cannot start quoter", zap.Error(err))
		return exitFail
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Error("cannot listen", zap.String("addr", *listen), zap.Error(err))
		return exitFail
	}
	srv := &http.Server{Handler: svc.Handler(), ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("HTTP server failed", zap.Error(err))
		}
	}()
	log.Info("serving", zap.String("addr", ln.Addr().String()))
	err = svc.Run(ctx)
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx)
	if err != nil {
		log.Error("quoter stopped", zap.Error(err))
		return exitFail
	}
	return exitOK
}

func cmdConformance(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("conformance", stderr)
	url := fs.String("url", env("SERVING_URL", ""), "exact serving base URL (env SERVING_URL)")
	model := fs.String("model", env("MODEL_ID", ""), "model id (env MODEL_ID)")
	quick := fs.Bool("quick", false, "run the short pre-quote suite only")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	timeout := fs.Duration("timeout", 60*time.Second, "timeout per check (0: the default)")
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	if err := (conformance.Config{CheckTimeout: *timeout}).WithDefaults().Validate(); err != nil {
		fmt.Fprintln(stderr, "quoter conformance:", err)
		return exitUsage
	}
	if *url == "" || *model == "" || fs.NArg() > 0 {
		fmt.Fprintln(stderr, "usage: quoter conformance --url URL --model ID [--quick] [--json]")
		return exitUsage
	}
	suite := conformance.Full
	if *quick {
		suite = conformance.Quick
	}
	rep := conformance.Run(ctx, conformance.Config{URL: *url, Model: *model, CheckTimeout: *timeout}, suite)
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(struct {
			conformance.Report
			Passed bool `json:"passed"`
		}{rep, rep.Passed()})
	} else {
		fmt.Fprint(stdout, rep.String())
	}
	if !rep.Passed() {
		return exitFail
	}
	return exitOK
}

const defaultProfiles = "deploy/config/tool-profiles.tsv"

func cmdToolProfile(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("tool-profile", stderr)
	profiles := fs.String("profiles", env("TOOL_PROFILES_FILE", defaultProfiles), "tool-profiles.tsv path (env TOOL_PROFILES_FILE)")
	mode := fs.String("mode", env("TOOL_PROFILE", toolprofile.ModeAuto), "auto or custom (env TOOL_PROFILE)")
	model := fs.String("model", env("MODEL_ID", ""), "model id (env MODEL_ID)")
	engine := fs.String("engine", env("ENGINE", toolprofile.EngineVLLM), "vllm or sglang (env ENGINE)")
	parser := fs.String("parser", "", "custom parser (default env VLLM_TOOL_CALL_PARSER, or SGLANG_TOOL_CALL_PARSER for sglang)")
	format := fs.String("format", "parser", "parser (the name only), env (KEY=value lines) or json")
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	if *parser == "" {
		*parser = os.Getenv("VLLM_TOOL_CALL_PARSER")
		if *engine == toolprofile.EngineSGLang && os.Getenv("SGLANG_TOOL_CALL_PARSER") != "" {
			*parser = os.Getenv("SGLANG_TOOL_CALL_PARSER")
		}
	}
	reg, err := toolprofile.Load(*profiles)
	if err != nil {
		fmt.Fprintln(stderr, "quoter tool-profile:", err)
		return exitFail
	}
	res, err := reg.Resolve(toolprofile.Request{Mode: *mode, ModelID: *model, Engine: *engine, CustomParser: *parser})
	if err != nil {
		fmt.Fprintln(stderr, "quoter tool-profile:", err)
		return exitFail
	}
	switch *format {
	case "parser":
		fmt.Fprintln(stdout, res.Parser)
	case "env":
		fmt.Fprintf(stdout, "TOOL_FAMILY='%s'\nTOOL_CALL_PARSER=%s\nREASONING_PARSER=%s\n",
			strings.ReplaceAll(res.Family, "'", ""), res.Parser, res.ReasoningParser)
	case "json":
		_ = json.NewEncoder(stdout).Encode(res)
	default:
		fmt.Fprintf(stderr, "quoter tool-profile: --format %q is not parser, env or json\n", *format)
		return exitUsage
	}
	return exitOK
}

func cmdToolProfilesJSON(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("tool-profiles-json", stderr)
	profiles := fs.String("profiles", defaultProfiles, "tool-profiles.tsv path")
	out := fs.String("out", "deploy/config/omnious-model-tool-profiles.json", "output path (- for stdout)")
	check := fs.Bool("check", false, "fail if the output file is out of date instead of writing it")
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	reg, err := toolprofile.Load(*profiles)
	if err != nil {
		fmt.Fprintln(stderr, "quoter tool-profiles-json:", err)
		return exitFail
	}
	data, err := reg.GenerateJSON()
	if err != nil {
		fmt.Fprintln(stderr, "quoter tool-profiles-json:", err)
		return exitFail
	}
	if *out == "-" {
		_, _ = stdout.Write(data)
		return exitOK
	}
	if *check {
		cur, err := os.ReadFile(*out)
		if err != nil || string(cur) != string(data) {
			fmt.Fprintf(stderr, "quoter tool-profiles-json: %s is out of date; run: go run ./cmd/quoter tool-profiles-json\n", *out)
			return exitFail
		}
		return exitOK
	}
	if err := os.WriteFile(*out, data, 0o644); err != nil {
		fmt.Fprintln(stderr, "quoter tool-profiles-json:", err)
		return exitFail
	}
	fmt.Fprintf(stdout, "wrote %s (%d families)\n", *out, len(reg.Profiles))
	return exitOK
}

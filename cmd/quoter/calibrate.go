package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/omnious/provider-node/internal/adminauth"
	"github.com/omnious/provider-node/quoter/calibration"
)

const calibrateUsage = "usage: quoter calibrate --url URL --model ID --capacity-url EPP_ADMIN_URL (--out FILE | --configmap NAME [--namespace NS]) [flags]"

func cmdCalibrate(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("calibrate", stderr)
	// The defaults are the package's own, so there is one place they are
	// set.
	def := calibration.Config{}.WithDefaults()
	var cfg calibration.Config
	fs.StringVar(&cfg.URL, "url", env("SERVING_URL", ""), "serving base URL the load is sent to (env SERVING_URL)")
	fs.StringVar(&cfg.Model, "model", env("MODEL_ID", ""), "model id (env MODEL_ID)")
	fs.StringVar(&cfg.CapacityURL, "capacity-url", env("EPP_ADMIN_URL", ""), "EPP admin base URL serving /v1/capacity (env EPP_ADMIN_URL)")
	var admin adminauth.Client
	registerAdmin(fs, &admin)
	fs.StringVar(&cfg.TokenFile, "calibration-token-file", env("QUOTER_CALIBRATION_TOKEN_FILE", ""),
		"file holding the calibration secret the EPP checks (env QUOTER_CALIBRATION_TOKEN_FILE; empty: none)")
	fs.DurationVar(&cfg.Objectives.TTFT, "slo-ttft-p95", envDuration("SLO_TTFT_P95", def.Objectives.TTFT), "p95 time-to-first-token objective (env SLO_TTFT_P95; 0: the default)")
	fs.DurationVar(&cfg.Objectives.ITL, "slo-itl-p95", envDuration("SLO_ITL_P95", def.Objectives.ITL), "p95 inter-token latency objective (env SLO_ITL_P95; 0: the default)")
	fs.IntVar(&cfg.Mix.PromptTokens, "prompt-tokens", def.Mix.PromptTokens, "prompt length in the engine's tokens, chat template included (random words, fitted to it by the first requests; 0: the default)")
	fs.IntVar(&cfg.Mix.SharedPrefixTokens, "shared-prefix-tokens", def.Mix.SharedPrefixTokens, "leading prompt tokens common to a group (0: none)")
	fs.IntVar(&cfg.Mix.Groups, "groups", def.Mix.Groups, "groups sharing a prefix (0: the default)")
	fs.IntVar(&cfg.Mix.OutputTokens, "output-tokens", def.Mix.OutputTokens, "tokens generated per request, max_tokens = min_tokens (0: the default)")
	fs.IntVar(&cfg.StartConcurrency, "start-concurrency", def.StartConcurrency, "first concurrency level (0: the default)")
	fs.Float64Var(&cfg.Factor, "factor", def.Factor, "ladder growth: next level max(prev+1, ceil(prev*factor)) (0: the default)")
	fs.IntVar(&cfg.MaxConcurrency, "max-concurrency", 0, "last level (0: the healthy replicas' batch-size targets summed)")
	fs.DurationVar(&cfg.LevelDuration, "level-duration", def.LevelDuration, "measured time per level (0: the default)")
	warmup := fs.Duration("warmup", *def.Warmup, "unmeasured time at the start of each level (0s: measure at once)")
	pastBreak := fs.Int("past-break", *def.PastBreak, "levels measured past the first that breaks an objective, the quote never reading beyond the loads measured (0: stop at the first)")
	repeats := fs.Int("repeats", *def.Repeats, "levels measured again after the climb, from the highest held down, until one holds twice; a level counts only if every measurement held (0: off, the highest level held once is sold)")
	out := fs.String("out", "", "write the calibration to FILE (atomically)")
	configMap := fs.String("configmap", "", "write the calibration into ConfigMap NAME")
	namespace := fs.String("namespace", env("POD_NAMESPACE", "default"), "the ConfigMap's namespace (env POD_NAMESPACE)")
	logLevel := fs.String("log-level", env("LOG_LEVEL", "info"), "debug, info, warn or error")
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	cfg.Warmup = warmup
	cfg.PastBreak = pastBreak
	cfg.Repeats = repeats
	if err := errors.Join(envDurationErrors(), cfg.WithDefaults().Validate()); err != nil {
		fmt.Fprintf(stderr, "quoter calibrate: %v\n%s\n", err, calibrateUsage)
		return exitUsage
	}
	if fs.NArg() > 0 || (*out == "") == (*configMap == "") {
		fmt.Fprintln(stderr, calibrateUsage)
		return exitUsage
	}
	log, err := newLogger(stderr, *logLevel)
	if err != nil {
		fmt.Fprintln(stderr, "quoter calibrate:", err)
		return exitUsage
	}
	defer func() { _ = log.Sync() }()
	cfg.Log = log
	if cfg.CapacityHTTP, err = adminClient(admin, 5*time.Second); err != nil {
		fmt.Fprintln(stderr, "quoter calibrate:", err)
		return exitUsage
	}
	cal, err := calibration.Run(ctx, cfg)
	if err != nil {
		fmt.Fprintln(stderr, "quoter calibrate:", err)
		return exitFail
	}
	var doc bytes.Buffer
	if err := cal.Write(&doc); err != nil {
		fmt.Fprintln(stderr, "quoter calibrate:", err)
		return exitFail
	}
	calibration.WriteTable(stdout, cal)
	if *out != "" {
		err = writeAtomic(*out, doc.Bytes())
	} else {
		err = saveCalibrationConfigMap(ctx, *namespace, *configMap, doc.Bytes())
	}
	if err != nil {
		fmt.Fprintln(stderr, "quoter calibrate: the calibration is not saved:", err)
		return exitFail
	}
	if *out != "" {
		fmt.Fprintf(stdout, "wrote %s\n", *out)
	} else {
		fmt.Fprintf(stdout, "wrote ConfigMap %s/%s\n", *namespace, *configMap)
	}
	return exitOK
}

// writeAtomic replaces path with data, or leaves it as it was: a temporary
// file in the same directory, synced, renamed over it.
func writeAtomic(path string, data []byte) (err error) {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("cannot write %s: %w", path, err)
	}
	defer func() {
		if err != nil {
			_ = f.Close()
			_ = os.Remove(f.Name())
		}
	}()
	if _, err = f.Write(data); err != nil {
		return fmt.Errorf("cannot write %s: %w", path, err)
	}
	if err = f.Chmod(0o644); err != nil {
		return fmt.Errorf("cannot write %s: %w", path, err)
	}
	if err = f.Sync(); err != nil {
		return fmt.Errorf("cannot sync %s: %w", path, err)
	}
	if err = f.Close(); err != nil {
		return fmt.Errorf("cannot write %s: %w", path, err)
	}
	if err = os.Rename(f.Name(), path); err != nil {
		return fmt.Errorf("cannot replace %s: %w", path, err)
	}
	// The rename is durable once the directory is.
	if d, derr := os.Open(filepath.Dir(path)); derr == nil {
		_ = d.Sync()
		_ = d.Close()
	}
	return nil
}

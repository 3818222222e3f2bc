// Package cli holds what the project's commands share: finding the config
// file flag before the others are defined, and building the logger.
package cli

import (
	"errors"
	"flag"
	"fmt"
	"strings"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// ConfigFlag returns the value of -config/--config in args without parsing
// the rest, so a command can load its file first and give its flags the
// file's values as defaults: flags then override only what they set.
func ConfigFlag(args []string) string {
	for i, a := range args {
		for _, name := range []string{"-config", "--config"} {
			if a == name && i+1 < len(args) {
				return args[i+1]
			}
			if v, ok := strings.CutPrefix(a, name+"="); ok {
				return v
			}
		}
	}
	return ""
}

// NewLogger returns a JSON production logger at level.
func NewLogger(level string) (*zap.Logger, error) {
	lvl, err := zapcore.ParseLevel(level)
	if err != nil {
		return nil, fmt.Errorf("bad -log-level: %w", err)
	}
	cfg := zap.NewProductionConfig()
	cfg.Level = zap.NewAtomicLevelAt(lvl)
	cfg.EncoderConfig.EncodeTime = zapcore.ISO8601TimeEncoder
	return cfg.Build()
}

// Failed reports whether run's error should fail the process: -h and
// --help print the usage and return flag.ErrHelp, which is not a failure
// (TestFailed).
func Failed(err error) bool {
	return err != nil && !errors.Is(err, flag.ErrHelp)
}

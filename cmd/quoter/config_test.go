package main

import (
	"bytes"
	"context"
	"flag"
	"io"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/omnious/provider-node/internal/testutil/conftest"
)

// TestFlagsNegative walks every numeric flag of every command: its help
// says what 0 means, and a negative value is refused naming the flag, or
// its help says what negative means. `quoter run --refresh -5s` once
// refreshed every 10s.
func TestFlagsNegative(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // no command gets to do anything
	sets := map[string]*flag.FlagSet{}
	orig := newFlagSet
	t.Cleanup(func() { newFlagSet = orig })
	newFlagSet = func(name string, stderr io.Writer) *flag.FlagSet {
		fs := orig(name, stderr)
		sets[name] = fs
		return fs
	}
	for _, cmd := range []string{"sign", "verify", "run", "conformance", "calibrate", "headroom", "tool-profile", "tool-profiles-json"} {
		run(ctx, []string{cmd, "-h"}, io.Discard, io.Discard)
		fs := sets[cmd]
		require.NotNil(t, fs, "%s builds its flags with newFlagSet", cmd)
		conftest.Flags(t, fs, func(name, value string) string {
			var stderr bytes.Buffer
			args := []string{cmd, "--" + name, value}
			if cmd == "sign" {
				args = append(args, "--once")
			}
			run(ctx, args, io.Discard, &stderr)
			return stderr.String()
		})
	}
}

func TestRunRefusesNegativeRefresh(t *testing.T) {
	var stderr bytes.Buffer
	code := run(context.Background(), []string{"run", "--refresh", "-5s", "--provider-id", "p", "--model", "m", "--model-class", "c",
		"--serving-url", "http://127.0.0.1:1", "--capacity-url", "http://127.0.0.1:2", "--floor-in", "1", "--floor-out", "1",
		"--state-file", t.TempDir() + "/state.json"}, io.Discard, &stderr)
	require.Equal(t, exitUsage, code)
	require.Equal(t, "quoter run: --refresh -5s is negative; give a positive duration, or 0 for the default (10s)\n", stderr.String())
}

// TestEnvironment: the environment variables the runbook's installer sets
// reach the config as before; a duration variable that does not parse, or
// is negative, is refused naming it, not taken as the default.
func TestEnvironment(t *testing.T) {
	args := []string{"run", "--serving-url", "http://127.0.0.1:1", "--capacity-url", "http://127.0.0.1:2"}
	for _, tc := range []struct {
		name string
		env  map[string]string
		want string
	}{
		{"runbook", map[string]string{"SLO_TTFT_P95": "1500ms"}, ""},
		{"unparsable", map[string]string{"QUOTER_REFRESH": "soon"}, `QUOTER_REFRESH "soon" is not a duration such as 10s`},
		{"negative", map[string]string{"QUOTER_REFRESH": "-5s"}, "--refresh -5s is negative"},
		{"negative objective", map[string]string{"SLO_ITL_P95": "-1ms"}, "--slo-itl-p95 -1ms is negative"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range map[string]string{"PROVIDER_ID": "acme-qwen", "MODEL_ID": "Qwen/Qwen3-32B", "MODEL_CLASS": "qwen3-32b",
				"FLOOR_IN": "210000", "FLOOR_OUT": "680000", "QUOTER_STATE_FILE": t.TempDir() + "/state.json"} {
				t.Setenv(k, v)
			}
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			var stderr bytes.Buffer
			code := run(context.Background(), args, io.Discard, &stderr)
			if tc.want == "" {
				// Past validation, the run stops at the missing key.
				require.Equal(t, exitFail, code, stderr.String())
				require.Contains(t, stderr.String(), "cannot start quoter")
				return
			}
			require.Equal(t, exitUsage, code)
			require.Contains(t, stderr.String(), tc.want)
		})
	}
}

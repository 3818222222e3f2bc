package cli

import (
	"errors"
	"flag"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestConfigFlag(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{nil, ""},
		{[]string{"-listen", "x"}, ""},
		{[]string{"-config", "a.yaml"}, "a.yaml"},
		{[]string{"--config", "b.yaml", "-x"}, "b.yaml"},
		{[]string{"-v", "--config=c.yaml"}, "c.yaml"},
		{[]string{"-config=d.yaml"}, "d.yaml"},
		{[]string{"-config"}, ""},
	}
	for _, tc := range tests {
		require.Equal(t, tc.want, ConfigFlag(tc.args), "%v", tc.args)
	}
}

func TestNewLogger(t *testing.T) {
	_, err := NewLogger("debug")
	require.NoError(t, err)
	_, err = NewLogger("loud")
	require.ErrorContains(t, err, "-log-level")
}

func TestNonNegative(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"unset", nil, ""},
		{"zero", []string{"-budget", "0"}, ""},
		{"negative", []string{"-budget", "-1"}, "-budget -1 is negative; give a positive value, or 0 (256 MiB)"},
		{"negative duration", []string{"-drain", "-1s"}, "-drain -1s is negative; give a positive value, or 0 (stop at once)"},
		{"negative has a meaning", []string{"-idle", "-1s"}, ""},
		{"two", []string{"-budget", "-1", "-drain", "-2s"}, "-budget -1 is negative; give a positive value, or 0 (256 MiB)\n-drain -2s is negative; give a positive value, or 0 (stop at once)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fs := flag.NewFlagSet("x", flag.ContinueOnError)
			fs.Int64("budget", 0, "memory budget (0: 256 MiB)")
			fs.Duration("drain", time.Second, "drain time (0s: stop at once)")
			fs.Duration("idle", time.Second, "idle timeout (0: the default; negative: never)")
			require.NoError(t, fs.Parse(tt.args))
			err := NonNegative(fs)
			if tt.want == "" {
				require.NoError(t, err)
				return
			}
			require.EqualError(t, err, tt.want)
		})
	}
}

func TestFailed(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"no error", nil, false},
		{"help", flag.ErrHelp, false},
		{"wrapped help", fmt.Errorf("compare: %w", flag.ErrHelp), false},
		{"error", errors.New("bad flag"), true},
	} {
		t.Run(tc.name, func(t *testing.T) { require.Equal(t, tc.want, Failed(tc.err)) })
	}
}

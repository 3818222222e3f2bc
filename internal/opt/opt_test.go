package opt

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestOr(t *testing.T) {
	require.Equal(t, 7, *Or[int](nil, 7), "nil takes the default")
	zero := 0
	got := Or(&zero, 7)
	require.Equal(t, 0, *got, "an explicit zero is kept")
	require.NotSame(t, &zero, got, "the result does not alias its input")
}

func TestZero(t *testing.T) {
	tests := []struct {
		name    string
		in, def int
		want    int
	}{
		{"unset", 0, 5, 5},
		{"set", 3, 5, 3},
		{"negative is kept for Validate", -3, 5, -3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := tt.in
			Zero(&v, tt.def)
			require.Equal(t, tt.want, v)
		})
	}
}

func TestNonNegative(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want string
	}{
		{"zero", NonNegative("retries", 0), ""},
		{"positive", NonNegative("--warmup", time.Second), ""},
		{"negative int", NonNegative("retries", -1), "retries -1 is negative; give 0 or a positive value"},
		{"negative duration", NonNegative("--warmup", -time.Second), "--warmup -1s is negative; give 0s or a positive duration"},
		{"defaulted zero", DefaultNonNegative("--refresh", 0, 10*time.Second), ""},
		{"defaulted negative duration", DefaultNonNegative("--refresh", -5*time.Second, 10*time.Second),
			"--refresh -5s is negative; give a positive duration, or 0 for the default (10s)"},
		{"defaulted negative float", DefaultNonNegative("factor", -1.5, 1.25),
			"factor -1.5 is negative; give a positive value, or 0 for the default (1.25)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.want == "" {
				require.NoError(t, tt.err)
				return
			}
			require.EqualError(t, tt.err, tt.want)
		})
	}
}

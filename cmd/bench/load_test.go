package main

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParseBytes(t *testing.T) {
	cases := []struct {
		in      string
		want    int
		wantErr bool
	}{
		{"32k", 32 << 10, false},
		{"200K", 200 << 10, false},
		{"1m", 1 << 20, false},
		{"4096", 4096, false},
		{"k", 0, true},
		{"-3k", 0, true},
		{"0", 0, true},
		{"12x", 0, true},
	}
	for _, tc := range cases {
		t.Run(tc.in, func(t *testing.T) {
			got, err := parseBytes(tc.in)
			if tc.wantErr {
				require.Error(t, err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
}

// TestLoadDispatchRejectsBadFlags reaches `bench load` through run and
// fails before starting anything.
func TestLoadDispatchRejectsBadFlags(t *testing.T) {
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"bad size", []string{"load", "-prompt-bytes", "lots"}, "bad -prompt-bytes"},
		{"bad rate", []string{"load", "-rates", "10,x"}, "bad -rates"},
		{"stray argument", []string{"load", "extra"}, "unexpected arguments"},
		{"missing EPP binary", []string{"load", "-epp", "/nonexistent/epp", "-rates", "10"}, "cannot start the EPP"},
		{"missing floor binary", []string{"load", "-floor", "-floor-bin", "/nonexistent/bench", "-rates", "10"}, "cannot start the floor server"},
		{"floor soak", []string{"load", "-floor", "-soak", "1m"}, "floor: no soak"},
		{"floor without destinations", []string{"floor", "-grpc-addr", "127.0.0.1:0"}, "want -dest"},
		{"floor off loopback", []string{"floor", "-grpc-addr", "0.0.0.0:0", "-dest", "127.0.0.1:1"}, "not a loopback address"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			require.ErrorContains(t, run(tc.args), tc.want)
		})
	}
}

package conftest

import (
	"reflect"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestHeadAndPick(t *testing.T) {
	tests := []struct {
		cell string
		i, n int
		want string
	}{
		{"0 (clock)", 0, 1, "0"},
		{"off; `error_status` defaults to 500", 0, 1, "off"},
		{"`map` (vllm), `sglang` (sglang)", 0, 1, "`map`"},
		{"500ms, 10s", 1, 2, "10s"},
		{"64 MiB", 1, 2, "64 MiB"},
		{"platinum 400/1.00, gold 300/0.85", 0, 1, "platinum 400/1.00, gold 300/0.85"},
	}
	for _, tt := range tests {
		t.Run(tt.cell, func(t *testing.T) {
			require.Equal(t, tt.want, pick(head(tt.cell), tt.i, tt.n))
		})
	}
}

func TestNumber(t *testing.T) {
	tests := []struct {
		in   string
		want float64
	}{
		{"0.3", 0.3}, {"281,600", 281600}, {"32 MiB", 32 << 20}, {"256 MiB", 256 << 20},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			n, err := number(tt.in)
			require.NoError(t, err)
			require.Equal(t, tt.want, n)
		})
	}
	_, err := number("lots")
	require.Error(t, err)
}

func TestZeroYAML(t *testing.T) {
	tests := []struct {
		key  string
		v    any
		want string
	}{
		{"fallbacks", new(2), "fallbacks: 0\n"},
		{"prefix.speculative_ttl", new(time.Second), "prefix:\n  speculative_ttl: 0s\n"},
		{"a.b.enabled", true, "a:\n  b:\n    enabled: false\n"},
	}
	for _, tt := range tests {
		t.Run(tt.key, func(t *testing.T) {
			require.Equal(t, tt.want, ZeroYAML(tt.key, reflect.ValueOf(tt.v)))
		})
	}
}

func TestFields(t *testing.T) {
	type inner struct {
		D time.Duration `yaml:"d"`
	}
	cfg := struct {
		A     int `yaml:"a"`
		Skip  int `yaml:"-"`
		Inner inner
		P     *float64 `yaml:"p"`
	}{}
	var keys []string
	for _, f := range Fields(cfg) {
		keys = append(keys, f.Key)
	}
	require.Equal(t, []string{"a", "Inner.d", "p"}, keys)
	require.True(t, IsZero(reflect.ValueOf(new(0.0))))
	require.False(t, IsZero(reflect.ValueOf((*float64)(nil))), "nil is unset, not zero")
}

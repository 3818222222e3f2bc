package main

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestChaosFlags(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"missing enginesim", []string{"chaos", "-enginesim", "/nonexistent/enginesim"}, "cannot find enginesim"},
		{"unknown scenario", []string{"chaos", "-enginesim", "true", "-scenarios", "nope"}, `unknown chaos scenario "nope"`},
		{"stray argument", []string{"chaos", "extra"}, "unexpected arguments"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.ErrorContains(t, run(tt.args), tt.want)
		})
	}
}

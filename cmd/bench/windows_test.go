package main

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/omnious/provider-node/bench/compare"
)

func TestParseSpans(t *testing.T) {
	for _, tc := range []struct {
		in   []string
		want []compare.WindowSpan
		err  string
	}{
		{nil, []compare.WindowSpan{{}}, ""},
		{[]string{"0:1902", "3240:"}, []compare.WindowSpan{{From: 0, To: 1902}, {From: 3240}}, ""},
		{[]string{"12"}, nil, "not FROM:TO"},
		{[]string{"x:3"}, nil, "FROM is not"},
		{[]string{"-1:3"}, nil, "FROM is not"},
		{[]string{"5:5"}, nil, "TO is not"},
		{[]string{"5:y"}, nil, "TO is not"},
	} {
		got, err := parseSpans(tc.in)
		if tc.err != "" {
			require.ErrorContains(t, err, tc.err, tc.in)
			continue
		}
		require.NoError(t, err)
		require.Equal(t, tc.want, got)
	}
}

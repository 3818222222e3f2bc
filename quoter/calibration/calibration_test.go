package calibration

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omnious/provider-node/capacity"
	"github.com/omnious/provider-node/internal/testutil/conftest"
)

func TestQuantile(t *testing.T) {
	seq := func(n int) []float64 { // 1..n, shuffled so quantile must sort
		xs := make([]float64, n)
		for i := range xs {
			xs[i] = float64((i*7)%n + 1)
		}
		return xs
	}
	for _, tc := range []struct {
		name string
		xs   []float64
		q    float64
		want float64
	}{
		{"one", []float64{3}, 0.95, 3},
		{"twenty", seq(20), 0.95, 19}, // 19 of 20 at or below
		{"hundred", seq(100), 0.95, 95},
		{"hundred and one", seq(101), 0.95, 96}, // 95.95 rounds up
		{"unsorted pair", []float64{2, 1}, 0.5, 1},
		{"median of four", []float64{4, 1, 3, 2}, 0.5, 2},
		{"top", seq(10), 1, 10},
		{"bottom", seq(10), 0.01, 1},
		{"one tail", append(make([]float64, 99), 5), 0.95, 0},
		{"tail above p95", append(make([]float64, 94), 5, 5, 5, 5, 5, 5), 0.95, 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, quantile(tc.xs, tc.q))
		})
	}
	require.True(t, math.IsNaN(quantile(nil, 0.95)))
}

func TestNext(t *testing.T) {
	for _, tc := range []struct {
		factor float64
		max    int
		want   []int
	}{
		{1.25, 12, []int{1, 2, 3, 4, 5, 7, 9, 12}},
		{2, 20, []int{1, 2, 4, 8, 16, 20}},
		{1.01, 4, []int{1, 2, 3, 4}},
	} {
		got := []int{1}
		for c := 1; c < tc.max; {
			c = next(c, tc.factor, tc.max)
			got = append(got, c)
		}
		require.Equal(t, tc.want, got, "factor %v", tc.factor)
	}
}

func TestPrompts(t *testing.T) {
	m := capacity.Mix{PromptTokens: 50, SharedPrefixTokens: 20, Groups: 3, OutputTokens: 1}
	a, b := newPrompts(m, 7, 0, 1), newPrompts(m, 7, 1, 1)
	prefixes := map[string]bool{}
	seen := map[string]bool{}
	for range 60 {
		for _, p := range []string{a.next(), b.next()} {
			w := strings.Fields(p)
			require.Len(t, w, m.PromptTokens)
			prefixes[strings.Join(w[:m.SharedPrefixTokens], " ")] = true
			rest := strings.Join(w[m.SharedPrefixTokens:], " ")
			require.False(t, seen[w[m.SharedPrefixTokens]+rest], "a random part repeated")
			seen[w[m.SharedPrefixTokens]+rest] = true
		}
	}
	require.Len(t, prefixes, m.Groups, "every group's prefix, shared by both workers")
	require.Equal(t, newPrompts(m, 7, 0, 1).next(), newPrompts(m, 7, 0, 1).next(), "seeded")
	require.NotEqual(t, newPrompts(m, 7, 0, 1).next(), newPrompts(m, 8, 0, 1).next())

	none := newPrompts(capacity.Mix{PromptTokens: 5, Groups: 1, OutputTokens: 1}, 0, 0, 1)
	require.Len(t, strings.Fields(none.next()), 5)

	// Fitted to an engine that counts 1.6 tokens a word: fewer words,
	// the prefix's and the rest's in proportion.
	fitted := newPrompts(m, 7, 0, 1/1.6)
	w := strings.Fields(fitted.next())
	require.Len(t, w, 31) // round(50/1.6)
	require.Len(t, fitted.prefixes[0], len(strings.Join(strings.Fields(fitted.prefixes[0]), " ")))
	require.Len(t, strings.Fields(fitted.prefixes[0]), 13) // round(20/1.6)
}

func TestBroken(t *testing.T) {
	o := capacity.Objectives{TTFT: 2 * time.Second, ITL: 50 * time.Millisecond, Quantile: 0.95}
	for _, tc := range []struct {
		lv   capacity.Level
		want string
	}{
		{capacity.Level{TTFTP95Seconds: 3.2, ITLP95Seconds: 0.01}, "TTFT p95 3.2s > 2s"},
		{capacity.Level{TTFTP95Seconds: 0.5, ITLP95Seconds: 0.0734}, "ITL p95 73ms > 50ms"},
		{capacity.Level{TTFTP95Seconds: 2.24, ITLP95Seconds: 0.05123}, "TTFT p95 2.2s > 2s, ITL p95 51ms > 50ms"},
	} {
		require.Equal(t, tc.want, broken(tc.lv, o))
	}
}

func TestValidate(t *testing.T) {
	ok := Config{URL: "http://127.0.0.1:1", Model: "m", CapacityURL: "http://127.0.0.1:2"}
	for _, tc := range []struct {
		name   string
		mutate func(*Config)
		want   string
	}{
		{"ok", func(*Config) {}, ""},
		{"no url", func(c *Config) { c.URL = "" }, "no serving URL"},
		{"prefix too long", func(c *Config) { c.Mix.SharedPrefixTokens = 2000 }, "longer than the 1000-token prompt"},
		{"factor", func(c *Config) { c.Factor = 1 }, "--factor 1: want > 1"},
		{"start above max", func(c *Config) { c.StartConcurrency, c.MaxConcurrency = 8, 4 }, "above the maximum"},
		{"quantile", func(c *Config) { c.Objectives.Quantile = 1 }, "quantile 1 is not in (0, 1)"},
		{"negative warmup", func(c *Config) { d := -time.Second; c.Warmup = &d }, "--warmup -1s is negative"},
		{"negative past-break", func(c *Config) { n := -1; c.PastBreak = &n }, "--past-break -1 is negative"},
		{"negative repeats", func(c *Config) { n := -2; c.Repeats = &n }, "--repeats -2 is negative; give 0 or a positive value"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := ok
			tc.mutate(&c)
			c = c.WithDefaults()
			err := c.Validate()
			if tc.want == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tc.want)
		})
	}
}

// TestREADMEDefaults keeps the README's configuration table equal to
// WithDefaults of an empty config.
func TestREADMEDefaults(t *testing.T) {
	var fields []conftest.Field
	for _, f := range conftest.Fields(Config{}.WithDefaults()) {
		if f.Key != "HTTP" && f.Key != "CapacityHTTP" && f.Key != "Log" {
			fields = append(fields, f)
		}
	}
	conftest.Check(t, conftest.Table(t, "README.md", "Configuration", "field", "default"), 0, 1, fields, nil)
}

// TestZeroIsASetting: a warmup of 0s stays 0s, 0 levels past the first
// break stay 0, and 0 repeats (off) stay 0.
func TestZeroIsASetting(t *testing.T) {
	zero, none, off := time.Duration(0), 0, 0
	c := Config{Warmup: &zero, PastBreak: &none, Repeats: &off}.WithDefaults()
	require.Equal(t, time.Duration(0), *c.Warmup)
	require.Equal(t, 0, *c.PastBreak)
	require.Equal(t, 0, *c.Repeats)
	require.Equal(t, 2, *Config{}.WithDefaults().Repeats)
}

func TestSummarise(t *testing.T) {
	o := capacity.Objectives{TTFT: time.Second, ITL: 50 * time.Millisecond, Quantile: 0.95}
	many := func(n int, v float64) []float64 {
		xs := make([]float64, n)
		for i := range xs {
			xs[i] = v
		}
		return xs
	}
	fail := errors.New("status 503: overloaded")
	for _, tc := range []struct {
		name    string
		s       stats
		want    capacity.Level
		wantErr string
	}{
		{name: "within", s: stats{ttft: many(20, 0.2), itl: many(400, 0.02), requests: 20, tokens: 4000},
			want: capacity.Level{Concurrency: 4, Requests: 20, TTFTP95Seconds: 0.2, ITLP95Seconds: 0.02, OutputTokensPerSec: 400, Within: true}},
		{name: "itl outside", s: stats{ttft: many(20, 0.2), itl: append(many(90, 0.02), many(10, 0.06)...), requests: 20, tokens: 4000},
			want: capacity.Level{Concurrency: 4, Requests: 20, TTFTP95Seconds: 0.2, ITLP95Seconds: 0.06, OutputTokensPerSec: 400}},
		{name: "ttft at the objective is within", s: stats{ttft: many(20, 1), itl: many(100, 0.05), requests: 20, tokens: 10},
			want: capacity.Level{Concurrency: 4, Requests: 20, TTFTP95Seconds: 1, ITLP95Seconds: 0.05, OutputTokensPerSec: 1, Within: true}},
		{name: "5% errors pass", s: stats{ttft: many(20, 0.2), itl: many(100, 0.02), requests: 20, errors: 1, firstErr: fail},
			want: capacity.Level{Concurrency: 4, Requests: 20, Errors: 1, TTFTP95Seconds: 0.2, ITLP95Seconds: 0.02, Within: true}},
		{name: "more fail", s: stats{ttft: many(20, 0.2), itl: many(100, 0.02), requests: 20, errors: 2, firstErr: fail},
			wantErr: "2 of 20 requests failed at concurrency 4 (more than 5%); the first: status 503: overloaded"},
		{name: "nothing measured", s: stats{requests: 0}, wantErr: "concurrency 4 measured no first token or no inter-token gap in 10s: lengthen the level duration"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lv, err := summarise(4, tc.s, 10*time.Second, o)
			if tc.wantErr != "" {
				require.EqualError(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, lv)
		})
	}
}

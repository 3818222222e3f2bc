package promtext

import (
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestValues(t *testing.T) {
	const page = "# HELP go_memstats_heap_inuse_bytes x\ngo_memstats_heap_inuse_bytes 1.5e+07\n" +
		"process_resident_memory_bytes 4.2e+07\ngo_memstats_heap_inuse_bytes_total 99\n" +
		"inference_objective_request_total{model_name=\"a\"} 3\ninference_objective_request_total{model_name=\"b\"} 4\n"
	cases := []struct {
		name    string
		names   []string
		want    []float64
		wantErr bool
	}{
		{"gauges", []string{"go_memstats_heap_inuse_bytes", "process_resident_memory_bytes"}, []float64{1.5e7, 4.2e7}, false},
		{"summed series", []string{"inference_objective_request_total"}, []float64{7}, false},
		{"missing", []string{"nope"}, nil, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Values(strings.NewReader(page), tc.names...)
			if tc.wantErr {
				require.Error(t, err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
}

func TestSum(t *testing.T) {
	cases := []struct {
		name     string
		page     string
		wantSums []float64
		wantSeen []bool
		wantErr  string
	}{
		{"labels and timestamps", "a{x=\"1\"} 2 1700000000\na{x=\"2\"} 3\nb 1\n", []float64{5, 0}, []bool{true, false}, ""},
		{"a brace inside a label value", "a{x=\"}\"} 2\n", []float64{2, 0}, []bool{true, false}, ""},
		{"a bad value is skipped and reported", "a 1\na{x=\"y\"} zz\nc 4\n", []float64{1, 4}, []bool{true, true}, "cannot parse"},
		{"lines that are not series", "garbage {\n# a 9\na{x=\"1\"}\n", []float64{0, 0}, []bool{false, false}, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			names := []string{"a", "c"}
			sums, seen, err := Sum(strings.NewReader(tc.page), names...)
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
			} else {
				require.NoError(t, err)
			}
			require.Equal(t, tc.wantSums, sums)
			require.Equal(t, tc.wantSeen, seen)
		})
	}
}

func TestSumWhere(t *testing.T) {
	const page = `omnious_epp_decisions_total{model="m",reason="prefix"} 5
omnious_epp_decisions_total{model="m",reason="load"} 7
omnious_epp_decisions_total{model="n",reason="prefix"} 1
omnious_epp_breaker_state{endpoint="127.0.0.1:1"} 1
omnious_epp_breaker_state{endpoint="127.0.0.1:2"} 0
omnious_epp_kv_sequence_total{event="reset",replica="127.0.0.1:1"} 2
odd{v="a \"quoted\" \\ value"} 3
`
	cases := []struct {
		name      string
		metric    string
		want      map[string]string
		wantSum   float64
		wantFound bool
	}{
		{"every series", "omnious_epp_decisions_total", nil, 13, true},
		{"one label", "omnious_epp_decisions_total", map[string]string{"reason": "prefix"}, 6, true},
		{"two labels", "omnious_epp_decisions_total", map[string]string{"reason": "prefix", "model": "n"}, 1, true},
		{"gauge of one endpoint", "omnious_epp_breaker_state", map[string]string{"endpoint": "127.0.0.1:1"}, 1, true},
		{"a zero gauge is found", "omnious_epp_breaker_state", map[string]string{"endpoint": "127.0.0.1:2"}, 0, true},
		{"no such label value", "omnious_epp_kv_sequence_total", map[string]string{"replica": "127.0.0.1:1", "event": "replay"}, 0, false},
		{"a label the series lacks", "omnious_epp_breaker_state", map[string]string{"model": "m"}, 0, false},
		{"escaped value", "odd", map[string]string{"v": `a "quoted" \ value`}, 3, true},
		{"no such metric", "nope", nil, 0, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sum, found, err := SumWhere(strings.NewReader(page), tc.metric, tc.want)
			require.NoError(t, err)
			require.Equal(t, tc.wantFound, found)
			require.Equal(t, tc.wantSum, sum)
		})
	}
	_, _, err := SumWhere(strings.NewReader("a{x=1} 2\n"), "a", map[string]string{"x": "1"})
	require.ErrorContains(t, err, "cannot parse the labels")
}

func TestHistogram(t *testing.T) {
	const name = "omnious_extproc_route_duration_seconds"
	page := func(a, b, c, inf int) string {
		return fmt.Sprintf("# TYPE %[1]s histogram\n%[1]s_bucket{le=\"0.0001\"} %[2]d\n%[1]s_bucket{le=\"0.0002\"} %[3]d\n"+
			"%[1]s_bucket{le=\"0.0004\"} %[4]d\n%[1]s_bucket{le=\"+Inf\"} %[5]d\n%[1]s_sum 1\n%[1]s_count %[5]d\nother_bucket{le=\"1\"} 9\n",
			name, a, b, c, inf)
	}
	read := func(s string) []Bucket {
		b, err := Buckets(strings.NewReader(s), name)
		require.NoError(t, err)
		return b
	}
	before := read(page(10, 20, 20, 20))
	require.Len(t, before, 4)
	require.True(t, math.IsInf(before[3].LE, 1))

	cases := []struct {
		name  string
		after []Bucket
		q     float64
		want  float64
	}{
		// 100 new samples: 50 in (0, 100µs], 30 in (100, 200µs], 20 in (200, 400µs].
		{"median at the first bound", read(page(60, 100, 120, 120)), 0.5, 0.0001},
		{"p75 interpolated in the second", read(page(60, 100, 120, 120)), 0.75, 0.0001 + 0.0001*25/30},
		{"p99 in the third", read(page(60, 100, 120, 120)), 0.99, 0.0002 + 0.0002*19/20},
		{"rank past the last bound gives the bound", read(page(10, 20, 20, 30)), 0.5, 0.0004},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			require.InDelta(t, tc.want, Quantile(tc.q, before, tc.after), 1e-12)
		})
	}
	require.True(t, math.IsNaN(Quantile(0.5, before, before)), "nothing added")
	_, err := Buckets(strings.NewReader("x 1\n"), name)
	require.ErrorContains(t, err, "not found")
	_, err = Buckets(strings.NewReader(name+"_bucket{le=\"abc\"} 1\n"), name)
	require.ErrorContains(t, err, "cannot parse")

	// Labelled histograms are summed over their other labels.
	labelled := name + "_bucket{api=\"chat\",le=\"0.1\"} 1\n" + name + "_bucket{api=\"chat\",le=\"+Inf\"} 2\n" +
		name + "_bucket{api=\"completions\",le=\"0.1\"} 3\n" + name + "_bucket{api=\"completions\",le=\"+Inf\"} 3\n"
	require.Equal(t, []Bucket{{0.1, 4}, {math.Inf(1), 5}}, read(labelled))
}

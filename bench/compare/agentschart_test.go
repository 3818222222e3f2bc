package compare

import (
	"bytes"
	"encoding/json"
	"math"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestWriteAgentsChart: the page charts every policy of the closed-loop
// runs against their agents, lists each run's figures, names the
// open-loop runs it leaves out, and refuses a set with no closed-loop run;
// contracts read back from JSON as written (null as NaN).
func TestWriteAgentsChart(t *testing.T) {
	run := func(agents int, goodput float64) ContractJSON {
		var c ContractJSON
		b := []byte(`{"scenario":"agents","replicas":4,"agents":` + jsonNum(agents) + `,"bound_hit_rate":null,"results":[` +
			`{"policy":"precise","hit_rate":0.6,"sessions":{"goodput_tok_per_s":` + jsonNum(goodput) + `,"started":64,"completed":64,"refused":0,"retries":0,"completed_per_min":8.5,"completion_p50_s":1,"completion_p90_s":2,"moves":0}},` +
			`{"policy":"agent","hit_rate":0.85,"sessions":{"goodput_tok_per_s":` + jsonNum(2*goodput) + `,"started":64,"completed":60,"refused":4,"retries":7,"completed_per_min":4.2,"completion_p50_s":1,"completion_p90_s":2,"moves":null}}]}`)
		require.NoError(t, json.Unmarshal(b, &c))
		return c
	}
	runs := []AgentsRun{{"a16", run(16, 100)}, {"a32-1", run(32, 120)}, {"a32-2", run(32, 130)}, {"open", run(0, 90)}}
	require.True(t, math.IsNaN(float64(runs[0].Contract.BoundHitRate)))
	require.True(t, math.IsNaN(float64(runs[0].Contract.Results[1].Sessions.Moves)))
	var buf bytes.Buffer
	require.NoError(t, WriteAgentsChart(&buf, runs))
	out := buf.String()
	require.Equal(t, 2, strings.Count(out, "<svg"))
	for _, want := range []string{">precise<", ">agent<", "Goodput vs offered agents", "Hit rate vs offered agents",
		"<td>a32-2</td><td>32</td><td>agent</td><td>260</td><td>85.0%</td><td>4.2</td><td>60 / 64</td><td>7</td>",
		"Not charted (open-loop or no session figures): open"} {
		require.Contains(t, out, want)
	}
	// Three closed-loop runs, two policies: six dots in each chart.
	require.Equal(t, 12, strings.Count(out, "<circle"))
	require.Error(t, WriteAgentsChart(&buf, runs[3:]))
}

func jsonNum[T int | float64](v T) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// FuzzJSONFloat: a contract's number reads back as written (null as
// NaN), and anything else is an error, never a panic.
func FuzzJSONFloat(f *testing.F) {
	for _, s := range []string{"null", "1.5", "-0", "1e308", "NaN", `"1"`, ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		var v jsonFloat
		if err := v.UnmarshalJSON([]byte(s)); err != nil {
			return
		}
		b, err := v.MarshalJSON()
		require.NoError(t, err)
		var back jsonFloat
		require.NoError(t, back.UnmarshalJSON(b))
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			require.Equal(t, "null", string(b))
			return
		}
		require.Equal(t, float64(v), float64(back))
	})
}

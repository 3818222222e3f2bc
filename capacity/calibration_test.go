package capacity

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestHeldStreams(t *testing.T) {
	// lv is a level at concurrency c with its p95s in milliseconds.
	lv := func(c int, ttftMS, itlMS float64) Level {
		return Level{Concurrency: c, Requests: 100, TTFTP95Seconds: ttftMS / 1000, ITLP95Seconds: itlMS / 1000}
	}
	strict := Objectives{TTFT: 2 * time.Second, ITL: 50 * time.Millisecond, Quantile: 0.95}
	loose := Objectives{TTFT: 3 * time.Second, ITL: 300 * time.Millisecond, Quantile: 0.95}
	// The ladders of the two real vLLM runs at TTFT p95 2 s, ITL p95 50 ms
	// (docs/notebook/2026-12-06-vllm/proof, precise/ and attempt-7/).
	precise := []Level{lv(2, 324, 32.9), lv(3, 501, 36.4), lv(4, 527, 63.9), lv(5, 739, 37.5)}
	attempt7 := []Level{lv(2, 540, 30.1), lv(3, 440, 31.2), lv(4, 630, 39.5), lv(5, 550, 47.8), lv(7, 910, 73.6), lv(9, 800, 122.8)}
	// Attempts 9 and 10 (attempt-9/, attempt-10/), each measured once, and
	// each with the closed-loop check its proof ran at the streams it
	// sold, the first step, as the ladder's repeat of that level: 5
	// streams held (ITL p95 35.8 ms), 7 broke (92.0 ms).
	attempt9 := []Level{lv(2, 215, 18.4), lv(3, 394, 27.7), lv(4, 582, 32.3), lv(5, 688, 39.3), lv(7, 1078, 72.9), lv(9, 1182, 109.3)}
	attempt10 := []Level{lv(2, 222, 17.6), lv(3, 351, 18.5), lv(4, 661, 30.9), lv(5, 613, 34.5), lv(7, 1053, 32.8), lv(9, 770, 85.8), lv(12, 1775, 97.5)}
	with := func(ls []Level, more ...Level) []Level { return append(slices.Clone(ls), more...) }
	for _, tc := range []struct {
		name     string
		levels   []Level
		quantile float64
		o        Objectives
		want     float64
		ok       bool
	}{
		{"real vLLM, levels not monotone: the highest held", precise, 0.95, strict, 5, true},
		{"real vLLM, broken past 5", attempt7, 0.95, strict, 5, true},
		{"attempt 9 as measured", attempt9, 0.95, strict, 5, true},
		{"attempt 9, its top repeated and held: confirmed", with(attempt9, lv(5, 675, 35.8)), 0.95, strict, 5, true},
		{"attempt 10 as measured: the highest held once", attempt10, 0.95, strict, 7, true},
		{"attempt 10, its top repeated and broke: the next held below", with(attempt10, lv(7, 453, 92.0)), 0.95, strict, 5, true},
		{"attempt 10, the next repeated and held", with(attempt10, lv(7, 453, 92.0), lv(5, 600, 36)), 0.95, strict, 5, true},
		{"attempt 10, both repeats broke: the highest never refuted", with(attempt10, lv(7, 453, 92.0), lv(5, 600, 60)), 0.95, strict, 4, true},
		{"held twice, broke once: not held", []Level{lv(2, 100, 20), lv(4, 100, 20), lv(4, 100, 60), lv(4, 100, 30)}, 0.95, strict, 2, true},
		{"a repeat judged at looser objectives than the run's holds", with(attempt10, lv(7, 453, 92.0)), 0.95, loose, 12, true},
		{"more than 5% of its requests failed: never held", []Level{lv(2, 100, 20), {Concurrency: 4, Requests: 100, Errors: 6, TTFTP95Seconds: 0.1, ITLP95Seconds: 0.02}}, 0.95, strict, 2, true},
		{"5% failed: held", []Level{lv(2, 100, 20), {Concurrency: 4, Requests: 100, Errors: 5, TTFTP95Seconds: 0.1, ITLP95Seconds: 0.02}}, 0.95, strict, 4, true},
		{"looser objectives than the run's: every level held, the top one", attempt7, 0.95, loose, 9, true},
		{"tighter objectives than the run's: judged again", attempt7, 0.95, Objectives{TTFT: 2 * time.Second, ITL: 35 * time.Millisecond, Quantile: 0.95}, 3, true},
		{"TTFT alone breaks", []Level{lv(4, 1900, 20), lv(8, 2100, 20)}, 0.95, strict, 4, true},
		{"none held", []Level{lv(2, 100, 60)}, 0.95, strict, 0, true},
		{"a level of no requests never held", []Level{lv(2, 100, 20), {Concurrency: 4}}, 0.95, strict, 2, true},
		{"no levels: nothing measured fleet-wide", nil, 0.95, strict, 0, false},
		{"levels at another quantile say nothing of this one", precise, 0.99, strict, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &Calibration{Levels: tc.levels, Objectives: ObjectivesJSON{TTFTSeconds: 2, ITLSeconds: 0.05, Quantile: tc.quantile}}
			got, ok := c.HeldStreams(tc.o)
			require.Equal(t, tc.ok, ok)
			require.Equal(t, tc.want, got)
		})
	}
}

func TestCalibrationRefusesBadLevels(t *testing.T) {
	const head = `{"version":2,"model":"m","replicas":1,"objectives":{"ttft_seconds":2,"itl_seconds":0.05,"quantile":0.95},
		"curve":{"itl_bounds":[0.05],"ttft_bounds":[1],"bins":[{"running":1,"concurrency":1}]},"levels":[`
	for _, tc := range []struct{ name, level, want string }{
		{"negative p95", `{"concurrency":2,"requests":1,"itl_p95_seconds":-0.01}`, "level 0 has a negative"},
		{"negative concurrency", `{"concurrency":-2,"requests":1}`, "level 0 has a negative"},
		{"well formed", `{"concurrency":2,"requests":1,"ttft_p95_seconds":0.3,"itl_p95_seconds":0.03}`, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ReadCalibration(strings.NewReader(head + tc.level + "]}"))
			if tc.want == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tc.want)
		})
	}
}

func TestStreamsBound(t *testing.T) {
	// A curve whose streams a replica are about 15 (within to 10, 0.93
	// at 20), claimed over 2 replicas.
	c := testCurve(testBin(5, 1, 1, 50, 500), testBin(10, 0.97, 1, 100, 500), testBin(20, 0.93, 1, 180, 500))
	at, err := c.At(testObjectives)
	require.NoError(t, err)
	claim := 2 * at.Streams
	require.InDelta(t, 30, claim, 5)
	lv := func(c int, within bool) Level {
		itl := 0.04
		if !within {
			itl = 0.07
		}
		return Level{Concurrency: c, Requests: 100, TTFTP95Seconds: 0.5, ITLP95Seconds: itl}
	}
	thin := testCurve(testBin(5, 1, 1, 50, 10))
	for _, tc := range []struct {
		name   string
		curve  Curve
		levels []Level
		want   float64
		ok     bool
	}{
		{"measured past the claim, all held up to it: the ladder vouches", c, []Level{lv(10, true), lv(20, true), lv(40, false)}, 0, false},
		{"the claim's own level held", c, []Level{lv(10, true), lv(int(claim)+1, true)}, 0, false},
		{"never measured as far as the claim: bounded", c, []Level{lv(10, true), lv(20, true)}, 20, true},
		{"a level below the claim broke: bounded by the highest held", c, []Level{lv(10, true), lv(15, false), lv(20, true), lv(40, false)}, 20, true},
		{"a repeat below the claim broke: bounded by the level held every time", c, []Level{lv(10, true), lv(20, true), lv(40, false), lv(20, false)}, 10, true},
		{"a curve too thin to read cannot be vouched for", thin, []Level{lv(10, true), lv(40, false)}, 10, true},
		{"no levels: no bound", c, nil, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cal := &Calibration{Replicas: 2, Levels: tc.levels, Curve: tc.curve,
				Objectives: ObjectivesJSON{TTFTSeconds: 2, ITLSeconds: 0.05, Quantile: 0.95}}
			got, ok := cal.StreamsBound(testObjectives)
			require.Equal(t, tc.ok, ok)
			require.Equal(t, tc.want, got)
		})
	}
}

func TestRateBound(t *testing.T) {
	// The curve of TestStreamsBound: about 30 streams claimed over 2
	// replicas.
	c := testCurve(testBin(5, 1, 1, 50, 500), testBin(10, 0.97, 1, 100, 500), testBin(20, 0.93, 1, 180, 500))
	lv := func(c int, within bool, tps float64) Level {
		itl := 0.04
		if !within {
			itl = 0.07
		}
		return Level{Concurrency: c, Requests: 100, TTFTP95Seconds: 0.5, ITLP95Seconds: itl, OutputTokensPerSec: tps}
	}
	bounded := []Level{lv(4, true, 200), lv(8, true, 300), lv(12, false, 500), lv(16, true, 360)}
	for _, tc := range []struct {
		name   string
		levels []Level
		load   float64
		want   float64
		ok     bool
	}{
		{"the ladder vouches for the curves: no bound", []Level{lv(10, true, 400), lv(40, true, 900)}, 6, 0, false},
		{"no levels: no bound", nil, 6, 0, false},
		{"between two held levels: linear", bounded, 6, 250, true},
		{"on a held level: its rate", bounded, 8, 300, true},
		{"across a broken level: between the held ones", bounded, 12, 330, true},
		{"below the lowest: in proportion", bounded, 2, 100, true},
		{"above the highest held: its rate", bounded, 30, 360, true},
		{"a repeated level: the lowest rate, the one every measurement reached", []Level{lv(4, true, 200), lv(4, true, 180), lv(8, false, 300)}, 4, 180, true},
		{"a repeated level that broke once is not held", []Level{lv(4, true, 200), lv(8, true, 300), lv(12, false, 400), lv(8, false, 280)}, 8, 200, true},
		{"below a refuted level: in proportion to the held one", []Level{lv(4, true, 200), lv(8, true, 300), lv(12, false, 400), lv(8, false, 280)}, 2, 100, true},
		{"nothing held: nothing to sell", []Level{lv(4, false, 200)}, 4, 0, true},
		{"no load: no rate", bounded, 0, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cal := &Calibration{Replicas: 2, Levels: tc.levels, Curve: c,
				Objectives: ObjectivesJSON{TTFTSeconds: 2, ITLSeconds: 0.05, Quantile: 0.95}}
			got, ok := cal.RateBound(testObjectives, tc.load)
			require.Equal(t, tc.ok, ok)
			require.InDelta(t, tc.want, got, 1e-9)
		})
	}
}

package extproc

import (
	"bytes"
	"strconv"
	"strings"
	"testing"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
)

// TestCacheSaltVLLMRefuses: every shape of cache_salt vLLM 0.32's
// validate_cache_salt refuses is answered 400 with vLLM's reason before
// routing, for a model only vLLM serves; the shapes it takes, and any
// salt for a model SGLang serves (alone or beside vLLM) or a model the
// EPP has no endpoint of, are routed. A refused salt reaches neither the
// scheduler nor a metric label.
func TestCacheSaltVLLMRefuses(t *testing.T) {
	long := strings.Repeat("s", saltMaxChars)
	wide := strings.Repeat("é", saltMaxChars) // 128 characters, 256 bytes
	for _, tt := range []struct {
		name, model, salt string // salt is the raw JSON value
		refused           string // vLLM's message, "" when routed
		scheduled         string // the salt the scheduler gets when routed
	}{
		{"a plain salt", "m1", `"tenant-a"`, "", "tenant-a"},
		{"null is no salt", "m1", `null`, "", ""},
		{"128 characters", "m1", `"` + long + `"`, "", long},
		{"128 characters of two bytes", "m1", `"` + wide + `"`, "", wide},
		{"escapes that decode to allowed characters", "m1", `"a\u0041\n"`, "", "aA\n"},
		{"empty", "m1", `""`, saltNotString, ""},
		{"a number", "m1", `42`, saltNotString, ""},
		{"a list", "m1", `["a"]`, saltNotString, ""},
		{"an object", "m1", `{"a":"b"}`, saltNotString, ""},
		{"true", "m1", `true`, saltNotString, ""},
		{"129 characters", "m1", `"` + long + `s"`, saltBadContents, ""},
		{"an at sign", "m1", `"a@b"`, saltBadContents, ""},
		{"a slash", "m1", `"a/b"`, saltBadContents, ""},
		{"an escaped slash", "m1", `"a\/b"`, saltBadContents, ""},
		{"a backslash", "m1", `"a\\b"`, saltBadContents, ""},
		{"NUL", "m1", `"a\u0000b"`, saltBadContents, ""},
		{"SGLang takes it", "sg", `"a/b"`, "", "a/b"},
		{"beside SGLang, vLLM's replicas refuse it themselves", "mix", `"a@b"`, "", "a@b"},
		{"a model with no endpoint", "other", `"a@b"`, "", "a@b"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p := &fakePicker{addrs: []string{ep1}}
			reg := prometheus.NewRegistry()
			s := NewServer(Config{}, p, nil, reg, zap.NewNop())
			s.SetModelEngines(map[string]Engines{"m1": EngineVLLM, "sg": EngineSGLang, "mix": EngineVLLM | EngineSGLang})
			c := serve(t, Config{}, s)
			body := `{"model":"` + tt.model + `","cache_salt":` + tt.salt + `,` + msgs + `}`
			var out []*extprocv3.ProcessingResponse
			if tt.refused != "" {
				out = append(out, expImmediate(400, "bad_request", tt.refused))
			} else {
				out = append(out, expRouted(ep1, strconv.Itoa(len(body))), expReqBody(body, true))
			}
			require.NoError(t, runSteps(t, c, []step{{chatHeaders(), nil}, {reqBody(body, true), out}}))
			reqs, _ := p.snapshot()
			if tt.refused != "" {
				require.Empty(t, reqs, "a refused salt never reaches the scheduler")
				require.Equal(t, 1.0, testutil.ToFloat64(s.m.errors.WithLabelValues(unknownLabel, unknownLabel, "bad_request")))
			} else {
				require.Len(t, reqs, 1)
				require.Equal(t, tt.scheduled, reqs[0].CacheSalt)
			}
			families, err := reg.Gather()
			require.NoError(t, err)
			for _, f := range families {
				for _, m := range f.GetMetric() {
					for _, l := range m.GetLabel() {
						if len(tt.scheduled) > 1 {
							require.NotContains(t, l.GetValue(), tt.scheduled, "%s: a salt on a metric label", f.GetName())
						}
						require.NotContains(t, l.GetValue(), "a@b", f.GetName())
					}
				}
			}
		})
	}
}

func FuzzVLLMSaltRefusal(f *testing.F) {
	for _, s := range []string{`"a"`, `null`, `""`, `42`, `"a\/b"`, `"\u0000"`, `"` + strings.Repeat("é", 129) + `"`, `"\ud800"`, `[`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		msg := vllmSaltRefusal(raw)
		require.Contains(t, []string{"", saltNotString, saltBadContents}, msg)
		if v := bytes.TrimLeft(raw, " \t\r\n"); msg == "" && !isNull(raw) {
			// What vLLM takes is a string it would take (the request's
			// span of the value starts at its quote; JSON whitespace
			// before it is the decoder's to skip).
			require.True(t, len(v) >= 2 && v[0] == '"', "%q taken", raw)
		}
	})
}

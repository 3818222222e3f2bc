package tokenizer

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/ardanlabs/jinja"
	"github.com/stretchr/testify/require"
)

// Expected strings are what CPython 3.11's repr and json.dumps print.
func TestPyFloatRepr(t *testing.T) {
	tests := []struct {
		in   float64
		want string
	}{
		{1.0, "1.0"}, {2.5, "2.5"}, {1e16, "1e+16"}, {1e15, "1000000000000000.0"},
		{0.0001, "0.0001"}, {0.00001, "1e-05"}, {-0.5, "-0.5"}, {123456789.125, "123456789.125"},
		{1.5e300, "1.5e+300"}, {0.1, "0.1"}, {1e22, "1e+22"}, {0.0, "0.0"}, {5e-324, "5e-324"},
		{-1e-7, "-1e-07"}, {12345678901234567.0, "1.2345678901234568e+16"},
	}
	for _, tc := range tests {
		require.Equal(t, tc.want, pyFloatRepr(tc.in), "%v", tc.in)
	}
}

func tojson(t *testing.T, src string, kwargs map[string]jinja.Value) string {
	t.Helper()
	v, err := decodeOrdered([]byte(src))
	require.NoError(t, err)
	out, err := pyTojson([]jinja.Value{v}, kwargs)
	require.NoError(t, err)
	return out.AsString()
}

func TestPyTojson(t *testing.T) {
	tests := []struct {
		name   string
		src    string
		kwargs map[string]jinja.Value
		want   string
	}{
		{"key order kept", `{"b":1,"a":[1,2.0,null,true]}`, nil, `{"b": 1, "a": [1, 2.0, null, true]}`},
		{"indent", `{"b":1,"a":[1,2.0]}`, map[string]jinja.Value{"indent": jinja.NewInt(2)}, "{\n  \"b\": 1,\n  \"a\": [\n    1,\n    2.0\n  ]\n}"},
		{"indent zero, empty list", `{"a":[]}`, map[string]jinja.Value{"indent": jinja.NewInt(0)}, "{\n\"a\": []\n}"},
		{"sort keys", `{"b":{},"a":[]}`, map[string]jinja.Value{"sort_keys": jinja.NewBool(true)}, `{"a": [], "b": {}}`},
		{"escapes", `"\u0001\b\u2028\u007f/<>&é"`, nil, "\"\\u0001\\b\u2028\x7f/<>&é\""},
		{"ascii", `"é😀\u007f"`, map[string]jinja.Value{"ensure_ascii": jinja.NewBool(true)}, `"\u00e9\ud83d\ude00\u007f"`},
		{"separators", `{"a":[1,2]}`, map[string]jinja.Value{"separators": jinja.NewList([]jinja.Value{jinja.NewString(","), jinja.NewString(":")})}, `{"a":[1,2]}`},
		{"big int stays int", `9007199254740993`, nil, `9007199254740993`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, tojson(t, tc.src, tc.kwargs))
		})
	}
}

func TestDecodeOrderedErrors(t *testing.T) {
	for _, src := range []string{``, `{`, `{"a":1}x`, `[1,]`, strings.Repeat("[", 200) + strings.Repeat("]", 200), `{"a" 1}`} {
		_, err := decodeOrdered([]byte(src))
		require.Error(t, err, src)
	}
}

func TestPyTrim(t *testing.T) {
	out, err := pyTrim([]jinja.Value{jinja.NewString(" \x1c\u0085x\ufeff\u180e \n")}, nil)
	require.NoError(t, err)
	require.Equal(t, "x\ufeff\u180e", out.AsString()) // as Python's str.strip()
	out, err = pyTrim([]jinja.Value{jinja.NewString("xxayx"), jinja.NewString("x")}, nil)
	require.NoError(t, err)
	require.Equal(t, "ay", out.AsString())
}

// FuzzDecodeOrdered checks that any input decodes or errors without
// panicking, and that what decodes re-encodes as valid JSON.
func FuzzDecodeOrdered(f *testing.F) {
	for _, s := range []string{`{"b":1,"a":[1,2.5,null,true,"x"]}`, `"\u00e9"`, `1e400`, `[[[]]]`, `{"a":{"a":{}}}`, `-0.0`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v, err := decodeOrdered([]byte(s))
		if err != nil {
			return
		}
		out, err := pyTojson([]jinja.Value{v}, nil)
		if err != nil {
			return // NaN/Inf from overflowing numbers cannot be re-encoded
		}
		require.True(t, json.Valid([]byte(out.AsString())) || strings.Contains(out.AsString(), "Infinity"), out.AsString())
	})
}

package jsonstr

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestDecode(t *testing.T) {
	tests := []struct {
		name, raw, want string
		err             bool
	}{
		{"empty", `""`, "", false},
		{"plain", `"hello world, this is longer than eight bytes"`, "hello world, this is longer than eight bytes", false},
		{"escapes", `"a\"b\\c\/d\be\ff\ng\rh\ti"`, "a\"b\\c/d\be\ff\ng\rh\ti", false},
		{"unicode escape", `"caf\u00e9 \u4f60"`, "café 你", false},
		{"surrogate pair", `"\ud83d\ude00!"`, "😀!", false},
		{"lone surrogate becomes U+FFFD", `"\ud83d x"`, "\ufffd x", false},
		{"reversed pair", `"\ude00\ud83d"`, "\ufffd\ufffd", false},
		{"utf-8 text", `"naïve 你好 😀 and more text"`, "naïve 你好 😀 and more text", false},
		{"invalid utf-8 becomes U+FFFD", "\"ab\xffcd\"", "ab\ufffdcd", false},
		{"bad escape", `"a\x"`, "", true},
		{"short unicode escape", `"\u12"`, "", true},
		{"control character", "\"a\nb\"", "", true},
		{"bare quote inside", `"ab"cd"`, "", true},
		{"dangling backslash", `"ab\"`, "", true},
		{"not a string", `123`, "", true},
		{"unterminated", `"abc`, "", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Decode([]byte(tc.raw))
			if tc.err {
				require.Error(t, err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
}

func TestPlain(t *testing.T) {
	for c := range 256 {
		want := c >= 0x20 && c < 0x80 && c != '"' && c != '\\'
		for pos := range 8 {
			var w [8]byte
			for i := range w {
				w[i] = 'a'
			}
			w[pos] = byte(c)
			require.Equal(t, want, plain(binary.LittleEndian.Uint64(w[:])), "byte %#x at %d", c, pos)
		}
	}
}

// FuzzDecode: Decode agrees with encoding/json on every input whose value
// is a string, both on the value and on whether there is one; any other
// value is an error.
func FuzzDecode(f *testing.F) {
	for _, s := range []string{`"plain"`, `"a\"b\\n\u00e9\ud83d\ude00"`, "\"\xff\"", `"\ud800"`, `"x"y"`, `"`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		var want string
		wantErr := json.Unmarshal(raw, &want)
		got, err := Decode(raw)
		appended, aerr := AppendDecode([]byte("pre:"), raw)
		if v := bytes.TrimLeft(raw, " \t\r\n"); wantErr != nil || len(v) == 0 || v[0] != '"' {
			require.Error(t, err)
			require.Error(t, aerr)
			require.Equal(t, "pre:", string(appended), "an error leaves dst as it was")
			return
		}
		require.NoError(t, err)
		require.Equal(t, want, got)
		require.NoError(t, aerr)
		require.Equal(t, "pre:"+want, string(appended))
	})
}

func BenchmarkDecode(b *testing.B) {
	text := strings.Repeat("The router sends each request to a replica whose cache holds its prefix. \"Quoted\"\n", 400)
	raw, err := json.Marshal(text)
	require.NoError(b, err)
	for _, bc := range []struct {
		name string
		fn   func([]byte) (string, error)
	}{
		{"jsonstr", Decode},
		{"encoding-json", func(r []byte) (s string, err error) { err = json.Unmarshal(r, &s); return }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.SetBytes(int64(len(raw)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := bc.fn(raw); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

package jsonstr

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"math/bits"
	"math/rand/v2"
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

// TestNeedLowest: in words of two bytes that may need a look among plain
// ones, and in words with several, need's lowest flagged byte is the first that
// needs a look, and a word with none has no flag: the decoder jumps to it.
func TestNeedLowest(t *testing.T) {
	needs := func(c byte) bool { return c < 0x20 || c >= 0x80 || c == '"' || c == '\\' }
	check := func(w []byte) {
		want := 8
		for i, c := range w {
			if needs(c) {
				want = i
				break
			}
		}
		m := need(binary.LittleEndian.Uint64(w)) & highs
		got := 8
		if m != 0 {
			got = bits.TrailingZeros64(m) >> 3
		}
		if got != want { // require in the loop costs seconds under -race
			require.Equal(t, want, got, "word % x", w)
		}
	}
	w := make([]byte, 8)
	for c1 := range 256 {
		for c2 := range 256 {
			for p1 := range 8 {
				for p2 := p1 + 1; p2 < 8; p2++ {
					copy(w, "abcdefgh")
					w[p1], w[p2] = byte(c1), byte(c2)
					check(w)
				}
			}
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 1 << 18 { // several bytes that need a look, among plain ones
		for i := range w {
			if w[i] = byte(rng.Uint32()); rng.IntN(4) > 0 {
				w[i] = 'a' + w[i]%26
			}
		}
		check(w)
	}
}

// TestPlain4: one byte that needs a look, anywhere in the four words,
// fails the four.
func TestPlain4(t *testing.T) {
	for c := range 256 {
		want := c >= 0x20 && c < 0x80 && c != '"' && c != '\\'
		for pos := range 32 {
			w := bytes.Repeat([]byte("a"), 32)
			w[pos] = byte(c)
			got := plain4(binary.LittleEndian.Uint64(w), binary.LittleEndian.Uint64(w[8:]),
				binary.LittleEndian.Uint64(w[16:]), binary.LittleEndian.Uint64(w[24:]))
			require.Equal(t, want, got, "byte %#x at %d", c, pos)
		}
	}
}

// TestDecodeEveryPosition: an escape, a control character, a quote or a
// multi-byte character at any offset of a long string (past and inside
// the four-word steps) decodes as encoding/json decodes it.
func TestDecodeEveryPosition(t *testing.T) {
	for _, special := range []string{`\n`, `\"`, `\u00e9`, "\n", `"`, "é", "\xff", `\`} {
		for pos := range 100 {
			raw := []byte(`"` + strings.Repeat("x", pos) + special + strings.Repeat("y", 100-pos) + `"`)
			var want string
			wantErr := json.Unmarshal(raw, &want)
			got, err := Decode(raw)
			if wantErr != nil {
				require.Error(t, err, "%q at %d", special, pos)
				continue
			}
			require.NoError(t, err, "%q at %d", special, pos)
			require.Equal(t, want, got, "%q at %d", special, pos)
		}
	}
}

// TestDecodeLongRuns: in text long enough for the vector scans, one or
// two special bytes at the edges of plainRun's windows and of runMin
// decode as encoding/json decodes them: the scans take the plain runs,
// the word loop what is not plain, and each hands over to the other at
// the right byte.
func TestDecodeLongRuns(t *testing.T) {
	specials := []string{`\n`, `\"`, `\u00e9`, "\n", `"`, "é", "\xff", "\x7f", `\`, "’"}
	var positions []int
	for _, p := range []int{0, 1, runMin, runWindow, 2 * runWindow} {
		positions = append(positions, p-1, p, p+1, p+7)
	}
	for _, n := range []int{runMin - 1, runMin, runWindow, runWindow + 1, 3*runWindow + 5} {
		for _, sp := range specials {
			for _, p := range positions {
				for _, q := range []int{-1, p + runMin - 1, p + runMin + 3, p + runWindow} {
					if p < 0 || p > n {
						continue
					}
					text := []byte(strings.Repeat("x", n))
					text = append(text[:p:p], append([]byte(sp), text[p:]...)...)
					if q >= 0 && q <= len(text) {
						text = append(text[:q:q], append([]byte(sp), text[q:]...)...)
					}
					raw := append(append([]byte(`"`), text...), '"')
					var want string
					wantErr := json.Unmarshal(raw, &want)
					got, err := Decode(raw)
					if wantErr != nil {
						require.Error(t, err, "%q at %d and %d of %d", sp, p, q, n)
						continue
					}
					require.NoError(t, err, "%q at %d and %d of %d", sp, p, q, n)
					require.Equal(t, want, got, "%q at %d and %d of %d", sp, p, q, n)
				}
			}
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

// BenchmarkDecodeLong is a 200 KiB prompt of plain text, the case that
// routing a long chat decodes.
//
//	go test ./internal/jsonstr -run '^$' -bench DecodeLong -count 6
func BenchmarkDecodeLong(b *testing.B) {
	text := strings.Repeat("The router sends each request to a replica whose cache holds its prefix. ", 2800)
	raw, err := json.Marshal(text)
	require.NoError(b, err)
	dst := make([]byte, 0, len(raw))
	b.SetBytes(int64(len(raw)))
	b.ReportAllocs()
	for b.Loop() {
		if dst, err = AppendDecode(dst[:0], raw); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDecodeNonASCII is text the vector scan does not take whole:
// Chinese, where no window is plain, and English with a curly quote every
// few hundred bytes, where every window has one.
//
//	go test ./internal/jsonstr -run '^$' -bench DecodeNonASCII -count 6
func BenchmarkDecodeNonASCII(b *testing.B) {
	for _, bc := range []struct{ name, text string }{
		{"chinese", strings.Repeat("路由器把每个请求发送到缓存中持有其前缀的副本。", 2000)},
		{"curly-quotes", strings.Repeat("The router sends each request to a replica whose cache holds its prefix; it’s the one that answers first, and the others wait for the next request to come. ", 1400)},
	} {
		raw, err := json.Marshal(bc.text)
		require.NoError(b, err)
		b.Run(bc.name, func(b *testing.B) {
			dst := make([]byte, 0, len(raw))
			b.SetBytes(int64(len(raw)))
			b.ReportAllocs()
			for b.Loop() {
				if dst, err = AppendDecode(dst[:0], raw); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

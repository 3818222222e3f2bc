// Package jsonstr decodes JSON string literals with the result
// encoding/json gives, at memory speed for the common case: runs of
// printable ASCII are found with vector scans and copied once, other text
// is checked eight bytes at a time, escapes are decoded inline, and only
// what encoding/json repairs or rejects (invalid UTF-8, lone surrogates,
// control characters) is handed to it. Prompts are long strings, and
// routing decodes every one of them.
package jsonstr

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"math/bits"
	"slices"
	"unicode/utf16"
	"unicode/utf8"
	"unsafe"

	"github.com/segmentio/asm/ascii"
)

var errNotString = errors.New("not a JSON string")

const (
	lows  = 0x0101010101010101
	highs = 0x8080808080808080
)

// plain reports whether none of the eight bytes in x needs a look: no
// control character, quote, backslash or non-ASCII byte.
func plain(x uint64) bool { return need(x)&highs == 0 }

// plain4 is plain of four words at once.
func plain4(x0, x1, x2, x3 uint64) bool {
	return (need(x0)|need(x1)|need(x2)|need(x3))&highs == 0
}

// need has the high bit of each byte of x that needs a look set, as plain
// tests it; above a non-ASCII byte, other bytes' bits may be wrong either
// way, so the lowest set bit is always the first byte that needs a look
// (TestNeedLowest). For an ASCII byte c, c+0x60 has its high bit set
// exactly when c >= 0x20, and (c^q)+0x7f exactly when c != q, and neither
// carries into the next byte; a non-ASCII byte is flagged by its own high
// bit, and only its carries reach the bytes above it.
func need(x uint64) uint64 {
	ctl := x + lows*(0x80-0x20)
	q := (x ^ (lows * '"')) + lows*0x7f
	b := (x ^ (lows * '\\')) + lows*0x7f
	return x | ^(ctl & q & b)
}

var unescaped = [256]byte{'"': '"', '\\': '\\', '/': '/', 'b': '\b', 'f': '\f', 'n': '\n', 'r': '\r', 't': '\t'}

// Decode returns the value of the JSON string literal raw (with its quotes;
// surrounding whitespace is allowed). Any other JSON value is an error.
func Decode(raw []byte) (string, error) {
	b, err := AppendDecode(nil, raw)
	if err != nil {
		return "", err
	}
	// b is new and never written again.
	return unsafe.String(unsafe.SliceData(b), len(b)), nil
}

// AppendDecode appends the value of the JSON string literal raw to dst, as
// Decode; on error dst is returned unchanged. Renderers use it to build a
// prompt without a copy of each message's text.
func AppendDecode(dst, raw []byte) ([]byte, error) {
	if len(raw) < 2 || raw[0] != '"' || raw[len(raw)-1] != '"' {
		return slow(dst, raw)
	}
	in := raw[1 : len(raw)-1]
	out := slices.Grow(dst, len(in)) // the value is never longer than the literal
	start, i := 0, 0
	scalar := 0 // up to here, text a vector scan found not plain
	for i < len(in) {
		if i >= scalar {
			n := plainRun(in[i:])
			if i += n; n == runWindow {
				continue
			}
			if i >= len(in) {
				break
			}
			if in[i] != '\\' {
				// Not a plain run (a byte that is not printable ASCII,
				// or escapes closer than runMin): the word loop takes
				// the window.
				scalar = i + runWindow
			}
		}
		end := len(in) // the word loops stop at the window's end
		if i < scalar {
			end = min(end, scalar)
		}
		// Four words a step with one branch: the checks of the four are
		// independent, and a branch per word held a 200 KiB prompt to a
		// third of the speed (BenchmarkDecodeLong).
		for ; i+32 <= end; i += 32 {
			w := in[i : i+32 : i+32]
			if !plain4(binary.LittleEndian.Uint64(w), binary.LittleEndian.Uint64(w[8:]),
				binary.LittleEndian.Uint64(w[16:]), binary.LittleEndian.Uint64(w[24:])) {
				break
			}
		}
		// Then a word at a time, and in the word that needs a look, to its
		// first byte that does: need's lowest flagged byte is always a
		// true one (TestDecodeEveryPosition), so the plain bytes before
		// an escape are not stepped through one by one.
		for i+8 <= end {
			m := need(binary.LittleEndian.Uint64(in[i:])) & highs
			if m != 0 {
				i += bits.TrailingZeros64(m) >> 3
				break
			}
			i += 8
		}
		if i >= len(in) {
			break
		}
		switch c := in[i]; {
		case c >= 0x20 && c < utf8.RuneSelf && c != '"' && c != '\\':
			i++
		case c >= utf8.RuneSelf:
			r, size := utf8.DecodeRune(in[i:])
			if r == utf8.RuneError && size == 1 {
				return slow(dst, raw) // encoding/json replaces it with U+FFFD
			}
			i += size
		case c == '\\' && i+1 < len(in):
			out = append(out, in[start:i]...)
			if e := unescaped[in[i+1]]; e != 0 {
				out = append(out, e)
				i += 2
			} else if r, n := unicodeEscape(in[i:]); n > 0 {
				out = utf8.AppendRune(out, r)
				i += n
			} else {
				return slow(dst, raw)
			}
			start = i
		default:
			return slow(dst, raw) // a control character, a bare quote, a dangling backslash
		}
	}
	return append(out, in[start:]...), nil
}

// runWindow is how far plainRun looks ahead. After a window that is not
// plain, the word loop takes the next window: text that is mostly
// non-ASCII is scanned by vector once and by word once, not by vector at
// each character (BenchmarkDecodeNonASCII).
const runWindow = 4096

// runMin is the shortest run plainRun takes: below it, the word loop is as
// fast as the vector scans' calls (BenchmarkDecode, an escape every 84
// bytes).
const runMin = 256

// plainRun is the length of the plain text at the start of in, up to its
// first backslash and at most runWindow bytes, when all of it is printable
// ASCII with no quote and it is runMin bytes or more; otherwise 0. Three
// vector scans (ascii.ValidPrint, bytes.IndexByte) read a plain run at
// tens of GB/s, where the word loop reads about 5 (BenchmarkDecodeLong). A
// 0 says nothing of where the text stops being plain: the word loop finds
// that.
func plainRun(in []byte) int {
	seg := in[:min(len(in), runWindow)]
	if b := bytes.IndexByte(seg, '\\'); b >= 0 {
		if b < runMin {
			return 0
		}
		seg = seg[:b]
	}
	if bytes.IndexByte(seg, '"') >= 0 || !ascii.ValidPrint(seg) {
		return 0
	}
	return len(seg)
}

// unicodeEscape decodes \uXXXX, or a surrogate pair \uXXXX\uXXXX, at the
// start of b; n is 0 for anything else (a lone surrogate included).
func unicodeEscape(b []byte) (r rune, n int) {
	r1 := hex4(b)
	switch {
	case r1 < 0:
		return 0, 0
	case !utf16.IsSurrogate(r1):
		return r1, 6
	}
	r2 := hex4(b[6:])
	if r2 < 0 {
		return 0, 0
	}
	if r = utf16.DecodeRune(r1, r2); r == utf8.RuneError {
		return 0, 0
	}
	return r, 12
}

// hex4 reads \uXXXX at the start of b, or returns -1.
func hex4(b []byte) rune {
	if len(b) < 6 || b[0] != '\\' || b[1] != 'u' {
		return -1
	}
	var r rune
	for _, c := range b[2:6] {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c -= 'a' - 10
		case c >= 'A' && c <= 'F':
			c -= 'A' - 10
		default:
			return -1
		}
		r = r<<4 | rune(c)
	}
	return r
}

func slow(dst, raw []byte) ([]byte, error) {
	if t := bytes.TrimLeft(raw, " \t\r\n"); len(t) == 0 || t[0] != '"' {
		return dst, errNotString // null too, which json.Unmarshal would take as ""
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return dst, err
	}
	return append(dst, s...), nil
}

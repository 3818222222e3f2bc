package extproc

import (
	"bytes"
	"errors"
	"fmt"

	"github.com/omnious/provider-node/internal/jsonstr"
)

// A minimal JSON scanner over the body bytes: it walks the top-level object
// once, records the byte spans of the few members routing needs, and skips
// everything else without decoding it. Nothing is copied; spans alias the
// body (TestAllocsParse). Structure is validated (brackets, strings, literals, numbers);
// string contents are not checked beyond their escapes, the engine does that.

const maxJSONDepth = 256

var (
	errUnexpectedEnd = errors.New("unexpected end of JSON input")
	errTooDeep       = errors.New("JSON nested too deeply")
)

func skipWS(b []byte, i int) int {
	for i < len(b) {
		switch b[i] {
		case ' ', '\t', '\n', '\r':
			i++
		default:
			return i
		}
	}
	return i
}

// skipString returns the index after the string starting at b[i] == '"'.
func skipString(b []byte, i int) (int, error) {
	i++
	quote := -1 // the next '"' at or after i, once found
	for {
		if quote < i {
			q := bytes.IndexByte(b[i:], '"')
			if q < 0 {
				return 0, errUnexpectedEnd
			}
			quote = i + q
		}
		bs := bytes.IndexByte(b[i:quote], '\\')
		if bs < 0 {
			return quote + 1, nil
		}
		// An escape before the quote: step over it and look again.
		j := i + bs + 1
		if j >= len(b) {
			return 0, errUnexpectedEnd
		}
		switch b[j] {
		case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			i = j + 1
		case 'u':
			if j+5 > len(b) {
				return 0, errUnexpectedEnd
			}
			for _, h := range b[j+1 : j+5] {
				if !isHex(h) {
					return 0, fmt.Errorf("invalid \\u escape at offset %d", j)
				}
			}
			i = j + 5
		default:
			return 0, fmt.Errorf("invalid escape at offset %d", j)
		}
	}
}

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

// skipValue returns the index after the value starting at b[i] (no leading
// whitespace).
func skipValue(b []byte, i, depth int) (int, error) {
	if i >= len(b) {
		return 0, errUnexpectedEnd
	}
	switch c := b[i]; {
	case c == '"':
		return skipString(b, i)
	case c == '{':
		it, err := newObjIter(b, i, depth+1)
		if err != nil {
			return 0, err
		}
		for {
			_, _, _, ok, err := it.next()
			if err != nil {
				return 0, err
			}
			if !ok {
				return it.i, nil
			}
		}
	case c == '[':
		return walkArray(b, i, depth, nil)
	case c == 't':
		return skipLiteral(b, i, "true")
	case c == 'f':
		return skipLiteral(b, i, "false")
	case c == 'n':
		return skipLiteral(b, i, "null")
	case c == '-' || c >= '0' && c <= '9':
		return skipNumber(b, i)
	default:
		return 0, fmt.Errorf("invalid character %q at offset %d", c, i)
	}
}

// walkArray returns the index after the array starting at b[i] == '[';
// fn, when not nil, is given each element's index and span [vs, ve).
func walkArray(b []byte, i, depth int, fn func(n, vs, ve int) error) (int, error) {
	if depth+1 > maxJSONDepth {
		return 0, errTooDeep
	}
	i = skipWS(b, i+1)
	if i < len(b) && b[i] == ']' {
		return i + 1, nil
	}
	for n := 0; ; n++ {
		j, err := skipValue(b, i, depth+1)
		if err != nil {
			return 0, err
		}
		if fn != nil {
			if err := fn(n, i, j); err != nil {
				return 0, err
			}
		}
		j = skipWS(b, j)
		if j >= len(b) {
			return 0, errUnexpectedEnd
		}
		switch b[j] {
		case ',':
			i = skipWS(b, j+1)
		case ']':
			return j + 1, nil
		default:
			return 0, fmt.Errorf("invalid character %q in array at offset %d", b[j], j)
		}
	}
}

func skipLiteral(b []byte, i int, lit string) (int, error) {
	if len(b)-i < len(lit) || string(b[i:i+len(lit)]) != lit {
		return 0, fmt.Errorf("invalid literal at offset %d", i)
	}
	return i + len(lit), nil
}

func skipNumber(b []byte, i int) (int, error) {
	start := i
	if b[i] == '-' {
		i++
	}
	digits := func() int {
		n := 0
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
			n++
		}
		return n
	}
	if i < len(b) && b[i] == '0' {
		i++
	} else if digits() == 0 {
		return 0, fmt.Errorf("invalid number at offset %d", start)
	}
	if i < len(b) && b[i] == '.' {
		i++
		if digits() == 0 {
			return 0, fmt.Errorf("invalid number at offset %d", start)
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if digits() == 0 {
			return 0, fmt.Errorf("invalid number at offset %d", start)
		}
	}
	return i, nil
}

// objIter walks the members of one object without allocating
// (TestAllocsParse).
type objIter struct {
	b     []byte
	i     int // next read position; after the closing brace once done
	depth int
	first bool
	done  bool
}

// newObjIter starts at b[i] == '{' (leading whitespace allowed).
func newObjIter(b []byte, i, depth int) (objIter, error) {
	if depth > maxJSONDepth {
		return objIter{}, errTooDeep
	}
	i = skipWS(b, i)
	if i >= len(b) {
		return objIter{}, errUnexpectedEnd
	}
	if b[i] != '{' {
		return objIter{}, fmt.Errorf("expected a JSON object at offset %d", i)
	}
	return objIter{b: b, i: i + 1, depth: depth, first: true}, nil
}

// next returns the raw key (between its quotes, escapes undecoded) and the
// value's span [vs, ve), or ok=false after the closing brace.
func (it *objIter) next() (key []byte, vs, ve int, ok bool, err error) {
	if it.done {
		return nil, 0, 0, false, nil
	}
	b := it.b
	i := skipWS(b, it.i)
	if i >= len(b) {
		return nil, 0, 0, false, errUnexpectedEnd
	}
	if it.first {
		it.first = false
		if b[i] == '}' {
			it.i, it.done = i+1, true
			return nil, 0, 0, false, nil
		}
	} else {
		switch b[i] {
		case '}':
			it.i, it.done = i+1, true
			return nil, 0, 0, false, nil
		case ',':
			i = skipWS(b, i+1)
		default:
			return nil, 0, 0, false, fmt.Errorf("invalid character %q after object member at offset %d", b[i], i)
		}
	}
	if i >= len(b) {
		return nil, 0, 0, false, errUnexpectedEnd
	}
	if b[i] != '"' {
		return nil, 0, 0, false, fmt.Errorf("expected an object key at offset %d", i)
	}
	ke, err := skipString(b, i)
	if err != nil {
		return nil, 0, 0, false, err
	}
	key = b[i+1 : ke-1]
	i = skipWS(b, ke)
	if i >= len(b) {
		return nil, 0, 0, false, errUnexpectedEnd
	}
	if b[i] != ':' {
		return nil, 0, 0, false, fmt.Errorf("expected ':' at offset %d", i)
	}
	vs = skipWS(b, i+1)
	ve, err = skipValue(b, vs, it.depth)
	if err != nil {
		return nil, 0, 0, false, err
	}
	it.i = ve
	return key, vs, ve, true, nil
}

// keyIs compares a raw key with name, decoding escapes in the rare case the
// key has any.
func keyIs(raw []byte, name string) bool {
	if bytes.IndexByte(raw, '\\') < 0 {
		return string(raw) == name
	}
	q := make([]byte, 0, len(raw)+2)
	s, err := jsonstr.Decode(append(append(append(q, '"'), raw...), '"'))
	return err == nil && s == name
}

// parseInt reads a non-negative JSON integer (a float is truncated); any
// other value gives 0.
func parseInt(raw []byte) int {
	n := 0
	for _, c := range raw {
		if c < '0' || c > '9' {
			break
		}
		if n > (1<<62)/10 {
			return n
		}
		n = n*10 + int(c-'0')
	}
	return n
}

func isNull(raw []byte) bool { return string(raw) == "null" }

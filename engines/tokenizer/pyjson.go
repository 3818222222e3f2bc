package tokenizer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"sort"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/ardanlabs/jinja"
)

// maxJSONDepth bounds nesting in request JSON decoded for templates.
const maxJSONDepth = 128

// decodeOrdered decodes JSON into template values, keeping object keys in
// their original order (Python dicts do, Go maps do not). Integers stay
// integers and other numbers become floats, as Python's json.loads does.
func decodeOrdered(b []byte) (jinja.Value, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	v, err := decodeValue(dec, 0)
	if err != nil {
		return jinja.Value{}, err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return jinja.Value{}, errors.New("trailing data after JSON value")
	}
	return v, nil
}

func decodeValue(dec *json.Decoder, depth int) (jinja.Value, error) {
	if depth > maxJSONDepth {
		return jinja.Value{}, errors.New("JSON nested too deeply")
	}
	tok, err := dec.Token()
	if err != nil {
		return jinja.Value{}, err
	}
	switch t := tok.(type) {
	case nil:
		return jinja.None(), nil
	case bool:
		return jinja.NewBool(t), nil
	case string:
		return jinja.NewString(t), nil
	case json.Number:
		s := string(t)
		if !strings.ContainsAny(s, ".eE") {
			if i, err := t.Int64(); err == nil {
				return jinja.NewInt(i), nil
			}
		}
		f, err := t.Float64()
		if err != nil && !math.IsInf(f, 0) {
			return jinja.Value{}, fmt.Errorf("bad number %s: %w", s, err)
		}
		return jinja.NewFloat(f), nil
	case json.Delim:
		switch t {
		case '[':
			var items []jinja.Value
			for dec.More() {
				v, err := decodeValue(dec, depth+1)
				if err != nil {
					return jinja.Value{}, err
				}
				items = append(items, v)
			}
			if _, err := dec.Token(); err != nil {
				return jinja.Value{}, err
			}
			return jinja.NewList(items), nil
		case '{':
			v := jinja.NewDict()
			d := v.AsDict()
			for dec.More() {
				kt, err := dec.Token()
				if err != nil {
					return jinja.Value{}, err
				}
				k, ok := kt.(string)
				if !ok {
					return jinja.Value{}, errors.New("object key is not a string")
				}
				val, err := decodeValue(dec, depth+1)
				if err != nil {
					return jinja.Value{}, err
				}
				d.Set(k, val) // a repeated key keeps its first position, as in Python
			}
			if _, err := dec.Token(); err != nil {
				return jinja.Value{}, err
			}
			return v, nil
		}
	}
	return jinja.Value{}, fmt.Errorf("unexpected JSON token %v", tok)
}

// pyTojson is Hugging Face's tojson filter: json.dumps with ensure_ascii,
// indent, separators and sort_keys keyword arguments.
func pyTojson(args []jinja.Value, kwargs map[string]jinja.Value) (jinja.Value, error) {
	if len(args) == 0 {
		return jinja.Undefined(), errors.New("tojson needs a value")
	}
	o := pyDumpOpts{item: ", ", key: ": "}
	if v, ok := kwargs["indent"]; ok && v.IsInt() {
		n := int(v.AsInt())
		if n < 0 || n > 64 {
			return jinja.Undefined(), fmt.Errorf("tojson: indent %d out of range", n)
		}
		o.indent, o.item = strings.Repeat(" ", n), ","
		o.indented = true
	}
	if v, ok := kwargs["separators"]; ok && v.IsList() && v.AsList().Len() == 2 {
		it := v.AsList().Items
		if !it[0].IsString() || !it[1].IsString() {
			return jinja.Undefined(), errors.New("tojson: separators must be two strings")
		}
		o.item, o.key = it[0].AsString(), it[1].AsString()
	}
	if v, ok := kwargs["sort_keys"]; ok {
		o.sortKeys = v.IsTruthy()
	}
	if v, ok := kwargs["ensure_ascii"]; ok {
		o.ascii = v.IsTruthy()
	}
	var b strings.Builder
	if err := o.dump(&b, args[0], 0); err != nil {
		return jinja.Undefined(), err
	}
	return jinja.NewString(b.String()), nil
}

type pyDumpOpts struct {
	item, key, indent string
	indented          bool
	sortKeys, ascii   bool
}

func (o *pyDumpOpts) newline(b *strings.Builder, depth int) {
	if !o.indented {
		return
	}
	b.WriteByte('\n')
	for range depth {
		b.WriteString(o.indent)
	}
}

func (o *pyDumpOpts) dump(b *strings.Builder, v jinja.Value, depth int) error {
	if depth > maxJSONDepth {
		return errors.New("tojson: value nested too deeply")
	}
	switch {
	case v.IsNone(), v.IsUndefined():
		b.WriteString("null")
	case v.IsBool():
		if v.AsBool() {
			b.WriteString("true")
		} else {
			b.WriteString("false")
		}
	case v.IsInt():
		b.WriteString(strconv.FormatInt(v.AsInt(), 10))
	case v.IsFloat():
		b.WriteString(pyFloatRepr(v.AsFloat()))
	case v.IsString():
		pyQuote(b, v.AsString(), o.ascii)
	case v.IsList():
		items := v.AsList().Items
		if len(items) == 0 {
			b.WriteString("[]")
			return nil
		}
		b.WriteByte('[')
		for i, it := range items {
			if i > 0 {
				b.WriteString(o.item)
			}
			o.newline(b, depth+1)
			if err := o.dump(b, it, depth+1); err != nil {
				return err
			}
		}
		o.newline(b, depth)
		b.WriteByte(']')
	case v.IsDict():
		d := v.AsDict()
		keys := d.Keys
		if len(keys) == 0 {
			b.WriteString("{}")
			return nil
		}
		if o.sortKeys {
			keys = append([]string(nil), keys...)
			sort.Strings(keys) // UTF-8 byte order is code point order, as in Python
		}
		b.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				b.WriteString(o.item)
			}
			o.newline(b, depth+1)
			pyQuote(b, k, o.ascii)
			b.WriteString(o.key)
			if err := o.dump(b, d.Data[k], depth+1); err != nil {
				return err
			}
		}
		o.newline(b, depth)
		b.WriteByte('}')
	default:
		return fmt.Errorf("tojson: cannot serialize %s", v.String())
	}
	return nil
}

// pyFloatRepr formats f as Python's repr(float): shortest round-trip
// digits, fixed notation for exponents in [-4, 16), else d.ddde±XX; always
// with a fraction or exponent so it reads back as a float.
func pyFloatRepr(f float64) string {
	switch {
	case math.IsNaN(f):
		return "NaN"
	case math.IsInf(f, 1):
		return "Infinity"
	case math.IsInf(f, -1):
		return "-Infinity"
	}
	s := strconv.FormatFloat(f, 'e', -1, 64) // -d.ddde±XX
	mant, expStr, _ := strings.Cut(s, "e")
	exp, _ := strconv.Atoi(expStr)
	neg := strings.HasPrefix(mant, "-")
	mant = strings.TrimPrefix(mant, "-")
	digits := strings.Replace(mant, ".", "", 1)
	var out string
	if exp >= -4 && exp < 16 {
		if exp < 0 {
			out = "0." + strings.Repeat("0", -exp-1) + digits
		} else if len(digits) <= exp+1 {
			out = digits + strings.Repeat("0", exp+1-len(digits)) + ".0"
		} else {
			out = digits[:exp+1] + "." + digits[exp+1:]
		}
	} else {
		out = mant
		sign := "+"
		if exp < 0 {
			sign, exp = "-", -exp
		}
		out += "e" + sign + fmt.Sprintf("%02d", exp)
	}
	if neg {
		out = "-" + out
	}
	return out
}

// pyQuote writes s as json.dumps quotes a string: \" \\ \n \r \t \b \f
// short escapes, other controls as \u00XX, and with ascii every non-ASCII
// rune as \uXXXX (surrogate pairs above the BMP).
func pyQuote(b *strings.Builder, s string, ascii bool) {
	const hex = "0123456789abcdef"
	b.WriteByte('"')
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch c {
			case '"':
				b.WriteString(`\"`)
			case '\\':
				b.WriteString(`\\`)
			case '\n':
				b.WriteString(`\n`)
			case '\r':
				b.WriteString(`\r`)
			case '\t':
				b.WriteString(`\t`)
			case '\b':
				b.WriteString(`\b`)
			case '\f':
				b.WriteString(`\f`)
			default:
				if c < 0x20 || (ascii && c == 0x7f) {
					b.WriteString(`\u00`)
					b.WriteByte(hex[c>>4])
					b.WriteByte(hex[c&15])
				} else {
					b.WriteByte(c)
				}
			}
			i++
			continue
		}
		r, w := utf8.DecodeRuneInString(s[i:])
		if !ascii {
			b.WriteString(s[i : i+w])
			i += w
			continue
		}
		writeU := func(u rune) {
			b.WriteString(`\u`)
			for sh := 12; sh >= 0; sh -= 4 {
				b.WriteByte(hex[(u>>sh)&15])
			}
		}
		if r > 0xFFFF {
			r -= 0x10000
			writeU(0xD800 + (r >> 10))
			writeU(0xDC00 + (r & 0x3FF))
		} else {
			writeU(r)
		}
		i += w
	}
	b.WriteByte('"')
}

// pyIsSpace is Python's str.isspace for one rune: Go's unicode.IsSpace
// plus the information separators U+001C-U+001F.
func pyIsSpace(r rune) bool {
	return unicode.IsSpace(r) || (r >= 0x1C && r <= 0x1F)
}

// pyTrim is Jinja2's trim filter: str.strip(chars).
func pyTrim(args []jinja.Value, kwargs map[string]jinja.Value) (jinja.Value, error) {
	if len(args) == 0 {
		return jinja.Undefined(), errors.New("trim needs a value")
	}
	s := args[0].String()
	if args[0].IsString() {
		s = args[0].AsString()
	}
	chars, ok := kwargs["chars"]
	if len(args) > 1 {
		chars, ok = args[1], true
	}
	if ok && chars.IsString() {
		return jinja.NewString(strings.Trim(s, chars.AsString())), nil
	}
	return jinja.NewString(strings.TrimFunc(s, pyIsSpace)), nil
}

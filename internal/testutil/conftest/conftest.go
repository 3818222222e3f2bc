// Package conftest holds what the config tests of every component share.
// Only tests import it.
//
// Check keeps the defaults a README documents in step with the code: a
// test reads the README's configuration table, compares every row's
// default with the field its key names in WithDefaults of a zero config,
// and requires a row for every field.
//
// A table row is "| key | default | meaning |". The key cell holds one or
// more backquoted keys (YAML names joined with ".", or Go field names where
// a field has no YAML tag); a key ending in ".*" covers every field under it
// that has no row of its own. The default cell is read up to the first
// " (", ";" or " —", so a note may follow. Several keys in one row take
// the same default, or one each when the cell lists as many values,
// separated by ", " (a ".*" key takes one value per field it covers, in
// field order, or one for all). A default starting with "see " delegates
// the keys to another README and is not compared.
//
// Values are compared by kind: durations as time.ParseDuration reads them,
// numbers as decimals (thousands separators and a KiB/MiB/GiB suffix
// allowed), strings with or without backquotes (`""` for empty), "off" and
// "none" as the zero value of any kind.
package conftest

import (
	"fmt"
	"math"
	"os"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Field is one leaf of a config: its key and value.
type Field struct {
	Key   string
	Value reflect.Value
}

// Fields flattens cfg, a struct, into its leaves in field order. Nested
// structs are walked (except time.Duration, which is a leaf, and the types
// in leaves); pointers, slices, maps and other kinds are leaves.
func Fields(cfg any, leaves ...reflect.Type) []Field {
	var out []Field
	isLeaf := map[reflect.Type]bool{}
	for _, l := range leaves {
		isLeaf[l] = true
	}
	var walk func(prefix string, v reflect.Value)
	walk = func(prefix string, v reflect.Value) {
		for i := range v.NumField() {
			f := v.Type().Field(i)
			if !f.IsExported() {
				continue
			}
			name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
			if name == "-" {
				continue
			}
			if name == "" {
				name = f.Name
			}
			fv := v.Field(i)
			if fv.Kind() == reflect.Struct && !isLeaf[f.Type] {
				walk(prefix+name+".", fv)
				continue
			}
			out = append(out, Field{prefix + name, fv})
		}
	}
	walk("", reflect.ValueOf(cfg))
	return out
}

// Row is one table row: its cells, trimmed.
type Row []string

// Table returns the rows (without header and separator) of the first
// Markdown table in file, after the first heading that contains section
// ("" for anywhere), whose header cells begin with header,
// case-insensitively.
func Table(t testing.TB, file, section string, header ...string) []Row {
	t.Helper()
	data, err := os.ReadFile(file)
	require.NoError(t, err)
	var rows []Row
	found, in := section == "", false
	for line := range strings.SplitSeq(string(data), "\n") {
		line = strings.TrimSpace(line)
		if !found {
			found = strings.HasPrefix(line, "#") && strings.Contains(line, section)
			continue
		}
		if !strings.HasPrefix(line, "|") {
			if in {
				break
			}
			continue
		}
		cells := splitRow(line)
		switch {
		case !in && matchHeader(cells, header):
			in = true
		case in && strings.Trim(line, "|-: ") == "":
		case in:
			rows = append(rows, cells)
		}
	}
	require.True(t, in, "%s has no table with header %q under a heading with %q", file, header, section)
	require.NotEmpty(t, rows, "%s: the %q table is empty", file, header)
	return rows
}

func splitRow(line string) Row {
	parts := strings.Split(strings.Trim(line, "|"), "|")
	row := make(Row, len(parts))
	for i, p := range parts {
		row[i] = strings.TrimSpace(p)
	}
	return row
}

func matchHeader(cells Row, header []string) bool {
	if len(cells) < len(header) {
		return false
	}
	for i, h := range header {
		if !strings.EqualFold(cells[i], h) {
			return false
		}
	}
	return true
}

var backquoted = regexp.MustCompile("`([^`]*)`")

// Keys returns the backquoted keys of a key cell.
func Keys(cell string) []string {
	var keys []string
	for _, m := range backquoted.FindAllStringSubmatch(cell, -1) {
		keys = append(keys, m[1])
	}
	return keys
}

// Custom compares a documented default with a field that the generic rules
// cannot read (a list of structs, say); it returns the field's value as the
// README writes it.
type Custom func(v reflect.Value) string

// Check compares every row of rows (keys in column keyCol, defaults in
// defCol) with fields, and requires a row (or a covering ".*" row) for
// every field. custom overrides the comparison of the keys it names.
func Check(t *testing.T, rows []Row, keyCol, defCol int, fields []Field, custom map[string]Custom) {
	t.Helper()
	byKey := map[string]reflect.Value{}
	for _, f := range fields {
		byKey[f.Key] = f.Value
	}
	documented := map[string]bool{}
	type wild struct {
		prefix string
		def    string
	}
	var wilds []wild
	for _, r := range rows {
		require.Greater(t, len(r), max(keyCol, defCol), "short row %q", r)
		keys, def := Keys(r[keyCol]), r[defCol]
		require.NotEmpty(t, keys, "row %q names no key", r)
		for i, k := range keys {
			if p, ok := strings.CutSuffix(k, ".*"); ok {
				wilds = append(wilds, wild{p + ".", def})
				continue
			}
			documented[k] = true
			if strings.HasPrefix(def, "see ") {
				continue
			}
			v, ok := byKey[k]
			require.True(t, ok, "the README documents %s, which the config does not have", k)
			d := pick(head(def), i, len(keys))
			if c, ok := custom[k]; ok {
				require.Equal(t, d, c(v), "README default of %s", k)
				continue
			}
			requireDefault(t, k, d, v)
		}
	}
	for _, w := range wilds {
		var covered []Field
		for _, f := range fields {
			if strings.HasPrefix(f.Key, w.prefix) && !documented[f.Key] {
				covered = append(covered, f)
			}
		}
		require.NotEmpty(t, covered, "the README's %s* row covers no field", w.prefix)
		for i, f := range covered {
			documented[f.Key] = true
			if !strings.HasPrefix(w.def, "see ") {
				requireDefault(t, f.Key, pick(head(w.def), i, len(covered)), f.Value)
			}
		}
	}
	for _, f := range fields {
		require.True(t, documented[f.Key], "the README has no row for %s", f.Key)
	}
}

// head is a default cell without its note.
func head(cell string) string {
	cut := len(cell)
	for _, sep := range []string{" (", ";", " —"} {
		if i := strings.Index(cell, sep); i >= 0 && i < cut {
			cut = i
		}
	}
	return strings.TrimSpace(cell[:cut])
}

// pick is the i-th of n values listed in def, or def when it lists
// another number of them.
func pick(def string, i, n int) string {
	if n > 1 {
		if vals := strings.Split(def, ", "); len(vals) == n {
			return strings.TrimSpace(vals[i])
		}
	}
	return def
}

func unquote(s string) string {
	if s == "`\"\"`" || s == `""` {
		return ""
	}
	if len(s) >= 2 && s[0] == '`' && s[len(s)-1] == '`' {
		return s[1 : len(s)-1]
	}
	return s
}

var durationType = reflect.TypeFor[time.Duration]()

func requireDefault(t *testing.T, key, doc string, v reflect.Value) {
	t.Helper()
	if v.Kind() == reflect.Pointer && !v.IsNil() && v.Elem().Kind() != reflect.Struct {
		v = v.Elem()
	}
	if doc == "off" || doc == "none" {
		require.True(t, v.IsZero(), "README says %s defaults to %s, WithDefaults gives %v", key, doc, v)
		return
	}
	doc = unquote(doc)
	if v.Type() == durationType {
		d, err := time.ParseDuration(strings.ReplaceAll(doc, " ", ""))
		require.NoError(t, err, "README default of %s", key)
		require.Equal(t, d, v.Interface(), "README default of %s", key)
		return
	}
	switch v.Kind() {
	case reflect.Bool:
		require.Equal(t, doc, strconv.FormatBool(v.Bool()), "README default of %s", key)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64,
		reflect.Float32, reflect.Float64:
		n, err := number(doc)
		require.NoError(t, err, "README default of %s", key)
		var got float64
		switch {
		case v.CanInt():
			got = float64(v.Int())
		case v.CanUint():
			got = float64(v.Uint())
		default:
			got = v.Float()
		}
		require.InDelta(t, n, got, 1e-9*math.Max(1, math.Abs(n)), "README default of %s", key)
	case reflect.String:
		require.Equal(t, doc, v.String(), "README default of %s", key)
	default:
		s, ok := v.Interface().(fmt.Stringer)
		require.True(t, ok, "%s: no rule compares a %s; pass a Custom", key, v.Type())
		require.Equal(t, doc, s.String(), "README default of %s", key)
	}
}

// number reads "0.3", "100000", "281,600", "32 MiB".
func number(s string) (float64, error) {
	s = strings.ReplaceAll(s, ",", "")
	mult := 1.0
	for suffix, m := range map[string]float64{"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30} {
		if rest, ok := strings.CutSuffix(s, suffix); ok {
			s, mult = strings.TrimSpace(rest), m
		}
	}
	n, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return 0, fmt.Errorf("%q is not a number: %w", s, err)
	}
	return n * mult, nil
}

// Lookup returns the field of fields named key.
func Lookup(t testing.TB, fields []Field, key string) reflect.Value {
	t.Helper()
	for _, f := range fields {
		if f.Key == key {
			return f.Value
		}
	}
	require.FailNow(t, "no such field", "the config has no field %s", key)
	return reflect.Value{}
}

// ZeroYAML is a YAML document that sets the dotted key to the zero of v's
// type ("0", "0s" or "false"), nested as the key says.
func ZeroYAML(key string, v reflect.Value) string {
	t := v.Type()
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	zero := "0"
	switch {
	case t == durationType:
		zero = "0s"
	case t.Kind() == reflect.Bool:
		zero = "false"
	case t.Kind() == reflect.String:
		zero = `""`
	}
	parts := strings.Split(key, ".")
	var b strings.Builder
	for i, p := range parts {
		b.WriteString(strings.Repeat("  ", i) + p + ":")
		if i < len(parts)-1 {
			b.WriteString("\n")
		}
	}
	b.WriteString(" " + zero + "\n")
	return b.String()
}

// IsZero reports whether v, or what it points to, is the zero value; a nil
// pointer is not (it is unset).
func IsZero(v reflect.Value) bool {
	if v.Kind() == reflect.Pointer {
		return !v.IsNil() && v.Elem().IsZero()
	}
	return v.IsZero()
}

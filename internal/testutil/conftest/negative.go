package conftest

import (
	"flag"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omnious/provider-node/internal/cli"
)

// negativeValue is the negative value to try on a flag, and false for a
// flag that takes no number.
func negativeValue(f *flag.Flag) (string, bool) {
	g, ok := f.Value.(flag.Getter)
	if !ok {
		return "", false
	}
	switch g.Get().(type) {
	case time.Duration:
		return "-1s", true
	case int, int64, float64:
		return "-1", true
	}
	return "", false
}

// Flags checks every numeric flag of fs against the rule of package opt:
// its help says what 0 means, and a negative value is refused, naming the
// flag and the value, unless its help says what negative means. run runs
// the command with the flag set to the value and returns what it wrote
// (its error output).
func Flags(t *testing.T, fs *flag.FlagSet, run func(flag, value string) string) {
	t.Helper()
	fs.VisitAll(func(f *flag.Flag) {
		v, ok := negativeValue(f)
		if !ok {
			return
		}
		t.Run(fs.Name()+"/"+f.Name, func(t *testing.T) {
			_, ok := cli.ZeroDocumented(f.Usage)
			require.True(t, ok, "-%s: the help says what 0 means: %q", f.Name, f.Usage)
			if cli.NegativeDocumented(f.Usage) {
				return
			}
			out := run(f.Name, v)
			require.Contains(t, out, f.Name+" "+v+" is negative", "-%s %s is refused, naming it", f.Name, v)
		})
	})
}

// Negative checks every numeric leaf of cfg (a struct; ints, floats,
// durations and pointers to them, nested structs walked) against the rule
// of package opt: set to -1 (-1s for a duration), validate refuses it
// naming its key (the last element of its YAML name) and the value, unless
// the key is in documented, the keys whose comment says what a negative
// value means.
func Negative[C any](t *testing.T, cfg C, validate func(C) error, documented ...string) {
	t.Helper()
	skip := map[string]bool{}
	for _, k := range documented {
		skip[k] = true
	}
	for _, key := range numericKeys(reflect.TypeOf(cfg), "") {
		if skip[key] {
			continue
		}
		t.Run(key, func(t *testing.T) {
			c := cfg
			v, name := setNegative(t, reflect.ValueOf(&c).Elem(), key)
			err := validate(c)
			require.Error(t, err, "%s %s is refused", key, v)
			require.Contains(t, err.Error(), name+" "+v, "the error names %s and its value", key)
		})
	}
}

// numericKeys are the dotted YAML keys of t's numeric leaves.
func numericKeys(t reflect.Type, prefix string) []string {
	var keys []string
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if !f.IsExported() || name == "-" {
			continue
		}
		if name == "" {
			name = f.Name
		}
		ft := f.Type
		if ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		switch {
		case ft == reflect.TypeOf(time.Duration(0)):
			keys = append(keys, prefix+name)
		case ft.Kind() == reflect.Struct:
			keys = append(keys, numericKeys(ft, prefix+name+".")...)
		case ft.Kind() >= reflect.Int && ft.Kind() <= reflect.Int64, ft.Kind() == reflect.Float64:
			keys = append(keys, prefix+name)
		}
	}
	return keys
}

// setNegative sets the leaf key of v to -1 (or -1s), allocating the
// pointers on its way, and returns the value as written and the key's last
// element.
func setNegative(t *testing.T, v reflect.Value, key string) (string, string) {
	head, rest, more := strings.Cut(key, ".")
	for i := range v.NumField() {
		f := v.Type().Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if name == "" {
			name = f.Name
		}
		if name != head {
			continue
		}
		fv := v.Field(i)
		if fv.Kind() == reflect.Pointer {
			p := reflect.New(fv.Type().Elem())
			if !fv.IsNil() {
				p.Elem().Set(fv.Elem())
			}
			fv.Set(p)
			fv = p.Elem()
		}
		if more {
			return setNegative(t, fv, rest)
		}
		if fv.Type() == reflect.TypeOf(time.Duration(0)) {
			fv.SetInt(int64(-time.Second))
			return "-1s", head
		}
		if fv.Kind() == reflect.Float64 {
			fv.SetFloat(-1)
		} else {
			fv.SetInt(-1)
		}
		return "-1", head
	}
	t.Fatalf("no field %s", key)
	return "", ""
}

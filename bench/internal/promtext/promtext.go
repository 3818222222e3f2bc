// Package promtext reads the Prometheus text exposition format, as engines
// and the EPP serve it on /metrics: it sums a metric's series, with or
// without a label filter, and reads a histogram's buckets and quantiles.
// It is the bench's only metrics reader; it imports nothing of the
// project.
package promtext

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"sort"
	"strconv"
)

// Sum sums, for each of names, the values of its series (labels ignored, a
// trailing timestamp too); seen[i] reports whether names[i] had any. A
// series whose value does not parse is skipped and reported in err, after
// the whole page is read.
func Sum(r io.Reader, names ...string) (sums []float64, seen []bool, err error) {
	sums, seen = make([]float64, len(names)), make([]bool, len(names))
	var bad error
	err = scan(r, func(s sample) error {
		i := slices.Index(names, string(s.name))
		if i < 0 {
			return nil
		}
		v, perr := s.value()
		if perr != nil {
			if bad == nil {
				bad = perr
			}
			return nil
		}
		sums[i] += v
		seen[i] = true
		return nil
	})
	if err != nil {
		return sums, seen, err
	}
	return sums, seen, bad
}

// Values sums each named metric's series; a name without any series, or a
// series that does not parse, is an error.
func Values(r io.Reader, names ...string) ([]float64, error) {
	vals, seen, err := Sum(r, names...)
	if err != nil {
		return nil, err
	}
	for i, ok := range seen {
		if !ok {
			return nil, fmt.Errorf("metric %s not found", names[i])
		}
	}
	return vals, nil
}

// SumWhere sums the series of name whose labels include every pair in
// want (nil: every series); found reports whether any matched.
func SumWhere(r io.Reader, name string, want map[string]string) (sum float64, found bool, err error) {
	err = scan(r, func(s sample) error {
		if string(s.name) != name {
			return nil
		}
		ok, err := s.matches(want)
		if err != nil || !ok {
			return err
		}
		v, err := s.value()
		if err != nil {
			return err
		}
		sum, found = sum+v, true
		return nil
	})
	return sum, found, err
}

// Bucket is one cumulative histogram bucket: N samples at most LE.
type Bucket struct{ LE, N float64 }

// Buckets reads the buckets of histogram name, summed over its other
// labels, in ascending order of their bounds (+Inf last).
func Buckets(r io.Reader, name string) ([]Bucket, error) {
	bucketName := name + "_bucket"
	byLE := map[float64]float64{}
	err := scan(r, func(s sample) error {
		if string(s.name) != bucketName {
			return nil
		}
		raw, ok, err := s.label("le")
		if err != nil || !ok {
			return err
		}
		le, err1 := strconv.ParseFloat(raw, 64)
		n, err2 := s.value()
		if err := errors.Join(err1, err2); err != nil {
			return fmt.Errorf("cannot parse %q: %w", s.line, err)
		}
		byLE[le] += n
		return nil
	})
	if err != nil {
		return nil, err
	}
	out := make([]Bucket, 0, len(byLE))
	for le, n := range byLE {
		out = append(out, Bucket{LE: le, N: n})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].LE < out[j].LE })
	if len(out) == 0 || !math.IsInf(out[len(out)-1].LE, 1) {
		return nil, fmt.Errorf("histogram %s not found", name)
	}
	return out, nil
}

// Quantile is Prometheus's histogram_quantile over the samples added
// between two readings of the same histogram: linear within the bucket
// that holds the rank; a rank in the +Inf bucket gives the largest finite
// bound. NaN when nothing was added.
func Quantile(q float64, before, after []Bucket) float64 {
	if len(before) != len(after) || len(after) == 0 {
		return math.NaN()
	}
	n := func(i int) float64 { return after[i].N - before[i].N }
	total := n(len(after) - 1)
	if !(total > 0) {
		return math.NaN()
	}
	rank := q * total
	lo, below := 0.0, 0.0
	for i, b := range after {
		if c := n(i); c >= rank {
			if math.IsInf(b.LE, 1) {
				return lo
			}
			if c == below {
				return b.LE
			}
			return lo + (b.LE-lo)*(rank-below)/(c-below)
		}
		lo, below = b.LE, n(i)
	}
	return lo
}

// sample is one series line: name{labels} value [timestamp].
type sample struct {
	line, name, labels, rest []byte
}

// scan calls fn for every series line of r; lines it cannot split are
// skipped. It stops at fn's first error.
func scan(r io.Reader, fn func(sample) error) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Bytes()
		end := bytes.IndexAny(line, "{ ")
		if len(line) == 0 || line[0] == '#' || end < 0 {
			continue
		}
		s := sample{line: line, name: line[:end], rest: line[end:]}
		if s.rest[0] == '{' {
			close := bytes.LastIndexByte(s.rest, '}')
			if close < 0 {
				continue
			}
			s.labels, s.rest = s.rest[1:close], s.rest[close+1:]
		}
		if len(bytes.TrimSpace(s.rest)) == 0 {
			continue // no value: not a series line
		}
		if err := fn(s); err != nil {
			return err
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("cannot read metrics: %w", err)
	}
	return nil
}

// value parses the sample's value (the first field after the labels).
func (s sample) value() (float64, error) {
	fields := bytes.Fields(s.rest)
	if len(fields) == 0 {
		return 0, fmt.Errorf("cannot parse %q: no value", s.line)
	}
	v, err := strconv.ParseFloat(string(fields[0]), 64)
	if err != nil {
		return 0, fmt.Errorf("cannot parse %q: %w", s.line, err)
	}
	return v, nil
}

// matches reports whether the sample's labels include every pair of want.
func (s sample) matches(want map[string]string) (bool, error) {
	n := 0
	err := s.eachLabel(func(k, v string) bool {
		if w, ok := want[k]; ok {
			if w != v {
				n = -1
				return false
			}
			n++
		}
		return true
	})
	return n == len(want), err
}

// label is the value of the sample's label key.
func (s sample) label(key string) (v string, ok bool, err error) {
	err = s.eachLabel(func(k, val string) bool {
		if k == key {
			v, ok = val, true
			return false
		}
		return true
	})
	return v, ok, err
}

// eachLabel calls fn with each name="value" pair, value unescaped, until
// fn returns false.
func (s sample) eachLabel(fn func(k, v string) bool) error {
	rest := s.labels
	for {
		rest = bytes.TrimLeft(rest, " ,")
		if len(rest) == 0 {
			return nil
		}
		eq := bytes.IndexByte(rest, '=')
		if eq < 0 || eq+1 >= len(rest) || rest[eq+1] != '"' {
			return fmt.Errorf("cannot parse the labels of %q", s.line)
		}
		k := string(bytes.TrimSpace(rest[:eq]))
		v, n, err := unquote(rest[eq+1:])
		if err != nil {
			return fmt.Errorf("cannot parse the labels of %q: %w", s.line, err)
		}
		if !fn(k, v) {
			return nil
		}
		rest = rest[eq+1+n:]
	}
}

// unquote reads a quoted label value at the start of b (escapes \\, \"
// and \n) and returns it with the bytes it took.
func unquote(b []byte) (string, int, error) {
	var out []byte
	for i := 1; i < len(b); i++ {
		switch c := b[i]; c {
		case '"':
			return string(out), i + 1, nil
		case '\\':
			if i+1 == len(b) {
				return "", 0, errors.New("unterminated escape")
			}
			i++
			if b[i] == 'n' {
				out = append(out, '\n')
			} else {
				out = append(out, b[i])
			}
		default:
			out = append(out, c)
		}
	}
	return "", 0, errors.New("unterminated value")
}

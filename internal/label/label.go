// Package label bounds the values a client controls (model names, tenant
// ids) before they become metric label values or map keys: a Set admits a
// fixed number of distinct values and maps every later one to a single
// overflow value, so no client can grow a map or a metric's series count
// past the bound.
package label

import (
	"sync"
	"sync/atomic"
)

// Set holds at most Max distinct values, first come first served. Values
// already in the set are found without a lock. Safe for concurrent use.
type Set struct {
	max      int32
	overflow string
	known    sync.Map // string -> struct{}
	n        atomic.Int32
}

// NewSet returns a set of at most max values; Label maps the rest to
// overflow.
func NewSet(max int, overflow string) *Set {
	return &Set{max: int32(max), overflow: overflow}
}

// Add puts v in the set while there is room. in reports whether v is in
// the set afterwards, added whether this call put it there (exactly one
// caller sees added for each value).
func (s *Set) Add(v string) (in, added bool) {
	if _, ok := s.known.Load(v); ok {
		return true, false
	}
	// Reserve a slot first, so concurrent adds cannot overshoot max.
	if s.n.Add(1) > s.max {
		s.n.Add(-1)
		return false, false
	}
	if _, loaded := s.known.LoadOrStore(v, struct{}{}); loaded {
		s.n.Add(-1)
		return true, false
	}
	return true, true
}

// Label returns v if it is in the set or there is room for it, else the
// overflow value.
func (s *Set) Label(v string) string {
	if in, _ := s.Add(v); in {
		return v
	}
	return s.overflow
}

// Known returns v if it is already in the set, else the overflow value; it
// never adds.
func (s *Set) Known(v string) string {
	if _, ok := s.known.Load(v); ok {
		return v
	}
	return s.overflow
}

// Len is the number of values in the set.
func (s *Set) Len() int { return int(s.n.Load()) }

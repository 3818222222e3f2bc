package rules

import (
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
)

// Store holds the rules in force: the last good Spec of each source, merged
// into one Table. Set is for sources (rarely called, serialised); Load is
// for requests (one atomic load). Safe for concurrent use.
type Store struct {
	bands       []Band
	defaultBand string

	mu    sync.Mutex
	specs map[string]*Spec // last good spec per source

	cur atomic.Pointer[Table]
}

// NewStore returns an empty store whose objectives map onto bands, with
// defaultBand for an objective without a priority.
func NewStore(bands []Band, defaultBand string) *Store {
	return &Store{bands: slices.Clone(bands), defaultBand: defaultBand, specs: map[string]*Spec{}}
}

// Load returns the current table; nil when there are no rules.
func (s *Store) Load() *Table {
	if s == nil {
		return nil
	}
	return s.cur.Load()
}

// Set replaces the rules of source (a short name such as "file",
// "kubernetes" or "config") with spec, which the store keeps and the
// caller must not modify afterwards. A spec that is invalid on its own or
// together with the other sources' (a name defined twice) is refused with
// an error and the source keeps its last good rules. A nil or empty spec
// removes the source's rules.
func (s *Store) Set(source string, spec *Spec) error {
	if err := spec.validate(); err != nil {
		return fmt.Errorf("%s rules: %w", source, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	next := make(map[string]*Spec, len(s.specs)+1)
	for k, v := range s.specs {
		next[k] = v
	}
	if spec.Empty() {
		delete(next, source)
	} else {
		next[source] = spec
	}
	sources := make([]string, 0, len(next))
	for k := range next {
		sources = append(sources, k)
	}
	slices.Sort(sources)
	merged := &Spec{}
	specs := make([]*Spec, 0, len(sources))
	for _, k := range sources {
		sp := next[k]
		specs = append(specs, sp)
		merged.Objectives = append(merged.Objectives, sp.Objectives...)
		merged.Rewrites = append(merged.Rewrites, sp.Rewrites...)
		merged.Models = append(merged.Models, sp.Models...)
	}
	if err := merged.Validate(); err != nil {
		// Each spec is valid alone: what fails is a name two sources define.
		return fmt.Errorf("%s rules conflict with those of %v (indices count across them, in that order): %w", source, sources, err)
	}
	s.specs = next
	s.cur.Store(compile(specs, s.bands, s.defaultBand))
	return nil
}

package rules

import (
	"cmp"
	"math/rand/v2"
	"slices"
)

// Band is a flow-control band as objectives are mapped onto it.
type Band struct {
	Name     string
	Priority int
}

// Table is a compiled, immutable rule set; every lookup is a map read and
// allocates nothing. The nil *Table holds no rules.
type Table struct {
	bands     map[string]string // objective -> band
	exact     map[string]*rewriteRule
	generic   *rewriteRule
	canonical map[string]string   // alias -> model
	fallbacks map[string][]string // model -> fallback models, aliases resolved
}

// rewriteRule is one compiled Rule.
type rewriteRule struct {
	rewrite string // the Rewrite's name
	targets []string
	cum     []uint64 // cumulative weights; nil: targets are equally likely
}

// compile builds the table of specs, which must each have passed
// Validate, merged in order. An empty result is nil.
func compile(specs []*Spec, bands []Band, defaultBand string) *Table {
	t := &Table{
		bands:     map[string]string{},
		exact:     map[string]*rewriteRule{},
		canonical: map[string]string{},
		fallbacks: map[string][]string{},
	}
	var rewrites []*Rewrite
	for _, s := range specs {
		for i := range s.Objectives {
			o := &s.Objectives[i]
			t.bands[o.Name] = bandOf(o.Priority, bands, defaultBand)
		}
		for i := range s.Rewrites {
			rewrites = append(rewrites, &s.Rewrites[i])
		}
		for _, m := range s.Models {
			for _, a := range m.Aliases {
				t.canonical[a] = m.Name
			}
		}
	}
	for _, s := range specs {
		for _, m := range s.Models {
			if len(m.Fallbacks) == 0 {
				continue
			}
			fb := make([]string, len(m.Fallbacks))
			for i, f := range m.Fallbacks {
				fb[i] = t.Canonical(f)
			}
			t.fallbacks[m.Name] = fb
		}
	}
	// Precedence as the InferenceModelRewrite API defines it: an exact
	// match beats a rule without matches; among equals the oldest rewrite
	// wins, and within one rewrite the first rule.
	slices.SortStableFunc(rewrites, func(a, b *Rewrite) int { return a.Created.Compare(b.Created) })
	for _, rw := range rewrites {
		for i := range rw.Rules {
			r := &rw.Rules[i]
			cr := compileRule(rw.Name, r)
			if len(r.Matches) == 0 {
				if t.generic == nil {
					t.generic = cr
				}
				continue
			}
			for _, m := range r.Matches {
				if _, taken := t.exact[m.Model.Value]; !taken {
					t.exact[m.Model.Value] = cr
				}
			}
		}
	}
	if len(t.bands)+len(t.exact)+len(t.canonical)+len(t.fallbacks) == 0 && t.generic == nil {
		return nil
	}
	return t
}

func compileRule(name string, r *Rule) *rewriteRule {
	cr := &rewriteRule{rewrite: name, targets: make([]string, len(r.Targets))}
	var sum uint64
	for i, tg := range r.Targets {
		cr.targets[i] = tg.ModelRewrite
		if tg.Weight != nil {
			sum += uint64(*tg.Weight)
			cr.cum = append(cr.cum, sum)
		}
	}
	return cr
}

// bandOf maps an objective's priority onto the bands: the band of the
// highest priority at or below it (a request never rises above what it
// asked for), the lowest band when it is below them all, and the default
// band when it is unset.
func bandOf(priority *int32, bands []Band, defaultBand string) string {
	if priority == nil || len(bands) == 0 {
		return defaultBand
	}
	p := int(*priority)
	best, lowest := -1, 0
	for i, b := range bands {
		if b.Priority <= p && (best < 0 || b.Priority > bands[best].Priority) {
			best = i
		}
		if b.Priority < bands[lowest].Priority {
			lowest = i
		}
	}
	if best < 0 {
		best = lowest
	}
	return bands[best].Name
}

// Band returns the band of the objective named name.
func (t *Table) Band(objective string) (band string, ok bool) {
	if t == nil {
		return "", false
	}
	band, ok = t.bands[objective]
	return band, ok
}

// Rewrite picks the target model for a request whose body names model,
// by the highest-precedence rule that matches it, weighted at random.
// rewrite is the name of the Rewrite the rule belongs to.
func (t *Table) Rewrite(model string) (target, rewrite string, ok bool) {
	if t == nil {
		return "", "", false
	}
	r := t.exact[model]
	if r == nil {
		if r = t.generic; r == nil {
			return "", "", false
		}
	}
	return r.pick(), r.rewrite, true
}

func (r *rewriteRule) pick() string {
	if len(r.targets) == 1 {
		return r.targets[0]
	}
	if r.cum == nil {
		return r.targets[rand.IntN(len(r.targets))]
	}
	n := rand.Uint64N(r.cum[len(r.cum)-1])
	i, _ := slices.BinarySearchFunc(r.cum, n, func(c, n uint64) int { return cmp.Compare(c, n+1) })
	return r.targets[i]
}

// Canonical returns the model an alias stands for, or model itself.
func (t *Table) Canonical(model string) string {
	if t == nil {
		return model
	}
	if m, ok := t.canonical[model]; ok {
		return m
	}
	return model
}

// Fallbacks returns the models to try, in order, when model cannot serve
// now; nil when it has none. The caller must not modify the slice.
func (t *Table) Fallbacks(model string) []string {
	if t == nil {
		return nil
	}
	return t.fallbacks[model]
}

// Models returns every model name the table mentions (rewrite matches and
// targets, models, aliases and fallbacks), sorted: the closed set an
// operator configured.
func (t *Table) Models() []string {
	if t == nil {
		return nil
	}
	seen := map[string]bool{}
	add := func(r *rewriteRule) {
		for _, m := range r.targets {
			seen[m] = true
		}
	}
	for m, r := range t.exact {
		seen[m] = true
		add(r)
	}
	if t.generic != nil {
		add(t.generic)
	}
	for a, m := range t.canonical {
		seen[a], seen[m] = true, true
	}
	for m, fb := range t.fallbacks {
		seen[m] = true
		for _, f := range fb {
			seen[f] = true
		}
	}
	out := make([]string, 0, len(seen))
	for m := range seen {
		out = append(out, m)
	}
	slices.Sort(out)
	return out
}

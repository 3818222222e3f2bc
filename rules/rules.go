// Package rules owns the model rules the EPP applies to a request before
// it is scheduled: InferenceObjective priorities (the objective a request
// names picks its flow-control band), InferenceModelRewrite weighted
// rewrites (the model the engine is asked for), and the llmgw router's
// per-model aliases and fallbacks. Sources (the Kubernetes API, the static
// endpoint file, the EPP config) hand their whole rule set to a Store,
// which compiles it into an immutable Table and publishes it behind an
// atomic pointer; a set that does not compile is refused and the last good
// one stays. A request reads the current Table without locks.
//
// The types below have the shape of the CRDs' specs (llm-d.ai/v1alpha2,
// the same under inference.networking.x-k8s.io/v1alpha2), so a rewrite's
// rules written for the API server are valid in a file as they are.
package rules

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// Objective is an InferenceObjective: a name requests refer to and the
// priority of the requests that do.
type Objective struct {
	Name string `yaml:"name"`
	// Priority orders requests in flow control, higher first; nil (unset)
	// gives the default band, as a request naming no objective gets.
	Priority *int32 `yaml:"priority"`
}

// Rewrite is an InferenceModelRewrite: ordered rules that send requests
// for some models to weighted target models.
type Rewrite struct {
	Name  string `yaml:"name"`
	Rules []Rule `yaml:"rules" json:"rules"`
	// Created orders rewrites for precedence, oldest first (the object's
	// creationTimestamp; zero for a file's entries, which keep file order).
	Created time.Time `yaml:"-"`
}

// Rule matches requests by their body's model and sends them to one of its
// targets. A rule without matches matches every model.
type Rule struct {
	Matches []Match  `yaml:"matches" json:"matches"`
	Targets []Target `yaml:"targets" json:"targets"`
}

// Match is one criterion of a rule (any one matching is enough).
type Match struct {
	Model *ModelMatch `yaml:"model" json:"model"`
}

// ModelMatch compares the request body's model with Value.
type ModelMatch struct {
	// Type is "Exact", the only kind the API defines; "" means Exact.
	Type  string `yaml:"type" json:"type"`
	Value string `yaml:"value" json:"value"`
}

// MatchExact is the one ModelMatch type.
const MatchExact = "Exact"

// Target is a weighted destination model.
type Target struct {
	// ModelRewrite is the model the engine is asked for.
	ModelRewrite string `yaml:"modelRewrite" json:"modelRewrite"`
	// Weight is the target's share relative to its siblings, 1..1000000;
	// set on every target of a rule or on none (then all are equal).
	Weight *int32 `yaml:"weight" json:"weight"`
}

// MaxWeight is the largest target weight the API accepts.
const MaxWeight = 1_000_000

// Model is one model's llmgw routing entry.
type Model struct {
	Name string `yaml:"name"`
	// Aliases are other names clients may use for the model.
	Aliases []string `yaml:"aliases"`
	// Fallbacks are tried in order when the model has no healthy endpoint
	// or its band is past its ceiling.
	Fallbacks []string `yaml:"fallbacks"`
}

// Spec is the whole rule set of one source.
type Spec struct {
	Objectives []Objective `yaml:"objectives"`
	Rewrites   []Rewrite   `yaml:"rewrites"`
	Models     []Model     `yaml:"models"`
}

// validate is Validate for a spec that may be nil.
func (s *Spec) validate() error {
	if s == nil {
		return nil
	}
	return s.Validate()
}

// Empty reports whether s holds no rule.
func (s *Spec) Empty() bool {
	return s == nil || len(s.Objectives)+len(s.Rewrites)+len(s.Models) == 0
}

// maxName bounds every name a rule holds: a Kubernetes object name is at
// most 253 bytes, and model names in practice far shorter.
const maxName = 253

func checkName(what, name string) error {
	switch {
	case name == "":
		return fmt.Errorf("%s is empty", what)
	case len(name) > maxName:
		return fmt.Errorf("%s is %d bytes, over %d", what, len(name), maxName)
	case strings.TrimSpace(name) != name:
		return fmt.Errorf("%s %q has leading or trailing space", what, name)
	}
	return nil
}

// Validate checks the objective on its own.
func (o *Objective) Validate() error { return checkName("name", o.Name) }

// Validate checks the rewrite on its own: every rule has targets with
// non-empty models, weights in range and set on all targets or none, and
// only Exact model matches with a value.
func (r *Rewrite) Validate() error {
	if err := checkName("name", r.Name); err != nil {
		return err
	}
	for i := range r.Rules {
		if err := r.Rules[i].validate(); err != nil {
			return fmt.Errorf("rules[%d]: %w", i, err)
		}
	}
	return nil
}

func (r *Rule) validate() error {
	for i, m := range r.Matches {
		if m.Model == nil {
			return fmt.Errorf("matches[%d]: no model", i)
		}
		if m.Model.Type != "" && m.Model.Type != MatchExact {
			return fmt.Errorf("matches[%d].model.type %q: want %s", i, m.Model.Type, MatchExact)
		}
		if err := checkName(fmt.Sprintf("matches[%d].model.value", i), m.Model.Value); err != nil {
			return err
		}
	}
	if len(r.Targets) == 0 {
		return errors.New("no targets")
	}
	weighted := 0
	for i, t := range r.Targets {
		if err := checkName(fmt.Sprintf("targets[%d].modelRewrite", i), t.ModelRewrite); err != nil {
			return err
		}
		if t.Weight != nil {
			if *t.Weight < 1 || *t.Weight > MaxWeight {
				return fmt.Errorf("targets[%d].weight %d: want 1..%d", i, *t.Weight, MaxWeight)
			}
			weighted++
		}
	}
	if weighted != 0 && weighted != len(r.Targets) {
		return fmt.Errorf("%d of %d targets have a weight: set it on all or none", weighted, len(r.Targets))
	}
	return nil
}

// Validate checks the model entry on its own.
func (m *Model) Validate() error {
	if err := checkName("name", m.Name); err != nil {
		return err
	}
	seen := map[string]bool{m.Name: true}
	for i, a := range m.Aliases {
		if err := checkName(fmt.Sprintf("aliases[%d]", i), a); err != nil {
			return err
		}
		if seen[a] {
			return fmt.Errorf("aliases[%d] %q repeats the name or another alias", i, a)
		}
		seen[a] = true
	}
	for i, f := range m.Fallbacks {
		if err := checkName(fmt.Sprintf("fallbacks[%d]", i), f); err != nil {
			return err
		}
		if seen[f] {
			return fmt.Errorf("fallbacks[%d] %q names the model itself or repeats", i, f)
		}
		seen[f] = true
	}
	return nil
}

// Validate checks every entry of s and that names are unique: objectives
// and rewrites by name, models by name and alias. Errors name the entry.
func (s *Spec) Validate() error {
	var errs []error
	objectives := map[string]int{}
	for i := range s.Objectives {
		o := &s.Objectives[i]
		if err := o.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("objectives[%d]: %w", i, err))
		} else if j, dup := objectives[o.Name]; dup {
			errs = append(errs, fmt.Errorf("objectives[%d]: name %q already used by objectives[%d]", i, o.Name, j))
		}
		objectives[o.Name] = i
	}
	rewrites := map[string]int{}
	for i := range s.Rewrites {
		r := &s.Rewrites[i]
		if err := r.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("rewrites[%d] (%s): %w", i, r.Name, err))
		} else if j, dup := rewrites[r.Name]; dup {
			errs = append(errs, fmt.Errorf("rewrites[%d]: name %q already used by rewrites[%d]", i, r.Name, j))
		}
		rewrites[r.Name] = i
	}
	// A name is a model's or one alias's, never both: otherwise a request
	// for it would have two meanings.
	names := map[string]string{}
	for i := range s.Models {
		m := &s.Models[i]
		if err := m.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("models[%d] (%s): %w", i, m.Name, err))
			continue
		}
		for j, n := range append([]string{m.Name}, m.Aliases...) {
			what := fmt.Sprintf("models[%d] (%s)", i, m.Name)
			if j > 0 {
				what += fmt.Sprintf(" alias %q", n)
			}
			if other, dup := names[n]; dup {
				errs = append(errs, fmt.Errorf("%s: %q is already %s", what, n, other))
				continue
			}
			if j == 0 {
				names[n] = "the name of models[" + fmt.Sprint(i) + "]"
			} else {
				names[n] = fmt.Sprintf("an alias of %s", m.Name)
			}
		}
	}
	return errors.Join(errs...)
}

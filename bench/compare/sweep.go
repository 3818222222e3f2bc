package compare

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/omnious/provider-node/bench/rig"
)

// Grid is a sweep over EPP configuration keys. Its YAML form:
//
//	base: precise          # a policy name, or an EPP config file the overrides apply to
//	params:                # dotted EPP config keys, each with its values; the grid is their product
//	  scoring.weights.prefix: [1, 3, 5]
//	  prefix.balance_rel: [1.25, 1.5, 2]
//
// Each point is written as an EPP config file (the base file, or
// "policy: <name>", with the overrides set as nested keys) and its path is
// what the Launcher receives.
type Grid struct {
	Base   string           `yaml:"base"`
	Params map[string][]any `yaml:"params"`
}

// SweepInfo is the sweep part of a report.
type SweepInfo struct {
	Base string
	// Files are the generated config files, in Results order.
	Files []string
	// Front are the indices (into Results) of the Pareto front of TTFT p90
	// (lower is better) against output tokens/s (higher is better).
	Front []int
}

func (s *SweepInfo) frontLabels(r *Report) []string {
	var out []string
	for _, i := range s.Front {
		p := r.Results[i]
		out = append(out, fmt.Sprintf("#%d %s (%s ms, %s tok/s)", i, p.Policy, fmtNum(p.TTFTP90, 1), fmtNum(p.OutputTokPS, 0)))
	}
	return out
}

// LoadGrid reads a grid file.
func LoadGrid(path string) (Grid, error) {
	var g Grid
	b, err := os.ReadFile(path)
	if err != nil {
		return g, fmt.Errorf("cannot read grid: %w", err)
	}
	if err := yaml.Unmarshal(b, &g); err != nil {
		return g, fmt.Errorf("cannot parse grid %s: %w", path, err)
	}
	return g, g.validate()
}

// ParseSet parses a command-line override "key=v1,v2,..." into the grid.
func (g *Grid) ParseSet(s string) error {
	k, v, ok := strings.Cut(s, "=")
	if !ok || strings.TrimSpace(k) == "" || v == "" {
		return fmt.Errorf("override %q: want key=value[,value...]", s)
	}
	if g.Params == nil {
		g.Params = map[string][]any{}
	}
	for _, raw := range strings.Split(v, ",") {
		var val any
		if err := yaml.Unmarshal([]byte(raw), &val); err != nil {
			return fmt.Errorf("override %q: value %q: %w", s, raw, err)
		}
		g.Params[strings.TrimSpace(k)] = append(g.Params[strings.TrimSpace(k)], val)
	}
	return nil
}

func (g Grid) validate() error {
	if g.Base == "" {
		return errors.New("grid: base (a policy or config file) is required")
	}
	if len(g.Params) == 0 {
		return errors.New("grid: no params")
	}
	for k, vs := range g.Params {
		if len(vs) == 0 {
			return fmt.Errorf("grid: %s has no values", k)
		}
		for _, part := range strings.Split(k, ".") {
			if part == "" {
				return fmt.Errorf("grid: bad key %q", k)
			}
		}
	}
	return nil
}

// override is one key=value of a grid point.
type override struct {
	Key   string
	Value any
}

// points is the cartesian product of the grid, keys in sorted order.
func (g Grid) points() [][]override {
	keys := make([]string, 0, len(g.Params))
	for k := range g.Params {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	pts := [][]override{nil}
	for _, k := range keys {
		var next [][]override
		for _, p := range pts {
			for _, v := range g.Params[k] {
				q := append(append([]override(nil), p...), override{k, v})
				next = append(next, q)
			}
		}
		pts = next
	}
	return pts
}

func pointLabel(p []override) string {
	parts := make([]string, len(p))
	for i, o := range p {
		parts[i] = fmt.Sprintf("%s=%v", o.Key, o.Value)
	}
	return strings.Join(parts, ",")
}

// pointConfig renders the config file of one grid point.
func pointConfig(base string, p []override) ([]byte, error) {
	doc := map[string]any{}
	if rig.IsPolicyName(base) {
		// The same scrape period the named policies get (rig.StartEPPs),
		// so that a point with no overrides reproduces its base policy.
		doc["policy"] = base
		doc["signals"] = map[string]any{"scrape_interval": rig.ScrapeInterval.String(), "scrape_timeout": rig.ScrapeInterval.String()}
	} else {
		b, err := os.ReadFile(base)
		if err != nil {
			return nil, fmt.Errorf("cannot read base config: %w", err)
		}
		if err := yaml.Unmarshal(b, &doc); err != nil {
			return nil, fmt.Errorf("cannot parse base config %s: %w", base, err)
		}
		if doc == nil {
			doc = map[string]any{}
		}
	}
	for _, o := range p {
		parts := strings.Split(o.Key, ".")
		m := doc
		for _, part := range parts[:len(parts)-1] {
			next, ok := m[part].(map[string]any)
			if !ok {
				if _, exists := m[part]; exists {
					return nil, fmt.Errorf("override %s: %s is not a mapping in the base config", o.Key, part)
				}
				next = map[string]any{}
				m[part] = next
			}
			m = next
		}
		m[parts[len(parts)-1]] = o.Value
	}
	return yaml.Marshal(doc)
}

// paretoFront returns the indices of the points no other point dominates
// (lower or equal TTFT p90 and higher or equal throughput, one strictly).
// Points with a NaN figure or with errors are left out.
func paretoFront(rs []PolicyResult) []int {
	valid := func(p PolicyResult) bool {
		return !math.IsNaN(p.TTFTP90) && !math.IsNaN(p.OutputTokPS) && p.Errors == 0
	}
	var front []int
	for i, a := range rs {
		if !valid(a) {
			continue
		}
		dominated := false
		for j, b := range rs {
			if i == j || !valid(b) {
				continue
			}
			if b.TTFTP90 <= a.TTFTP90 && b.OutputTokPS >= a.OutputTokPS && (b.TTFTP90 < a.TTFTP90 || b.OutputTokPS > a.OutputTokPS) {
				dominated = true
				break
			}
		}
		if !dominated {
			front = append(front, i)
		}
	}
	return front
}

// Sweep runs every point of the grid as a policy (its generated config
// file, written under dir) and reports the Pareto front of TTFT p90 against
// throughput.
func Sweep(ctx context.Context, opts Options, g Grid, dir string, launch rig.Launcher) (*Report, error) {
	if err := g.validate(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("cannot create sweep dir: %w", err)
	}
	info := &SweepInfo{Base: g.Base}
	opts.Policies, opts.Labels = nil, nil
	for i, p := range g.points() {
		b, err := pointConfig(g.Base, p)
		if err != nil {
			return nil, err
		}
		path := filepath.Join(dir, fmt.Sprintf("sweep-%03d.yaml", i))
		if err := os.WriteFile(path, b, 0o644); err != nil {
			return nil, fmt.Errorf("cannot write sweep config: %w", err)
		}
		info.Files = append(info.Files, path)
		opts.Policies = append(opts.Policies, path)
		opts.Labels = append(opts.Labels, pointLabel(p))
	}
	if opts.Scenario == "" {
		opts.Scenario = "sweep over " + g.Base
	}
	rep, err := Run(ctx, opts, launch)
	if rep != nil {
		info.Front = paretoFront(rep.Results)
		rep.Sweep = info
	}
	return rep, err
}

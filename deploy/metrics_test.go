// Package deploy_test checks the deployment assets. Those that hold PromQL:
// every Grafana dashboard, alert rule and KEDA trigger must parse and may
// only use the metric names listed in metrics.txt, the one list that is
// compared with live /metrics scrapes of the EPP, the quoter and the
// engines. And (oneendpoint_test.go) the EPP as the Helm chart and the
// systemd unit start it routes each request to one ip:port, as the shipped
// Envoy config needs.
package deploy_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/prometheus/promql/parser"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

// catalog maps each listed metric name to its type.
type catalog map[string]string

func loadCatalog(t *testing.T) catalog {
	t.Helper()
	raw, err := os.ReadFile("metrics.txt")
	require.NoError(t, err)
	c, err := parseCatalog(string(raw))
	require.NoError(t, err)
	return c
}

func parseCatalog(text string) (catalog, error) {
	c := catalog{}
	for i, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) != 3 {
			return nil, fmt.Errorf("metrics.txt:%d: want name, type and component, got %q", i+1, line)
		}
		switch f[1] {
		case "counter", "gauge", "histogram":
		default:
			return nil, fmt.Errorf("metrics.txt:%d: unknown type %q", i+1, f[1])
		}
		switch f[2] {
		case "epp", "quoter", "engine":
		default:
			return nil, fmt.Errorf("metrics.txt:%d: unknown component %q", i+1, f[2])
		}
		if _, dup := c[f[0]]; dup {
			return nil, fmt.Errorf("metrics.txt:%d: %s listed twice", i+1, f[0])
		}
		c[f[0]] = f[1]
	}
	return c, nil
}

// known reports whether a series name is listed, accepting a histogram's
// _bucket, _sum and _count series.
func (c catalog) known(name string) bool {
	if _, ok := c[name]; ok {
		return true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suffix); ok && c[base] == "histogram" {
			return true
		}
	}
	return false
}

// Grafana and Helm placeholders become values that keep the PromQL valid.
var (
	helmAction  = regexp.MustCompile(`{{-?[^}]*-?}}`)
	grafanaVars = strings.NewReplacer("$__rate_interval", "5m", "$__interval", "1m", "$__range", "1h")
	grafanaVar  = regexp.MustCompile(`\$\{?[A-Za-z_][A-Za-z0-9_]*\}?`)
)

func substitute(expr string) string {
	expr = helmAction.ReplaceAllString(expr, "x")
	expr = grafanaVars.Replace(expr)
	return grafanaVar.ReplaceAllString(expr, "x")
}

// metricNames parses expr and returns the metric names it selects.
func metricNames(expr string) ([]string, error) {
	node, err := parser.NewParser(parser.Options{}).ParseExpr(substitute(expr))
	if err != nil {
		return nil, err
	}
	var names []string
	var walkErr error
	parser.Inspect(node, func(n parser.Node, _ []parser.Node) error {
		vs, ok := n.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		name := vs.Name
		for _, m := range vs.LabelMatchers {
			if m.Name == "__name__" {
				name = m.Value
			}
		}
		if name == "" {
			walkErr = fmt.Errorf("selector %s has no metric name", vs)
		}
		names = append(names, name)
		return nil
	})
	return names, walkErr
}

// source is one PromQL expression and where it came from.
type source struct{ where, expr string }

func ruleExprs(t *testing.T, path string) []source {
	t.Helper()
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	var f struct {
		Groups []struct {
			Name  string `yaml:"name"`
			Rules []struct {
				Alert  string `yaml:"alert"`
				Record string `yaml:"record"`
				Expr   string `yaml:"expr"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	require.NoError(t, yaml.Unmarshal(raw, &f))
	var out []source
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			out = append(out, source{fmt.Sprintf("%s: %s%s", path, r.Alert, r.Record), r.Expr})
		}
	}
	require.NotEmpty(t, out, "no rules in %s", path)
	return out
}

type dashboard struct {
	UID        string  `json:"uid"`
	Panels     []panel `json:"panels"`
	Templating struct {
		List []struct {
			Name       string          `json:"name"`
			Type       string          `json:"type"`
			Query      json.RawMessage `json:"query"`
			Definition string          `json:"definition"`
			Datasource json.RawMessage `json:"datasource"`
		} `json:"list"`
	} `json:"templating"`
}

type panel struct {
	ID         int             `json:"id"`
	Type       string          `json:"type"`
	Title      string          `json:"title"`
	Datasource json.RawMessage `json:"datasource"`
	Panels     []panel         `json:"panels"`
	Targets    []struct {
		Expr       string          `json:"expr"`
		Datasource json.RawMessage `json:"datasource"`
	} `json:"targets"`
}

func loadDashboard(t *testing.T, path string) dashboard {
	t.Helper()
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	var d dashboard
	require.NoError(t, json.Unmarshal(raw, &d), path)
	return d
}

func flatten(ps []panel) []panel {
	var out []panel
	for _, p := range ps {
		out = append(out, p)
		out = append(out, flatten(p.Panels)...)
	}
	return out
}

var labelValues = regexp.MustCompile(`^label_values\((.+),\s*[A-Za-z_][A-Za-z0-9_]*\)$`)

func dashboardExprs(t *testing.T, path string, d dashboard) []source {
	t.Helper()
	var out []source
	for _, p := range flatten(d.Panels) {
		for _, tg := range p.Targets {
			out = append(out, source{fmt.Sprintf("%s: panel %d %q", path, p.ID, p.Title), tg.Expr})
		}
	}
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		m := labelValues.FindStringSubmatch(v.Definition)
		require.NotNil(t, m, "%s: variable %s: want label_values(selector, label), got %q", path, v.Name, v.Definition)
		out = append(out, source{fmt.Sprintf("%s: variable %s", path, v.Name), m[1]})
	}
	return out
}

var kedaQuery = regexp.MustCompile(`(?m)^\s*query:\s*(.+)$`)

func kedaExprs(t *testing.T) []source {
	t.Helper()
	path := "helm/provider-node/templates/keda-scaledobject.yaml"
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	var out []source
	for _, m := range kedaQuery.FindAllStringSubmatch(string(raw), -1) {
		out = append(out, source{path, m[1]})
	}
	require.NotEmpty(t, out, "no trigger queries in %s", path)
	return out
}

func dashboardPaths(t *testing.T) []string {
	t.Helper()
	paths, err := filepath.Glob("grafana/*.json")
	require.NoError(t, err)
	require.ElementsMatch(t, []string{"grafana/epp.json", "grafana/quoter.json"}, paths)
	return paths
}

func TestParseCatalog(t *testing.T) {
	tests := []struct {
		name, text string
		wantErr    string
		known      []string
		unknown    []string
	}{
		{name: "histogram series", text: "a_seconds histogram epp\nb_total counter quoter\n",
			known:   []string{"a_seconds", "a_seconds_bucket", "a_seconds_sum", "a_seconds_count", "b_total"},
			unknown: []string{"b_total_bucket", "a", "c"}},
		{name: "comments and colons", text: "# x\n\nvllm:num_requests_running gauge engine\n",
			known: []string{"vllm:num_requests_running"}, unknown: []string{"vllm:num_requests_running_count"}},
		{name: "missing column", text: "a gauge\n", wantErr: "want name, type and component"},
		{name: "bad type", text: "a summary epp\n", wantErr: "unknown type"},
		{name: "bad component", text: "a gauge bench\n", wantErr: "unknown component"},
		{name: "duplicate", text: "a gauge epp\na gauge epp\n", wantErr: "listed twice"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := parseCatalog(tc.text)
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			for _, n := range tc.known {
				require.True(t, c.known(n), n)
			}
			for _, n := range tc.unknown {
				require.False(t, c.known(n), n)
			}
		})
	}
}

func TestMetricNames(t *testing.T) {
	tests := []struct {
		name, expr string
		want       []string
		wantErr    bool
	}{
		{name: "grafana rate", expr: `sum by (le) (rate(x_bucket{namespace="$namespace"}[$__rate_interval]))`, want: []string{"x_bucket"}},
		{name: "binary and functions", expr: `time() - max(a) > on() group_left b`, want: []string{"a", "b"}},
		{name: "helm action", expr: `sum(q{namespace="{{ $ns }}", name="{{ $pool }}"})`, want: []string{"q"}},
		{name: "name matcher", expr: `{__name__="c", job="x"}`, want: []string{"c"}},
		{name: "colon name", expr: `rate(vllm:generation_tokens_total[5m])`, want: []string{"vllm:generation_tokens_total"}},
		{name: "syntax error", expr: `sum(rate(a[5m])`, wantErr: true},
		{name: "no metric name", expr: `{job="x"}`, wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := metricNames(tc.expr)
			if tc.wantErr {
				require.Error(t, err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
}

// TestExpressionsUseListedMetrics is the check deploy/check.sh relies on.
func TestExpressionsUseListedMetrics(t *testing.T) {
	c := loadCatalog(t)
	var all []source
	all = append(all, ruleExprs(t, "prometheus/rules.yaml")...)
	all = append(all, kedaExprs(t)...)
	for _, p := range dashboardPaths(t) {
		all = append(all, dashboardExprs(t, p, loadDashboard(t, p))...)
	}
	used := map[string]bool{}
	for _, s := range all {
		names, err := metricNames(s.expr)
		require.NoError(t, err, "%s: %s", s.where, s.expr)
		require.NotEmpty(t, names, "%s selects no metric: %s", s.where, s.expr)
		for _, n := range names {
			require.True(t, c.known(n), "%s uses %s, which deploy/metrics.txt does not list", s.where, n)
			used[n] = true
		}
	}
	// Every listed name is used somewhere, so the list stays the real one.
	var unused []string
	for n, typ := range c {
		if used[n] || (typ == "histogram" && (used[n+"_bucket"] || used[n+"_sum"] || used[n+"_count"])) {
			continue
		}
		unused = append(unused, n)
	}
	sort.Strings(unused)
	require.Empty(t, unused, "listed in metrics.txt but used by no dashboard, rule or trigger")
}

func TestChartRulesMatchPrometheusRules(t *testing.T) {
	want, err := os.ReadFile("prometheus/rules.yaml")
	require.NoError(t, err)
	got, err := os.ReadFile("helm/provider-node/files/prometheus-rules.yaml")
	require.NoError(t, err)
	require.Equal(t, string(want), string(got), "copy prometheus/rules.yaml to helm/provider-node/files/prometheus-rules.yaml")
}

func TestChartEnvoyMatchesBareMetal(t *testing.T) {
	want, err := os.ReadFile("envoy/envoy.yaml")
	require.NoError(t, err)
	got, err := os.ReadFile("helm/provider-node/files/envoy.yaml")
	require.NoError(t, err)
	require.Equal(t, string(want), string(got), "copy envoy/envoy.yaml to helm/provider-node/files/envoy.yaml")
}

func TestDashboards(t *testing.T) {
	uids := map[string]string{}
	for _, path := range dashboardPaths(t) {
		t.Run(path, func(t *testing.T) {
			raw, err := os.ReadFile(path)
			require.NoError(t, err)
			d := loadDashboard(t, path)
			require.NotEmpty(t, d.UID)
			require.NotContains(t, uids, d.UID, "dashboard uid reused")
			uids[d.UID] = path

			var dsVar bool
			for _, v := range d.Templating.List {
				if v.Name == "datasource" && v.Type == "datasource" && string(v.Query) == `"prometheus"` {
					dsVar = true
				}
			}
			require.True(t, dsVar, "no datasource template variable of type prometheus")

			ids := map[int]string{}
			for _, p := range flatten(d.Panels) {
				require.Positive(t, p.ID, "panel %q has no id", p.Title)
				require.NotContains(t, ids, p.ID, "panel id %d used by %q and %q", p.ID, ids[p.ID], p.Title)
				ids[p.ID] = p.Title
				if p.Type == "row" {
					continue
				}
				require.JSONEq(t, `{"type":"prometheus","uid":"${datasource}"}`, string(p.Datasource), "panel %q", p.Title)
				require.NotEmpty(t, p.Targets, "panel %q has no query", p.Title)
				for _, tg := range p.Targets {
					require.JSONEq(t, `{"type":"prometheus","uid":"${datasource}"}`, string(tg.Datasource), "panel %q", p.Title)
				}
			}
			// Range functions take Grafana's rate interval, never a fixed window.
			for _, s := range dashboardExprs(t, path, d) {
				if strings.Contains(s.expr, "[") {
					require.Regexp(t, `\[\$__rate_interval\]`, s.expr, s.where)
					require.NotRegexp(t, `\[[0-9]+[smhd]\]`, s.expr, s.where)
				}
			}
			require.NotContains(t, string(raw), `"uid": "prometheus"`, "hard-coded datasource")
		})
	}
}

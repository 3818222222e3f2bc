package compare

import (
	"fmt"
	"html/template"
	"io"
	"math"
	"slices"
	"strings"

	"github.com/omnious/provider-node/bench/internal/chart"
)

// AgentsRun is one agents run's JSON contract (-json) and its name.
type AgentsRun struct {
	Name     string
	Contract ContractJSON
}

// agentsPoint is one policy's figures in one run.
type agentsPoint struct {
	run                   string
	agents                float64
	goodput, hit, perMin  float64
	completed, started, r int
}

// agentsPoints groups the closed-loop agents runs' figures by policy, in
// the order policies first appear; runs without closed-loop agents or
// session figures are returned by name in skipped.
func agentsPoints(runs []AgentsRun) (policies []string, pts map[string][]agentsPoint, skipped []string) {
	pts = map[string][]agentsPoint{}
	for _, r := range runs {
		if r.Contract.Agents <= 0 {
			skipped = append(skipped, r.Name)
			continue
		}
		for _, p := range r.Contract.Results {
			s := p.Sessions
			if s == nil {
				continue
			}
			if _, ok := pts[p.Policy]; !ok {
				policies = append(policies, p.Policy)
			}
			pts[p.Policy] = append(pts[p.Policy], agentsPoint{run: r.Name, agents: float64(r.Contract.Agents),
				goodput: float64(s.GoodputTokPS), hit: float64(p.HitRate), perMin: float64(s.PerMin),
				completed: s.Completed, started: s.Started, r: s.Retries})
		}
	}
	return policies, pts, skipped
}

// agentsLine plots val per policy against the offered agents: every run
// a dot, the mean at each agent count joined by a line.
func agentsLine(title, ylabel string, policies []string, pts map[string][]agentsPoint, val func(agentsPoint) float64) template.HTML {
	var xs, ys []float64
	for _, ps := range pts {
		for _, p := range ps {
			xs, ys = append(xs, p.agents), append(ys, val(p))
		}
	}
	c := chart.New(title, "closed-loop agents", ylabel, 0, chart.FiniteMax(xs...)*1.1, 0, chart.FiniteMax(ys...)*1.15)
	slices.Sort(xs)
	c.XTicks(slices.Compact(xs))
	for i, pol := range policies {
		sum, n := map[float64]float64{}, map[float64]int{}
		for _, p := range pts[pol] {
			v := val(p)
			if math.IsNaN(v) {
				continue
			}
			sum[p.agents] += v
			n[p.agents]++
			c.Printf(`<circle cx="%.1f" cy="%.1f" r="3" fill="%s"/>`, c.X(p.agents), c.Y(v), chart.Colour(i))
		}
		var at []float64
		for x := range sum {
			at = append(at, x)
		}
		slices.Sort(at)
		var line []string
		for _, x := range at {
			line = append(line, fmt.Sprintf("%.1f,%.1f", c.X(x), c.Y(sum[x]/float64(n[x]))))
		}
		c.Printf(`<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`, chart.Colour(i), strings.Join(line, " "))
		c.Legend(i, pol)
	}
	return c.SVG()
}

var agentsTmpl = template.Must(template.New("agents").Parse(`<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>bench: agents against offered load</title>
<style>body{font-family:sans-serif;margin:24px;color:#222}table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}th:first-child,td:first-child{text-align:left}.charts svg{margin:8px;border:1px solid #eee}small{color:#666}</style>
</head><body>
<h1>Agents: goodput and hit rate against offered agents</h1>
<p>Closed-loop agents runs (bench -scenario agents -json), each dot one run, the line through the mean at each agent count. Goodput is output tok/s of calls within the TTFT objective, model time.</p>
<div class="charts">{{range .Charts}}{{.}}{{end}}</div>
<table><tr><th>run</th><th>agents</th><th>policy</th><th>goodput tok/s</th><th>hit rate</th><th>sessions done / min</th><th>done / started</th><th>retries</th></tr>
{{range .Rows}}<tr>{{range .}}<td>{{.}}</td>{{end}}</tr>{{end}}</table>
{{if .Skipped}}<p><small>Not charted (open-loop or no session figures): {{.Skipped}}</small></p>{{end}}
</body></html>
`))

// WriteAgentsChart writes a self-contained page (inline SVG) charting,
// per policy, goodput and hit rate against the offered closed-loop
// agents of runs (TestWriteAgentsChart).
func WriteAgentsChart(w io.Writer, runs []AgentsRun) error {
	policies, pts, skipped := agentsPoints(runs)
	if len(policies) == 0 {
		return fmt.Errorf("no closed-loop agents run among %d", len(runs))
	}
	data := struct {
		Charts  []template.HTML
		Rows    [][]string
		Skipped string
	}{Skipped: strings.Join(skipped, ", ")}
	data.Charts = []template.HTML{
		agentsLine("Goodput vs offered agents", "goodput tok/s", policies, pts, func(p agentsPoint) float64 { return p.goodput }),
		agentsLine("Hit rate vs offered agents", "hit rate", policies, pts, func(p agentsPoint) float64 { return p.hit }),
	}
	for _, pol := range policies {
		for _, p := range pts[pol] {
			data.Rows = append(data.Rows, []string{p.run, fmtNum(p.agents, 0), pol, fmtNum(p.goodput, 0), fmtPct(p.hit),
				fmtNum(p.perMin, 1), fmt.Sprintf("%d / %d", p.completed, p.started), fmt.Sprint(p.r)})
		}
	}
	return agentsTmpl.Execute(w, data)
}

package compare

import (
	"fmt"
	"html"
	"html/template"
	"io"
	"math"
	"os"
	"strings"

	"github.com/omnious/provider-node/bench/internal/chart"
)

// lineChart plots one series per policy against the ladder's QPS.
func lineChart(title, ylabel string, r *Report, val func(StageResult) float64) template.HTML {
	var qps []float64
	if len(r.Results) > 0 {
		for _, s := range r.Results[0].Stages {
			qps = append(qps, s.QPS)
		}
	}
	var all []float64
	for _, p := range r.Results {
		for _, s := range p.Stages {
			all = append(all, val(s))
		}
	}
	c := chart.New(title, "QPS (model time)", ylabel, 0, chart.FiniteMax(qps...)*1.05, 0, chart.FiniteMax(all...)*1.1)
	c.XTicks(qps)
	for i, p := range r.Results {
		var pts []string
		for _, s := range p.Stages {
			v := val(s)
			if math.IsNaN(v) {
				continue
			}
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", c.X(s.QPS), c.Y(v)))
			c.Printf(`<circle cx="%.1f" cy="%.1f" r="3" fill="%s"/>`, c.X(s.QPS), c.Y(v), chart.Colour(i))
		}
		c.Printf(`<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`, chart.Colour(i), strings.Join(pts, " "))
		c.Legend(i, p.Policy)
	}
	return c.SVG()
}

// refLine is a labelled horizontal reference in a bar chart.
type refLine struct {
	v    float64
	name string
}

// barChart draws one bar per policy, with an optional dashed reference line.
func barChart(title, ylabel string, r *Report, val func(PolicyResult) float64, refs ...refLine) template.HTML {
	var vals []float64
	for _, p := range r.Results {
		vals = append(vals, val(p))
	}
	all := append([]float64(nil), vals...)
	for _, rl := range refs {
		all = append(all, rl.v)
	}
	top := chart.FiniteMax(all...) * 1.15
	c := chart.New(title, "policy", ylabel, 0, float64(max(len(vals), 1)), 0, top)
	bw := c.PlotWidth() / float64(max(len(vals), 1))
	for i, v := range vals {
		if math.IsNaN(v) {
			continue
		}
		x := c.X(float64(i)) + bw*0.15
		c.Printf(`<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"/><text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`,
			x, c.Y(v), bw*0.7, c.Y(0)-c.Y(v), chart.Colour(i), x+bw*0.35, c.Y(v)-3, chart.Tick(v))
		c.Legend(i, r.Results[i].Policy)
	}
	for i, rl := range refs {
		if math.IsNaN(rl.v) {
			continue
		}
		dash := []string{"6 4", "2 3"}[i%2]
		c.Printf(`<line x1="%g" y1="%.1f" x2="%g" y2="%.1f" stroke="#000" stroke-dasharray="%s"/><text x="%g" y="%.1f">%s</text>`,
			c.Left(), c.Y(rl.v), c.Right(), c.Y(rl.v), dash, c.Left()+4+120*float64(i), c.Y(rl.v)-4, html.EscapeString(rl.name))
	}
	return c.SVG()
}

// loadChart draws each policy's per-replica load relative to the mean.
func loadChart(r *Report) template.HTML {
	n := 0
	var all []float64
	rel := make([][]float64, len(r.Results))
	for i, p := range r.Results {
		n = max(n, len(p.LoadRequests))
		var sum float64
		for _, v := range p.LoadRequests {
			sum += v
		}
		for _, v := range p.LoadRequests {
			x := math.NaN()
			if sum > 0 {
				x = v / (sum / float64(len(p.LoadRequests)))
			}
			rel[i] = append(rel[i], x)
			all = append(all, x)
		}
	}
	c := chart.New("Requests per replica (1 = mean)", "replica", "load / mean", 0, float64(max(n, 1)), 0, math.Max(chart.FiniteMax(all...)*1.1, 1.2))
	slot := c.PlotWidth() / float64(max(n, 1))
	bw := slot * 0.8 / float64(max(len(r.Results), 1))
	for rep := 0; rep < n; rep++ {
		c.Printf(`<text x="%.1f" y="%g" text-anchor="middle">%d</text>`, c.X(float64(rep))+slot/2, c.Bottom()+14, rep)
	}
	for i, vals := range rel {
		for rep, v := range vals {
			if math.IsNaN(v) {
				continue
			}
			c.Printf(`<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"/>`,
				c.X(float64(rep))+slot*0.1+bw*float64(i), c.Y(v), bw, c.Y(0)-c.Y(v), chart.Colour(i))
		}
		c.Legend(i, r.Results[i].Policy)
	}
	c.Printf(`<line x1="%g" y1="%.1f" x2="%g" y2="%.1f" stroke="#000" stroke-dasharray="6 4"/>`, c.Left(), c.Y(1), c.Right(), c.Y(1))
	return c.SVG()
}

// paretoChart plots sweep points: throughput against TTFT p90, the front
// highlighted.
func paretoChart(r *Report) template.HTML {
	var xs, ys []float64
	for _, p := range r.Results {
		xs, ys = append(xs, p.OutputTokPS), append(ys, p.TTFTP90)
	}
	c := chart.New("Sweep: TTFT p90 vs throughput (front in red)", "output tok/s", "TTFT p90 ms", 0, chart.FiniteMax(xs...)*1.1, 0, chart.FiniteMax(ys...)*1.1)
	c.XTicks([]float64{0, chart.FiniteMax(xs...) / 2, chart.FiniteMax(xs...)})
	front := map[int]bool{}
	for _, i := range r.Sweep.Front {
		front[i] = true
	}
	for i := range xs {
		if math.IsNaN(xs[i]) || math.IsNaN(ys[i]) {
			continue
		}
		fill := "#1f77b4"
		if front[i] {
			fill = "#d62728"
		}
		c.Printf(`<circle cx="%.1f" cy="%.1f" r="4" fill="%s"><title>%s</title></circle><text x="%.1f" y="%.1f" font-size="9">%d</text>`,
			c.X(xs[i]), c.Y(ys[i]), fill, html.EscapeString(r.Results[i].Policy), c.X(xs[i])+5, c.Y(ys[i])-5, i)
	}
	return c.SVG()
}

var reportTmpl = template.Must(template.New("report").Parse(`<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>bench: {{.R.Scenario}}</title>
<style>body{font-family:sans-serif;margin:24px;color:#222}table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}th:first-child,td:first-child{text-align:left}.charts svg{margin:8px;border:1px solid #eee}small{color:#666}</style>
</head><body>
<h1>Routing bench: {{.R.Scenario}}</h1>
<p>{{.R.Workload}}. {{.R.Replicas}} replicas, {{.R.Requests}} requests per policy, started {{.R.Started.Format "2006-01-02 15:04:05 MST"}}, wall {{.Wall}}.</p>
<p>{{.TimeNote}}</p>
<p>Infinite-cache bound: {{.Bound}} <small>({{.R.BoundNote}})</small>. Fleet bound: {{.FleetBound}} <small>(the same pieces in one LRU cache as large as the whole fleet's KV cache: the best a router can do with this capacity)</small></p>
<table>{{range $i, $row := .Rows}}<tr>{{range $row}}{{if eq $i 0}}<th>{{.}}</th>{{else}}<td>{{.}}</td>{{end}}{{end}}</tr>{{end}}</table>
{{range .Notes}}<p><small>{{.}}</small></p>{{end}}
{{if .Stages}}<h2>Per QPS stage: TTFT p90 ms / output tok/s</h2><table>{{range $i, $row := .Stages}}<tr>{{range $row}}{{if eq $i 0}}<th>{{.}}</th>{{else}}<td>{{.}}</td>{{end}}{{end}}</tr>{{end}}</table>{{end}}
{{if .Sweep}}<h2>Sweep</h2><table><tr><th>#</th><th>overrides</th><th>TTFT p90</th><th>tok/s</th><th>front</th></tr>{{range .Sweep}}<tr><td>{{.I}}</td><td>{{.Label}}</td><td>{{.TTFT}}</td><td>{{.TokPS}}</td><td>{{if .Front}}*{{end}}</td></tr>{{end}}</table>{{end}}
<div class="charts">{{range .Charts}}{{.}}{{end}}</div>
<p><small>Hit rate is the replicas' own prefix-cache counters (hits/queries, tokens) over the run; load is requests served per replica from the replicas' counters.</small></p>
</body></html>
`))

type sweepRow struct {
	I           int
	Label       string
	TTFT, TokPS string
	Front       bool
}

// WriteHTML writes a self-contained report (inline SVG, no scripts).
func (r *Report) WriteHTML(w io.Writer) error {
	data := struct {
		R                     *Report
		Wall, TimeNote, Bound string
		FleetBound            string
		Rows, Stages          [][]string
		Notes                 []string
		Charts                []template.HTML
		Sweep                 []sweepRow
	}{R: r, Wall: r.Wall.Round(1e9).String(), Bound: fmtPct(r.Bound), Rows: r.tableRows(), FleetBound: fmtPct(r.FleetBound)}
	data.TimeNote = "Latencies in wall time."
	if r.Simulated {
		data.TimeNote = fmt.Sprintf("Simulated fleet: latencies and tokens/s are in model time (wall time x time scale %g).", r.TimeScale)
	}
	data.Notes = r.notes()
	ladder := len(r.Results) > 0 && len(r.Results[0].Stages) > 1
	if ladder {
		data.Stages = [][]string{append([]string{"QPS"}, r.policyNames()...)}
		for k, st := range r.Results[0].Stages {
			row := []string{fmtNum(st.QPS, 1)}
			for _, p := range r.Results {
				if k < len(p.Stages) {
					row = append(row, fmtNum(p.Stages[k].TTFTP90ms, 0)+" / "+fmtNum(p.Stages[k].OutputTokPS, 0))
				}
			}
			data.Stages = append(data.Stages, row)
		}
		data.Charts = append(data.Charts,
			lineChart("TTFT p90 vs QPS", "TTFT p90 ms", r, func(s StageResult) float64 { return s.TTFTP90ms }),
			lineChart("Output tokens/s vs QPS", "output tok/s", r, func(s StageResult) float64 { return s.OutputTokPS }))
	} else {
		data.Charts = append(data.Charts, barChart("TTFT p90", "ms", r, func(p PolicyResult) float64 { return p.TTFTP90 }))
	}
	data.Charts = append(data.Charts,
		barChart("Cache-hit rate vs infinite-cache bound", "hit rate", r, func(p PolicyResult) float64 { return p.HitRate },
			refLine{r.Bound, "bound " + fmtPct(r.Bound)}, refLine{r.FleetBound, "fleet bound " + fmtPct(r.FleetBound)}),
		barChart("Output tokens/s", "tok/s", r, func(p PolicyResult) float64 { return p.OutputTokPS }),
		loadChart(r))
	if len(r.Results) > 0 && r.Results[0].Sessions != nil {
		// An agents run: its goodput first (bench agents-chart draws it
		// against the offered agents across runs).
		data.Charts = append([]template.HTML{barChart("Goodput (output tok/s of calls with TTFT <= "+GoodputTTFT.String()+")", "tok/s", r,
			func(p PolicyResult) float64 {
				if p.Sessions == nil {
					return math.NaN()
				}
				return p.Sessions.GoodputTokPS
			})}, data.Charts...)
	}
	if r.Sweep != nil {
		data.Charts = append([]template.HTML{paretoChart(r)}, data.Charts...)
		front := map[int]bool{}
		for _, i := range r.Sweep.Front {
			front[i] = true
		}
		for i, p := range r.Results {
			data.Sweep = append(data.Sweep, sweepRow{I: i, Label: p.Policy, TTFT: fmtNum(p.TTFTP90, 1), TokPS: fmtNum(p.OutputTokPS, 0), Front: front[i]})
		}
	}
	return reportTmpl.Execute(w, data)
}

// WriteHTMLFile writes the HTML report to path.
func (r *Report) WriteHTMLFile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("cannot create report: %w", err)
	}
	if err := r.WriteHTML(f); err != nil {
		f.Close()
		return fmt.Errorf("cannot render report: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("cannot write report: %w", err)
	}
	return nil
}

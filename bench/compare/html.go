package compare

import (
	"fmt"
	"html"
	"html/template"
	"io"
	"math"
	"os"
	"strings"
)

// palette colours series by policy index.
var palette = [...]string{"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"}

func colour(i int) string { return palette[i%len(palette)] }

// svgChart is a hand-written SVG plot area with axes.
type svgChart struct {
	b                      strings.Builder
	w, h                   float64
	left, right, top, bott float64
	xmin, xmax, ymin, ymax float64
}

func newChart(title, xlabel, ylabel string, xmin, xmax, ymin, ymax float64) *svgChart {
	c := &svgChart{w: 560, h: 320, left: 64, right: 150, top: 30, bott: 46, xmin: xmin, xmax: xmax, ymin: ymin, ymax: ymax}
	if !(c.xmax > c.xmin) {
		c.xmax = c.xmin + 1
	}
	if !(c.ymax > c.ymin) {
		c.ymax = c.ymin + 1
	}
	fmt.Fprintf(&c.b, `<svg xmlns="http://www.w3.org/2000/svg" width="%g" height="%g" viewBox="0 0 %g %g" font-family="sans-serif" font-size="11">`, c.w, c.h, c.w, c.h)
	fmt.Fprintf(&c.b, `<text x="%g" y="18" font-size="13" font-weight="bold">%s</text>`, c.left, html.EscapeString(title))
	x0, y0, x1, y1 := c.left, c.h-c.bott, c.w-c.right, c.top
	fmt.Fprintf(&c.b, `<line x1="%g" y1="%g" x2="%g" y2="%g" stroke="#333"/><line x1="%g" y1="%g" x2="%g" y2="%g" stroke="#333"/>`, x0, y0, x1, y0, x0, y0, x0, y1)
	for i := 0; i <= 4; i++ {
		v := c.ymin + (c.ymax-c.ymin)*float64(i)/4
		y := c.y(v)
		fmt.Fprintf(&c.b, `<line x1="%g" y1="%.1f" x2="%g" y2="%.1f" stroke="#ddd"/><text x="%g" y="%.1f" text-anchor="end">%s</text>`, x0, y, x1, y, x0-4, y+4, tick(v))
	}
	fmt.Fprintf(&c.b, `<text x="%g" y="%g" text-anchor="middle">%s</text>`, (x0+x1)/2, c.h-8, html.EscapeString(xlabel))
	fmt.Fprintf(&c.b, `<text x="14" y="%g" text-anchor="middle" transform="rotate(-90 14 %g)">%s</text>`, (y0+y1)/2, (y0+y1)/2, html.EscapeString(ylabel))
	return c
}

func tick(v float64) string {
	switch a := math.Abs(v); {
	case a == 0:
		return "0"
	case a >= 1e6:
		return fmt.Sprintf("%.1fM", v/1e6)
	case a >= 1e4:
		return fmt.Sprintf("%.0fk", v/1e3)
	case a >= 100:
		return fmt.Sprintf("%.0f", v)
	case a >= 1:
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.2f", v)
}

func (c *svgChart) x(v float64) float64 {
	return c.left + (v-c.xmin)/(c.xmax-c.xmin)*(c.w-c.left-c.right)
}

func (c *svgChart) y(v float64) float64 {
	return c.h - c.bott - (v-c.ymin)/(c.ymax-c.ymin)*(c.h-c.top-c.bott)
}

func (c *svgChart) xTicks(vals []float64) {
	for _, v := range vals {
		fmt.Fprintf(&c.b, `<text x="%.1f" y="%g" text-anchor="middle">%s</text>`, c.x(v), c.h-c.bott+14, tick(v))
	}
}

func (c *svgChart) legend(i int, name string) {
	y := c.top + 14*float64(i)
	fmt.Fprintf(&c.b, `<rect x="%g" y="%g" width="10" height="10" fill="%s"/><text x="%g" y="%g">%s</text>`,
		c.w-c.right+10, y, colour(i), c.w-c.right+24, y+9, html.EscapeString(name))
}

func (c *svgChart) svg() template.HTML {
	c.b.WriteString(`</svg>`)
	return template.HTML(c.b.String()) // built from escaped parts only
}

func finiteMax(vals ...float64) float64 {
	m := 0.0
	for _, v := range vals {
		if !math.IsNaN(v) && !math.IsInf(v, 0) {
			m = math.Max(m, v)
		}
	}
	return m
}

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
	c := newChart(title, "QPS (model time)", ylabel, 0, finiteMax(qps...)*1.05, 0, finiteMax(all...)*1.1)
	c.xTicks(qps)
	for i, p := range r.Results {
		var pts []string
		for _, s := range p.Stages {
			v := val(s)
			if math.IsNaN(v) {
				continue
			}
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", c.x(s.QPS), c.y(v)))
			fmt.Fprintf(&c.b, `<circle cx="%.1f" cy="%.1f" r="3" fill="%s"/>`, c.x(s.QPS), c.y(v), colour(i))
		}
		fmt.Fprintf(&c.b, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`, colour(i), strings.Join(pts, " "))
		c.legend(i, p.Policy)
	}
	return c.svg()
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
	top := finiteMax(all...) * 1.15
	c := newChart(title, "policy", ylabel, 0, float64(max(len(vals), 1)), 0, top)
	bw := (c.w - c.left - c.right) / float64(max(len(vals), 1))
	for i, v := range vals {
		if math.IsNaN(v) {
			continue
		}
		x := c.x(float64(i)) + bw*0.15
		fmt.Fprintf(&c.b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"/><text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`,
			x, c.y(v), bw*0.7, c.y(0)-c.y(v), colour(i), x+bw*0.35, c.y(v)-3, tick(v))
		c.legend(i, r.Results[i].Policy)
	}
	for i, rl := range refs {
		if math.IsNaN(rl.v) {
			continue
		}
		dash := []string{"6 4", "2 3"}[i%2]
		fmt.Fprintf(&c.b, `<line x1="%g" y1="%.1f" x2="%g" y2="%.1f" stroke="#000" stroke-dasharray="%s"/><text x="%g" y="%.1f">%s</text>`,
			c.left, c.y(rl.v), c.w-c.right, c.y(rl.v), dash, c.left+4+120*float64(i), c.y(rl.v)-4, html.EscapeString(rl.name))
	}
	return c.svg()
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
	c := newChart("Requests per replica (1 = mean)", "replica", "load / mean", 0, float64(max(n, 1)), 0, math.Max(finiteMax(all...)*1.1, 1.2))
	slot := (c.w - c.left - c.right) / float64(max(n, 1))
	bw := slot * 0.8 / float64(max(len(r.Results), 1))
	for rep := 0; rep < n; rep++ {
		fmt.Fprintf(&c.b, `<text x="%.1f" y="%g" text-anchor="middle">%d</text>`, c.x(float64(rep))+slot/2, c.h-c.bott+14, rep)
	}
	for i, vals := range rel {
		for rep, v := range vals {
			if math.IsNaN(v) {
				continue
			}
			fmt.Fprintf(&c.b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"/>`,
				c.x(float64(rep))+slot*0.1+bw*float64(i), c.y(v), bw, c.y(0)-c.y(v), colour(i))
		}
		c.legend(i, r.Results[i].Policy)
	}
	fmt.Fprintf(&c.b, `<line x1="%g" y1="%.1f" x2="%g" y2="%.1f" stroke="#000" stroke-dasharray="6 4"/>`, c.left, c.y(1), c.w-c.right, c.y(1))
	return c.svg()
}

// paretoChart plots sweep points: throughput against TTFT p90, the front
// highlighted.
func paretoChart(r *Report) template.HTML {
	var xs, ys []float64
	for _, p := range r.Results {
		xs, ys = append(xs, p.OutputTokPS), append(ys, p.TTFTP90)
	}
	c := newChart("Sweep: TTFT p90 vs throughput (front in red)", "output tok/s", "TTFT p90 ms", 0, finiteMax(xs...)*1.1, 0, finiteMax(ys...)*1.1)
	c.xTicks([]float64{0, finiteMax(xs...) / 2, finiteMax(xs...)})
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
		fmt.Fprintf(&c.b, `<circle cx="%.1f" cy="%.1f" r="4" fill="%s"><title>%s</title></circle><text x="%.1f" y="%.1f" font-size="9">%d</text>`,
			c.x(xs[i]), c.y(ys[i]), fill, html.EscapeString(r.Results[i].Policy), c.x(xs[i])+5, c.y(ys[i])-5, i)
	}
	return c.svg()
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

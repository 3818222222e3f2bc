package proof

import (
	"bytes"
	"fmt"
	"html/template"
	"io"
	"math"
	"os"
	"sort"
	"strings"

	"github.com/omnious/provider-node/bench/internal/chart"
)

// capacityTmpl is the capacity proof's HTML report: the table as printed
// and its charts.
var capacityTmpl = template.Must(template.New("capacity").Parse(`<!doctype html>
<html><head><meta charset="utf-8"><title>capacity proof: {{.R.Scenario}}</title>
<style>body{font-family:sans-serif;margin:24px}pre{background:#f6f6f6;padding:12px}</style></head>
<body><h1>Capacity proof: {{.R.Scenario}}</h1>
<p>Does a signed quote promise what the fleet serves within its objectives? Latencies and tokens/s in model time.</p>
<pre>{{.Table}}</pre>
{{range .Charts}}<div>{{.}}</div>{{end}}
</body></html>
`))

// WriteHTML renders the report with its charts: the ladder's p95s over
// their objectives against QPS with the quote's rate marked, quoted against
// true capacity, and the latency at 0.5x, 1x and 1.25x of the quote.
func (r *Report) WriteHTML(w io.Writer) error {
	var table bytes.Buffer
	if err := r.WriteTable(&table); err != nil {
		return err
	}
	return capacityTmpl.Execute(w, struct {
		R      *Report
		Table  string
		Charts []template.HTML
	}{r, table.String(), []template.HTML{r.ladderChart(), r.quoteChart(), r.checkChart()}})
}

// WriteHTMLFile writes the HTML report to path.
func (r *Report) WriteHTMLFile(path string) error {
	var b bytes.Buffer
	if err := r.WriteHTML(&b); err != nil {
		return fmt.Errorf("cannot render capacity report: %w", err)
	}
	if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
		return fmt.Errorf("cannot write capacity report: %w", err)
	}
	return nil
}

func (r *Report) over(s Step) (ttft, itl float64) {
	return s.TTFTP95ms / (r.Objectives.TTFTSeconds * 1000), s.ITLP95ms / (r.Objectives.ITLSeconds * 1000)
}

func (r *Report) ladderChart() template.HTML {
	steps := append([]Step(nil), r.Ladder...)
	sort.Slice(steps, func(i, j int) bool { return steps[i].QPS < steps[j].QPS })
	var qps, all []float64
	for _, s := range steps {
		t, i := r.over(s)
		qps = append(qps, s.QPS)
		all = append(all, math.Min(t, 3), math.Min(i, 3))
	}
	c := chart.New("Ladder: p95 over objective vs offered QPS", "QPS (model time)", "p95 / objective (capped at 3)",
		0, chart.FiniteMax(qps...)*1.05, 0, math.Max(chart.FiniteMax(all...), 1.2)*1.05)
	c.XTicks(qps)
	for k, name := range []string{"TTFT", "ITL"} {
		var pts []string
		for _, s := range steps {
			t, i := r.over(s)
			v := math.Min([]float64{t, i}[k], 3)
			if math.IsNaN(v) {
				continue
			}
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", c.X(s.QPS), c.Y(v)))
		}
		c.Printf(`<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`, chart.Colour(k), strings.Join(pts, " "))
		c.Legend(k, name)
	}
	c.Printf(`<line x1="%g" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#000" stroke-dasharray="4 3"/>`, c.Left(), c.Y(1), c.X(c.XMax()), c.Y(1))
	marks := []struct {
		qps  float64
		name string
	}{{r.True.QPS, "true capacity"}}
	for _, s := range r.Checks {
		if s.Label == "1.00x idle quote" {
			marks = append(marks, struct {
				qps  float64
				name string
			}{s.QPS, "idle quote"})
			break
		}
	}
	for i, m := range marks {
		c.Printf(`<line x1="%.1f" y1="%g" x2="%.1f" y2="%g" stroke="%s" stroke-dasharray="2 2"/>`, c.X(m.qps), c.Top(), c.X(m.qps), c.Bottom(), chart.Colour(2+i))
		c.Legend(2+i, m.name)
	}
	return c.SVG()
}

// quoteChart: each quote's promised tokens/s (plus the load it was read
// under) against what the fleet served within the objectives.
func (r *Report) quoteChart() template.HTML {
	type bar struct {
		name         string
		quoted, true float64
	}
	var bars []bar
	for _, q := range r.Quotes {
		b := bar{name: q.Label, quoted: q.TokensPerS, true: r.True.OutputTokPS}
		switch q.Label {
		case "half loaded":
			b.quoted += r.HalfLoadAtQuote
		case "one replica lost":
			if r.Replicas > 0 {
				b.true *= float64(r.Replicas-1) / float64(r.Replicas)
			}
		}
		bars = append(bars, b)
	}
	var all []float64
	for _, b := range bars {
		all = append(all, b.quoted, b.true)
	}
	c := chart.New("Quoted (+ load it was read under) vs true capacity", "", "output tok/s", 0, float64(len(bars)), 0, chart.FiniteMax(all...)*1.1)
	bw := c.PlotWidth() / float64(max(len(bars), 1)) / 3
	for i, b := range bars {
		for k, v := range []float64{b.quoted, b.true} {
			x := c.X(float64(i)) + bw*(0.5+float64(k))
			c.Printf(`<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"/>`, x, c.Y(v), bw, c.Y(0)-c.Y(v), chart.Colour(k))
		}
		c.Printf(`<text x="%.1f" y="%g" text-anchor="middle" font-size="9">%s</text>`, c.X(float64(i))+bw*1.5, c.Bottom()+14, template.HTMLEscapeString(b.name))
	}
	c.Legend(0, "quoted")
	c.Legend(1, "true (x (n-1)/n when lost)")
	return c.SVG()
}

// checkChart: p95 over objective at the loads offered against the quotes.
func (r *Report) checkChart() template.HTML {
	var all []float64
	for _, s := range r.Checks {
		t, i := r.over(s)
		all = append(all, math.Min(t, 3), math.Min(i, 3))
	}
	c := chart.New("p95 over objective at multiples of the quote", "", "p95 / objective (capped at 3)", 0, float64(len(r.Checks)), 0,
		math.Max(chart.FiniteMax(all...), 1.2)*1.05)
	bw := c.PlotWidth() / float64(max(len(r.Checks), 1)) / 3
	for i, s := range r.Checks {
		t, it := r.over(s)
		for k, v := range []float64{t, it} {
			v = math.Min(v, 3)
			if math.IsNaN(v) {
				continue
			}
			x := c.X(float64(i)) + bw*(0.5+float64(k))
			c.Printf(`<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"/>`, x, c.Y(v), bw, c.Y(0)-c.Y(v), chart.Colour(k))
		}
		c.Printf(`<text x="%.1f" y="%g" text-anchor="middle" font-size="9">%s</text>`, c.X(float64(i))+bw*1.5, c.Bottom()+14, template.HTMLEscapeString(s.Label))
	}
	c.Printf(`<line x1="%g" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#000" stroke-dasharray="4 3"/>`, c.Left(), c.Y(1), c.X(c.XMax()), c.Y(1))
	c.Legend(0, "TTFT")
	c.Legend(1, "ITL")
	return c.SVG()
}

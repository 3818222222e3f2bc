// Package chart draws the bench reports' charts as hand-written,
// self-contained SVG: a plot area with axes, ticks and a legend, on which
// a report draws its series in Colour order.
package chart

import (
	"fmt"
	"html"
	"html/template"
	"math"
	"strings"
)

// palette colours series by index.
var palette = [...]string{"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"}

// Colour is series i's colour.
func Colour(i int) string { return palette[i%len(palette)] }

// Chart is a hand-written SVG plot area with axes.
type Chart struct {
	b                      strings.Builder
	w, h                   float64
	left, right, top, bott float64
	xmin, xmax, ymin, ymax float64
}

// New is a chart titled title over [xmin, xmax] x [ymin, ymax] (an empty
// range is widened to 1), with y gridlines and the axes labelled.
func New(title, xlabel, ylabel string, xmin, xmax, ymin, ymax float64) *Chart {
	c := &Chart{w: 560, h: 320, left: 64, right: 150, top: 30, bott: 46, xmin: xmin, xmax: xmax, ymin: ymin, ymax: ymax}
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
		y := c.Y(v)
		fmt.Fprintf(&c.b, `<line x1="%g" y1="%.1f" x2="%g" y2="%.1f" stroke="#ddd"/><text x="%g" y="%.1f" text-anchor="end">%s</text>`, x0, y, x1, y, x0-4, y+4, Tick(v))
	}
	fmt.Fprintf(&c.b, `<text x="%g" y="%g" text-anchor="middle">%s</text>`, (x0+x1)/2, c.h-8, html.EscapeString(xlabel))
	fmt.Fprintf(&c.b, `<text x="14" y="%g" text-anchor="middle" transform="rotate(-90 14 %g)">%s</text>`, (y0+y1)/2, (y0+y1)/2, html.EscapeString(ylabel))
	return c
}

// Tick is v as an axis label: 0, 1.5M, 12k, 250, 2.5 or 0.25.
func Tick(v float64) string {
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

// X is where value v falls on the x axis, in pixels.
func (c *Chart) X(v float64) float64 {
	return c.left + (v-c.xmin)/(c.xmax-c.xmin)*(c.w-c.left-c.right)
}

// Y is where value v falls on the y axis, in pixels.
func (c *Chart) Y(v float64) float64 {
	return c.h - c.bott - (v-c.ymin)/(c.ymax-c.ymin)*(c.h-c.top-c.bott)
}

// XMax is the x axis' highest value.
func (c *Chart) XMax() float64 { return c.xmax }

// Left is the plot area's left edge, in pixels.
func (c *Chart) Left() float64 { return c.left }

// Right is the plot area's right edge, in pixels.
func (c *Chart) Right() float64 { return c.w - c.right }

// Top is the plot area's top edge, in pixels.
func (c *Chart) Top() float64 { return c.top }

// Bottom is the plot area's bottom edge (the x axis), in pixels.
func (c *Chart) Bottom() float64 { return c.h - c.bott }

// PlotWidth is the plot area's width, in pixels.
func (c *Chart) PlotWidth() float64 { return c.w - c.left - c.right }

// Printf adds an SVG element; the caller escapes any text in it.
func (c *Chart) Printf(format string, args ...any) { fmt.Fprintf(&c.b, format, args...) }

// XTicks labels the x axis at vals.
func (c *Chart) XTicks(vals []float64) {
	for _, v := range vals {
		fmt.Fprintf(&c.b, `<text x="%.1f" y="%g" text-anchor="middle">%s</text>`, c.X(v), c.h-c.bott+14, Tick(v))
	}
}

// Legend names series i, in its colour, right of the plot area.
func (c *Chart) Legend(i int, name string) {
	y := c.top + 14*float64(i)
	fmt.Fprintf(&c.b, `<rect x="%g" y="%g" width="10" height="10" fill="%s"/><text x="%g" y="%g">%s</text>`,
		c.w-c.right+10, y, Colour(i), c.w-c.right+24, y+9, html.EscapeString(name))
}

// SVG closes the chart and returns it.
func (c *Chart) SVG() template.HTML {
	c.b.WriteString(`</svg>`)
	return template.HTML(c.b.String()) // built from escaped parts only
}

// FiniteMax is the largest finite value of vals, at least 0.
func FiniteMax(vals ...float64) float64 {
	m := 0.0
	for _, v := range vals {
		if !math.IsNaN(v) && !math.IsInf(v, 0) {
			m = math.Max(m, v)
		}
	}
	return m
}

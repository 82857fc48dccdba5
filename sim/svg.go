package sim

import (
	"bufio"
	"fmt"
	"html"
	"io"
	"math"
)

var palette = []string{"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"}

// WriteSVG draws the report as an SVG image: on the left the cumulative
// distribution of time to first token per policy (log time axis), on the
// right the token hit rate per policy beside the two bounds.
func (r *Report) WriteSVG(w io.Writer) error {
	const (
		W, H           = 1000, 460
		lx, ly, lw, lh = 70, 50, 520, 340 // CDF panel
		rx, rw         = 700, 260         // hit-rate panel
	)
	b := bufio.NewWriter(w)
	p := func(format string, a ...any) { fmt.Fprintf(b, format, a...) }
	p(`<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", W, H, W, H)
	p(`<rect width="%d" height="%d" fill="white"/>`+"\n", W, H)
	p(`<text x="%d" y="20" font-size="14" font-weight="bold">%s</text>`+"\n", lx, html.EscapeString(r.Workload))
	p(`<text x="%d" y="36" fill="#555">%d × %s, %s index</text>`+"\n", lx, r.Replicas, html.EscapeString(r.Preset.Name), r.Index)

	// CDF panel: x from the smallest to the largest TTFT, log scale.
	lo, hi := math.Inf(1), 0.0
	for _, x := range r.Results {
		if x.ttft == nil || x.ttft.n == 0 {
			continue
		}
		for _, pt := range x.ttft.cdf() {
			lo, hi = math.Min(lo, pt[0]), math.Max(hi, pt[0])
		}
	}
	if hi <= 0 || math.IsInf(lo, 1) {
		lo, hi = 0.01, 1
	}
	lo = math.Pow(10, math.Floor(math.Log10(math.Max(lo, 1e-4))))
	hi = math.Pow(10, math.Ceil(math.Log10(math.Max(hi, lo*10))))
	xOf := func(s float64) float64 {
		s = math.Min(math.Max(s, lo), hi)
		return lx + lw*(math.Log10(s)-math.Log10(lo))/(math.Log10(hi)-math.Log10(lo))
	}
	yOf := func(f float64) float64 { return ly + lh*(1-f) }
	p(`<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#999"/>`+"\n", lx, ly, lw, lh)
	for d := lo; d <= hi*1.0001; d *= 10 {
		x := xOf(d)
		p(`<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#ddd"/>`+"\n", x, ly, x, ly+lh)
		p(`<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", x, ly+lh+16, tick(d))
	}
	for f := 0.0; f <= 1.0001; f += 0.25 {
		y := yOf(f)
		p(`<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>`+"\n", lx, y, lx+lw, y)
		p(`<text x="%d" y="%.1f" text-anchor="end">%.2f</text>`+"\n", lx-6, y+4, f)
	}
	p(`<text x="%d" y="%d" text-anchor="middle">time to first token (log scale)</text>`+"\n", lx+lw/2, ly+lh+34)
	p(`<text x="18" y="%d" transform="rotate(-90 18 %d)" text-anchor="middle">fraction of requests</text>`+"\n", ly+lh/2, ly+lh/2)
	for i, x := range r.Results {
		col := palette[i%len(palette)]
		if x.ttft != nil && x.ttft.n > 0 {
			p(`<polyline fill="none" stroke="%s" stroke-width="1.8" points="`, col)
			py, lastF := yOf(0), -1.0
			pts := x.ttft.cdf()
			for j, pt := range pts {
				// Skip steps under 0.1% unless last, to keep the file small.
				if j > 0 && j < len(pts)-1 && pt[1]-lastF < 0.001 {
					continue
				}
				px := xOf(pt[0])
				if j == 0 {
					p("%.1f,%.1f ", px, py)
				}
				p("%.1f,%.1f %.1f,%.1f ", px, py, px, yOf(pt[1]))
				py, lastF = yOf(pt[1]), pt[1]
			}
			p(`"/>` + "\n")
		}
		ly2 := ly + 14 + 16*i
		p(`<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="3"/>`+"\n", lx+10, ly2, lx+30, ly2, col)
		p(`<text x="%d" y="%d">%s</text>`+"\n", lx+35, ly2+4, html.EscapeString(x.Policy))
	}

	// Hit-rate panel: one bar per policy, then the bounds.
	n := len(r.Results) + 2
	bh := math.Min(24, float64(lh)/float64(n))
	p(`<text x="%d" y="%d" text-anchor="middle">token hit rate</text>`+"\n", rx+rw/2, ly-6)
	bar := func(i int, name string, v float64, col string) {
		y := float64(ly) + bh*float64(i)
		p(`<rect x="%d" y="%.1f" width="%.1f" height="%.1f" fill="%s"/>`+"\n", rx, y+2, float64(rw)*math.Min(math.Max(v, 0), 1), bh-4, col)
		p(`<text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n", rx-6, y+bh/2+4, html.EscapeString(name))
		p(`<text x="%.1f" y="%.1f">%s</text>`+"\n", float64(rx)+float64(rw)*math.Min(math.Max(v, 0), 1)+4, y+bh/2+4, pct(v))
	}
	for i, x := range r.Results {
		bar(i, x.Policy, x.TokenHitRate, palette[i%len(palette)])
	}
	bar(len(r.Results), "pooled LRU", r.PooledLRU.TokenHitRate, "#bbb")
	bar(len(r.Results)+1, "unbounded", r.Unbounded.TokenHitRate, "#ddd")
	p(`<line x1="%d" y1="%d" x2="%d" y2="%.1f" stroke="#999"/>`+"\n", rx, ly, rx, float64(ly)+bh*float64(n))
	p("</svg>\n")
	return b.Flush()
}

// tick labels a power of ten of seconds: 1ms, 10ms, 100ms, 1s, 10s, ...
func tick(s float64) string {
	switch {
	case s < 1e-3:
		return fmt.Sprintf("%gµs", math.Round(s*1e6))
	case s < 1:
		return fmt.Sprintf("%gms", math.Round(s*1e3))
	}
	return fmt.Sprintf("%gs", math.Round(s))
}

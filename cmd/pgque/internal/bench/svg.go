package bench

import (
	"fmt"
	"html"
	"math"
	"strings"
)

// chart is one horizontal bar chart: a bar per row, drawn as plain SVG so
// the figures render on any code host without a plotting dependency.
type chart struct {
	file  string
	title string
	unit  string // axis unit: "x (ratio to reference)" or the rows' unit
	bars  []bar
	mark  float64 // a reference line (1.0 on ratio charts), 0 for none
}

type bar struct {
	label  string
	value  float64
	text   string  // printed after the bar
	target float64 // drawn as a tick on the bar's row, NaN for none
	met    *bool
}

// charts groups the report's rows into charts: per suite, one chart of the
// ratios of rows that have a reference, and one chart per unit of the rows
// that do not.
func (rep *Report) charts() []chart {
	var out []chart
	index := map[string]int{}
	mode := "full run"
	if rep.Quick {
		mode = "quick run"
	}
	for _, r := range rep.Results {
		var key, file, title, unit string
		b := bar{target: math.NaN(), met: r.Met}
		if r.Reference != "" {
			key = r.Suite + "/ratio"
			file = r.Suite + ".svg"
			title = fmt.Sprintf("pgque bench: %s, ratio to reference (%s)", r.Suite, mode)
			unit = "× reference"
			b.label = r.Case + " ÷ " + r.Reference
			b.value = r.Ratio
			b.text = fmt.Sprintf("%.2f× (%s / %s %s)", r.Ratio, fmtNum(r.Value), fmtNum(r.RefValue), r.Unit)
			if strings.HasPrefix(r.Target, "ratio") {
				b.target = targetBound(r.Target)
			}
		} else {
			slug := strings.NewReplacer("/", "_per_", " ", "_").Replace(r.Unit)
			key = r.Suite + "/" + r.Unit
			file = r.Suite + "-" + slug + ".svg"
			title = fmt.Sprintf("pgque bench: %s, %s (%s)", r.Suite, r.Unit, mode)
			unit = r.Unit
			b.label = r.Case
			b.value = r.Value
			b.text = fmtNum(r.Value) + " " + r.Unit
			if strings.HasPrefix(r.Target, "value") {
				b.target = targetBound(r.Target)
			}
		}
		i, ok := index[key]
		if !ok {
			i = len(out)
			index[key] = i
			c := chart{file: file, title: title, unit: unit}
			if r.Reference != "" {
				c.mark = 1
			}
			out = append(out, c)
		}
		out[i].bars = append(out[i].bars, b)
	}
	return out
}

// targetBound parses the number out of "ratio >= 0.9".
func targetBound(t string) float64 {
	var on, op string
	var v float64
	if _, err := fmt.Sscanf(t, "%s %s %g", &on, &op, &v); err != nil {
		return math.NaN()
	}
	return v
}

const (
	svgWidth   = 900
	svgLabelW  = 330
	svgBarMaxW = 330
	svgRowH    = 26
	svgTop     = 44
)

// svg renders the chart.
func (c chart) svg() string {
	maxV := c.mark
	for _, b := range c.bars {
		maxV = math.Max(maxV, b.value)
		if !math.IsNaN(b.target) {
			maxV = math.Max(maxV, b.target)
		}
	}
	if maxV <= 0 || math.IsNaN(maxV) {
		maxV = 1
	}
	scale := svgBarMaxW / (maxV * 1.05)
	h := svgTop + len(c.bars)*svgRowH + 30
	var s strings.Builder
	fmt.Fprintf(&s, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n",
		svgWidth, h, svgWidth, h)
	fmt.Fprintf(&s, `<rect width="100%%" height="100%%" fill="#ffffff"/>`+"\n")
	fmt.Fprintf(&s, `<text x="10" y="20" font-size="14" font-weight="bold">%s</text>`+"\n", html.EscapeString(c.title))
	fmt.Fprintf(&s, `<text x="10" y="36" fill="#555">bars: %s; green = target met, red = missed, grey = no target; black tick = target</text>`+"\n",
		html.EscapeString(c.unit))
	for i, b := range c.bars {
		y := svgTop + i*svgRowH
		w := math.Max(0, b.value*scale)
		if math.IsNaN(w) || math.IsInf(w, 0) {
			w = 0
		}
		color := "#9e9e9e"
		if b.met != nil {
			color = map[bool]string{true: "#43a047", false: "#e53935"}[*b.met]
		}
		fmt.Fprintf(&s, `<text x="%d" y="%d" text-anchor="end">%s</text>`+"\n", svgLabelW-8, y+16, html.EscapeString(b.label))
		fmt.Fprintf(&s, `<rect x="%d" y="%d" width="%.1f" height="%d" fill="%s"/>`+"\n", svgLabelW, y+4, w, svgRowH-8, color)
		textX := float64(svgLabelW) + w + 6
		if !math.IsNaN(b.target) {
			textX = math.Max(textX, float64(svgLabelW)+b.target*scale+6)
		}
		fmt.Fprintf(&s, `<text x="%.1f" y="%d" fill="#222">%s</text>`+"\n", textX, y+16, html.EscapeString(b.text))
		if !math.IsNaN(b.target) {
			x := float64(svgLabelW) + b.target*scale
			fmt.Fprintf(&s, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#000" stroke-width="2"/>`+"\n", x, y+1, x, y+svgRowH-1)
		}
	}
	bottom := svgTop + len(c.bars)*svgRowH
	if c.mark > 0 {
		x := float64(svgLabelW) + c.mark*scale
		fmt.Fprintf(&s, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#1e88e5" stroke-dasharray="4 3"/>`+"\n", x, svgTop, x, bottom)
		fmt.Fprintf(&s, `<text x="%.1f" y="%d" fill="#1e88e5" text-anchor="middle">1× (reference)</text>`+"\n", x, bottom+16)
	}
	fmt.Fprintf(&s, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#333"/>`+"\n", svgLabelW, svgTop, svgLabelW, bottom)
	s.WriteString("</svg>\n")
	return s.String()
}

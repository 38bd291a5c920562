package cli

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

// table writes an aligned table with a header row.
func table(w io.Writer, header []string, rows [][]string) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, strings.Join(header, "\t"))
	for _, r := range rows {
		fmt.Fprintln(tw, strings.Join(r, "\t"))
	}
	return tw.Flush()
}

// fmtSeconds renders a duration given in seconds compactly: 12ms, 3.4s,
// 5m10s, 2h3m.
func fmtSeconds(sec float64) string {
	d := time.Duration(sec * float64(time.Second))
	switch {
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Minute:
		return d.Round(100 * time.Millisecond).String()
	case d < time.Hour:
		return d.Round(time.Second).String()
	default:
		return strings.TrimSuffix(d.Round(time.Minute).String(), "0s")
	}
}

// fmtAge renders an age, or "-" when there is nothing to be old.
func fmtAge(sec float64, some bool) string {
	if !some {
		return "-"
	}
	return fmtSeconds(sec)
}

// fmtRate renders events per second, "-" when unknown.
func fmtRate(r *float64) string {
	if r == nil {
		return "-"
	}
	return fmt.Sprintf("%.1f", *r)
}

// joinWarnings renders warnings in one table cell.
func joinWarnings(w []string) string {
	if len(w) == 0 {
		return ""
	}
	return strings.Join(w, "; ")
}

// orDash returns s, or "-" when it is empty.
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

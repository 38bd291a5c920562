package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
)

// WriteTable prints the report as a table: one row per (case, reference),
// then the targets that were missed and the suites that failed.
func (rep *Report) WriteTable(w io.Writer) {
	mode := "full"
	if rep.Quick {
		mode = "quick"
	}
	server, _, _ := strings.Cut(rep.Environment.Server, " on ")
	fmt.Fprintf(w, "pgque bench (%s run, %s, %s, %d CPUs, %s)\n", mode, server, rep.Environment.Cluster,
		rep.Environment.CPUs, rep.Environment.Settings)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "suite\tcase\tvalue\tunit\treference\tratio\ttarget\t")
	for _, r := range rep.Results {
		ratio, ref := "", r.Reference
		if r.Reference != "" {
			ratio = fmt.Sprintf("%.2fx", r.Ratio)
			ref = fmt.Sprintf("%s (%s)", r.Reference, fmtNum(r.RefValue))
		}
		tgt := ""
		if r.Met != nil {
			tgt = r.Target + " " + map[bool]string{true: "ok", false: "MISSED"}[*r.Met]
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", r.Suite, r.Case, fmtNum(r.Value), r.Unit, ref, ratio, tgt)
	}
	tw.Flush()
	var missed []string
	for _, r := range rep.Results {
		if r.Met != nil && !*r.Met {
			missed = append(missed, fmt.Sprintf("  %s/%s vs %s: %s, got %s", r.Suite, r.Case,
				orDash(r.Reference), r.Target, got(r)))
		}
	}
	if len(missed) > 0 {
		fmt.Fprintf(w, "\ntargets missed (%d):\n%s\n", len(missed), strings.Join(missed, "\n"))
	}
	for _, f := range rep.Failures {
		fmt.Fprintf(w, "\nsuite %s FAILED: %s\n", f.Suite, f.Error)
	}
}

func got(r Result) string {
	if strings.HasPrefix(r.Target, "ratio") {
		return fmt.Sprintf("%.2fx", r.Ratio)
	}
	return fmtNum(r.Value) + " " + r.Unit
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// WriteFiles writes report.json and one SVG chart per suite (per unit for
// figures without a reference) into dir, creating it if needed. Charts of
// suites in this report replace older ones; others are left alone, so a run
// of one suite refreshes only its own charts.
func (rep *Report) WriteFiles(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("writing the report: %w", err)
	}
	b, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return fmt.Errorf("encoding the report: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "report.json"), append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("writing the report: %w", err)
	}
	for _, c := range rep.charts() {
		if err := os.WriteFile(filepath.Join(dir, c.file), []byte(c.svg()), 0o644); err != nil {
			return fmt.Errorf("writing chart %s: %w", c.file, err)
		}
	}
	return nil
}

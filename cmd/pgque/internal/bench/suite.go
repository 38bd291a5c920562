package bench

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
)

// suite is one named benchmark: it measures its cases together with the
// references they are compared to, so it can run alone.
type suite struct {
	name  string
	about string
	run   func(ctx context.Context, e *env, r *recorder) error
	// preload lists the libraries the suite needs in
	// shared_preload_libraries; the bench's own cluster loads them.
	preload []string
}

// registry lists the suites in run order. It is filled by the suite files'
// init functions through register, so each suite lives in one file.
var registry []*suite

// suiteOrder fixes the run order whatever the init order of the files.
var suiteOrder = []string{"floor", "pgq", "produce", "consume", "latency", "readamp", "bloat", "catchup", "held", "pause", "resize", "peers", "ts"}

func register(s *suite) { registry = append(registry, s) }

// SuiteNames returns the names of every suite, in run order.
func SuiteNames() []string {
	var names []string
	for _, s := range allSuites() {
		names = append(names, s.name)
	}
	return names
}

// allSuites returns the registered suites in suiteOrder, then those
// suiteOrder does not name, in name order.
func allSuites() []*suite {
	var out, rest []*suite
	for _, name := range suiteOrder {
		if s := findSuite(name); s != nil {
			out = append(out, s)
		}
	}
	for _, s := range registry {
		if !slices.Contains(suiteOrder, s.name) {
			rest = append(rest, s)
		}
	}
	slices.SortFunc(rest, func(a, b *suite) int { return strings.Compare(a.name, b.name) })
	return append(out, rest...)
}

func findSuite(name string) *suite {
	for _, s := range registry {
		if s.name == name {
			return s
		}
	}
	return nil
}

// recorder collects a suite's results.
type recorder struct {
	suite    string
	progress *env
	results  []Result
}

// target is a goal a figure is judged against.
type target struct {
	on    string // "ratio" or "value"
	op    string // ">=" or "<="
	bound float64
}

func atLeast(ratio float64) *target  { return &target{on: "ratio", op: ">=", bound: ratio} }
func valueAtMost(v float64) *target  { return &target{on: "value", op: "<=", bound: v} }
func valueAtLeast(v float64) *target { return &target{on: "value", op: ">=", bound: v} }
func (t *target) String() string     { return fmt.Sprintf("%s %s %s", t.on, t.op, fmtNum(t.bound)) }
func (t *target) judge(r Result) bool {
	v := r.Value
	if t.on == "ratio" {
		v = r.Ratio
	}
	if t.op == ">=" {
		return v >= t.bound
	}
	return v <= t.bound
}

// add records one figure without a reference.
func (r *recorder) add(cse string, m measurement, unit string, t *target, note string) {
	r.push(Result{Case: cse, Value: m.value, Unit: unit, Samples: m.samples, Note: note}, t)
}

// compare records cse against reference ref (both in unit); the ratio is
// cse / ref. A reference that was not measured (PgQ on a server without
// it) records no comparison: cse alone, without target, unless it already
// has a row.
func (r *recorder) compare(cse string, m measurement, ref string, rm measurement, unit string, t *target, note string) {
	if len(rm.samples) == 0 {
		if !slices.ContainsFunc(r.results, func(res Result) bool { return res.Case == cse }) {
			r.add(cse, m, unit, nil, strings.TrimPrefix(note+"; "+ref+" was not run on this server", "; "))
		}
		return
	}
	res := Result{Case: cse, Value: m.value, Unit: unit, Samples: m.samples,
		Reference: ref, RefValue: rm.value, Note: note}
	if rm.value != 0 {
		res.Ratio = m.value / rm.value
	}
	r.push(res, t)
}

func (r *recorder) push(res Result, t *target) {
	res.Suite = r.suite
	if t != nil {
		res.Target = t.String()
		met := t.judge(res) && !math.IsNaN(res.Value)
		res.Met = &met
	}
	r.results = append(r.results, res)
	line := fmt.Sprintf("   %-34s %12s %-10s", res.Case, fmtNum(res.Value), res.Unit)
	if res.Reference != "" {
		line += fmt.Sprintf(" %5.2fx %s", res.Ratio, res.Reference)
	}
	if res.Met != nil && !*res.Met {
		line += "  (target " + res.Target + " missed)"
	}
	r.progress.logf("%s", line)
}

// fmtNum formats a figure with about three significant digits.
func fmtNum(v float64) string {
	a := math.Abs(v)
	switch {
	case v == 0:
		return "0"
	case a >= 1000:
		return fmt.Sprintf("%.0f", v)
	case a >= 100:
		return fmt.Sprintf("%.1f", v)
	case a >= 1:
		return fmt.Sprintf("%.2f", v)
	default:
		return fmt.Sprintf("%.3f", v)
	}
}

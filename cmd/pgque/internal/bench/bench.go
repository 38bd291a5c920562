package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"time"
)

// OutDirDefault is where Run writes report.json and the SVG charts when
// Options.OutDir is empty.
const OutDirDefault = "docs/benchmarks"

// Options configures Run. The zero value runs every suite, in full, on a
// throwaway cluster, and writes into OutDirDefault.
type Options struct {
	// DSN names the database to benchmark against. The role must be allowed
	// to create databases: every suite works in its own fresh database
	// (bench_<suite>...) on that server. Empty starts a throwaway cluster
	// from the locally installed PostgreSQL binaries and stops it at the end.
	DSN string
	// Suites selects the suites to run, by name (see SuiteNames). Empty runs
	// them all, in SuiteNames order.
	Suites []string
	// Quick shrinks every suite so that the whole run takes under two
	// minutes (CI). Quick figures are noisier; the report says which mode
	// produced it.
	Quick bool
	// OutDir receives report.json and the SVG charts. Empty means
	// OutDirDefault; "-" writes nothing.
	OutDir string
	// Progress receives progress lines while the suites run and, at the end,
	// the result table. Nil discards both.
	Progress io.Writer

	// UpstreamSQL is the path of upstream PgQue's single-file installer
	// (its v0.3.0-alpha.1 devel/sql/pgque.sql, extracted by the user). When
	// set, the steady, drain and wal suites also install it into a database of
	// their own on the same cluster and measure it beside pgque with the
	// same workload, through its own API and its default tick schedule.
	UpstreamSQL string
	// Only, when set, keeps the steady suite's configurations whose names
	// match it (a regular expression, e.g. "r2k_s16_go"): one row rerun
	// without the rest of the suite.
	Only string
	// HandlerTime, when set, makes the steady suite's Go handlers take
	// that long per event (they wait, as a handler calling another
	// service would), so that its Go configurations measure the pool with
	// handlers that do real work; their names end in _h<ms>ms. The SQL
	// loops and the drains are unchanged.
	HandlerTime time.Duration
	// TickLag, when set, is the ticker_max_lag of every queue the steady
	// suite measures pgque on (the default is 10 ms): the trade of ticks,
	// and so CPU per event, against latency. Their names end in _t<ms>ms.
	// Upstream's queues keep its own schedule.
	TickLag time.Duration
	// tiny shrinks quick mode further, for the package's own tests.
	tiny bool
	// dbPrefix goes before the name of every database the suites make,
	// so that the package's tests can run suites side by side on one
	// server.
	dbPrefix string
}

// validate checks the options and returns the suites to run, in order.
func (o *Options) validate() ([]*suite, error) {
	if o.HandlerTime < 0 || o.HandlerTime > time.Second {
		return nil, fmt.Errorf("--handler-time must be between 0 and 1s, not %s", o.HandlerTime)
	}
	if o.TickLag != 0 && (o.TickLag < time.Millisecond || o.TickLag > 10*time.Second) {
		return nil, fmt.Errorf("--tick-lag must be 0 (the queue's default) or between 1ms and 10s, not %s", o.TickLag)
	}
	if len(o.Suites) == 0 {
		return allSuites(), nil
	}
	var out []*suite
	for _, name := range o.Suites {
		s := findSuite(strings.TrimSpace(name))
		if s == nil {
			return nil, fmt.Errorf("unknown benchmark suite %q (known: %s)",
				name, strings.Join(SuiteNames(), ", "))
		}
		if !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	return out, nil
}

// Report is the outcome of one Run: every figure, with its reference and the
// targets it was judged against, plus what failed.
type Report struct {
	// StartedAt and Elapsed time the whole run.
	StartedAt time.Time     `json:"started_at"`
	Elapsed   time.Duration `json:"elapsed_ns"`
	// Quick is true for a --quick run.
	Quick bool `json:"quick"`
	// Command is the command line that produced the report.
	Command string `json:"command"`
	// Suites are the suites that were asked for, in run order.
	Suites []string `json:"suites"`
	// Environment describes where the figures come from.
	Environment Environment `json:"environment"`
	// Results holds one row per (case, reference) pair, in run order.
	Results []Result `json:"results"`
	// Failures lists suites that stopped with an error (their partial
	// results stay in Results).
	Failures []Failure `json:"failures,omitempty"`
}

// Environment describes the machine and server a Report was measured on.
type Environment struct {
	Server     string `json:"server"`     // version() of the server
	Cluster    string `json:"cluster"`    // "throwaway (internal/pgcluster, <bin dir>)" or "external DSN"
	CPUs       int    `json:"cpus"`       // runtime.NumCPU of the bench process
	GoVersion  string `json:"go_version"` // runtime.Version
	OS         string `json:"os"`         // GOOS/GOARCH
	Settings   string `json:"settings"`   // fsync, synchronous_commit, shared_buffers
	PgBoss     string `json:"pgboss,omitempty"`
	NodeJS     string `json:"nodejs,omitempty"`
	PgQVersion string `json:"pgq_version,omitempty"`
	// Upstream names the upstream PgQue installer measured beside pgque
	// (--upstream-sql) and its sha256.
	Upstream string `json:"upstream,omitempty"`
}

// Result is one figure. A case compared with two references appears twice,
// once per reference.
type Result struct {
	Suite string `json:"suite"`
	Case  string `json:"case"`
	// Value is the measured figure in Unit; higher is better unless Unit
	// says otherwise (ms, rows/event, dead tuples, bytes).
	Value float64 `json:"value"`
	Unit  string  `json:"unit"`
	// Reference names the case this one is compared with ("" if none), and
	// RefValue is its figure, measured in the same rounds.
	Reference string  `json:"reference,omitempty"`
	RefValue  float64 `json:"ref_value,omitempty"`
	// Ratio is Value / RefValue (0 when there is no reference).
	Ratio float64 `json:"ratio,omitempty"`
	// Target, when set, is the goal this row is judged against, e.g.
	// "ratio >= 0.9" or "value <= 10"; Met says whether it was reached.
	Target string `json:"target,omitempty"`
	Met    *bool  `json:"met,omitempty"`
	// Note explains anything a reader needs to interpret the row.
	Note string `json:"note,omitempty"`
	// Samples are the per-round values the median was taken from.
	Samples []float64 `json:"samples,omitempty"`
}

// Failure records a suite that ended with an error.
type Failure struct {
	Suite string `json:"suite"`
	Error string `json:"error"`
}

// Run runs the selected suites and returns their report. It prints progress
// and, at the end, the result table to opts.Progress, and writes report.json
// and the charts to opts.OutDir. A suite that fails is recorded in
// Report.Failures and the run goes on with the next one; Run then returns
// the report together with an error naming every failed suite.
func Run(ctx context.Context, opts Options) (*Report, error) {
	suites, err := opts.validate()
	if err != nil {
		return nil, err
	}
	out := opts.Progress
	if out == nil {
		out = io.Discard
	}
	rep := &Report{StartedAt: time.Now(), Quick: opts.Quick || opts.tiny,
		Command: strings.Join(append([]string{filepath.Base(os.Args[0])}, os.Args[1:]...), " ")}
	for _, s := range suites {
		rep.Suites = append(rep.Suites, s.name)
	}
	var libs []string
	for _, s := range suites {
		libs = append(libs, s.preload...)
	}
	var upstream *upstreamFile
	if opts.UpstreamSQL != "" {
		if upstream, err = readUpstreamFile(opts.UpstreamSQL); err != nil {
			return nil, err
		}
	}
	e, err := newEnv(ctx, opts.DSN, opts.Quick, opts.tiny, libs, out)
	if err != nil {
		return nil, err
	}
	defer e.close(context.WithoutCancel(ctx))
	e.upstream = upstream
	e.dbPrefix = opts.dbPrefix
	e.handlerTime = opts.HandlerTime
	e.tickLag = opts.TickLag
	if opts.Only != "" {
		if e.only, err = regexp.Compile(opts.Only); err != nil {
			return nil, fmt.Errorf("--only: %w", err)
		}
	}
	rep.Environment = e.describe(ctx)
	if upstream != nil {
		rep.Environment.Upstream = upstream.describe()
		if !slices.ContainsFunc(rep.Suites, func(s string) bool { return s == "steady" || s == "drain" || s == "wal" }) {
			e.logf("--upstream-sql is used by the steady, drain and wal suites only, and none of them runs")
		}
	}

	var failed []error
	for _, s := range suites {
		e.logf("== %s: %s", s.name, s.about)
		start := time.Now()
		rec := &recorder{suite: s.name, progress: e}
		err := s.run(ctx, e, rec)
		rep.Results = append(rep.Results, rec.results...)
		if err != nil {
			e.logf("!! %s failed after %s: %v", s.name, since(start), err)
			rep.Failures = append(rep.Failures, Failure{Suite: s.name, Error: err.Error()})
			failed = append(failed, fmt.Errorf("suite %s: %w", s.name, err))
			if ctx.Err() != nil {
				break
			}
			continue
		}
		e.logf("== %s done in %s", s.name, since(start))
	}
	rep.Elapsed = time.Since(rep.StartedAt)
	for _, f := range e.extras {
		f(&rep.Environment)
	}

	fmt.Fprintln(out)
	rep.WriteTable(out)
	if opts.OutDir != "-" {
		dir := opts.OutDir
		if dir == "" {
			dir = OutDirDefault
		}
		if err := rep.WriteFiles(dir); err != nil {
			failed = append(failed, err)
		} else {
			fmt.Fprintf(out, "\nwrote %s/report.json and %d chart(s)\n", dir, len(rep.charts()))
		}
	}
	return rep, errors.Join(failed...)
}

// since formats the time elapsed since t for progress lines.
func since(t time.Time) string {
	return time.Since(t).Round(100 * time.Millisecond).String()
}

// hostEnvironment fills the fields of Environment that come from the bench
// process itself.
func hostEnvironment() Environment {
	return Environment{
		CPUs:      runtime.NumCPU(),
		GoVersion: runtime.Version(),
		OS:        runtime.GOOS + "/" + runtime.GOARCH,
	}
}

package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pgque/pgque/internal/pgcluster"
	"github.com/pgque/pgque/internal/testing/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestSuites runs every suite in its smallest mode against a real server
// (the package's test server, see pgtest) and checks that each produces a
// well-formed report: rows for its cases, finite figures, positive rates and
// ratios, and the JSON and charts on disk. Missing tools (PgQ, Node.js,
// npm) fail the suite that needs them with a message saying so; they are
// never skipped. The suites run side by side (as many as -parallel
// allows): each makes databases of its own, and most of a tiny run is
// waiting (on handlers, ticks, a held horizon): with -race on a 2-core
// machine the suites took 151 s one after the other, 81 s two at a time.
// What is checked is the report's form, which a neighbour's load does not
// change.
func TestSuites(t *testing.T) {
	dsn := pgtest.NewDB(t)
	for _, name := range SuiteNames() {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			out := t.TempDir()
			var progress bytes.Buffer
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			rep, err := Run(ctx, Options{DSN: dsn, Suites: []string{name}, OutDir: out, Progress: &progress, tiny: true,
				dbPrefix: "t_" + strings.ReplaceAll(name, "-", "_") + "_"})
			if err != nil {
				t.Fatalf("Run(%s): %v\nprogress:\n%s", name, err, progress.String())
			}
			checkReport(t, rep, name)
			checkFiles(t, out, rep)
			if !strings.Contains(progress.String(), "suite") || !strings.Contains(progress.String(), "== "+name) {
				t.Errorf("progress output lacks the suite banner or the table:\n%s", progress.String())
			}
		})
	}
}

func checkReport(t *testing.T, rep *Report, suite string) {
	t.Helper()
	if len(rep.Failures) > 0 {
		t.Fatalf("failures: %+v", rep.Failures)
	}
	if len(rep.Results) == 0 {
		t.Fatalf("suite %s recorded no results", suite)
	}
	if rep.Environment.Server == "" || rep.Environment.CPUs == 0 {
		t.Errorf("environment not described: %+v", rep.Environment)
	}
	for _, r := range rep.Results {
		if r.Suite != suite || r.Case == "" || r.Unit == "" {
			t.Errorf("malformed row %+v", r)
		}
		if math.IsNaN(r.Value) || math.IsInf(r.Value, 0) || r.Value < 0 {
			t.Errorf("%s/%s: value %v is not a finite non-negative number", r.Suite, r.Case, r.Value)
		}
		// Counts of dead tuples may be zero (that is the goal); rates,
		// latencies, sizes and read counts may not.
		if r.Value == 0 && r.Unit != "dead tuples" && r.Unit != "end/mid" {
			t.Errorf("%s/%s: value is 0 %s", r.Suite, r.Case, r.Unit)
		}
		if r.Reference != "" && (r.RefValue <= 0 || r.Ratio <= 0 || math.IsInf(r.Ratio, 0)) {
			t.Errorf("%s/%s vs %s: reference %v, ratio %v", r.Suite, r.Case, r.Reference, r.RefValue, r.Ratio)
		}
		if r.Target != "" && r.Met == nil {
			t.Errorf("%s/%s: target %q not judged", r.Suite, r.Case, r.Target)
		}
	}
}

func checkFiles(t *testing.T, dir string, rep *Report) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "report.json"))
	if err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatalf("report.json does not parse: %v", err)
	}
	if len(back.Results) != len(rep.Results) {
		t.Errorf("report.json has %d results, the report %d", len(back.Results), len(rep.Results))
	}
	charts := rep.charts()
	if len(charts) == 0 {
		t.Fatal("no charts")
	}
	for _, c := range charts {
		svg, err := os.ReadFile(filepath.Join(dir, c.file))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.HasPrefix(svg, []byte("<svg ")) || !bytes.HasSuffix(bytes.TrimSpace(svg), []byte("</svg>")) {
			t.Errorf("%s is not an SVG document", c.file)
		}
	}
}

func TestUnknownSuite(t *testing.T) {
	_, err := Run(context.Background(), Options{Suites: []string{"nope"}})
	if err == nil || !strings.Contains(err.Error(), "unknown benchmark suite") || !strings.Contains(err.Error(), "floor") {
		t.Fatalf("err = %v, want an unknown-suite error listing the suites", err)
	}
}

// TestHandlerTime checks --handler-time: out of range it is refused before
// anything runs, and in range it names the Go configurations that get it.
func TestHandlerTime(t *testing.T) {
	for _, d := range []time.Duration{-time.Millisecond, 2 * time.Second} {
		_, err := Run(context.Background(), Options{Suites: []string{"steady"}, HandlerTime: d})
		if err == nil || !strings.Contains(err.Error(), "--handler-time") {
			t.Errorf("HandlerTime %s: err = %v, want a --handler-time error", d, err)
		}
	}
	clients := map[string]string{}
	for _, cfg := range steadyConfigs(&env{handlerTime: 20 * time.Millisecond}) {
		clients[cfg.name()] = cfg.client
		if want := cfg.client == "go" || cfg.client == "gogather" || cfg.client == "ts" || cfg.client == "tsgather"; (cfg.handle == 20*time.Millisecond) != want ||
			strings.HasSuffix(cfg.name(), "_h20ms") != want {
			t.Errorf("%s (client %s): handler time %s", cfg.name(), cfg.client, cfg.handle)
		}
	}
	for _, n := range []string{"r500_s16_go_free_h20ms", "r500_s16_gogather_held_h20ms", "r500_s16_ts_free_h20ms", "r500_s16_tsgather_held_h20ms", "r500_s16_sql_free"} {
		if _, ok := clients[n]; !ok {
			t.Errorf("no configuration %s among %v", n, clients)
		}
	}
}

// TestTickLag checks --tick-lag: out of range it is refused before anything
// runs, and in range every configuration gets it and says so in its name.
func TestTickLag(t *testing.T) {
	for _, d := range []time.Duration{-time.Millisecond, time.Microsecond, 11 * time.Second} {
		_, err := Run(context.Background(), Options{Suites: []string{"steady"}, TickLag: d})
		if err == nil || !strings.Contains(err.Error(), "--tick-lag") {
			t.Errorf("TickLag %s: err = %v, want a --tick-lag error", d, err)
		}
	}
	names := map[string]bool{}
	for _, cfg := range steadyConfigs(&env{tickLag: 40 * time.Millisecond, handlerTime: 5 * time.Millisecond}) {
		names[cfg.name()] = true
		if cfg.tick != 40*time.Millisecond || !strings.HasSuffix(cfg.name(), "_t40ms") {
			t.Errorf("%s: tick lag %s", cfg.name(), cfg.tick)
		}
	}
	for _, n := range []string{"r500_s16_go_free_h5ms_t40ms", "r500_s16_none_free_t40ms", "r100_s1_sql_held_t40ms"} {
		if !names[n] {
			t.Errorf("no configuration %s", n)
		}
	}
	// And the queue ticks at that lag: 500 events/s with a 100 ms lag make
	// about 10 ticks a second, where the default 10 ms make about 90.
	rep, progress := runWithPgssOpts(t, Options{Suites: []string{"steady"}, Only: "r500_s4_go_free", TickLag: 100 * time.Millisecond})
	ticks := -1.0
	for _, r := range rep.Results {
		if r.Case == "r500_s4_go_free_t100ms_ticks" {
			ticks = r.Value
		}
	}
	if ticks < 1 || ticks > 20 {
		t.Errorf("r500_s4_go_free_t100ms made %v ticks/s, want 1 to 20 at a 100 ms lag\nprogress:\n%s", ticks, progress.String())
	}
}

func TestChartsAndTable(t *testing.T) {
	met, missed := true, false
	rep := &Report{Quick: true, Results: []Result{
		{Suite: "s", Case: "a", Value: 90, Unit: "events/s", Reference: "b", RefValue: 100, Ratio: 0.9, Target: "ratio >= 0.9", Met: &met},
		{Suite: "s", Case: "c", Value: 12, Unit: "ms", Target: "value <= 10", Met: &missed},
		{Suite: "s", Case: "d", Value: 3, Unit: "ms"},
	}, Failures: []Failure{{Suite: "t", Error: "boom"}}}
	charts := rep.charts()
	if len(charts) != 2 || charts[0].file != "s.svg" || charts[1].file != "s-ms.svg" || len(charts[1].bars) != 2 {
		t.Fatalf("charts = %+v", charts)
	}
	svg := charts[0].svg()
	for _, want := range []string{"a ÷ b", "0.90×", "#43a047"} {
		if !strings.Contains(svg, want) {
			t.Errorf("ratio chart lacks %q", want)
		}
	}
	if !strings.Contains(charts[1].svg(), "#e53935") {
		t.Error("missed target not drawn red")
	}
	var b bytes.Buffer
	rep.WriteTable(&b)
	for _, want := range []string{"0.90x", "MISSED", "targets missed (1)", "suite t FAILED: boom"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, b.String())
		}
	}
}

func TestPick(t *testing.T) {
	full, quick, tiny := &env{}, &env{quick: true}, &env{quick: true, tiny: true}
	if pick(full, 3, 5) != 5 || pick(quick, 3, 5) != 3 || pick(tiny, 3, 5) != 1 || pick(tiny, 100, 1000) != 25 {
		t.Error("pick of counts")
	}
	if pick(tiny, 1500*time.Millisecond, time.Second) != 500*time.Millisecond || pick(tiny, 150*time.Millisecond, 0) != 100*time.Millisecond {
		t.Error("pick of durations")
	}
}

func TestWithDatabase(t *testing.T) {
	if got := withDatabase("postgres://u@h:5/a?sslmode=disable", "b"); got != "postgres://u@h:5/b?sslmode=disable" {
		t.Errorf("url: %s", got)
	}
	if got := withDatabase("host=/tmp port=5 dbname=a", "b"); got != "host=/tmp port=5 dbname=a dbname='b'" {
		t.Errorf("keyword/value: %s", got)
	}
}

// runWithPgss runs suite in its smallest mode on the bench's own cluster,
// which preloads pg_stat_statements, checks that its report is well formed,
// and returns it with the progress output.
func runWithPgss(t *testing.T, suite string) (*Report, *bytes.Buffer) {
	t.Helper()
	return runWithPgssOpts(t, Options{Suites: []string{suite}})
}

// runWithPgssOpts is runWithPgss with options (the suite is opts.Suites[0]).
func runWithPgssOpts(t *testing.T, opts Options) (*Report, *bytes.Buffer) {
	t.Helper()
	suite := opts.Suites[0]
	binDir, err := pgcluster.FindBinDir()
	if err != nil {
		t.Fatal(err)
	}
	if preloadSettings(binDir, []string{pgssLibrary}) == nil {
		t.Skipf("the PostgreSQL build in %s ships no pg_stat_statements (contrib)", binDir)
	}
	var progress bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	opts.OutDir, opts.Progress, opts.tiny = "-", &progress, true
	rep, err := Run(ctx, opts)
	if err != nil {
		t.Fatalf("Run: %v\nprogress:\n%s", err, progress.String())
	}
	checkReport(t, rep, suite)
	return rep, &progress
}

// TestSteadyServerFigures runs the steady suite on the bench's own cluster,
// which preloads pg_stat_statements, and checks that every configuration
// gets its server-side figures: time, calls and buffers of the receive and
// ack statements, the CPU of the consumer's backends (a part of every
// server process's), WAL and latency; the configuration whose consumer
// never receives gets the producers' and the server's figures and none
// of a consumer's.
func TestSteadyServerFigures(t *testing.T) {
	rep, progress := runWithPgss(t, "steady")
	got := map[string]float64{}
	for _, r := range rep.Results {
		got[r.Case] = r.Value
	}
	configs := steadyConfigs(&env{quick: true, tiny: true})
	if len(configs) == 0 {
		t.Fatal("no configurations in tiny mode")
	}
	floors, ts := 0, 0
	for _, cfg := range configs {
		n := cfg.name()
		if cfg.client == "ts" {
			// Skipped only where Node.js or the package's build is
			// missing, and then said so.
			if strings.Contains(progress.String(), n+" skipped") {
				t.Logf("%s skipped:\n%s", n, progress.String())
				continue
			}
			ts++
		}
		figs := []string{"_recv_ack_time", "_recv_ack_calls", "_recv_ack_buffers", "_send_time",
			"_cpu_consumer", "_cpu_server", "_wal", "_latency_p50", "_latency_p99"}
		if cfg.client == "none" {
			floors++
			figs = []string{"_send_time", "_cpu_server", "_wal"}
			for _, fig := range []string{"_recv_ack_calls", "_cpu_consumer", "_latency_p50"} {
				if v, ok := got[n+fig]; ok {
					t.Errorf("%s%s = %v from a consumer that never receives", n, fig, v)
				}
			}
		}
		for _, fig := range figs {
			if _, ok := got[n+fig]; !ok {
				t.Errorf("no figure %s%s\nprogress:\n%s", n, fig, progress.String())
			}
		}
		if got[n+"_cpu_consumer"] > got[n+"_cpu_server"] {
			t.Errorf("%s: the consumer's backends used %v µs/event, more than every server process together (%v)",
				n, got[n+"_cpu_consumer"], got[n+"_cpu_server"])
		}
	}
	if floors == 0 {
		t.Error("no configuration with a consumer that never receives")
	}
	if ts == 0 && os.Getenv("CI") == "true" {
		t.Error("the TypeScript worker's configuration did not run in CI")
	}
}

// TestDrainSuite runs the drain suite alone, without upstream: both of
// pgque's drains, cold and warm, report their rate and server figures,
// and none of the steady configurations runs.
func TestDrainSuite(t *testing.T) {
	rep, progress := runWithPgss(t, "drain")
	got := map[string]bool{}
	for _, r := range rep.Results {
		got[r.Case] = true
		if !strings.HasPrefix(r.Case, "drain_s16_sql") {
			t.Errorf("the drain suite recorded %s, not a drain's figure", r.Case)
		}
	}
	for _, n := range []string{"drain_s16_sql", "drain_s16_sql_warm"} {
		for _, fig := range []string{"_rate", "_recv_ack_time", "_recv_ack_calls", "_cpu_server"} {
			if !got[n+fig] {
				t.Errorf("no figure %s%s\nprogress:\n%s", n, fig, progress.String())
			}
		}
	}
}

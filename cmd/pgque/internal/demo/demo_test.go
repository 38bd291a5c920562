package demo

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/pgque/pgque/internal/testing/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// small returns options for a short run in a fresh database.
func small(t *testing.T) Options {
	t.Helper()
	return Options{DSN: pgtest.NewDB(t), Tenants: 20, Events: 2000, Progress: &bytes.Buffer{}}
}

// runDemo runs the demo with a deadline.
func runDemo(t *testing.T, o Options) (*Result, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	return Run(ctx, o)
}

// checkPassed fails the test unless the run passed every check.
func checkPassed(t *testing.T, res *Result, err error) {
	t.Helper()
	if err != nil || res == nil || !res.Passed {
		var sum strings.Builder
		if res != nil {
			res.WriteSummary(&sum)
		}
		t.Fatalf("Run = %v\n%s", err, sum.String())
	}
}

// TestStrict: without failures, the run applies every event exactly once,
// in order per tenant, and reaches the producers' state.
func TestStrict(t *testing.T) {
	t.Parallel()
	o := small(t)
	res, err := runDemo(t, o)
	checkPassed(t, res, err)
	if !res.Strict || res.Sent != 2000 || res.Applied != 2000 || res.Reorders != 0 || res.InjectedFailures != 0 ||
		res.Latency.Count != 2000 || res.Latency.P50 <= 0 || res.Latency.Max < res.Latency.P99 || res.Throughput <= 0 {
		t.Errorf("result = %+v", res)
	}
	var handled int64
	for _, n := range res.PerWorker {
		handled += n
	}
	if handled != 2000 || len(res.PerWorker) != WorkersDefault {
		t.Errorf("per worker = %v, want %d workers handling 2000 events in all", res.PerWorker, WorkersDefault)
	}
	if len(res.Checks) != 5 {
		t.Errorf("checks = %+v, want 5", res.Checks)
	}
	// A passing run in a given database cleans up after itself.
	var n int
	conn := pgtest.Conn(t, o.DSN)
	if err := conn.QueryRow(context.Background(), `select count(*) from pg_namespace where nspname = 'pgque_demo'`).Scan(&n); err != nil || n != 0 {
		t.Errorf("schema pgque_demo left behind after a passing run (%v)", err)
	}
}

// TestWithFailures: 5% of first deliveries fail; the library retries them
// under the pause policy, and the run verifies strictly: every tenant's
// events applied in order, exactly once.
func TestWithFailures(t *testing.T) {
	t.Parallel()
	o := small(t)
	o.FailureRate = 0.05
	res, err := runDemo(t, o)
	checkPassed(t, res, err)
	if res.InjectedFailures < 50 || res.Applied != 2000 {
		t.Errorf("result = %+v, want about 100 injected failures and all 2000 events applied", res)
	}
	if !res.Strict || res.Policy != "pause" || res.Reorders != 0 {
		t.Errorf("with failures the run must be strict under pause, without reorders: %+v", res)
	}
	t.Logf("%d injected failures, %d reorders", res.InjectedFailures, res.Reorders)
}

// TestSkippedEventFails: a handler that acknowledges an event without
// applying it makes the run fail, strict or lenient, and the result says
// which check caught it.
func TestSkippedEventFails(t *testing.T) {
	t.Parallel()
	for _, rate := range []float64{0, 0.05} {
		o := small(t)
		o.FailureRate = rate
		SkipEventForTest(&o, "t0003", 2)
		res, err := runDemo(t, o)
		if !errors.Is(err, ErrVerificationFailed) || res == nil || res.Passed {
			t.Fatalf("failure rate %g: Run = %v, %+v; want ErrVerificationFailed", rate, err, res)
		}
		failed := map[string]bool{}
		for _, c := range res.Checks {
			if !c.OK {
				failed[c.Name] = true
			}
		}
		if !failed["exactly once"] {
			t.Errorf("failure rate %g: checks %+v, want \"exactly once\" to fail", rate, res.Checks)
		}
		if rate == 0 && !failed["run"] {
			t.Errorf("strict run: checks %+v, want the run to stop on the order violation", res.Checks)
		}
		var sum strings.Builder
		res.WriteSummary(&sum)
		if !strings.Contains(sum.String(), "FAILED") || !strings.Contains(sum.String(), "t0003") {
			t.Errorf("summary does not name the missing event:\n%s", sum.String())
		}
		// A failed run leaves its tables for inspection.
		var n int
		conn := pgtest.Conn(t, o.DSN)
		if err := conn.QueryRow(context.Background(), `select count(*) from pgque_demo.tenant`).Scan(&n); err != nil || n != o.Tenants {
			t.Errorf("after a failed run: %d tenants in pgque_demo.tenant (%v), want the tables left for inspection", n, err)
		}
	}
}

// TestLifecycle: every tenant's generated sequence is a valid file
// lifecycle numbered 1..n (expected replays and checks it), and its replay
// gives the generator's own state.
func TestLifecycle(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(1, 2))
	g := newTenantGen("t")
	for range 5000 {
		g.nextEvent(rng)
	}
	g.sent = len(g.events)
	state, err := g.expected()
	if err != nil {
		t.Fatal(err)
	}
	if len(state) != len(g.files) {
		t.Fatalf("%d files replayed, generator has %d", len(state), len(g.files))
	}
	for f, st := range state {
		if g.files[f] != st {
			t.Errorf("%s: replayed %+v, generator %+v", f, st, g.files[f])
		}
	}
	// A broken lifecycle is caught.
	g.events[10].typ = TypeCreated
	if _, err := g.expected(); err == nil {
		t.Error("expected() accepted a lifecycle with a changed event type")
	}
}

func TestPercentiles(t *testing.T) {
	t.Parallel()
	var d []time.Duration
	for i := 100; i >= 1; i-- {
		d = append(d, time.Duration(i)*time.Millisecond)
	}
	got := percentiles(d)
	want := Latency{Count: 100, P50: 50 * time.Millisecond, P95: 95 * time.Millisecond, P99: 99 * time.Millisecond, Max: 100 * time.Millisecond}
	if got != want {
		t.Errorf("percentiles = %+v, want %+v", got, want)
	}
	if got := percentiles(nil); got != (Latency{}) {
		t.Errorf("percentiles(nil) = %+v", got)
	}
}

func TestValidate(t *testing.T) {
	t.Parallel()
	for _, o := range []Options{{Slots: 2000}, {FailureRate: 1}, {FailureRate: -0.1}, {Events: -1}, {Rate: -1}, {Duration: -time.Second}} {
		if err := o.Validate(); err == nil {
			t.Errorf("Validate(%+v) = nil", o)
		}
	}
}

// TestTriggerSource: with --source trigger the producers only write rows of
// an attached table; the events its trigger emits are applied exactly once,
// in order per tenant, reaching the producers' state, and a passing run
// leaves no attachment behind.
func TestTriggerSource(t *testing.T) {
	t.Parallel()
	o := small(t)
	o.Source = SourceTrigger
	res, err := runDemo(t, o)
	checkPassed(t, res, err)
	if !res.Strict || res.Source != SourceTrigger || res.Sent != 2000 || res.Applied != 2000 || res.Latency.Count != 2000 {
		t.Errorf("result = %+v", res)
	}
	conn := pgtest.Conn(t, o.DSN)
	var n int
	if err := conn.QueryRow(context.Background(), `select count(*) from pgque.table_source`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("%d attachments left after a passing run", n)
	}
}

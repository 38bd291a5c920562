package crontest

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgque/pgque/internal/pgcluster"
	"github.com/pgque/pgque/internal/testing/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// setup starts a cluster with pg_cron preloaded for the "postgres" database
// and installs pgque and pg_cron there.
func setup(t *testing.T) string {
	t.Helper()
	// The shared server runs the same build as the cluster below, which
	// cannot start with a library it lacks preloaded.
	pgtest.SkipWithoutExtension(t, "pg_cron")
	c := pgtest.NewCluster(t, pgcluster.Options{Settings: map[string]string{
		"shared_preload_libraries": "pg_cron",
		"cron.database_name":       "postgres",
	}})
	dsn := c.DSN("postgres")
	pgtest.Install(t, dsn)
	conn := pgtest.Conn(t, dsn)
	if _, err := conn.Exec(context.Background(), "create extension pg_cron"); err != nil {
		t.Fatal(err)
	}
	return dsn
}

func TestStartSchedulesTheTickerAndStopRemovesIt(t *testing.T) {
	dsn := setup(t)
	ctx := context.Background()
	conn := pgtest.Conn(t, dsn)

	var job1, job2 int64
	if err := conn.QueryRow(ctx, "select pgque.start()").Scan(&job1); err != nil {
		t.Fatal(err)
	}
	if err := conn.QueryRow(ctx, "select pgque.start()").Scan(&job2); err != nil {
		t.Fatal(err)
	}
	var n int
	var schedule, command string
	if err := conn.QueryRow(ctx,
		"select count(*), min(schedule), min(command) from cron.job where jobname = 'pgque_ticker'").
		Scan(&n, &schedule, &command); err != nil {
		t.Fatal(err)
	}
	if n != 1 || schedule != "* * * * *" || command != "call pgque.run_ticker(55)" {
		t.Fatalf("cron.job after two starts: %d jobs, schedule %q, command %q", n, schedule, command)
	}

	var stopped bool
	if err := conn.QueryRow(ctx, "select pgque.stop()").Scan(&stopped); err != nil || !stopped {
		t.Fatalf("stop: %v, %v", stopped, err)
	}
	if err := conn.QueryRow(ctx, "select pgque.stop()").Scan(&stopped); err != nil || stopped {
		t.Fatalf("second stop: %v, %v; want false", stopped, err)
	}
	if err := conn.QueryRow(ctx, "select count(*) from cron.job").Scan(&n); err != nil || n != 0 {
		t.Fatalf("cron.job after stop: %d rows, %v", n, err)
	}
}

func TestRunTickerTicksAndMovesRetries(t *testing.T) {
	dsn := setup(t)
	ctx := context.Background()
	conn := pgtest.Conn(t, dsn)
	for _, q := range []string{
		"select pgque.create_queue('q')",
		"select pgque.subscribe('q', 'c')",
		"select pgque.send('q', '{\"n\": 1}')",
		"select pgque.subscribe_slot('q', 'slots', k, 4) from generate_series(0, 3) k",
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatal(q, err)
		}
	}
	var before, after string
	if err := conn.QueryRow(ctx, "show synchronous_commit").Scan(&before); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := conn.Exec(ctx, "call pgque.run_ticker(1, 'test')"); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < time.Second || d > 10*time.Second {
		t.Fatalf("run_ticker(1) ran for %v", d)
	}
	// Each round commits without a flush, for its own transaction only:
	// the session (pg_cron's, or a caller's) keeps its setting.
	if err := conn.QueryRow(ctx, "show synchronous_commit").Scan(&after); err != nil || after != before {
		t.Fatalf("synchronous_commit is %q after run_ticker (%v), %q before", after, err, before)
	}
	// The slot group's routing indexes, which the subscribe leaves to
	// maint_route_indexes, run by the loop in the round after maint().
	var ix int
	if err := conn.QueryRow(ctx, `select count(*) from pg_catalog.pg_class where relname ~ '^event_[0-9]+_[0-9]+_route4$'`).Scan(&ix); err != nil || ix != 3 {
		t.Fatalf("%d routing indexes after run_ticker (%v), want 3", ix, err)
	}
	var got int64
	if err := conn.QueryRow(ctx, "select msg_id from pgque.receive('q', 'c')").Scan(&got); err != nil {
		t.Fatalf("the ticker loop made no tick covering the event: %v", err)
	}
	var batch int64
	if err := conn.QueryRow(ctx, "select batch_id from pgque.receive('q', 'c')").Scan(&batch); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "select pgque.nack($1, $2, '0 s', 'again')", batch, got); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "select pgque.ack($1)", batch); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "call pgque.run_ticker(2, 'test')"); err != nil {
		t.Fatal(err)
	}
	var retry int
	if err := conn.QueryRow(ctx, "select msg_id, retry_count from pgque.receive('q', 'c')").Scan(&got, &retry); err != nil {
		t.Fatalf("the retried event did not come back through the ticker loop: %v", err)
	}
	if retry != 1 {
		t.Fatalf("retry_count = %d, want 1", retry)
	}
	// The loop gives the lease up when it ends, so a daemon can take over.
	var owner *string
	if err := conn.QueryRow(ctx, "select owner from pgque.ticker_lease").Scan(&owner); err != nil {
		t.Fatal(err)
	}
	if owner != nil {
		t.Fatalf("ticker lease still held by %q after run_ticker returned", *owner)
	}
}

func TestStartWithoutPgCronSaysHow(t *testing.T) {
	dsn := pgtest.NewInstalledDB(t)
	conn := pgtest.Conn(t, dsn)
	_, err := conn.Exec(context.Background(), "select pgque.start()")
	if err == nil {
		t.Fatal("start() without pg_cron succeeded")
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "PQ011" || !strings.Contains(pgErr.Message, "pg_cron is not installed") {
		t.Fatalf("start() without pg_cron: %v; want PQ011 saying pg_cron is not installed", err)
	}
}

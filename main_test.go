package pgque_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgque/pgque"
	"github.com/pgque/pgque/internal/testing/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// testEnv is what most tests need: a fresh installed database, a pool, a
// client and a queue.
type testEnv struct {
	dsn    string
	pool   *pgxpool.Pool
	client *pgque.Client
	queue  string
}

// queueSeq makes queue names unique within the binary.
var queueSeq atomic.Int64

// setup gives the test its own database with pgque installed, a client and
// an empty queue.
func setup(t *testing.T) *testEnv {
	t.Helper()
	dsn := pgtest.NewInstalledDB(t)
	pool := pgtest.Pool(t, dsn)
	client := newClient(t, pool)
	queue := fmt.Sprintf("q%d", queueSeq.Add(1))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := client.CreateQueue(ctx, queue); err != nil {
		t.Fatal(err)
	}
	return &testEnv{dsn: dsn, pool: pool, client: client, queue: queue}
}

// newClient returns a client over pool that logs through t.
func newClient(t *testing.T, pool *pgxpool.Pool) *pgque.Client {
	t.Helper()
	client, err := pgque.NewClient(pool, &pgque.Config{Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	return client
}

// testLogger writes warnings and errors to the test log.
func testLogger(t *testing.T) *slog.Logger {
	level := slog.LevelWarn
	if os.Getenv("PGQUE_TEST_DEBUG") != "" {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: level}))
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	defer func() { _ = recover() }() // logging after the test ended
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// startTicker runs a fast ticker for the test.
func startTicker(t *testing.T, client *pgque.Client) *pgque.Ticker {
	t.Helper()
	return startTickerWith(t, client, &pgque.TickerConfig{LeaseTTL: 2 * time.Second})
}

// startTickerWith runs a ticker with cfg for the test, stopped when it ends.
func startTickerWith(t *testing.T, client *pgque.Client, cfg *pgque.TickerConfig) *pgque.Ticker {
	t.Helper()
	tk, err := client.NewTicker(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := tk.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := tk.Stop(ctx); err != nil {
			t.Error("stopping ticker:", err)
		}
	})
	return tk
}

// waitOrDescribe is pgtest.WaitFor that, when the wait times out, logs
// where queue stands before failing: its consumers' positions, its last
// ticks, the ticker lease, the database's sessions that are not idle and
// what each of notes returns. A wait that failed once on a loaded machine
// then says which part stalled.
func waitOrDescribe(t *testing.T, env *testEnv, queue string, timeout time.Duration, what string, cond func() bool, notes ...func() string) {
	t.Helper()
	if pgtest.Eventually(context.Background(), timeout, cond) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, q := range []struct{ name, sql string }{
		{"consumers", `select consumer_name, 'lag ' || lag, 'seen ' || last_seen || ' ago', last_tick, current_batch, next_tick,
			pending_events, retry_pending from pgque.get_consumer_info($1)`},
		{"last ticks", `select t.tick_id, (clock_timestamp() - t.tick_time)::text || ' ago', t.tick_event_seq
			from pgque.tick t join pgque.queue q on q.queue_id = t.tick_queue
			where q.queue_name = $1 order by t.tick_id desc limit 3`},
		{"ticker lease", `select owner, 'until ' || (lease_until - clock_timestamp()) || ' from now' from pgque.ticker_lease
			where $1::text is not null`},
		{"sessions", `select pid, state, wait_event_type, wait_event, (clock_timestamp() - query_start)::text, left(query, 120)
			from pg_stat_activity where datname = current_database() and state <> 'idle' and pid <> pg_backend_pid()
			and $1::text is not null`},
	} {
		rows, err := env.pool.Query(ctx, q.sql, queue)
		if err != nil {
			t.Logf("%s: %v", q.name, err)
			continue
		}
		for rows.Next() {
			v, err := rows.Values()
			t.Logf("%s: %v %v", q.name, v, err)
		}
		if err := rows.Err(); err != nil {
			t.Logf("%s: %v", q.name, err)
		}
	}
	for _, note := range notes {
		t.Log(note())
	}
	t.Fatalf("timed out after %v waiting for %s", timeout, what)
}

// lockWaiters counts the sessions of env's database that wait on a lock
// in a call of pgque.fn. It asks pg_locks for a lock not yet granted, not
// pg_stat_activity for the wait event: a backend waiting on a lock clears
// its wait event each time its latch wakes it (its deadlock check, a
// deadlock_timeout into the wait; a barrier that another test's DROP
// DATABASE sends every backend) and sets it again, so a check that must
// see the wait go on could catch it ended for an instant. The ungranted
// lock stays until the wait ends.
func lockWaiters(t *testing.T, env *testEnv, fn string) int {
	t.Helper()
	var n int
	err := env.pool.QueryRow(context.Background(), `select count(distinct a.pid)
		from pg_stat_activity a join pg_locks l on l.pid = a.pid
		where a.datname = current_database() and not l.granted and a.query like '%pgque.' || $1 || '(%'`, fn).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// logSessions logs the sessions of env's database that are not idle, with
// the locks each waits for: what a failed check of a waiting call shows.
func logSessions(t *testing.T, env *testEnv) {
	t.Helper()
	rows, err := env.pool.Query(context.Background(), `select a.pid, a.state, a.wait_event_type, a.wait_event,
			(select string_agg(l.locktype || ' ' || l.mode, ', ') from pg_locks l where l.pid = a.pid and not l.granted),
			(clock_timestamp() - a.query_start)::text, left(a.query, 120)
		from pg_stat_activity a
		where a.datname = current_database() and a.state <> 'idle' and a.pid <> pg_backend_pid()`)
	if err != nil {
		t.Log("sessions:", err)
		return
	}
	defer rows.Close()
	for rows.Next() {
		v, err := rows.Values()
		t.Logf("session: %v %v", v, err)
	}
}

// stopLetsFinish stops a service (stop; stopping is closed once Stop told
// it to stop) while one of its calls waits on a row that holder keeps
// locked, and checks that the call is let finish rather than cancelled:
// waiting (whether the call still waits) must hold for a second
// after the stop began, since a cancelled call stops waiting within
// milliseconds, and Stop must return once holder commits.
func stopLetsFinish(t *testing.T, env *testEnv, holder pgx.Tx, stop func(context.Context) error, stopping func() <-chan struct{}, what string, waiting func() bool) {
	t.Helper()
	ctx := context.Background()
	stopped := make(chan error, 1)
	go func() { stopped <- stop(ctx) }()
	<-stopping()
	if pgtest.Eventually(ctx, time.Second, func() bool { return !waiting() }) {
		logSessions(t, env)
		t.Fatalf("after Stop, %s no longer waits: it was cancelled, not let finish", what)
	}
	if err := holder.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-stopped:
		if err != nil {
			t.Fatal("stopping:", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("Stop did not return 10 s after %s could go on", what)
	}
}

package enginetest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/pgque/pgque/internal/testing/pgtest"
)

// TestTickerProbesABoundedShareOfManyQueues: a session's first ticker()
// calls over many quiet queues probe at most _ticker_probes() of them a
// call, planned for the queue at hand, so a call's locks on the event
// tables stay bounded whatever the number of queues (one call that probed
// all 1 400 queues of a database, or built the probe's generic plan,
// failed with "out of shared memory", and so did every call after it).
// The calls go on where the last one stopped until every queue is
// probed; a queue with events is ticked in the first call, past the
// budget or not.
func TestTickerProbesABoundedShareOfManyQueues(t *testing.T) {
	t.Parallel()
	dsn, pool := setupDB(t)
	ctx := context.Background()
	const queues = 130
	exec(t, pool, fmt.Sprintf("select pgque.create_queue('m' || i) from generate_series(1, %d) i", queues))
	probes := scalar[int32](t, pool, "select pgque._ticker_probes()")
	if probes*2 >= queues {
		t.Fatalf("_ticker_probes() is %d: the test needs more than two calls' worth of queues", probes)
	}
	// Every queue's first tick is older than ticker_max_lag, with nothing
	// sent since: due only if a straggler probe finds one.
	exec(t, pool, "select pg_sleep(0.05)")
	// The last queue has an event: due without a probe.
	last := fmt.Sprintf("m%d", queues)
	exec(t, pool, `select pgque.send($1, '{"x": 1}'::jsonb)`, last)

	conn := pgtest.Conn(t, dsn)
	// eventLocks runs one ticker() call in a transaction and returns the
	// locks it left on event tables and their indexes, and what it ticked.
	eventLocks := func() (locks, ticked int64) {
		t.Helper()
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		ticked = scalar[int64](t, tx, "select pgque.ticker()")
		locks = scalar[int64](t, tx, `select count(*) from pg_catalog.pg_locks l join pg_catalog.pg_class c on c.oid = l.relation
			where l.pid = pg_catalog.pg_backend_pid() and c.relname like 'event\_%' and c.relkind in ('r', 'i')`)
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		return locks, ticked
	}
	settled := func() int {
		return int(scalar[int64](t, conn, `select count(*) from string_to_table(coalesce(current_setting('pgque.settled_ticks', true), ''), ',') e
			where e <> ''`))
	}

	locks, ticked := eventLocks()
	if ticked != 1 {
		t.Errorf("the first call ticked %d queues, want 1 (the one with an event)", ticked)
	}
	// A probe locks a queue's three tables and their indexes (the event
	// index and the dedup key index): nine relations.
	if max := int64(probes) * 9; locks > max {
		t.Errorf("the first call holds %d locks on event tables and indexes, want at most %d (%d probes)", locks, max, probes)
	}
	if got := settled(); got != int(probes) {
		t.Errorf("after the first call %d ticks are settled, want %d", got, probes)
	}
	for range (queues - 1) / int(probes) {
		if locks, _ := eventLocks(); locks > int64(probes)*9 {
			t.Errorf("a later call holds %d locks on event tables and indexes, want at most %d", locks, int64(probes)*9)
		}
	}
	// All but the ticked queue are settled now (its new tick is probed
	// and settled too, in one of those calls or the next).
	if got := settled(); got < queues-1 {
		t.Errorf("after %d calls %d ticks are settled, want at least %d", 1+(queues-1)/int(probes), got, queues-1)
	}
	if n := scalar[int64](t, pool, "select count(*) from pgque.tick t join pgque.queue q on q.queue_id = t.tick_queue where q.queue_name = $1", last); n != 2 {
		t.Errorf("queue %s has %d ticks, want 2", last, n)
	}
}

// TestTickerPollsSettledQueuesWithoutReadingTheirTicks: once a session
// has settled the last ticks of idle queues, its ticker() calls read none
// of their ticks (their sequences have not moved since a settled tick, and
// their idle period has not come), which was most of what an idle queue
// cost a poll; a queue that gets an event is still ticked at the next
// call. The session's notes are ordinary settings: notes in another form
// (an older version's, or anything a session set) are dropped and cause no
// error, and a note that claims a settled tick in the future is not
// trusted.
func TestTickerPollsSettledQueuesWithoutReadingTheirTicks(t *testing.T) {
	t.Parallel()
	dsn, pool := setupDB(t)
	const queues = 60
	exec(t, pool, fmt.Sprintf("select pgque.create_queue('s' || i) from generate_series(1, %d) i", queues))
	// Every first tick older than ticker_max_lag: polls probe, then settle.
	exec(t, pool, "select pg_sleep(0.05)")
	conn := pgtest.Conn(t, dsn)
	ticks := []string{"pgque.tick_0", "pgque.tick_1"}
	settled := func() int64 {
		return scalar[int64](t, conn, `select count(*) from string_to_table(coalesce(current_setting('pgque.settled_ticks', true), ''), ',') e
			where e <> ''`)
	}
	// Other tests' transactions hold ticks unsettled while they run.
	pgtest.WaitFor(t, 30*time.Second, "ticker() to settle every queue", func() bool {
		pollTicker(t, conn, ticks, "select pgque.ticker()")
		return settled() == queues
	})
	for i := range 3 {
		if tk, scans := pollTicker(t, conn, ticks, "select pgque.ticker()"); tk != nil || scans != 0 {
			t.Fatalf("poll %d over %d settled idle queues: tick %v, %d scans of the tick table; want none", i, queues, tk, scans)
		}
	}
	exec(t, pool, `select pgque.send('s7', '{"x": 1}'::jsonb)`)
	if n := scalar[int64](t, conn, "select pgque.ticker()"); n != 1 {
		t.Fatalf("ticker() after an event on a settled queue ticked %d queues, want 1", n)
	}
	if n := scalar[int64](t, pool, "select count(*) from pgque.tick t join pgque.queue q on q.queue_id = t.tick_queue where q.queue_name = 's7'"); n != 2 {
		t.Fatalf("queue s7 has %d ticks, want 2", n)
	}

	// A settled tick claimed in the future: its queue's tick is read.
	s9 := scalar[int32](t, pool, "select queue_id from pgque.queue where queue_name = 's9'")
	tick9 := scalar[int64](t, pool, "select max(tick_id) from pgque.tick where tick_queue = $1", s9)
	exec(t, conn, `select set_config('pgque.settled_ticks', $1, false)`,
		fmt.Sprintf(",%d:%d:0:%d,", s9, tick9, time.Now().Add(time.Hour).UnixMicro()))
	if _, scans := pollTicker(t, conn, ticks, "select pgque.ticker()"); scans == 0 {
		t.Error("a settled tick noted an hour ahead kept its queue's tick unread")
	}

	// Foreign notes: no error, dropped, and the queues settle again.
	for _, v := range []string{"x", ",1:2,", ",1:2:3:4:5,", ",-1:2:3:4,", ",99999999999999999999:1:1:1,"} {
		exec(t, conn, "select set_config('pgque.settled_ticks', $1, false), set_config('pgque.probed_ticks', $1, false)", v)
		if _, err := conn.Exec(context.Background(), "select pgque.ticker()"); err != nil {
			t.Fatalf("ticker() with notes %q: %v", v, err)
		}
		for _, name := range []string{"pgque.settled_ticks", "pgque.probed_ticks"} {
			if got := scalar[string](t, conn, "select current_setting($1)", name); got == v {
				t.Errorf("ticker() kept %s = %q", name, v)
			}
		}
	}
	pgtest.WaitFor(t, 30*time.Second, "ticker() to settle every queue again", func() bool {
		pollTicker(t, conn, ticks, "select pgque.ticker()")
		return settled() == queues
	})
	exec(t, pool, `select pgque.send('s8', '{"x": 1}'::jsonb)`)
	if n := scalar[int64](t, conn, "select pgque.ticker()"); n != 1 {
		t.Fatalf("ticker() after an event on a queue settled again ticked %d queues, want 1", n)
	}
}

// TestTickerIgnoresAForeignResumePoint: pgque.ticker_resume is an
// ordinary session setting, so anything may be in it. A value that is not
// a queue id is ignored (the call starts from the first queue), never a
// cast error that would fail every ticker() call of that session.
func TestTickerIgnoresAForeignResumePoint(t *testing.T) {
	t.Parallel()
	dsn, pool := setupDB(t)
	exec(t, pool, "select pgque.create_queue('r1')")
	// Due by count at once, however soon after its first tick.
	exec(t, pool, "select pgque.set_queue_config('r1', 'ticker_max_count', '1')")
	exec(t, pool, `select pgque.send('r1', '{"x": 1}'::jsonb)`)
	conn := pgtest.Conn(t, dsn)
	for _, v := range []string{"not a number", "-3", "99999999999999999999", " 7", "1e3"} {
		exec(t, conn, "select set_config('pgque.ticker_resume', $1, false)", v)
		if _, err := conn.Exec(context.Background(), "select pgque.ticker()"); err != nil {
			t.Errorf("ticker() with pgque.ticker_resume = %q: %v", v, err)
		}
	}
	if n := scalar[int64](t, pool, "select count(*) from pgque.tick t join pgque.queue q on q.queue_id = t.tick_queue where q.queue_name = 'r1'"); n != 2 {
		t.Errorf("queue r1 has %d ticks, want 2 (its first and the one for its event)", n)
	}
}

package enginetest

import (
	"context"
	"fmt"
	"strings"
	"testing"

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
		return strings.Count(scalar[string](t, conn, "select coalesce(current_setting('pgque.settled_ticks', true), '')"), ":")
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

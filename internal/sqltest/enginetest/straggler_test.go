package enginetest

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgque/pgque/internal/testing/pgtest"
)

// TestTickerSeesEventsCommittedAfterTheirTick: a producer takes its ev_id,
// a tick is made while it is still open, then it commits. The event
// sequence did not move since that tick, yet the next ticker() call must tick
// (within ticker_max_lag), not wait for ticker_idle_period.
func TestTickerSeesEventsCommittedAfterTheirTick(t *testing.T) {
	ctx := context.Background()
	_, pool := setupEngine(t)
	for _, q := range []string{
		"select pgque.set_queue_config('q', 'ticker_idle_period', '1 hour')",
		"select pgque.set_queue_config('q', 'ticker_max_lag', '0')",
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatal(q, err)
		}
	}

	producer, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer producer.Rollback(ctx)
	var id int64
	if err := producer.QueryRow(ctx, "select pgque.send('q', '{\"late\": true}')").Scan(&id); err != nil {
		t.Fatal(err)
	}

	// A tick while the producer is open: it covers the ev_id, not the event.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var tick *int64
	if err := tx.QueryRow(ctx, "select pgque.force_next_tick('q'), pgque.ticker('q')").Scan(new(int64), &tick); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil || tick == nil {
		t.Fatalf("forced tick: %v, %v", tick, err)
	}
	// force_next_tick gave that transaction an id before it read the
	// sequence, so the tick has no tick_xid, and the next poll makes one
	// that has (TestTickerSettlesTicksWithoutTickXid); then nothing more
	// while nothing commits.
	if err := pool.QueryRow(ctx, "select pgque.ticker('q')").Scan(&tick); err != nil || tick == nil {
		t.Fatalf("no tick after a tick without tick_xid (%v, %v)", tick, err)
	}
	if err := pool.QueryRow(ctx, "select pgque.ticker('q')").Scan(&tick); err != nil || tick != nil {
		t.Fatalf("ticker with nothing committed since the last tick ticked (%v, %v)", tick, err)
	}

	if err := producer.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(ctx, "select pgque.ticker('q')").Scan(&tick); err != nil {
		t.Fatal(err)
	}
	if tick == nil {
		t.Fatal("ticker did not tick for an event committed after the last tick; it would wait for ticker_idle_period")
	}
	var got int64
	if err := pool.QueryRow(ctx, "select msg_id from pgque.receive('q', 'c') where msg_id = $1", id).Scan(&got); err != nil {
		t.Fatalf("the late event is not in the batch the new tick closed: %v", err)
	}
	if err := pool.QueryRow(ctx, "select pgque.ticker('q')").Scan(&tick); err != nil || tick != nil {
		t.Fatalf("ticker kept ticking an idle queue (%v, %v)", tick, err)
	}
}

// TestTickerSettlesIdleTicks: polling an idle queue stops probing the event
// index once no transaction that could still commit a straggler is running,
// and never before. A producer (each form: send, keyed send, send_batch,
// insert_event) is held after it took its ev_id (a
// SHARE lock on pgque.event alone blocks its INSERT before the row's values
// are computed, and not the probe, which reads the partitions); a tick
// covers that ev_id; the first poll while the producer is open must probe
// and note the producer's transaction among those it waits on, and the poll
// after it commits must tick. Then, with nothing open, polls stop
// probing within a bounded number, both ticker(queue) and ticker(), until
// the next send; a new session probes again.
func TestTickerSettlesIdleTicks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn, pool, tables, ticker := setupIdleQueue(t)
	poll := func(c *pgx.Conn, call string) (*int64, int64) {
		t.Helper()
		return pollTicker(t, c, tables, call)
	}
	if tk, _ := poll(ticker, "select pgque.ticker('q')"); tk == nil {
		t.Fatal("no tick for the first send")
	}
	// drain receives and acknowledges every batch ticked so far and
	// returns how many events they held.
	drain := func(t *testing.T, pool beginner) int {
		n := 0
		for {
			ms := mustReceive(t, pool, "q", "c", 100)
			if len(ms) == 0 {
				return n
			}
			n += len(ms)
			ack(t, pool, ms[0].BatchID)
		}
	}

	// Each way events are written, stopped between its ev_id and its
	// INSERT.
	for _, produce := range []string{
		`select pgque.send('q', 't', '{"late": 1}'::jsonb, 'k')`,
		`select pgque.send('q', 't', '{"late": 2}'::text, 'k')`,
		`select pgque.send('q', 't', '{"late": 3}'::text, 'k', 'dedup-3')`,
		`select pgque.send('q', '{"late": 4}')`,
		`select pgque.send_batch('q', 't', array['{"late": 5}', '{"late": 6}']::text[])`,
		`select pgque.insert_event('q', 't', 'late 7')`,
	} {
		drain(t, pool)
		locker, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		exec(t, locker, "lock table only pgque.event in share mode")
		producer := pgtest.Conn(t, dsn)
		pid := scalar[int32](t, producer, "select pg_backend_pid()")
		sent := make(chan error, 1)
		go func() {
			_, err := producer.Exec(ctx, produce)
			sent <- err
		}()
		pgtest.WaitFor(t, 10*time.Second, produce+": the producer to wait for pgque.event's lock", func() bool {
			return scalar[bool](t, pool, "select exists (select 1 from pg_stat_activity where pid = $1 and wait_event_type = 'Lock')", pid)
		})
		tk, _ := poll(ticker, "select pgque.ticker('q')")
		if tk == nil {
			t.Fatalf("%s: no tick after the producer took its ev_id", produce)
		}
		if !scalar[bool](t, pool, "select tick_xid is not null from pgque.tick where tick_id = $1", *tk) {
			t.Fatal("a tick made in a fresh transaction has no tick_xid")
		}
		for i := range 3 {
			tk, scans := poll(ticker, "select pgque.ticker('q')")
			if tk != nil {
				t.Fatalf("%s: poll %d ticked with nothing committed since the tick", produce, i)
			}
			if i == 0 && scans == 0 {
				t.Fatalf("%s: the first poll did not probe while a producer holding a covered ev_id is open: its event would wait for ticker_idle_period", produce)
			}
		}
		// Later polls skip the probe while the transactions it noted run;
		// the producer must be among them, or its commit would go unseen.
		xid := scalar[string](t, pool, "select backend_xid::text from pg_stat_activity where pid = $1", pid)
		if !probedWaitsOn(t, ticker, *tk, xid) {
			t.Fatalf("%s: the probe's note %q does not wait on the producer's transaction %s",
				produce, scalar[string](t, ticker, "select current_setting('pgque.probed_ticks', true)"), xid)
		}
		if err := locker.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		if err := <-sent; err != nil {
			t.Fatalf("%s: %v", produce, err)
		}
		if tk, _ := poll(ticker, "select pgque.ticker('q')"); tk == nil {
			t.Fatalf("%s: no tick for the event committed after its tick", produce)
		}
		if n := drain(t, pool); n == 0 {
			t.Fatalf("%s: the late event is not in the batch after its commit", produce)
		}
	}

	// Nothing open now but other tests' transactions, which end: within a
	// bounded number of polls the ticker stops probing.
	// A poll may also skip the probe while the transactions it waits on
	// run (TestTickerSkipsProbesWhileItsTransactionsRun): settled is the
	// session's note of the queue's last tick.
	settle := func(c *pgx.Conn, call string) {
		t.Helper()
		pgtest.WaitFor(t, 10*time.Second, call+" to settle an idle queue", func() bool {
			if tk, _ := poll(c, call); tk != nil {
				t.Fatalf("%s ticked an idle queue", call)
			}
			return scalar[bool](t, c, `select strpos(coalesce(current_setting('pgque.settled_ticks', true), ''),
				',' || q.queue_id || ':' || (select max(tick_id) from pgque.tick where tick_queue = q.queue_id) || ':') > 0
				  from pgque.queue q where q.queue_name = 'q'`)
		})
		for i := range 3 {
			if tk, scans := poll(c, call); tk != nil || scans != 0 {
				t.Fatalf("%s poll %d after settling: tick %v, %d scans; want none", call, i, tk, scans)
			}
		}
	}
	settle(ticker, "select pgque.ticker('q')")
	settle(ticker, "select pgque.ticker()")
	other := pgtest.Conn(t, dsn)
	if _, scans := poll(other, "select pgque.ticker()"); scans == 0 {
		t.Fatal("a new session skipped the probe: the settled ticks are per session")
	}
	exec(t, pool, "select pgque.send('q', '{}')")
	if tk, _ := poll(ticker, "select pgque.ticker()"); tk == nil {
		t.Fatal("a settled queue did not tick for a new event")
	}
}

// pollTicker runs one ticker call on c in its own transaction and returns
// the tick it made (nil: none) and how many scans it made of tables, the
// queue's event tables: the straggler probe is the only reader of them in
// the ticker.
func pollTicker(t *testing.T, c *pgx.Conn, tables []string, call string) (*int64, int64) {
	t.Helper()
	ctx := context.Background()
	tx, err := c.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	// The xact counters hold what the session has not reported yet,
	// earlier transactions included: the call's scans are a difference.
	count := func() int64 {
		return scalar[int64](t, tx, `select coalesce(sum(coalesce(seq_scan, 0) + coalesce(idx_scan, 0)), 0)::bigint
			  from pg_stat_xact_all_tables where relid = any($1::regclass[])`, tables)
	}
	before := count()
	var tick *int64
	if err := tx.QueryRow(ctx, call).Scan(&tick); err != nil {
		t.Fatalf("%s: %v", call, err)
	}
	if call == "select pgque.ticker()" && tick != nil {
		if *tick == 0 {
			tick = nil
		} else {
			tick = new(int64) // ticker() counts ticks; a non-nil pointer says one was made
		}
	}
	scans := count() - before
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	return tick, scans
}

// probedWaits returns the transaction ids the ticker session c noted for
// tick when its probe found nothing (pgque.probed_ticks), and whether it
// noted the tick at all.
func probedWaits(t *testing.T, c *pgx.Conn, tick int64) ([]string, bool) {
	t.Helper()
	var waits []string
	err := c.QueryRow(context.Background(), `select string_to_array(m[1], ' ')
		  from regexp_match(coalesce(current_setting('pgque.probed_ticks', true), ''), ',[0-9]+:' || $1::bigint || ':([0-9 ]*),') m`,
		tick).Scan(&waits)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, false
	}
	if err != nil {
		t.Fatal(err)
	}
	return waits, true
}

// probedWaitsOn reports whether c's note for tick waits on the 32-bit
// transaction id xid (as pg_stat_activity shows it).
func probedWaitsOn(t *testing.T, c *pgx.Conn, tick int64, xid string) bool {
	t.Helper()
	waits, _ := probedWaits(t, c, tick)
	for _, w := range waits {
		full, err := strconv.ParseUint(w, 10, 64)
		if err != nil {
			t.Fatalf("probed_ticks holds %q, not a transaction id", w)
		}
		if strconv.FormatUint(full%(1<<32), 10) == xid {
			return true
		}
	}
	return false
}

// TestTickerSkipsProbesWhileItsTransactionsRun: an open transaction with a
// transaction id older than an idle queue's tick (a report or migration
// that wrote something) holds the tick unsettled for as long as it runs.
// The ticker probed the event index at every poll for all that time, on
// every such queue (30 idle queues and one such transaction cost the
// ticker's backend 0.7 s of CPU a second). Now a probe that finds nothing
// notes the transactions that could still commit a straggler, and polls
// skip the probe while they all run; when one ends, the next poll probes
// again. A note that is not a list of transaction ids is ignored.
func TestTickerSkipsProbesWhileItsTransactionsRun(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, pool, tables, ticker := setupIdleQueue(t)
	// poll runs ticker('q'), pollAll ticker(), whose first statement drops
	// the queues it need not look at.
	pollWith := func(call, what string) int64 {
		t.Helper()
		tk, scans := pollTicker(t, ticker, tables, call)
		if tk != nil {
			t.Fatalf("%s: %s ticked with nothing sent since the last tick", what, call)
		}
		return scans
	}
	poll := func(what string) int64 { t.Helper(); return pollWith("select pgque.ticker('q')", what) }
	pollAll := func(what string) int64 { t.Helper(); return pollWith("select pgque.ticker()", what) }
	held, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Rollback(ctx)
	xid := scalar[string](t, held, "select (pg_current_xact_id()::text::bigint % 4294967296)::text")
	tick, _ := pollTicker(t, ticker, tables, "select pgque.ticker('q')")
	if tick == nil {
		t.Fatal("no tick for the send")
	}
	if poll("first poll") == 0 {
		t.Fatal("the first poll of a tick held unsettled did not probe")
	}
	if !probedWaitsOn(t, ticker, *tick, xid) {
		t.Fatalf("the note %q does not wait on the open transaction %s",
			scalar[string](t, ticker, "select current_setting('pgque.probed_ticks', true)"), xid)
	}
	// Other tests' transactions the tick saw running end soon, each
	// costing one more probe; then only the held one is left.
	pgtest.WaitFor(t, 20*time.Second, "the note to wait on the held transaction alone", func() bool {
		poll("poll while others end")
		waits, _ := probedWaits(t, ticker, *tick)
		return len(waits) == 1 && probedWaitsOn(t, ticker, *tick, xid)
	})
	for i := range 3 {
		if scans := poll("poll while the held transaction runs"); scans != 0 {
			t.Fatalf("poll %d while the one transaction the probe waits on runs: %d scans, want none", i, scans)
		}
		if scans := pollAll("poll while the held transaction runs"); scans != 0 {
			t.Fatalf("ticker() poll %d while the one transaction the probe waits on runs: %d scans, want none", i, scans)
		}
	}
	// A note any session could have set to anything: ignored, and probed.
	queueID := scalar[int32](t, pool, "select queue_id from pgque.queue where queue_name = 'q'")
	exec(t, ticker, "select set_config('pgque.probed_ticks', $1, false)", fmt.Sprintf(",%d:%d:not xids,", queueID, *tick))
	if scans := poll("poll with a foreign note"); scans == 0 {
		t.Fatal("a poll with a note that is not a list of transaction ids skipped the probe")
	}
	if scans := poll("poll after the note was made again"); scans != 0 {
		t.Fatalf("after the probe noted the held transaction again, a poll made %d scans, want none", scans)
	}
	if err := held.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if scans := pollAll("poll after the held transaction ended"); scans == 0 {
		t.Fatal("the ticker() poll after the transaction the probe waited on ended did not probe again")
	}
	// Nothing of the tick's is open now: settled, no more probes.
	pgtest.WaitFor(t, 20*time.Second, "the tick to settle", func() bool { return poll("poll to settle") == 0 })
	exec(t, pool, "select pgque.send('q', '{}')")
	if tk, _ := pollTicker(t, ticker, tables, "select pgque.ticker('q')"); tk == nil {
		t.Fatal("no tick for a new send")
	}
}

// setupIdleQueue makes queue q tick at once for any event and only then
// (no idle ticks), sends one event, and returns the queue's event tables
// and a session for the ticker.
func setupIdleQueue(t *testing.T) (dsn string, pool beginner, tables []string, ticker *pgx.Conn) {
	t.Helper()
	dsn, pool = setupEngine(t)
	for _, q := range []string{
		"select pgque.set_queue_config('q', 'ticker_idle_period', '1 hour')",
		"select pgque.set_queue_config('q', 'ticker_max_lag', '0')",
		"select pgque.send('q', '{}')",
	} {
		exec(t, pool, q)
	}
	return dsn, pool, eventTables(t, pool, "q"), pgtest.Conn(t, dsn)
}

// TestTickerSettlesTicksWithoutTickXid: a tick whose transaction had an id
// before it read the sequence (force_next_tick and ticker(queue) in one
// transaction) has no tick_xid, so no probe can settle it. Polling it
// probed on every call, planning the probe each time, until
// ticker_idle_period (an hour here): about 1 ms a call, 100 calls a second
// for the ticker daemon. Now the next poll from a transaction without an id
// makes one more tick, which has a tick_xid, and polls settle on it. A
// poll from a transaction that has an id could only make another tick
// without one: it makes none.
func TestTickerSettlesTicksWithoutTickXid(t *testing.T) {
	t.Parallel()
	dsn, pool, tables, ticker := setupIdleQueue(t)
	lastTick := func() (id int64, bounded bool) {
		t.Helper()
		err := pool.QueryRow(context.Background(), `select t.tick_id, t.tick_xid is not null from pgque.tick t
			  where t.tick_queue = (select queue_id from pgque.queue where queue_name = 'q')
			  order by t.tick_id desc limit 1`).Scan(&id, &bounded)
		if err != nil {
			t.Fatal(err)
		}
		return id, bounded
	}
	exec(t, ticker, "begin")
	exec(t, ticker, "select pgque.force_next_tick('q')")
	exec(t, ticker, "select pgque.ticker('q')")
	exec(t, ticker, "commit")
	forced, bounded := lastTick()
	if bounded {
		t.Fatal("the forced tick has a tick_xid: this test needs one without")
	}
	exec(t, ticker, "begin")
	exec(t, ticker, "select pg_current_xact_id()")
	n := scalar[int64](t, ticker, "select pgque.ticker()")
	exec(t, ticker, "commit")
	if n != 0 {
		t.Fatal("ticker() in a transaction that has an id ticked a still queue")
	}
	// A writer transaction open across that tick (a horizon held
	// elsewhere) keeps the new tick unsettled: polls probe it, as any
	// tick's, and make no more ticks.
	holder := pgtest.Conn(t, dsn)
	held, err := holder.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer held.Rollback(context.Background())
	exec(t, held, "select pg_current_xact_id()")
	if tk, _ := pollTicker(t, ticker, tables, "select pgque.ticker()"); tk == nil {
		t.Fatal("ticker() made no tick after a tick without tick_xid: every poll would probe it until ticker_idle_period")
	}
	next, bounded := lastTick()
	if next <= forced || !bounded {
		t.Fatalf("the tick after %d is %d, tick_xid set: %v; want a later tick with one", forced, next, bounded)
	}
	for i := range 5 {
		if tk, _ := pollTicker(t, ticker, tables, "select pgque.ticker()"); tk != nil {
			t.Fatalf("poll %d with a writer open made another tick", i)
		}
	}
	if err := held.Rollback(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := len(mustReceive(t, pool, "q", "c", 100)); n != 1 {
		t.Fatalf("the batches up to the forced tick hold %d events, want the 1 sent", n)
	}
	// Other tests' transactions hold the new tick unsettled while they
	// run; then polls neither tick nor probe.
	pgtest.WaitFor(t, 10*time.Second, "ticker() to settle the new tick", func() bool {
		if tk, _ := pollTicker(t, ticker, tables, "select pgque.ticker()"); tk != nil {
			t.Fatal("ticker() ticked a still queue again")
		}
		return scalar[bool](t, ticker, `select strpos(coalesce(current_setting('pgque.settled_ticks', true), ''),
			',' || (select queue_id from pgque.queue where queue_name = 'q') || ':' || $1::bigint || ':') > 0`, next)
	})
	for i := range 3 {
		if tk, scans := pollTicker(t, ticker, tables, "select pgque.ticker()"); tk != nil || scans != 0 {
			t.Fatalf("poll %d after settling: tick %v, %d scans; want none", i, tk, scans)
		}
	}
}

// TestTickerBoundsTicksDueWithoutAProbe: ticker() ticks a queue that its
// first statement finds due (here, by a moved sequence) on the sequence
// value that statement read, without _tick_poll's second look. That value
// is read before the call's transaction has an id, so the tick still gets
// its tick_xid bound, which lets later polls settle it without probing
// for stragglers; a value that did not match what _tick_write reads under
// the queue's lock would leave every such tick unbounded.
func TestTickerBoundsTicksDueWithoutAProbe(t *testing.T) {
	t.Parallel()
	_, pool, _, ticker := setupIdleQueue(t)
	for i := range 3 {
		if i > 0 {
			exec(t, pool, "select pgque.send('q', '{}')")
		}
		if n := scalar[int64](t, ticker, "select pgque.ticker()"); n != 1 {
			t.Fatalf("round %d: ticker() ticked %d queues, want 1 (the queue's sequence moved)", i, n)
		}
		if !scalar[bool](t, pool, `select t.tick_xid is not null from pgque.tick t
			  where t.tick_queue = (select queue_id from pgque.queue where queue_name = 'q')
			  order by t.tick_id desc limit 1`) {
			t.Fatalf("round %d: a tick ticker() made on its first statement's sequence read has no tick_xid", i)
		}
	}
}

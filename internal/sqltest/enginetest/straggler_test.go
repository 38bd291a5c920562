package enginetest

import (
	"context"
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
// covers that ev_id; every poll while the producer is open must probe, and
// the poll after it commits must tick. Then, with nothing open, polls stop
// probing within a bounded number, both ticker(queue) and ticker(), until
// the next send; a new session probes again.
func TestTickerSettlesIdleTicks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn, pool := setupEngine(t)
	for _, q := range []string{
		"select pgque.set_queue_config('q', 'ticker_idle_period', '1 hour')",
		"select pgque.set_queue_config('q', 'ticker_max_lag', '0')",
		"select pgque.send('q', '{}')",
	} {
		exec(t, pool, q)
	}
	tables := eventTables(t, pool, "q")
	ticker := pgtest.Conn(t, dsn)
	// poll runs one ticker call in its own transaction and returns the tick
	// it made (nil: none) and how many scans it made of the queue's event
	// tables: the straggler probe is the only reader of them in the ticker.
	poll := func(c *pgx.Conn, call string) (*int64, int64) {
		t.Helper()
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
			if scans == 0 {
				t.Fatalf("%s: poll %d did not probe while a producer holding a covered ev_id is open: its event would wait for ticker_idle_period", produce, i)
			}
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
	settle := func(c *pgx.Conn, call string) {
		t.Helper()
		pgtest.WaitFor(t, 10*time.Second, call+" to stop probing an idle queue", func() bool {
			tk, scans := poll(c, call)
			if tk != nil {
				t.Fatalf("%s ticked an idle queue", call)
			}
			return scans == 0
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

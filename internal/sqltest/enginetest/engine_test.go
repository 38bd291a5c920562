package enginetest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgque/pgque/internal/testing/pgtest"
)

// setupEngine gives an engine test a database with queue "q" and consumer
// "c" registered, and a pool on it.
func setupEngine(t *testing.T) (dsn string, pool beginner) {
	t.Helper()
	dsn, pool = setupDB(t)
	newQueue(t, pool, "q", "c")
	return dsn, pool
}

// TestLongTransactionLandsInExactlyOneBatch: a producer transaction that
// stays open across several ticks and then commits appears in exactly one
// batch, the first one cut after its commit; rolled-back transactions (short,
// or open across ticks) never appear.
func TestLongTransactionLandsInExactlyOneBatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn, pool := setupEngine(t)
	long := pgtest.Conn(t, dsn)
	doomed := pgtest.Conn(t, dsn)

	ltx, err := long.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var longIDs []int64
	for i := range 3 {
		longIDs = append(longIDs, scalar[int64](t, ltx, "select pgque.insert_event('q', 'long', $1)", fmt.Sprint("long-", i)))
	}
	dtx, err := doomed.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	doomedID := scalar[int64](t, dtx, "select pgque.insert_event('q', 'doomed', 'rolled back after ticks')")
	// A short transaction that rolls back at once.
	stx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	shortRollback := scalar[int64](t, stx, "select pgque.insert_event('q', 'doomed', 'rolled back at once')")
	if err := stx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}

	seen := map[int64]int{} // ev_id -> number of batches it appeared in
	record := func(batches [][]event) {
		for i, evs := range batches {
			checkOrdered(t, fmt.Sprint("batch ", i), evs)
			for _, e := range evs {
				seen[e.ID]++
			}
		}
	}

	// Several ticks pass while both transactions stay open; short committed
	// transactions in between are delivered tick by tick, the open ones not.
	var shortIDs []int64
	for i := range 4 {
		id := scalar[int64](t, pool, "select pgque.insert_event('q', 'short', $1)", fmt.Sprint("short-", i))
		shortIDs = append(shortIDs, id)
		tick(t, pool, "q")
		batches := drainBatches(t, pool, "q", "c")
		if len(batches) != 1 || !slices.Equal(evIDs(batches[0]), []int64{id}) {
			t.Fatalf("tick %d while the long transaction is open: batches %v, want exactly [[%d]]", i, batchIDs(batches), id)
		}
		record(batches)
	}

	if err := dtx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := ltx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	tick(t, pool, "q")
	after := drainBatches(t, pool, "q", "c")
	if len(after) != 1 || !slices.Equal(evIDs(after[0]), longIDs) {
		t.Fatalf("first batch after the long transaction committed: %v, want exactly %v", batchIDs(after), longIDs)
	}
	for _, e := range after[0] {
		if e.Type == nil || *e.Type != "long" {
			t.Errorf("event %d has type %v, want long", e.ID, e.Type)
		}
	}
	record(after)

	// Later ticks never bring the long transaction's events again.
	for range 3 {
		tick(t, pool, "q")
		record(drainBatches(t, pool, "q", "c"))
	}
	for _, id := range append(slices.Clone(longIDs), shortIDs...) {
		if seen[id] != 1 {
			t.Errorf("committed event %d appeared in %d batches, want exactly 1", id, seen[id])
		}
	}
	for _, id := range []int64{doomedID, shortRollback} {
		if seen[id] != 0 {
			t.Errorf("rolled-back event %d appeared in %d batches", id, seen[id])
		}
	}
	if len(seen) != len(longIDs)+len(shortIDs) {
		t.Errorf("saw %d distinct events, want %d", len(seen), len(longIDs)+len(shortIDs))
	}
}

func batchIDs(batches [][]event) [][]int64 {
	var out [][]int64
	for _, b := range batches {
		out = append(out, evIDs(b))
	}
	return out
}

// TestConcurrentProducersUnionEqualsCommitted: 8 concurrent producers with
// random delays and random commit/rollback while a ticker runs: the union
// of all batches is exactly the committed events, without duplicates, every
// batch in ev_id order.
func TestConcurrentProducersUnionEqualsCommitted(t *testing.T) {
	t.Parallel()
	runProducerStress(t, false)
}

// stressResult is what runProducerStress observed.
type stressResult struct {
	committedTx, rolledBackTx int64
	batches                   int64
	rotations                 int64
}

// runProducerStress runs 8 producers (random events per transaction, random
// delays, some transactions held open across many ticks, a quarter rolled
// back), a ticker goroutine, a consumer goroutine and, with rotate, a
// maint() goroutine with rotation_period 1 ms. Then it stops the producers,
// ticks, drains, and checks that what was consumed is exactly what was
// committed.
func runProducerStress(t *testing.T, rotate bool) stressResult {
	const (
		producers   = 8
		duration    = 1500 * time.Millisecond
		maxDuration = 20 * time.Second
	)
	ctx := context.Background()
	dsn, admin := setupEngine(t)
	exec(t, admin, "select pgque.set_queue_config('q', 'ticker_max_lag', '2 ms')")
	if rotate {
		exec(t, admin, "select pgque.set_queue_config('q', 'rotation_period', '1 ms')")
	}
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = producers + 4
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()

	var (
		mu        sync.Mutex
		committed = map[int64]string{} // ev_id -> data, of committed transactions
		consumed  = map[int64]int{}    // ev_id -> times consumed
		data      = map[int64]string{}
		res       stressResult
		stop      atomic.Bool
		bg        sync.WaitGroup
		prod      sync.WaitGroup
	)
	fail := func(format string, args ...any) {
		t.Errorf(format, args...)
		stop.Store(true)
	}
	consume := func(evs []event) {
		mu.Lock()
		defer mu.Unlock()
		checkOrdered(t, "stress batch", evs)
		for _, e := range evs {
			consumed[e.ID]++
			data[e.ID] = e.data()
		}
		res.batches++
	}

	for p := range producers {
		prod.Add(1)
		go func() {
			defer prod.Done()
			rng := rand.New(rand.NewPCG(uint64(p), uint64(time.Now().UnixNano())))
			for txn := 0; !stop.Load(); txn++ {
				tx, err := pool.Begin(ctx)
				if err != nil {
					fail("producer %d: begin: %v", p, err)
					return
				}
				ids := map[int64]string{}
				n := 1 + rng.IntN(5)
				long := rng.IntN(15) == 0 // held open across many ticks
				for i := range n {
					d := fmt.Sprintf("p%d-t%d-e%d", p, txn, i)
					var id int64
					var err error
					if i%2 == 0 {
						err = tx.QueryRow(ctx, "select pgque.insert_event('q', 'stress', $1)", d).Scan(&id)
					} else {
						// The api layer's send writes through the same path.
						err = tx.QueryRow(ctx, "select pgque.send('q', 'stress', to_jsonb($1::text), $2)", d, fmt.Sprint("k", p)).Scan(&id)
						d = fmt.Sprintf("%q", d)
					}
					if err != nil {
						fail("producer %d: insert: %v", p, err)
						tx.Rollback(ctx)
						return
					}
					ids[id] = d
					// Workload: the transaction stays open across ticks.
					if long {
						_ = pgtest.Work(ctx, time.Duration(20+rng.IntN(60))*time.Millisecond)
					} else {
						_ = pgtest.Work(ctx, time.Duration(rng.IntN(3000))*time.Microsecond)
					}
				}
				if rng.IntN(4) == 0 {
					if err := tx.Rollback(ctx); err != nil {
						fail("producer %d: rollback: %v", p, err)
						return
					}
					mu.Lock()
					res.rolledBackTx++
					mu.Unlock()
					continue
				}
				if err := tx.Commit(ctx); err != nil {
					// Only a successful COMMIT makes the ids count.
					fail("producer %d: commit: %v", p, err)
					return
				}
				mu.Lock()
				res.committedTx++
				for id, d := range ids {
					committed[id] = d
				}
				mu.Unlock()
			}
		}()
	}

	bg.Add(1)
	go func() { // ticker
		defer bg.Done()
		for !stop.Load() {
			if _, err := pool.Exec(ctx, "select pgque.ticker('q')"); err != nil {
				fail("ticker: %v", err)
				return
			}
			_ = pgtest.Work(ctx, 3*time.Millisecond) // workload: the ticker's pace
		}
	}()
	bg.Add(1)
	go func() { // consumer, concurrently with the producers
		defer bg.Done()
		for !stop.Load() {
			evs, ok, err := consumeBatch(pool, "q", "c")
			if err != nil {
				fail("consumer: %v", err)
				return
			}
			if !ok {
				_ = pgtest.Work(ctx, 2*time.Millisecond) // workload: an idle consumer's poll interval
				continue
			}
			consume(evs)
		}
	}()
	if rotate {
		bg.Add(1)
		go func() { // maintenance: rotation as often as it is allowed
			defer bg.Done()
			last := int32(0)
			for !stop.Load() {
				if _, err := pool.Exec(ctx, "select pgque.maint()"); err != nil {
					fail("maint: %v", err)
					return
				}
				var cur int32
				if err := pool.QueryRow(ctx, "select queue_cur_table from pgque.queue where queue_name = 'q'").Scan(&cur); err != nil {
					fail("maint: %v", err)
					return
				}
				if cur != last {
					mu.Lock()
					res.rotations++
					mu.Unlock()
					last = cur
				}
				_ = pgtest.Work(ctx, 5*time.Millisecond) // workload: maintenance's pace
			}
		}()
	}

	// Run for duration, longer (up to maxDuration) on a slow machine until
	// the run has done enough to prove something.
	enough := func() bool {
		mu.Lock()
		defer mu.Unlock()
		return res.committedTx >= 20 && res.rolledBackTx >= 5 && (!rotate || res.rotations >= 3)
	}
	start := time.Now()
	pgtest.Eventually(ctx, maxDuration, func() bool {
		return stop.Load() || (time.Since(start) >= duration && enough())
	})
	if !stop.Load() && !enough() {
		// Say what held the run back while it is still running.
		for _, q := range []string{
			"select * from pgque.rotation_blockers()",
			"select queue_cur_table, clock_timestamp() - queue_switch_time as since_switch from pgque.queue where queue_name = 'q'",
			"select * from pgque.get_consumer_info('q')",
		} {
			rows, err := admin.Query(ctx, "select row_to_json(x)::text from ("+q+") x")
			if err != nil {
				t.Logf("%s: %v", q, err)
				continue
			}
			for rows.Next() {
				v, err := rows.Values()
				t.Logf("%s: %v %v", q, v, err)
			}
			rows.Close()
		}
	}
	stop.Store(true)
	prod.Wait()
	bg.Wait()
	if t.Failed() {
		return res
	}

	// Every producer has ended: one more tick covers every commit.
	tick(t, admin, "q")
	for _, evs := range drainBatches(t, admin, "q", "c") {
		consume(evs)
	}
	if rotate {
		// Rotation after the drain must not take anything either: a last
		// tick and drain find nothing new.
		for range 3 {
			waitRotationDue(t, admin)
			exec(t, admin, "select pgque.maint()")
		}
		tick(t, admin, "q")
		for _, evs := range drainBatches(t, admin, "q", "c") {
			consume(evs)
		}
	}

	mu.Lock()
	defer mu.Unlock()
	t.Logf("%d committed and %d rolled-back transactions, %d events committed, %d batches, %d rotations",
		res.committedTx, res.rolledBackTx, len(committed), res.batches, res.rotations)
	if res.committedTx < 20 || res.rolledBackTx < 5 {
		t.Errorf("only %d commits and %d rollbacks: the run proves too little", res.committedTx, res.rolledBackTx)
	}
	for id, d := range committed {
		switch n := consumed[id]; {
		case n == 0:
			t.Errorf("committed event %d (%s) was never delivered", id, d)
		case n > 1:
			t.Errorf("committed event %d (%s) was delivered %d times", id, d, n)
		case data[id] != d:
			t.Errorf("event %d delivered with data %q, want %q", id, data[id], d)
		}
	}
	for id, n := range consumed {
		if _, ok := committed[id]; !ok {
			t.Errorf("event %d (%s) was delivered %d times but never committed", id, data[id], n)
		}
	}
	return res
}

// TestConcurrentNextBatchSameID: two concurrent next_batch calls for one
// subscription get the same batch id. The first caller holds its
// transaction open; the second waits on the subscription's row lock and,
// once the first commits, returns the same batch.
func TestConcurrentNextBatchSameID(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn, pool := setupEngine(t)
	exec(t, pool, "select pgque.insert_event('q', 't', 'x')")
	tick(t, pool, "q")
	c1, c2 := pgtest.Conn(t, dsn), pgtest.Conn(t, dsn)

	tx1, err := c1.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	b1 := scalar[int64](t, tx1, "select pgque.next_batch('q', 'c')")

	done := pgtest.Async(func() (id *int64, err error) {
		err = c2.QueryRow(ctx, "select pgque.next_batch('q', 'c')").Scan(&id)
		return id, err
	})

	// The second caller must be waiting on a lock, not returning.
	pid2 := c2.PgConn().PID()
	pgtest.WaitFor(t, 10*time.Second, "the second next_batch to wait on the subscription lock", func() bool {
		select {
		case r := <-done:
			t.Fatalf("second next_batch returned (%v, %v) while the first caller's transaction was open", r.Value, r.Err)
		default:
		}
		wait := scalar[*string](t, pool, "select wait_event_type from pg_catalog.pg_stat_activity where pid = $1", pid2)
		return wait != nil && *wait == "Lock"
	})
	select {
	case r := <-done:
		t.Fatalf("second next_batch returned (%v, %v) while blocked", r.Value, r.Err)
	case <-time.After(200 * time.Millisecond):
	}

	if err := tx1.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	var r pgtest.Result[*int64]
	select {
	case r = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("second next_batch still blocked after the first committed")
	}
	if r.Err != nil {
		t.Fatal(r.Err)
	}
	if r.Value == nil {
		t.Fatalf("second next_batch = NULL, want the first caller's batch %d", b1)
	}
	if *r.Value != b1 {
		t.Fatalf("second next_batch = %d, want the first caller's batch %d", *r.Value, b1)
	}

	// Both callers read the same events; after finish_batch the next batch
	// has another id.
	e1, err := batchEvents(c1, b1)
	if err != nil {
		t.Fatal(err)
	}
	e2, err := batchEvents(c2, *r.Value)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(evIDs(e1), evIDs(e2)) || len(e1) != 1 {
		t.Errorf("the two callers read %v and %v, want the same single event", evIDs(e1), evIDs(e2))
	}
	exec(t, c1, "select pgque.finish_batch($1)", b1)
	wantCode(t, "finish_batch twice", queryErr(c2, "select pgque.finish_batch($1)", b1), "PQ020", fmt.Sprint(b1))
	tick(t, pool, "q")
	b3 := scalar[int64](t, c2, "select pgque.next_batch('q', 'c')")
	if b3 == b1 {
		t.Errorf("the batch after finish_batch reused id %d", b1)
	}
	// Serial callers without a finish in between also agree.
	if b4 := scalar[int64](t, c1, "select pgque.next_batch('q', 'c')"); b4 != b3 {
		t.Errorf("next_batch while batch %d is open = %d", b3, b4)
	}
}

// TestRegisterWhileMaintCleansTicks: a consumer registered in a transaction
// that stays open while the ticker, the other consumers and maint() move on
// still has its starting tick when it commits, and receives every event
// committed after that tick.
func TestRegisterWhileMaintCleansTicks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn, pool := setupEngine(t)
	tick(t, pool, "q")
	drainBatches(t, pool, "q", "c")

	late := pgtest.Conn(t, dsn)
	tx, err := late.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if n := scalar[int32](t, tx, "select pgque.subscribe('q', 'late')"); n != 1 {
		t.Fatalf("subscribe = %d", n)
	}
	start := scalar[int64](t, tx, "select sub_last_tick from pgque.subscription where sub_name = 'late'")

	// Meanwhile: an event, a tick, c moves past it, maintenance runs.
	e1 := scalar[int64](t, pool, "select pgque.insert_event('q', 't', 'e1')")
	tick(t, pool, "q")
	drainBatches(t, pool, "q", "c")
	done := make(chan error, 1)
	go func() {
		mctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		_, err := pool.Exec(mctx, "select pgque.maint()")
		done <- err
	}()
	// maint() may wait for the registering transaction; it must not fail.
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("maint(): %v", err)
		}
		done <- nil
	case <-time.After(500 * time.Millisecond):
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("maint(): %v", err)
	}
	if !scalar[bool](t, pool, "select exists (select 1 from pgque.tick where tick_id = $1)", start) {
		t.Errorf("tick %d, where the new subscription starts, was deleted by maint() while the subscription was being registered", start)
	}

	e2 := scalar[int64](t, pool, "select pgque.insert_event('q', 't', 'e2')")
	tick(t, pool, "q")
	var got []int64
	for range 10 {
		evs, ok, err := consumeBatch(pool, "q", "late")
		if err != nil {
			t.Fatalf("consuming as the late subscription: %v", err)
		}
		if !ok {
			break
		}
		got = append(got, evIDs(evs)...)
	}
	if !slices.Equal(got, []int64{e1, e2}) {
		t.Errorf("the late subscription received %v, want %v (everything committed after its starting tick %d)", got, []int64{e1, e2}, start)
	}
	// With no registration in flight, maint() cleans the ticks up again.
	drainBatches(t, pool, "q", "c")
	exec(t, pool, "select pgque.maint()")
	if n := scalar[int64](t, pool, `select count(*) from pgque.tick
		 where tick_id < (select min(last_tick) from pgque.get_consumer_info('q'))`); n != 0 {
		t.Errorf("%d ticks older than every cursor survive maint()", n)
	}
	if n := scalar[int64](t, pool, "select count(*) from pgque.tick"); n != 1 {
		t.Errorf("%d ticks left after every consumer caught up and maint() ran, want 1", n)
	}
}

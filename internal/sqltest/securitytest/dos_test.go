package securitytest

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgque/pgque/internal/testing/pgtest"
)

// asRole opens a connection to dsn that acts as role for its whole life.
func asRole(t *testing.T, dsn, role string) *pgx.Conn {
	t.Helper()
	c := pgtest.Conn(t, dsn)
	if _, err := c.Exec(context.Background(), "set role "+role); err != nil {
		t.Fatal(err)
	}
	return c
}

// TestRolledBackSubscribesBurnNoIds: with the id sequence a few steps from
// its 20-bit end, a reader's thousands of rolled-back subscribes (plain
// and slot) do not exhaust subscription ids: afterwards the admin and the
// reader still subscribe, and ids still in use are skipped, not reused.
func TestRolledBackSubscribesBurnNoIds(t *testing.T) {
	dsn, conn := setupDB(t)
	ctx := context.Background()
	if _, err := conn.Exec(ctx, `select setval('pgque.subscription_id_seq', 1048570)`); err != nil {
		t.Fatal(err)
	}
	reader := asRole(t, dsn, roleReader)
	for i := range 3000 {
		tx, err := reader.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		stmt := `select pgque.subscribe('q1', 'burn' || $1::int)`
		if i%2 == 1 {
			stmt = `select pgque.subscribe_slot('q1', 'burn' || $1::int, 0, 2)`
		}
		if _, err := tx.Exec(ctx, stmt, i); err != nil {
			t.Fatalf("rolled-back subscribe #%d: %v", i, err)
		}
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
	}
	var live []int64
	rows, _ := conn.Query(ctx, `select sub_id from pgque.subscription order by 1`)
	live, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatal(err)
	}
	// Point the sequence just before a live id: the next subscribes must
	// skip it.
	if _, err := conn.Exec(ctx, `select setval('pgque.subscription_id_seq', $1)`, live[0]-1); err != nil && live[0] > 1 {
		t.Fatal(err)
	}
	for i, who := range []*pgx.Conn{reader, conn, reader} {
		var n int
		if err := who.QueryRow(ctx, `select pgque.subscribe('q1', 'after' || $1::int)`, i).Scan(&n); err != nil || n != 1 {
			t.Fatalf("subscribe after the burn (#%d): %v %v", i, n, err)
		}
	}
	var dup int
	if err := conn.QueryRow(ctx, `select count(*) - count(distinct sub_id) from pgque.subscription`).Scan(&dup); err != nil || dup != 0 {
		t.Fatalf("%d duplicate subscription ids (%v)", dup, err)
	}
	// The old subscriptions still work: their batches are their own.
	var got int
	if err := reader.QueryRow(ctx, `select count(*) from pgque.receive('q1', 'c1', 100)`).Scan(&got); err != nil {
		t.Fatal(err)
	}
}

// TestDistinctSlotCountsAreBounded: a reader may subscribe consumers with
// at most 4 distinct N >= 2 per queue (each adds a routing index on every
// event table that every producer maintains); the fifth gets PQ051, the
// same N again is fine, and a freed N can be replaced.
func TestDistinctSlotCountsAreBounded(t *testing.T) {
	dsn, _ := setupDB(t)
	ctx := context.Background()
	reader := asRole(t, dsn, roleReader)
	// The fixture's consumer sc already uses N = 2.
	for _, n := range []int{3, 4, 5} {
		if _, err := reader.Exec(ctx, `select pgque.subscribe_slot('q1', 'n' || $1::int, 0, $1)`, n); err != nil {
			t.Fatalf("N=%d: %v", n, err)
		}
	}
	for _, n := range []int{6, 7, 100, 1024} {
		code, msg := sqlstate(t, reader, "", sprintf(`select pgque.subscribe_slot('q1', 'n%d', 0, %d)`, n, n))
		if code != "PQ051" {
			t.Errorf("N=%d: %s %s, want PQ051", n, code, msg)
		}
	}
	for _, stmt := range []string{
		`select pgque.subscribe_slot('q1', 'again3', 0, 3)`, // an N in use
		`select pgque.subscribe_slot('q1', 'single', 0, 1)`, // N = 1 needs no index
		`select pgque.unsubscribe_slot('q1', 'n5', 0, 5)`,   // frees N = 5
		`select pgque.subscribe_slot('q1', 'n8', 0, 8)`,     // so 8 fits
	} {
		if code, msg := sqlstate(t, reader, "", stmt); code != "" {
			t.Errorf("%s: %s %s", stmt, code, msg)
		}
		if _, err := reader.Exec(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	// The indexes come from maint_route_indexes (the ticker's): one per
	// event table for each of the 4 N in use, that of the freed N gone.
	if _, err := asRole(t, dsn, roleAdmin).Exec(ctx, `select pgque.maint_route_indexes()`); err != nil {
		t.Fatal(err)
	}
	var ix int
	if err := reader.QueryRow(ctx, `select count(*) from pg_catalog.pg_class where relname like 'event\_%\_route%'`).Scan(&ix); err != nil || ix != 4*3 {
		t.Fatalf("%d routing indexes (%v), want 12", ix, err)
	}
}

// TestOpenIndexChangeNeverBlocksProducers: a reader may leave a
// subscribe_slot or an unsubscribe_slot open for as long as it likes (an
// admin a resize_slots). Their routing indexes are built and dropped by
// maint_route_indexes in a transaction of its own: when the subscribe
// built them itself, its SHARE locks on the event tables held every send
// to the queue until it ended, and an unsubscribe's drop would hold the
// tables' ACCESS EXCLUSIVE lock, against readers too.
func TestOpenIndexChangeNeverBlocksProducers(t *testing.T) {
	dsn, conn := setupDB(t)
	ctx := context.Background()
	writer := asRole(t, dsn, roleWriter)
	plain := asRole(t, dsn, roleReader)
	admin := asRole(t, dsn, roleAdmin)
	if _, err := plain.Exec(ctx, `select pgque.subscribe('q1', 'plain')`); err != nil {
		t.Fatal(err)
	}
	routeIndexes := func() int {
		t.Helper()
		var n int
		if err := conn.QueryRow(ctx, `select count(*) from pg_catalog.pg_class
			where relname similar to 'event\_' || (select queue_id from pgque.queue where queue_name = 'q1') || '\_[0-9]\_route4'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	// Each statement left open by the reader, then a send and a plain
	// receive on the same queue, each of which must not wait for it.
	for _, step := range []struct {
		name, role, stmt string
		indexes          int // routing indexes for N=4 once maint_route_indexes ran after the commit
	}{
		{"subscribe_slot", roleReader, `select count(pgque.subscribe_slot('q1', 'g', k, 4)) from generate_series(0, 3) k`, 3},
		{"resize_slots", roleAdmin, `select pgque.resize_slots('q1', 'g', 8)`, 3},
		{"unsubscribe_slot", roleReader, `select count(pgque.unsubscribe_slot('q1', 'g', k, 4)) from generate_series(0, 3) k`, 0},
	} {
		open := asRole(t, dsn, step.role)
		tx, err := open.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, step.stmt); err != nil {
			t.Fatalf("%s: %v", step.name, err)
		}
		for _, other := range []struct {
			who  *pgx.Conn
			stmt string
		}{
			{writer, `select pgque.send('q1', 't', '{}'::jsonb, 'k1')`},
			{plain, `select count(*) from pgque.receive('q1', 'plain', 10)`},
		} {
			octx, cancel := context.WithTimeout(ctx, 10*time.Second)
			_, err := other.who.Exec(octx, other.stmt)
			cancel()
			if err != nil {
				t.Fatalf("%s beside an open %s: %v", other.stmt, step.name, err)
			}
		}
		// The ticker's maint_route_indexes meanwhile waits for nothing.
		mctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err = admin.Exec(mctx, `select pgque.maint_route_indexes()`)
		cancel()
		if err != nil {
			t.Fatalf("maint_route_indexes beside an open %s: %v", step.name, err)
		}
		if step.name == "resize_slots" {
			// Leaves the group at 4 slots for the unsubscribe.
			if err := tx.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
		} else if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := admin.Exec(ctx, `select pgque.maint_route_indexes()`); err != nil {
			t.Fatal(err)
		}
		if n := routeIndexes(); n != step.indexes {
			t.Errorf("after %s and maint_route_indexes: %d routing indexes for N=4, want %d", step.name, n, step.indexes)
		}
	}
}

// TestRoutingIndexNeverBlocksProducers: a reader subscribing a new N on a
// queue whose current table holds a backlog, or while a producer's
// transaction is open on it, returns at once without waiting for the
// producer, and a steady producer's inserts are not held up; the missing
// index is built later, by maint_route_indexes, only where it is cheap.
func TestRoutingIndexNeverBlocksProducers(t *testing.T) {
	dsn, conn := setupDB(t)
	ctx := context.Background()
	if _, err := conn.Exec(ctx, `select pgque.send('q1', 't', '{}'::jsonb, 'k' || g) from generate_series(1, 20000) g`); err != nil {
		t.Fatal(err)
	}
	// A producer's open transaction on the queue's current table.
	open := asRole(t, dsn, roleWriter)
	otx, err := open.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer otx.Rollback(ctx)
	if _, err := otx.Exec(ctx, `select pgque.send('q1', 't', '{}'::jsonb, 'open')`); err != nil {
		t.Fatal(err)
	}
	// A steady producer.
	writer := pgtest.Pool(t, dsn)
	var worst atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			start := time.Now()
			if _, err := writer.Exec(ctx, `set role pgque_writer; select pgque.send('q1', 't', '{}'::jsonb, 'steady')`); err != nil {
				t.Error("steady producer:", err)
				return
			}
			if d := int64(time.Since(start)); d > worst.Load() {
				worst.Store(d)
			}
		}
	}()
	reader := asRole(t, dsn, roleReader)
	for _, n := range []int{3, 4, 5} {
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		start := time.Now()
		_, err := reader.Exec(sctx, `select pgque.subscribe_slot('q1', 'r' || $1::int, 0, $1)`, n)
		cancel()
		if err != nil {
			t.Fatalf("subscribe_slot N=%d beside an open producer: %v", n, err)
		}
		if d := time.Since(start); d > 2*time.Second {
			t.Errorf("subscribe_slot N=%d took %v", n, d)
		}
	}
	close(stop)
	wg.Wait()
	if w := time.Duration(worst.Load()); w > time.Second {
		t.Errorf("a producer's send waited %v while slots were subscribed", w)
	}
	// The full table got no index; maint_route_indexes leaves it alone too.
	var n int64
	admin := asRole(t, dsn, roleAdmin)
	if err := admin.QueryRow(ctx, `select pgque.maint_route_indexes()`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	var onCurrent int
	if err := conn.QueryRow(ctx, `select count(*) from pg_catalog.pg_class c, pgque.queue q
		where q.queue_name = 'q1' and c.relname similar to 'event\_' || q.queue_id || '\_' || q.queue_cur_table || '\_route[345]'`).Scan(&onCurrent); err != nil {
		t.Fatal(err)
	}
	if onCurrent != 0 {
		t.Errorf("%d routing indexes were built on the full current table", onCurrent)
	}
	// The empty tables got theirs (now or by maint_route_indexes).
	var empty int
	if err := conn.QueryRow(ctx, `select count(*) from pg_catalog.pg_class c
		where c.relname similar to 'event\_' || (select queue_id from pgque.queue where queue_name = 'q1') || '\_[0-9]\_route[345]'`).Scan(&empty); err != nil {
		t.Fatal(err)
	}
	if empty != 2*3 {
		t.Errorf("%d routing indexes on the two empty tables, want 6", empty)
	}
}

// TestRotationBlockersNamesWhatPinsRotation: a reader's idle subscription
// and a reader's transaction left open after subscribe each keep maint()
// from rotating; rotation_blockers names both (the subscription by name,
// the session by pid, role and the start of its transaction), and not a
// consumer of the same age that acknowledged everything: blame follows each
// consumer's real cursor, not the tick it registered at.
func TestRotationBlockersNamesWhatPinsRotation(t *testing.T) {
	dsn, _ := setupDB(t)
	reader := asRole(t, dsn, roleReader)
	admin := asRole(t, dsn, roleAdmin)
	mustExec(t, admin, `select pgque.set_queue_config('q1', 'rotation_period', '1 microsecond')`)
	mustExec(t, reader, `select pgque.subscribe('q1', 'idle_reader')`, `select pgque.subscribe('q1', 'done_reader')`)
	mustExec(t, admin, `select pgque.send('q1', 't', '{}'::jsonb, 'k')`, `select pgque.force_next_tick('q1')`, `select pgque.ticker('q1')`)
	mustExec(t, reader, `select pgque.ack(b) from (select distinct batch_id as b from pgque.receive('q1', 'done_reader', 100)) x`)
	if n := scalarOf[int64](t, reader, `select count(*) from pgque.receive('q1', 'done_reader', 100)`); n != 0 {
		t.Fatalf("done_reader still has %d events", n)
	}
	// Two rotations make the table holding idle_reader's event the oldest,
	// the one the next rotation would truncate.
	mustExec(t, admin, `select pgque.maint()`, `select pgque.maint()`)
	pid := pgtest.HoldTx(t, asRole(t, dsn, roleReader), `select pgque.subscribe('q1', 'open_tx')`)
	got := rotationBlockers(t, admin)
	var idle, done, session bool
	for _, b := range got {
		if b.Queue == nil || *b.Queue != "q1" {
			continue
		}
		idle = idle || *b.Kind == "subscription" && b.What == "idle_reader"
		done = done || *b.Kind == "subscription" && b.What == "done_reader"
		session = session || *b.Kind == "session" && b.namesSession(pid, true)
	}
	if !idle || done || !session {
		t.Fatalf("rotation_blockers = %+v, want idle_reader and the open session (pid %d) with its role and start, not done_reader", got, pid)
	}
}

// TestOpenSubscribeNeverBlocksAnotherSubscribe: the first subscribe of a
// queue (plain) or of an N (slots) makes the queue's reader function for
// it. A reader that leaves that transaction open must not hold up another
// reader's subscribe to the same queue, which would otherwise wait on the
// reader's catalog row: it waits 50 ms at most and leaves the reader to
// maintenance. Here the first transaction rolls back, so only maintenance
// makes them: maint() the plain one, maint_route_indexes the slots'.
func TestOpenSubscribeNeverBlocksAnotherSubscribe(t *testing.T) {
	dsn, conn := setupDB(t)
	ctx := context.Background()
	admin := asRole(t, dsn, roleAdmin)
	if _, err := admin.Exec(ctx, `select pgque.create_queue('fresh')`); err != nil {
		t.Fatal(err)
	}
	reader := func(queue string, n int) bool {
		t.Helper()
		var ok bool
		if err := conn.QueryRow(ctx, `select pg_catalog.to_regproc(pg_catalog.format('pgque._read_%s_%s', queue_id, $2::int)) is not null
			from pgque.queue where queue_name = $1`, queue, n).Scan(&ok); err != nil {
			t.Fatal(err)
		}
		return ok
	}
	b := asRole(t, dsn, roleReader)
	for _, c := range []struct {
		queue, first, second, maint string
		n                           int
	}{
		{"fresh", `select pgque.subscribe('fresh', 'a')`, `select pgque.subscribe('fresh', 'b')`, `select pgque.maint()`, 1},
		{"q1", `select pgque.subscribe_slot('q1', 'ga', 0, 4)`, `select pgque.subscribe_slot('q1', 'gb', 0, 4)`, `select pgque.maint_route_indexes()`, 4},
	} {
		a := asRole(t, dsn, roleReader)
		tx, err := a.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, c.first); err != nil {
			t.Fatal(err)
		}
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err = b.Exec(sctx, c.second)
		cancel()
		if err != nil {
			t.Fatalf("%s beside an open %s: %v", c.second, c.first, err)
		}
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		if reader(c.queue, c.n) {
			t.Fatalf("a reader for %s, N=%d exists before maintenance: the second subscribe waited for the first", c.queue, c.n)
		}
		if _, err := admin.Exec(ctx, c.maint); err != nil {
			t.Fatal(err)
		}
		if !reader(c.queue, c.n) {
			t.Errorf("%s made no reader for %s, N=%d", c.maint, c.queue, c.n)
		}
	}
}

// TestOpenUnsubscribeHoldsNoRetries: a consumer role that leaves an
// unsubscribe open holds its subscription's retry rows (the cascade
// deletes them). maint_retry_events skips them and moves every other due
// retry, those of other queues included: it waited for them, and with it
// every queue's retries and the ticker daemons' loop, for as long as the
// transaction stayed open. The held ones move once it rolls back.
func TestOpenUnsubscribeHoldsNoRetries(t *testing.T) {
	dsn, _ := setupDB(t)
	ctx := context.Background()
	admin := asRole(t, dsn, roleAdmin)
	reader := asRole(t, dsn, roleReader)
	for _, q := range []string{"rq1", "rq2"} {
		mustExec(t, admin, `select pgque.create_queue('`+q+`')`)
		mustExec(t, reader, `select pgque.subscribe('`+q+`', 'c')`)
		mustExec(t, admin, `select pgque.send('`+q+`', 't', '{}'::jsonb, 'k')`, `select pgque.force_next_tick('`+q+`')`, `select pgque.ticker('`+q+`')`)
		// The event comes back as a retry due at once.
		mustExec(t, reader, `select pgque.nack(r.batch_id, r.msg_id, '0 s', 'again') from pgque.receive('`+q+`', 'c', 10) r`,
			`select pgque.ack(b) from (select batch_id b from pgque.receive('`+q+`', 'c', 10) limit 1) x`)
	}
	retries := func() int {
		t.Helper()
		var n int
		if err := admin.QueryRow(ctx, `select count(*) from pgque.retry_queue`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := retries(); n != 2 {
		t.Fatalf("%d retries pending, want 2", n)
	}
	open := asRole(t, dsn, roleReader)
	tx, err := open.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `select pgque.unsubscribe('rq1', 'c')`); err != nil {
		t.Fatal(err)
	}
	mctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	var moved int
	err = admin.QueryRow(mctx, `select pgque.maint_retry_events()`).Scan(&moved)
	cancel()
	if err != nil || moved != 1 {
		t.Fatalf("maint_retry_events beside an open unsubscribe: %d moved, %v; want rq2's retry moved", moved, err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := admin.QueryRow(ctx, `select pgque.maint_retry_events()`).Scan(&moved); err != nil || moved != 1 {
		t.Fatalf("maint_retry_events once the unsubscribe rolled back: %d moved, %v; want rq1's retry", moved, err)
	}
}

// TestOpenSubscribeOfSameGroupIsBounded: a subscribe_slot of a slot that
// is already subscribed, left open by one reader, holds up nothing: not
// another worker's start (which subscribes its slots again), nor a claim
// and release in one transaction (whose lease row updates check the
// group's key). A subscribe that does change the group, left open, makes
// the group's next change fail after about 2 s (55P03), not wait.
func TestOpenSubscribeOfSameGroupIsBounded(t *testing.T) {
	dsn, _ := setupDB(t)
	ctx := context.Background()
	admin := asRole(t, dsn, roleAdmin)
	if _, err := admin.Exec(ctx, `select pgque.subscribe_slot('q1', 'g', s, 4) from generate_series(0, 2) s`); err != nil {
		t.Fatal(err)
	}
	hold := func(stmt string) pgx.Tx {
		t.Helper()
		tx, err := asRole(t, dsn, roleReader).Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
		if _, err := tx.Exec(ctx, stmt); err != nil {
			t.Fatal(err)
		}
		return tx
	}
	victim := asRole(t, dsn, roleReader)
	noop := hold(`select pgque.subscribe_slot('q1', 'g', 0, 4)`)
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := victim.Exec(sctx, `select pgque.subscribe_slot('q1', 'g', 1, 4)`); err != nil {
		t.Fatalf("a worker's subscribe beside an open one of a subscribed slot: %v", err)
	}
	tx, err := victim.Begin(sctx)
	if err != nil {
		t.Fatal(err)
	}
	var token string
	if err := tx.QueryRow(sctx, `select token::text from pgque.claim_slot('q1', 'g', 2, 'w')`).Scan(&token); err != nil {
		t.Fatalf("claim beside an open subscribe: %v", err)
	}
	if _, err := tx.Exec(sctx, `select pgque.release_slot('q1', 'g', 2, 'w', $1::uuid)`, token); err != nil {
		t.Fatalf("release in the claim's transaction beside an open subscribe: %v", err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := noop.Rollback(ctx); err != nil {
		t.Fatal(err)
	}

	hold(`select pgque.subscribe_slot('q1', 'g', 3, 4)`) // a new slot: the group's row is locked
	start := time.Now()
	_, err = victim.Exec(sctx, `select pgque.unsubscribe_slot('q1', 'g', 1, 4)`)
	if code(err) != "55P03" {
		t.Fatalf("unsubscribe beside an open subscribe that changed the group: %v, want 55P03", err)
	}
	if el := time.Since(start); el > 4*time.Second {
		t.Errorf("the refused unsubscribe took %v, want about 2 s", el)
	}
}

package pgque_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgque/pgque"
	"github.com/pgque/pgque/internal/testing/pgtest"
)

// Tests of Client.Send's coalescing (sendqueue.go). Each holds the one
// statement of a SendConcurrency 1 client on a lock, so that the Sends made
// meanwhile wait, and then checks what became of them.

// coalesceClient returns a client over env's pool whose Sends coalesce
// behind one statement, and whose waiting Sends never give up waiting
// during the test.
func coalesceClient(t *testing.T, env *testEnv) *pgque.Client {
	t.Helper()
	c, err := pgque.NewClient(env.pool, &pgque.Config{Logger: testLogger(t), SendConcurrency: 1})
	if err != nil {
		t.Fatal(err)
	}
	pgque.SetSendPatience(c, time.Hour)
	return c
}

// lockQueue holds an ACCESS EXCLUSIVE lock on queue's current event table
// from its own connection until the returned function is called: a send
// to the queue then waits in its INSERT.
func lockQueue(t *testing.T, env *testEnv, queue string) (unlock func()) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, env.dsn)
	if err != nil {
		t.Fatal(err)
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var table string
	if err := tx.QueryRow(ctx, `select pgque._event_table(queue_id, queue_cur_table) from pgque.queue where queue_name = $1`,
		queue).Scan(&table); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "lock table "+table+" in access exclusive mode"); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	unlock = func() {
		once.Do(func() {
			if err := tx.Rollback(ctx); err != nil {
				t.Error(err)
			}
			conn.Close(ctx)
		})
	}
	t.Cleanup(unlock)
	return unlock
}

// waitLockWaiters waits until n backends wait for a lock.
func waitLockWaiters(t *testing.T, env *testEnv, n int) {
	t.Helper()
	pgtest.WaitFor(t, 10*time.Second, fmt.Sprintf("%d sends waiting on the lock", n), func() bool {
		var got int
		err := env.pool.QueryRow(context.Background(), `select count(*) from pg_locks
		                                                   where not granted and database = (select oid from pg_database where datname = current_database())`).Scan(&got)
		return err == nil && got >= n
	})
}

type sendOutcome struct {
	i   int
	id  int64
	err error
}

// sendAsync makes a Send on its own goroutine and reports on out.
func sendAsync(ctx context.Context, c *pgque.Client, queue string, i int, ev pgque.Event, out chan<- sendOutcome) {
	go func() {
		id, err := c.Send(ctx, queue, ev)
		out <- sendOutcome{i, id, err}
	}()
}

// stuckSend returns a coalescing client (coalesceClient) whose one
// statement is a Send of first, number -1, stuck on a lock of env's queue
// table, the channel it and later sendAsync calls report on, and the
// function that releases the lock.
func stuckSend(t *testing.T, env *testEnv, first pgque.Event, reports int) (*pgque.Client, chan sendOutcome, func()) {
	t.Helper()
	c := coalesceClient(t, env)
	unlock := lockQueue(t, env, env.queue)
	out := make(chan sendOutcome, reports)
	sendAsync(context.Background(), c, env.queue, -1, first, out)
	waitLockWaiters(t, env, 1)
	return c, out, unlock
}

func TestSendCoalescesWaitingSends(t *testing.T) {
	t.Parallel()
	env := setup(t)
	ctx := context.Background()
	c, out, unlock := stuckSend(t, env, pgque.Event{Type: "t", Payload: map[string]int{"n": -1}}, 11)
	for i := range 10 {
		sendAsync(ctx, c, env.queue, i, pgque.Event{Type: "t", Payload: map[string]int{"n": i}, PartitionKey: fmt.Sprint("k", i%3)}, out)
	}
	pgtest.WaitFor(t, 10*time.Second, "10 sends waiting", func() bool { return pgque.SendsWaiting(c) == 10 })
	unlock()

	ids := map[int64]int{}
	for range 11 {
		o := <-out
		if o.err != nil {
			t.Fatalf("send %d: %v", o.i, o.err)
		}
		if _, dup := ids[o.id]; dup {
			t.Fatalf("id %d returned twice", o.id)
		}
		ids[o.id] = o.i
	}
	if got := pgque.SendCounters(c); got.Statements != 1 || got.Events != 10 {
		t.Fatalf("coalescing: %+v, want the 10 waiting sends in 1 statement", got)
	}
	// Every id names the event its Send sent, with its key.
	rows, err := env.pool.Query(ctx, `select ev_id, ev_data, ev_extra1 from pgque.event where ev_type = 't'`)
	if err != nil {
		t.Fatal(err)
	}
	type row struct {
		id   int64
		data string
		key  *string
	}
	got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (row, error) {
		var x row
		return x, r.Scan(&x.id, &x.data, &x.key)
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 11 {
		t.Fatalf("%d events stored, want 11", len(got))
	}
	for _, r := range got {
		i, ok := ids[r.id]
		if !ok {
			t.Fatalf("event %d stored but no Send returned it", r.id)
		}
		var p struct{ N int }
		if err := json.Unmarshal([]byte(r.data), &p); err != nil || p.N != i {
			t.Fatalf("event %d holds %s, but send %d returned it", r.id, r.data, i)
		}
		if i >= 0 && (r.key == nil || *r.key != fmt.Sprint("k", i%3)) {
			t.Fatalf("event %d (send %d) has key %v", r.id, i, r.key)
		}
	}
}

func TestSendCoalescedFailureFailsOnlyItsEvent(t *testing.T) {
	t.Parallel()
	env := setup(t)
	ctx := context.Background()
	c, out, unlock := stuckSend(t, env, pgque.Event{Type: "t", Payload: 0}, 6)
	for i := range 5 {
		ev := pgque.Event{Type: "t", Payload: i}
		if i == 2 {
			// Valid JSON, so the client sends it; jsonb refuses \u0000, so
			// the server refuses it, and with it the whole statement.
			ev.Payload = json.RawMessage(`{"s": "\u0000"}`)
		}
		sendAsync(ctx, c, env.queue, i, ev, out)
	}
	pgtest.WaitFor(t, 10*time.Second, "5 sends waiting", func() bool { return pgque.SendsWaiting(c) == 5 })
	unlock()

	for range 6 {
		o := <-out
		switch {
		case o.i == 2 && !errors.Is(o.err, pgque.ErrInvalidPayload):
			t.Fatalf("the bad event's send: got %v, want ErrInvalidPayload", o.err)
		case o.i != 2 && o.err != nil:
			t.Fatalf("send %d failed beside the bad event: %v", o.i, o.err)
		}
	}
	if got := pgque.SendCounters(c); got.Statements != 1 || got.Alone != 5 {
		t.Fatalf("coalescing: %+v, want 1 statement and its 5 events sent again alone", got)
	}
	var n int
	if err := env.pool.QueryRow(ctx, `select count(*) from pgque.event`).Scan(&n); err != nil || n != 5 {
		t.Fatalf("%d events stored (%v), want 5", n, err)
	}
}

func TestSendCoalescedMissingQueueFailsAllAtOnce(t *testing.T) {
	t.Parallel()
	env := setup(t)
	ctx := context.Background()
	c, out, unlock := stuckSend(t, env, pgque.Event{Payload: 0}, 4)
	for i := range 3 {
		sendAsync(ctx, c, "no-such-queue", i, pgque.Event{Payload: i}, out)
	}
	pgtest.WaitFor(t, 10*time.Second, "3 sends waiting", func() bool { return pgque.SendsWaiting(c) == 3 })
	unlock()
	for range 4 {
		o := <-out
		if o.i >= 0 && !errors.Is(o.err, pgque.ErrQueueNotFound) {
			t.Fatalf("send %d to a missing queue: got %v, want ErrQueueNotFound", o.i, o.err)
		}
		if o.i < 0 && o.err != nil {
			t.Fatal(o.err)
		}
	}
	if got := pgque.SendCounters(c); got.Statements != 1 || got.Alone != 0 {
		t.Fatalf("coalescing: %+v, want 1 statement and nothing sent again", got)
	}
}

func TestSendCancelledWhileWaitingIsNotSent(t *testing.T) {
	t.Parallel()
	env := setup(t)
	ctx := context.Background()
	c, out, unlock := stuckSend(t, env, pgque.Event{Type: "kept", Payload: 0}, 3)
	cctx, cancel := context.WithCancel(ctx)
	sendAsync(cctx, c, env.queue, 1, pgque.Event{Type: "cancelled", Payload: 1}, out)
	pgtest.WaitFor(t, 10*time.Second, "a send waiting", func() bool { return pgque.SendsWaiting(c) == 1 })
	cancel()
	if o := <-out; o.i != 1 || !errors.Is(o.err, context.Canceled) {
		t.Fatalf("cancelled send: got send %d with %v, want send 1 with context.Canceled", o.i, o.err)
	}
	sendAsync(ctx, c, env.queue, 2, pgque.Event{Type: "kept", Payload: 2}, out)
	pgtest.WaitFor(t, 10*time.Second, "the next send waiting", func() bool { return pgque.SendsWaiting(c) == 2 })
	unlock()
	for range 2 {
		if o := <-out; o.err != nil {
			t.Fatalf("send %d: %v", o.i, o.err)
		}
	}
	var kept, cancelled int
	if err := env.pool.QueryRow(ctx, `select count(*) filter (where ev_type = 'kept'), count(*) filter (where ev_type = 'cancelled')
	                                    from pgque.event`).Scan(&kept, &cancelled); err != nil {
		t.Fatal(err)
	}
	if kept != 2 || cancelled != 0 {
		t.Fatalf("stored %d kept and %d cancelled events, want 2 and 0", kept, cancelled)
	}
}

// A stuck statement (here: a lock on one queue's table) holds up Sends to
// other queues for the patience only, and Sends with a dedup key not at
// all.
func TestSendWaitsOnlyThePatienceBehindAStuckStatement(t *testing.T) {
	t.Parallel()
	env := setup(t)
	c := coalesceClient(t, env)
	pgque.SetSendPatience(c, 50*time.Millisecond)
	ctx := context.Background()
	other := env.queue + "_other"
	if _, err := env.client.CreateQueue(ctx, other); err != nil {
		t.Fatal(err)
	}
	unlock := lockQueue(t, env, env.queue)
	defer unlock()

	out := make(chan sendOutcome, 1)
	sendAsync(ctx, c, env.queue, 0, pgque.Event{Payload: 0}, out)
	waitLockWaiters(t, env, 1)

	// Both of these finish while the lock is still held (the deadline
	// turns a Send that waits for the lock into a failure, not a hang).
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := c.Send(sctx, other, pgque.Event{Payload: 1, DedupKey: "d1"}); err != nil {
		t.Fatal(err)
	}
	if got := pgque.SendCounters(c); got.Bypassed != 0 {
		t.Fatalf("a dedup send waited for a statement: %+v", got)
	}
	start := time.Now()
	if _, err := c.Send(sctx, other, pgque.Event{Payload: 2}); err != nil {
		t.Fatal(err)
	}
	if waited := time.Since(start); waited < 50*time.Millisecond {
		t.Fatalf("the send behind the stuck statement returned after %v, before its patience", waited)
	}
	if got := pgque.SendCounters(c); got.Bypassed != 1 {
		t.Fatalf("counters %+v, want 1 send that ran its own statement", got)
	}
	select {
	case o := <-out:
		t.Fatalf("the send on the locked queue returned (%v) while the lock was held", o.err)
	default:
	}
	unlock()
	if o := <-out; o.err != nil {
		t.Fatal(o.err)
	}
}

// Many goroutines sending at once, each one event after another: every
// event is stored once under the id its Send returned, and each goroutine's
// events keep its order (run with -race).
func TestSendConcurrentSendersKeepTheirOrder(t *testing.T) {
	t.Parallel()
	env := setup(t)
	c, err := pgque.NewClient(env.pool, &pgque.Config{Logger: testLogger(t), SendConcurrency: 2})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	const senders, each = 24, 60
	ids := make([][]int64, senders)
	var wg sync.WaitGroup
	errs := make(chan error, senders)
	for g := range senders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				id, err := c.Send(ctx, env.queue, pgque.Event{Type: "t", Payload: map[string]int{"g": g, "i": i}, PartitionKey: fmt.Sprint("g", g)})
				if err != nil {
					errs <- err
					return
				}
				ids[g] = append(ids[g], id)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	byID := map[int64][2]int{}
	for g, list := range ids {
		for i, id := range list {
			if i > 0 && id <= list[i-1] {
				t.Fatalf("sender %d: event %d got id %d after %d", g, i, id, list[i-1])
			}
			byID[id] = [2]int{g, i}
		}
	}
	if len(byID) != senders*each {
		t.Fatalf("%d distinct ids for %d sends", len(byID), senders*each)
	}
	rows, err := env.pool.Query(ctx, `select ev_id, ev_data, ev_extra1 from pgque.event`)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for rows.Next() {
		var id int64
		var data, key string
		if err := rows.Scan(&id, &data, &key); err != nil {
			t.Fatal(err)
		}
		var p struct{ G, I int }
		if err := json.Unmarshal([]byte(data), &p); err != nil {
			t.Fatal(err)
		}
		if want, ok := byID[id]; !ok || want != [2]int{p.G, p.I} || key != fmt.Sprint("g", p.G) {
			t.Fatalf("event %d holds %s with key %s; its Send was %v", id, data, key, want)
		}
		n++
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if n != senders*each {
		t.Fatalf("%d events stored, want %d", n, senders*each)
	}
	t.Logf("coalescing: %+v", pgque.SendCounters(c))
}

// A queue whose table is locked, and a dedup key held by an open
// transaction, hold at most their share of the pool: with 20 Sends stuck
// on each, 20 Sends to another queue all succeed while the locks are
// still held (run with -race).
func TestSendStuckQueueAndKeyLeavePoolToOthers(t *testing.T) {
	t.Parallel()
	env := setup(t)
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(env.dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 8
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	c, err := pgque.NewClient(pool, &pgque.Config{Logger: testLogger(t), PollOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	pgque.SetSendPatience(c, 20*time.Millisecond)
	keyed, other := env.queue+"_keyed", env.queue+"_other"
	for _, q := range []string{keyed, other} {
		if _, err := env.client.CreateQueue(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	// An open transaction sent key "held": every other Send of it waits
	// until it ends.
	holder, err := env.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback(ctx)
	if _, err := env.client.SendTx(ctx, holder, keyed, pgque.Event{Payload: 0, DedupKey: "held"}); err != nil {
		t.Fatal(err)
	}
	unlock := lockQueue(t, env, env.queue)
	defer unlock()

	stuckCtx, cancelStuck := context.WithCancel(ctx)
	defer cancelStuck()
	stuck := make(chan sendOutcome, 40)
	for i := range 20 {
		sendAsync(stuckCtx, c, env.queue, i, pgque.Event{Payload: i}, stuck)
		sendAsync(stuckCtx, c, keyed, i, pgque.Event{Payload: i, DedupKey: "held"}, stuck)
	}
	// Statements of both are stuck (four of the queue's, one of the key's),
	// and the queue's other 16 Sends have given up waiting for a statement
	// and run, or wait to run, their own.
	pgtest.WaitFor(t, 10*time.Second, "5 stuck statements", func() bool {
		var n int
		err := env.pool.QueryRow(ctx, `select count(*) from pg_stat_activity
		                                where datname = current_database() and wait_event_type = 'Lock'`).Scan(&n)
		return err == nil && n >= 5
	})
	pgtest.WaitFor(t, 10*time.Second, "the stuck sends past their patience", func() bool {
		return pgque.SendCounters(c).Bypassed >= 16
	})

	octx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	done := make(chan sendOutcome, 20)
	for i := range 20 {
		sendAsync(octx, c, other, i, pgque.Event{Payload: i}, done)
	}
	for range 20 {
		if o := <-done; o.err != nil {
			t.Fatalf("send %d to another queue while one queue and one key are stuck: %v", o.i, o.err)
		}
	}
	select {
	case o := <-stuck:
		t.Fatalf("a stuck send returned (%v) while its lock was held", o.err)
	default:
	}
	if err := holder.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	unlock()
	for range 40 {
		if o := <-stuck; o.err != nil {
			t.Fatalf("stuck send %d after the locks went: %v", o.i, o.err)
		}
	}
}

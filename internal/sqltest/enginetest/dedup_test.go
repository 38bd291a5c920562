package enginetest

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgque/pgque/internal/testing/pgtest"
)

// sendKey sends one event to queue q with dedup key k and returns its ev_id.
func sendKey(t testing.TB, q db, k string) int64 {
	t.Helper()
	return scalar[int64](t, q, `select pgque.send('q', 't', '{"a": 1}', partition_key => 'p', dedup_key => $1)`, k)
}

// holdKey opens a transaction on a connection of its own to dsn and sends
// key k in it, leaving it open: other senders of k wait for it.
func holdKey(t testing.TB, dsn, k string) (pgx.Tx, int64) {
	t.Helper()
	tx, err := pgtest.Conn(t, dsn).Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return tx, sendKey(t, tx, k)
}

// sendResult is the outcome of a send made by sendKeyAsync.
type sendResult struct {
	id  int64
	err error
}

// sendKeyAsync sends an event with dedup key k over conn on a goroutine
// of its own and reports on the channel it returns.
func sendKeyAsync(conn *pgx.Conn, k string) <-chan sendResult {
	done := make(chan sendResult, 1)
	go func() {
		var r sendResult
		r.err = conn.QueryRow(context.Background(), `select pgque.send('q', 't', '{"a": 2}', 'p', $1)`, k).Scan(&r.id)
		done <- r
	}()
	return done
}

// eventCount is the number of events stored in queue q.
func eventCount(t testing.TB, q db) int64 {
	t.Helper()
	return scalar[int64](t, q, `select count(*) from pgque.event e join pgque.queue qu on e.ev_part / 16 = qu.queue_id where qu.queue_name = 'q'`)
}

// waitLocked waits until the backend pid is waiting on a lock, failing the
// test when done delivers first (the call returned instead of waiting).
func waitLocked[T any](t testing.TB, q db, pid uint32, done <-chan T) {
	t.Helper()
	pgtest.WaitFor(t, 10*time.Second, "the second sender to wait for the first", func() bool {
		select {
		case r := <-done:
			t.Fatalf("second sender returned (%v) instead of waiting for the first", r)
		default:
		}
		wait := scalar[*string](t, q, "select wait_event_type from pg_catalog.pg_stat_activity where pid = $1", pid)
		return wait != nil && *wait == "Lock"
	})
}

// backdate moves every dedup key back by d, as if d had passed: the keyed
// events (a key's time is its event's ev_time), the records of reused
// keys, and the last generation switch.
func backdate(t testing.TB, q db, d string) {
	t.Helper()
	exec(t, q, `update pgque.event set ev_time = ev_time - $1::interval where ev_dedup is not null`, d)
	exec(t, q, `update pgque.dedup_0 set dd_time = dd_time - $1::interval`, d)
	exec(t, q, `update pgque.dedup_1 set dd_time = dd_time - $1::interval`, d)
	backdateSwitch(t, q, d)
}

// backdateSwitch moves the last generation switch back by d.
func backdateSwitch(t testing.TB, q db, d string) {
	t.Helper()
	exec(t, q, `update pgque.dedup_state set ds_switch_time = ds_switch_time - $1::interval`, d)
}

// dedupRecords counts the records of reused keys in generation gen (0 or
// 1), or in both for -1.
func dedupRecords(t testing.TB, q db, gen int) int64 {
	t.Helper()
	switch gen {
	case 0:
		return scalar[int64](t, q, `select count(*) from pgque.dedup_0`)
	case 1:
		return scalar[int64](t, q, `select count(*) from pgque.dedup_1`)
	}
	return dedupRecords(t, q, 0) + dedupRecords(t, q, 1)
}

// keyedEvents counts the events of queue q that hold their dedup key.
func keyedEvents(t testing.TB, q db) int64 {
	t.Helper()
	return scalar[int64](t, q, `select count(*) from pgque.event e join pgque.queue qu on e.ev_part / 16 = qu.queue_id
		where qu.queue_name = 'q' and e.ev_dedup is not null`)
}

// TestDedupSameKey: the same key twice in one transaction and in two
// committed transactions returns the first ev_id and stores one event; a
// different key, and a NULL key, make new events.
func TestDedupSameKey(t *testing.T) {
	ctx := context.Background()
	_, pool := setupEngine(t)

	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	a1 := sendKey(t, tx, "k1")
	a2 := sendKey(t, tx, "k1")
	if a1 != a2 {
		t.Fatalf("same key in one transaction: ev_ids %d and %d", a1, a2)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if a3 := sendKey(t, pool, "k1"); a3 != a1 {
		t.Fatalf("same key in a later transaction: ev_id %d, want %d", a3, a1)
	}
	if n := eventCount(t, pool); n != 1 {
		t.Fatalf("%d events stored for one key, want 1", n)
	}
	if b := sendKey(t, pool, "k2"); b == a1 {
		t.Fatal("a different key returned the first key's event")
	}
	n1 := scalar[int64](t, pool, `select pgque.send('q', 't', '{}', 'p', null)`)
	n2 := scalar[int64](t, pool, `select pgque.send('q', 't', '{}', 'p', dedup_key => null)`)
	if n1 == n2 {
		t.Fatal("two sends without a dedup key returned one ev_id")
	}
	if n := eventCount(t, pool); n != 4 {
		t.Fatalf("%d events, want 4 (k1, k2, two without a key)", n)
	}
	// The first event is the one stored, with its payload and keys.
	if typ := scalar[string](t, pool, `select ev_type || '/' || ev_extra1 from pgque.event where ev_id = $1`, a1); typ != "t/p" {
		t.Fatalf("stored event: %s", typ)
	}
}

// TestDedupRacingSenders: while one transaction holds an uncommitted send
// of a key, a second sender of the key waits; when the first commits the
// second gets its ev_id and nothing is stored, when it rolls back the key
// is free and the second sends a new event.
func TestDedupRacingSenders(t *testing.T) {
	for _, outcome := range []string{"commit", "rollback"} {
		t.Run(outcome, func(t *testing.T) {
			ctx := context.Background()
			dsn, pool := setupEngine(t)
			tx, first := holdKey(t, dsn, "race")
			c2 := pgtest.Conn(t, dsn)
			var err error

			done := sendKeyAsync(c2, "race")
			waitLocked(t, pool, c2.PgConn().PID(), done)

			if outcome == "commit" {
				err = tx.Commit(ctx)
			} else {
				err = tx.Rollback(ctx)
			}
			if err != nil {
				t.Fatal(err)
			}
			var r sendResult
			select {
			case r = <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("second sender still waiting after the first finished")
			}
			if r.err != nil {
				t.Fatal(r.err)
			}
			switch {
			case outcome == "commit" && r.id != first:
				t.Fatalf("after the first committed, second got ev_id %d, want %d", r.id, first)
			case outcome == "rollback" && r.id == first:
				t.Fatalf("after the first rolled back, second got its ev_id %d", r.id)
			}
			if n := eventCount(t, pool); n != 1 {
				t.Fatalf("%d events, want 1", n)
			}
			if got := sendKey(t, pool, "race"); got != r.id {
				t.Fatalf("a third send got %d, want %d", got, r.id)
			}
		})
	}
}

// TestDedupRacingRepeatableRead: under REPEATABLE READ a sender that had to
// wait for a concurrent sender of its key fails with 40001 instead of
// storing a duplicate it cannot see.
func TestDedupRacingRepeatableRead(t *testing.T) {
	ctx := context.Background()
	dsn, pool := setupEngine(t)
	c1, c2 := pgtest.Conn(t, dsn), pgtest.Conn(t, dsn)
	tx1, err := c1.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sendKey(t, tx1, "rr")
	tx2, err := c2.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	exec(t, tx2, "select 1") // takes the transaction snapshot now
	done := make(chan error, 1)
	go func() {
		_, err := tx2.Exec(ctx, `select pgque.send('q', 't', '{}', 'p', 'rr')`)
		done <- err
	}()
	waitLocked(t, pool, c2.PgConn().PID(), done)
	if err := tx1.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	wantCode(t, "racing send under repeatable read", <-done, "40001", "dedup key")
	_ = tx2.Rollback(ctx)
	if n := eventCount(t, pool); n != 1 {
		t.Fatalf("%d events, want 1", n)
	}
}

// TestDedupAfterRollback: a rolled-back send frees its key.
func TestDedupAfterRollback(t *testing.T) {
	ctx := context.Background()
	_, pool := setupEngine(t)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	gone := sendKey(t, tx, "rb")
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if id := sendKey(t, pool, "rb"); id == gone {
		t.Fatalf("send after rollback returned the rolled-back ev_id %d", id)
	}
	if n := eventCount(t, pool); n != 1 {
		t.Fatalf("%d events, want 1", n)
	}
}

// TestDedupWindow: once the window has passed, the key sends a new event;
// within it, it does not. The window is per queue.
func TestDedupWindow(t *testing.T) {
	_, pool := setupEngine(t)
	newQueue(t, pool, "other")
	exec(t, pool, `select pgque.set_queue_config('q', 'dedup_window', '10 seconds')`)
	if w := scalar[string](t, pool, `select queue_dedup_window::text from pgque.queue where queue_name = 'q'`); w != "00:00:10" {
		t.Fatalf("window stored as %s", w)
	}
	if w := scalar[*string](t, pool, `select queue_dedup_window::text from pgque.queue where queue_name = 'other'`); w != nil {
		t.Fatalf("queue without a window set stores %s (the default, 5 minutes, needs nothing)", *w)
	}
	first := sendKey(t, pool, "w")
	backdate(t, pool, "9 seconds")
	if id := sendKey(t, pool, "w"); id != first {
		t.Fatalf("within the window: ev_id %d, want %d", id, first)
	}
	backdate(t, pool, "2 seconds")
	second := sendKey(t, pool, "w")
	if second == first {
		t.Fatal("after the window the key still returned the old event")
	}
	if id := sendKey(t, pool, "w"); id != second {
		t.Fatalf("the new event is not remembered: %d, want %d", id, second)
	}
	if n := eventCount(t, pool); n != 2 {
		t.Fatalf("%d events, want 2", n)
	}
	// The expired event still holds the key's place in the current table,
	// so the reuse is recorded once in the generation tables; a third send
	// a window later overwrites that record rather than adding one.
	if n, k := dedupRecords(t, pool, -1), keyedEvents(t, pool); n != 1 || k != 1 {
		t.Fatalf("%d reuse records and %d keyed events for one key, want 1 and 1", n, k)
	}
	backdate(t, pool, "11 seconds")
	third := sendKey(t, pool, "w")
	if third == second || third == first {
		t.Fatal("a window after the reuse the key still returned an old event")
	}
	if id := sendKey(t, pool, "w"); id != third {
		t.Fatalf("the third event is not remembered: %d, want %d", id, third)
	}
	if n, e := dedupRecords(t, pool, -1), eventCount(t, pool); n != 1 || e != 3 {
		t.Fatalf("%d reuse records and %d events, want 1 and 3", n, e)
	}
	// The default window applies to a queue that set none: 5 minutes.
	o1 := scalar[int64](t, pool, `select pgque.send('other', 't', '{}', null, 'w')`)
	backdate(t, pool, "4 minutes")
	if o2 := scalar[int64](t, pool, `select pgque.send('other', 't', '{}', null, 'w')`); o2 != o1 {
		t.Fatalf("default window: after 4 minutes got %d, want %d", o2, o1)
	}
	backdate(t, pool, "2 minutes")
	if o3 := scalar[int64](t, pool, `select pgque.send('other', 't', '{}', null, 'w')`); o3 == o1 {
		t.Fatal("default window: the key still deduplicates after 6 minutes")
	}
}

// TestDedupAcrossRotation: a key keeps deduplicating after its event table
// is retired; a sender waiting for an open sender of its key finds that
// sender's event in the table retired meanwhile; a reused key is found
// across a rotation too; rotation keeps a retired table holding keys for
// the window (rotation_blockers says so) and then truncates it, freeing
// its keys.
func TestDedupAcrossRotation(t *testing.T) {
	ctx := context.Background()
	dsn, pool := setupEngine(t)
	exec(t, pool, `select pgque.unsubscribe('q', 'c')`) // no consumer pins a table
	exec(t, pool, `select pgque.set_queue_config('q', 'dedup_window', '1 minute')`)
	exec(t, pool, `select pgque.set_queue_config('q', 'rotation_period', '1 ms')`)
	rotate := func(want int32) {
		t.Helper()
		maintRotate(t, pool)
		if c := curTable(t, pool); c != want {
			t.Fatalf("current table %d, want %d", c, want)
		}
	}
	old := sendKey(t, pool, "old")
	reused := sendKey(t, pool, "reused")
	exec(t, pool, `update pgque.event set ev_time = ev_time - interval '2 minutes' where ev_id = $1`, reused)
	reused = sendKey(t, pool, "reused") // expired in table 0: sent again, recorded as a reuse
	if n := dedupRecords(t, pool, -1); n != 1 {
		t.Fatalf("%d reuse records, want 1", n)
	}

	// A sender with an open transaction holds its key; rotation does not
	// wait for it.
	c1, c2 := pgtest.Conn(t, dsn), pgtest.Conn(t, dsn)
	tx, err := c1.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	race := sendKey(t, tx, "race")
	rotate(1)
	done := make(chan int64, 1)
	go func() {
		var id int64
		if err := c2.QueryRow(ctx, `select pgque.send('q', 't', '{}', 'p', 'race')`).Scan(&id); err != nil {
			t.Error(err)
		}
		done <- id
	}()
	waitLocked(t, pool, c2.PgConn().PID(), done)
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if id := <-done; id != race {
		t.Fatalf("second sender got %d, want %d (the first's, in the retired table)", id, race)
	}
	for key, want := range map[string]int64{"old": old, "race": race, "reused": reused} {
		if id := sendKey(t, pool, key); id != want {
			t.Fatalf("key %s after a rotation: %d, want %d", key, id, want)
		}
	}
	fresh := sendKey(t, pool, "fresh") // in table 1
	rotate(2)
	if id := sendKey(t, pool, "old"); id != old {
		t.Fatalf("key two tables back: %d, want %d", id, old)
	}

	// Table 0 holds keys and was retired less than a window ago: rotation
	// keeps it, and says why.
	rotate(2)
	why := scalar[string](t, pool, `select what from pgque.rotation_blockers() where queue = 'q' and kind = 'retention'`)
	if !strings.Contains(why, "dedup_window") {
		t.Fatalf("rotation_blockers: %q", why)
	}
	if id := sendKey(t, pool, "race"); id != race {
		t.Fatalf("key in the held table: %d, want %d", id, race)
	}

	// A window after its retirement it is truncated and made current: its
	// keys are free, table 1's are not.
	exec(t, pool, `update pgque.event set ev_time = ev_time - interval '2 minutes' where ev_part % 16 = 0`)
	exec(t, pool, `update pgque.dedup_0 set dd_time = dd_time - interval '2 minutes'`)
	exec(t, pool, `update pgque.dedup_1 set dd_time = dd_time - interval '2 minutes'`)
	exec(t, pool, `update pgque.queue set queue_retired[1] = queue_retired[1] - interval '2 minutes' where queue_name = 'q'`)
	rotate(0)
	if n := scalar[int64](t, pool, `select count(*) from pgque.event_1_0`); n != 0 {
		t.Fatalf("table 0 holds %d events after its truncation", n)
	}
	if id := sendKey(t, pool, "fresh"); id != fresh {
		t.Fatalf("key in table 1: %d, want %d", id, fresh)
	}
	for _, key := range []string{"old", "race", "reused"} {
		if id := sendKey(t, pool, key); id == old || id == race || id == reused {
			t.Fatalf("key %s still deduplicated after its table was truncated", key)
		}
	}

	// The generation tables of reused keys turn at the pace of the longest
	// window of any queue.
	gen := func() int32 { return scalar[int32](t, pool, `select ds_cur from pgque.dedup_state`) }
	backdateSwitch(t, pool, "2 minutes")
	exec(t, pool, `select pgque.maint()`)
	if g := gen(); g != 1 {
		t.Fatalf("generation %d after a window, want 1", g)
	}
	newQueue(t, pool, "slow")
	exec(t, pool, `select pgque.set_queue_config('slow', 'dedup_window', '1 hour')`)
	backdateSwitch(t, pool, "2 minutes")
	exec(t, pool, `select pgque.maint()`)
	if g := gen(); g != 1 {
		t.Fatalf("generations turned after 2 minutes although queue slow keeps keys for an hour: %d", g)
	}
	backdateSwitch(t, pool, "1 hour")
	exec(t, pool, `select pgque.maint()`)
	if g := gen(); g != 0 {
		t.Fatalf("no turn after the longest window: generation %d", g)
	}
	if n := dedupRecords(t, pool, -1); n != 0 {
		t.Fatalf("%d reuse records two windows on, want 0", n)
	}
}

// TestDedupRepeatableReadUnseen: a REPEATABLE READ sender whose snapshot
// predates a committed send of its key (no lock to wait for) fails with
// 40001 rather than storing a duplicate, through send and send_batch.
func TestDedupRepeatableReadUnseen(t *testing.T) {
	ctx := context.Background()
	dsn, pool := setupEngine(t)
	for i, call := range []string{
		`select pgque.send('q', 't', '{}', 'p', $1)`,
		`select pgque.send_batch('q', 't', array['{}']::jsonb[], dedup_keys => array[$1])`,
	} {
		key := fmt.Sprintf("rr%d", i)
		c := pgtest.Conn(t, dsn)
		tx, err := c.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
		if err != nil {
			t.Fatal(err)
		}
		exec(t, tx, "select 1") // takes the transaction snapshot now
		sendKey(t, pool, key)
		_, err = tx.Exec(ctx, call, key)
		wantCode(t, call+" under repeatable read", err, "40001")
		_ = tx.Rollback(ctx)
		if n := eventCount(t, pool); n != int64(i+1) {
			t.Fatalf("%d events, want %d", n, i+1)
		}
	}
}

// TestDedupUpgradeMovesKeys: an install over the layout that kept every
// key in the generation tables and the window in pgque.queue_dedup moves
// the window into the queue row and each key's newest record into its
// event's row, so the keys keep deduplicating.
func TestDedupUpgradeMovesKeys(t *testing.T) {
	dsn, pool := setupEngine(t)
	a := scalar[int64](t, pool, `select pgque.send('q', 't', '{}', 'p')`)
	b := scalar[int64](t, pool, `select pgque.send('q', 't', '{}', 'p')`)
	// The earlier layout, by hand: no key column, the window in a table of
	// its own, key "k" stored twice (an expired record for event a, the
	// live one for event b) and "gone" for an event no longer stored.
	exec(t, pool, `alter table pgque.event drop column ev_dedup`)
	exec(t, pool, `create table pgque.queue_dedup (qd_queue integer primary key, qd_window interval not null)`)
	exec(t, pool, `insert into pgque.queue_dedup select queue_id, '10 minutes' from pgque.queue where queue_name = 'q'`)
	exec(t, pool, `update pgque.queue set queue_dedup_window = null`)
	exec(t, pool, `insert into pgque.dedup_0 select queue_id, 'k', $1, now() - interval '20 minutes' from pgque.queue where queue_name = 'q'`, a)
	exec(t, pool, `insert into pgque.dedup_1 select queue_id, 'k', $1, now() from pgque.queue where queue_name = 'q'`, b)
	exec(t, pool, `insert into pgque.dedup_1 select queue_id, 'gone', 999999, now() from pgque.queue where queue_name = 'q'`)

	reinstall(t, dsn)

	if w := scalar[string](t, pool, `select queue_dedup_window::text from pgque.queue where queue_name = 'q'`); w != "00:10:00" {
		t.Fatalf("window after the upgrade: %s", w)
	}
	if reg := scalar[*string](t, pool, `select to_regclass('pgque.queue_dedup')::text`); reg != nil {
		t.Fatalf("%s still exists", *reg)
	}
	if got := column[int64](t, pool, `select ev_id from pgque.event where ev_dedup = 'k'`); len(got) != 1 || got[0] != b {
		t.Fatalf("events holding key k: %v, want [%d]", got, b)
	}
	if id := sendKey(t, pool, "k"); id != b {
		t.Fatalf("key k after the upgrade: %d, want %d", id, b)
	}
}

// TestDedupSendBatch: duplicate keys inside one batch get the first
// element's ev_id; NULL elements are not deduplicated; keys sent earlier
// return their events.
func TestDedupSendBatch(t *testing.T) {
	_, pool := setupEngine(t)
	before := sendKey(t, pool, "seen")
	ids := column[int64](t, pool, `select unnest(pgque.send_batch('q', 't',
		array['{"n":1}', '{"n":2}', '{"n":3}', '{"n":4}', '{"n":5}', '{"n":6}']::jsonb[],
		partition_keys => array['p1', 'p2', 'p3', 'p4', 'p5', 'p6'],
		dedup_keys => array['a', 'b', 'a', null, null, 'seen']))`)
	if len(ids) != 6 {
		t.Fatalf("%d ids, want 6", len(ids))
	}
	if ids[0] != ids[2] {
		t.Errorf("duplicate key in the batch: ev_ids %d and %d", ids[0], ids[2])
	}
	if ids[3] == ids[4] || ids[0] == ids[1] {
		t.Errorf("distinct elements share ev_ids: %v", ids)
	}
	if ids[5] != before {
		t.Errorf("key sent before the batch: ev_id %d, want %d", ids[5], before)
	}
	if n := eventCount(t, pool); n != 5 {
		t.Fatalf("%d events, want 5 (seen, a, b, two without a key)", n)
	}
	// Elements keep their own payload and partition key, in order.
	got := column[string](t, pool, `select ev_data || ev_extra1 from pgque.event where ev_id = any($1) order by ev_id`, ids[:5])
	if strings.Join(got, ",") != `{"n": 1}p1,{"n": 2}p2,{"n": 4}p4,{"n": 5}p5` {
		t.Errorf("stored events: %v", got)
	}
}

// TestDedupBadInput: empty and over-long keys, mismatched key arrays, too
// many keys in one batch and out-of-range windows are refused with their
// SQLSTATEs, storing nothing.
func TestDedupBadInput(t *testing.T) {
	_, pool := setupEngine(t)
	long := strings.Repeat("x", 513)
	for _, c := range []struct {
		sql, code, mention string
		args               []any
	}{
		{`select pgque.send('q', 't', '{}', null, '')`, "PQ063", "empty", nil},
		{`select pgque.send('q', 't', '{}', null, $1)`, "PQ063", "513 bytes", []any{long}},
		{`select pgque.send_batch('q', 't', array['{}', '{}']::jsonb[], dedup_keys => array['a', ''])`, "PQ063", "dedup key 2", nil},
		{`select pgque.send_batch('q', 't', array['{}', '{}']::jsonb[], dedup_keys => array['a'])`, "PQ011", "1 dedup keys for 2 payloads", nil},
		{`select pgque.send('nope', 't', '{}', null, 'k')`, "PQ001", "nope", nil},
		{`select pgque.set_queue_config('q', 'dedup_window', '-5 minutes')`, "PQ011", "dedup_window", nil},
		{`select pgque.set_queue_config('q', 'dedup_window', '0')`, "PQ011", "between 1 second and 7 days", nil},
		{`select pgque.set_queue_config('q', 'dedup_window', '30 days')`, "PQ011", "between 1 second and 7 days", nil},
		{`select pgque.set_queue_config('q', 'dedup_window', 'soon')`, "PQ011", "must be an interval", nil},
		{`select pgque.set_queue_config('q', 'dedup_windo', '1 minute')`, "PQ012", "dedup_window", nil},
		{`select pgque.send_batch('q', 't', array_fill('{}'::jsonb, array[1001]), dedup_keys => (select array_agg('k' || i) from generate_series(1, 1001) i))`,
			"PQ011", "at most 1000", nil},
	} {
		wantCode(t, c.sql, queryErr(pool, c.sql, c.args...), c.code, c.mention)
	}
	if n := eventCount(t, pool); n != 0 {
		t.Fatalf("%d events stored by refused sends", n)
	}
	// 512 bytes is accepted.
	sendKey(t, pool, strings.Repeat("x", 512))
}

// TestDedupRacingReuse: two senders reusing one expired key at once: the
// second waits for the first and, once it commits, gets its ev_id; one
// event is stored for the reuse.
func TestDedupRacingReuse(t *testing.T) {
	ctx := context.Background()
	dsn, pool := setupEngine(t)
	old := sendKey(t, pool, "reuse")
	exec(t, pool, `update pgque.event set ev_time = ev_time - interval '10 minutes' where ev_id = $1`, old)
	tx, first := holdKey(t, dsn, "reuse")
	c2 := pgtest.Conn(t, dsn)
	if first == old {
		t.Fatal("an expired key returned its old event")
	}
	done := sendKeyAsync(c2, "reuse")
	waitLocked(t, pool, c2.PgConn().PID(), done)
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil || r.id != first {
		t.Fatalf("second reuser: %d %v, want %d", r.id, r.err, first)
	}
	if n := eventCount(t, pool); n != 2 {
		t.Fatalf("%d events, want 2 (the expired one and one reuse)", n)
	}
}

// TestDedupBatchKeyOrder: a send_batch takes its keys in key order, so
// while it waits for a key held by an open transaction it holds none of
// its keys that sort after it, and two batches sharing keys in opposite
// orders cannot deadlock.
func TestDedupBatchKeyOrder(t *testing.T) {
	ctx := context.Background()
	dsn, pool := setupEngine(t)
	tx, held := holdKey(t, dsn, "a")
	c2 := pgtest.Conn(t, dsn)
	done := make(chan error, 1)
	go func() {
		_, err := c2.Exec(ctx, `select pgque.send_batch('q', 't', array['{}', '{}']::jsonb[], dedup_keys => array['b', 'a'])`)
		done <- err
	}()
	waitLocked(t, pool, c2.PgConn().PID(), done)
	c3 := pgtest.Conn(t, dsn)
	exec(t, c3, `set statement_timeout = '5s'`)
	b := sendKey(t, c3, "b") // would wait for the batch had it taken "b" first
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	ids := column[int64](t, pool, `select unnest(pgque.send_batch('q', 't', array['{}', '{}']::jsonb[], dedup_keys => array['b', 'a']))`)
	if len(ids) != 2 || ids[0] != b || ids[1] != held {
		t.Fatalf("batch after both committed: %v, want [%d %d]", ids, b, held)
	}
}

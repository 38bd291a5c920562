package partitiontest

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// tickScans runs f in a transaction on conn and returns how many rows of
// the tick tables it read by sequential scans, from the transaction's own
// statistics. (An empty tick table may be scanned: it has no row to read.)
func tickScans(t *testing.T, conn *pgxpool.Conn, f func(tx pgx.Tx)) int64 {
	t.Helper()
	return xactDelta(t, conn, `select coalesce(sum(seq_tup_read), 0)::bigint from pg_catalog.pg_stat_xact_user_tables
		where schemaname = 'pgque' and relname like 'tick\_%'`, f)[0]
}

// T-tick-probes: whether a later tick exists is asked of the tick index,
// whatever plan the session has cached. Every poll of the read path that
// finds nothing asks it (receive_partitioned_raw, receive_raw), and so does
// a chunk that reaches its batch's end (to wake a slot that is behind).
// Asked as EXISTS, the generic plan a session caches after five calls may
// read the whole tick table to find no later tick: costing the first row
// of an EXISTS, the planner prefers a scan with no start-up cost while the
// table's pages are not all-visible (a tick table maint has just flipped,
// before autovacuum reaches it), and at 100 ticks a second that table
// holds thousands of rows. Here autovacuum is off on the tick tables,
// which hold 3000 analyzed ticks; each question is asked ten times on one
// connection, and none may read a tick table's rows by a sequential scan.
func TestTickProbesUseTheIndex(t *testing.T) {
	d := setup(t)
	ctx := context.Background()
	d.createQueue("q")
	d.exec("alter table pgque.tick_0 set (autovacuum_enabled = off)")
	d.exec("alter table pgque.tick_1 set (autovacuum_enabled = off)")
	// 3000 ticks, as maint leaves between two flips at 100 ticks a second:
	// enough pages that a lookup by tick id is planned on the index (a
	// table of a few pages is rightly scanned whole). Written at once, as
	// ticks of an idle queue: the same snapshot and event position.
	d.exec(`insert into pgque.tick (tick_queue, tick_id, tick_time, tick_snapshot, tick_event_seq)
		select q.queue_id, nextval('pgque.tick_id_seq'), clock_timestamp(), pg_current_snapshot(),
		       coalesce(pg_sequence_last_value(q.queue_event_seq), 0)
		  from pgque.queue q, generate_series(1, 3000) where q.queue_name = 'q'`)
	d.tick("q")
	d.exec("analyze pgque.tick")
	if v := one[int32](t, d.pool, `select coalesce(sum(relallvisible), 0)::integer from pg_catalog.pg_class
		where relnamespace = 'pgque'::regnamespace and relname like 'tick\_%' and relkind = 'r'`); v != 0 {
		t.Fatalf("the tick tables have %d all-visible pages, want 0 (vacuumed: the test would prove nothing)", v)
	}
	// Subscribed after the ticks: every consumer is caught up.
	d.subscribeSlots("q", "c", 4)
	d.exec("select pgque.subscribe('q', 'p')")
	mustClaim(t, d.pool, "q", "c", 0, "w", "1 hour")
	mustClaim(t, d.pool, "q", "c", 1, "w", "1 hour")
	tok0 := tokenFor(t, d.pool, "q", "c", 0, "w")
	tok1 := tokenFor(t, d.pool, "q", "c", 1, "w")
	key := one[string](t, d.pool, `select k from (select 'k' || g as k from generate_series(0, 99) g) x
		where pgque.slot_of(k, 4) = 1 limit 1`)

	conn, err := d.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	count := func(tx pgx.Tx, sql string, args ...any) int {
		t.Helper()
		var n int
		if err := tx.QueryRow(ctx, "select count(*)::integer from "+sql, args...).Scan(&n); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
		return n
	}
	polls := []struct {
		name string
		poll func(tx pgx.Tx)
	}{
		{"receive_partitioned_raw, an idle slot", func(tx pgx.Tx) {
			if n := count(tx, "pgque.receive_partitioned_raw('q', 'c', 0, 4, 'w', $1::uuid, 100)", tok0); n != 0 {
				t.Fatalf("the idle slot received %d events", n)
			}
		}},
		{"receive_raw, a caught-up consumer", func(tx pgx.Tx) {
			if n := count(tx, "pgque.receive_raw('q', 'p', 100)"); n != 0 {
				t.Fatalf("the caught-up consumer received %d events", n)
			}
		}},
	}
	for _, p := range polls {
		var scans int64
		for range 10 {
			scans += tickScans(t, conn, p.poll)
		}
		if scans != 0 {
			t.Errorf("%s: %d tick rows read by sequential scans in 10 polls, want 0", p.name, scans)
		}
	}

	// A chunk that reaches its batch's end asks whether a later tick
	// exists (the slot is behind): one event at a time for slot 1, each
	// chunk's acknowledgement folded into the next call.
	var scans int64
	var epoch, batch, msgID *int64
	for i := range 10 {
		d.send("q", &key)
		d.tick("q")
		scans += tickScans(t, conn, func(tx pgx.Tx) {
			rows, err := tx.Query(ctx, `select epoch, batch_id, msg_id
				from pgque.receive_partitioned_raw('q', 'c', 1, 4, 'w', $1::uuid, 100, $2, $3, $4)`, tok1, epoch, batch, msgID)
			if err != nil {
				t.Fatal(err)
			}
			n := 0
			for rows.Next() {
				var e, b, m int64
				if err := rows.Scan(&e, &b, &m); err != nil {
					t.Fatal(err)
				}
				epoch, batch, msgID = &e, &b, &m
				n++
			}
			if err := rows.Err(); err != nil {
				t.Fatal(err)
			}
			if n != 1 {
				t.Fatalf("call %d: slot 1 received %d events, want 1", i, n)
			}
		})
	}
	if scans != 0 {
		t.Errorf("a chunk at its batch's end: %d tick rows read by sequential scans in 10 calls, want 0", scans)
	}
}

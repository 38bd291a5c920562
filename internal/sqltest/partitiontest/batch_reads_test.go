package partitiontest

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
)

// eventRowsRead runs f in a transaction and returns the rows of pgque's
// event tables it read (sequential reads plus index fetches, bitmap heap
// scans included), from the transaction's own statistics.
func eventRowsRead(t *testing.T, d *db, f func(tx pgx.Tx)) int64 {
	t.Helper()
	const rows = `select coalesce(sum(seq_tup_read + coalesce(idx_tup_fetch, 0)), 0)::bigint
		from pg_catalog.pg_stat_xact_user_tables where schemaname = 'pgque' and relname like 'event\_%'`
	var n int64
	err := pgx.BeginFunc(context.Background(), d.pool, func(tx pgx.Tx) error {
		before := one[int64](t, tx, rows)
		f(tx)
		n = one[int64](t, tx, rows) - before
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// T-read-history: a batch's reads stay within the batch, whatever the
// table holds and whatever the planner knows of it. After 3000 keyed events
// with dedup keys, acknowledged, in a table never analyzed (a new queue, or
// one a rotation just emptied), each read path (receive_raw,
// receive_partitioned_raw, get_batch_events, slot_heads) reads a handful
// of rows for a 3-event batch. Three plans read the whole history before:
// the batch's two parts written as one OR, which no routing-index range
// bounds, so a slot's read scanned its routing index by slot alone; an
// empty list of running transactions ("ev_txid = any('{}')"), which the
// planner proves false and may answer from any partial index, such as the
// dedup key index; and slot_heads' "ev_txid = any(list) order by ev_txid",
// an in-order scan of the slot's index with the list as a filter.
func TestReadsStayInTheBatch(t *testing.T) {
	d := setup(t)
	d.createQueue("q")
	d.exec("select pgque.subscribe('q', 'plain')")
	d.exec("select pgque.register_consumer('q', 'pgq')")
	const n = 2
	d.subscribeSlots("q", "s", n)
	slots := d.claimAll("q", "s", n, "w", 1000)
	d.exec(`select count(pgque.send('q', 't', '{}'::text, 'k' || (g % 7), 'd' || g)) from generate_series(1, 3000) g`)
	d.tick("q")

	// Everyone drains the keyed events and stands on a tick that saw no
	// transaction running (one of this cluster's other tests may hold one
	// for a moment: tick again until a tick's snapshot lists none).
	ctx := context.Background()
	drainAll := func() {
		for range 100 {
			var b *int64
			if err := d.pool.QueryRow(ctx, "select max(batch_id) from pgque.receive_raw('q', 'plain', 1000)").Scan(&b); err != nil {
				t.Fatal(err)
			}
			if b == nil {
				break
			}
			d.exec("select pgque.ack($1)", *b)
		}
		for {
			var batch *int64
			if err := d.pool.QueryRow(ctx, "select pgque.next_batch('q', 'pgq')").Scan(&batch); err != nil {
				t.Fatal(err)
			}
			if batch == nil {
				break
			}
			d.exec("select count(*) from pgque.get_batch_events($1)", *batch)
			d.exec("select pgque.finish_batch($1)", *batch)
		}
		for _, s := range slots {
			drain(t, d.pool, s)
		}
	}
	clean := false
	for range 50 {
		drainAll()
		d.exec("select pgque.force_next_tick('q')")
		d.tick("q")
		if one[bool](t, d.pool, `select cardinality(array(select pg_catalog.pg_snapshot_xip(t.tick_snapshot))) = 0
			from pgque.tick t join pgque.queue q on q.queue_id = t.tick_queue
			where q.queue_name = 'q' order by t.tick_id desc limit 1`) {
			clean = true
			break
		}
	}
	if !clean {
		t.Fatal("no tick in 50 without a running transaction in its snapshot")
	}
	drainAll()
	d.exec(`select count(pgque.send('q', 't', '{}'::text, 'k' || g)) from generate_series(1, 3) g`)
	d.tick("q")

	const most = 50
	check := func(what string, got int64) {
		t.Helper()
		if got > most {
			t.Errorf("%s read %d event rows for a 3-event batch, want at most %d (the rows of earlier batches)", what, got, most)
		}
	}
	check("slot_heads", eventRowsRead(t, d, func(tx pgx.Tx) {
		one[int64](t, tx, "select count(*) from pgque.slot_heads('q', 's')")
	}))
	check("receive_raw", eventRowsRead(t, d, func(tx pgx.Tx) {
		if got := one[int64](t, tx, "select count(*) from pgque.receive_raw('q', 'plain', 100)"); got != 3 {
			t.Fatalf("receive_raw gave %d events, want 3", got)
		}
	}))
	var batch int64
	check("next_batch + get_batch_events", eventRowsRead(t, d, func(tx pgx.Tx) {
		batch = one[int64](t, tx, "select pgque.next_batch('q', 'pgq')")
		if got := one[int64](t, tx, "select count(*) from pgque.get_batch_events($1)", batch); got != 3 {
			t.Fatalf("get_batch_events gave %d events, want 3", got)
		}
	}))
	total := int64(0)
	for _, s := range slots {
		check("receive_partitioned_raw", eventRowsRead(t, d, func(tx pgx.Tx) {
			total += one[int64](t, tx, "select count(*) from pgque.receive_partitioned_raw('q', 's', $1, $2, 'w', $3::uuid, 100)",
				s.slot, s.n, tokenFor(t, d.pool, "q", "s", s.slot, "w"))
		}))
	}
	if total != 3 {
		t.Fatalf("the slots received %d events, want 3", total)
	}
}

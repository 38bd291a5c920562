package partitiontest

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgque/pgque/internal/testing/pgtest"
)

// readCost is what one read did, from its transaction's own statistics:
// event rows read (as eventRowsRead counts them) and calls of the queue
// readers (pgque._read_<queue>_<N>).
type readCost struct {
	rows, readerCalls int64
}

func measureRead(t *testing.T, conn *pgxpool.Conn, f func(tx pgx.Tx)) readCost {
	t.Helper()
	d := xactDelta(t, conn, `select (select coalesce(sum(seq_tup_read + coalesce(idx_tup_fetch, 0)), 0)::bigint
		  from pg_catalog.pg_stat_xact_user_tables where schemaname = 'pgque' and relname like 'event\_%'),
		(select coalesce(sum(calls), 0)::bigint
		  from pg_catalog.pg_stat_xact_user_functions where schemaname = 'pgque' and funcname like '\_read\_%')`, f)
	return readCost{rows: d[0], readerCalls: d[1]}
}

// xactDelta runs f in a transaction on conn (with track_functions = 'pl')
// and returns how much each bigint column of stats, a query of the
// transaction's own statistics (pg_stat_xact_*), grew meanwhile.
func xactDelta(t *testing.T, conn *pgxpool.Conn, stats string, f func(tx pgx.Tx)) []int64 {
	t.Helper()
	ctx := context.Background()
	var delta []int64
	read := func(tx pgx.Tx) ([]int64, error) {
		rows, err := tx.Query(ctx, stats)
		if err != nil {
			return nil, err
		}
		return pgx.CollectExactlyOneRow(rows, func(r pgx.CollectableRow) ([]int64, error) {
			vals, err := r.Values()
			out := make([]int64, len(vals))
			for i, v := range vals {
				out[i] = v.(int64)
			}
			return out, err
		})
	}
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "set local track_functions = 'pl'"); err != nil {
			return err
		}
		before, err := read(tx)
		if err != nil {
			return err
		}
		f(tx)
		after, err := read(tx)
		if err != nil {
			return err
		}
		for i := range after {
			delta = append(delta, after[i]-before[i])
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return delta
}

// receiveIDs returns the ev_ids of one receive_raw chunk and acknowledges it.
func receiveIDs(t *testing.T, q querier, queue, consumer string, max int) []int64 {
	t.Helper()
	var ids []int64
	var batch *int64
	err := q.QueryRow(context.Background(), `select coalesce(array_agg(msg_id order by msg_id), '{}'), max(batch_id)
		from pgque.receive_raw($1, $2, $3)`, queue, consumer, max).Scan(&ids, &batch)
	if err != nil {
		t.Fatal(err)
	}
	if batch != nil {
		if _, err := q.Exec(context.Background(), "select pgque.ack($1)", *batch); err != nil {
			t.Fatal(err)
		}
	}
	return ids
}

// T-readers: a queue gets a reader per slot count its consumers use, made
// when the first consumer of that N subscribes: not SECURITY DEFINER, its
// search_path pinned, executable by no role. Small chunks are read through
// it (its plan made once per session), large ones inline, and both read
// exactly the same events (a chunk is small by max or by the events sent
// between its batch's ticks). A batch whose first tick saw a transaction
// running reads, through the reader's cached plan too, only the rows of the
// batch after 3000 acknowledged events of the same keys. Without a reader
// the entry points read inline, and maint drops the readers of a dropped
// queue.
func TestReaders(t *testing.T) {
	d := setup(t)
	ctx := context.Background()
	d.createQueue("q")
	qid := one[int32](t, d.pool, "select queue_id from pgque.queue where queue_name = 'q'")
	d.exec("select pgque.subscribe('q', 'small')")
	d.exec("select pgque.subscribe('q', 'large')")
	const n = 4
	d.subscribeSlots("q", "s", n)
	slots := d.claimAll("q", "s", n, "w", 100)

	type reader struct {
		Name                          string
		Definer                       bool
		Config                        string
		Reader, Writer, Admin, Public bool
	}
	rows, err := d.pool.Query(ctx, `select p.proname::text, p.prosecdef, coalesce(array_to_string(p.proconfig, ','), ''),
		       has_function_privilege('pgque_reader', p.oid, 'execute'), has_function_privilege('pgque_writer', p.oid, 'execute'),
		       has_function_privilege('pgque_admin', p.oid, 'execute'), has_function_privilege('public', p.oid, 'execute')
		  from pg_proc p where p.pronamespace = 'pgque'::regnamespace and p.proname like '\_read\_%' order by 1`)
	if err != nil {
		t.Fatal(err)
	}
	readers, err := pgx.CollectRows(rows, pgx.RowToStructByPos[reader])
	if err != nil {
		t.Fatal(err)
	}
	want := []string{fmt.Sprintf("_read_%d_1", qid), fmt.Sprintf("_read_%d_%d", qid, n)}
	var names []string
	for _, r := range readers {
		names = append(names, r.Name)
		if r.Definer || r.Reader || r.Writer || r.Admin || r.Public ||
			r.Config != "search_path=pg_catalog, pg_temp,plan_cache_mode=force_generic_plan,enable_seqscan=off" {
			t.Errorf("reader %+v: want SECURITY INVOKER, search_path pinned, executable by no role", r)
		}
	}
	if !slices.Equal(names, want) {
		t.Fatalf("readers %v, want %v", names, want)
	}
	// The queue's key reader (pgque.tick_slots.sql), which its ticks call.
	rows, err = d.pool.Query(ctx, `select p.proname::text, p.prosecdef, coalesce(array_to_string(p.proconfig, ','), ''),
		       has_function_privilege('pgque_reader', p.oid, 'execute'), has_function_privilege('pgque_writer', p.oid, 'execute'),
		       has_function_privilege('pgque_admin', p.oid, 'execute'), has_function_privilege('public', p.oid, 'execute')
		  from pg_proc p where p.pronamespace = 'pgque'::regnamespace and p.proname ~ '^_slot_keys_[0-9]+$' order by 1`)
	if err != nil {
		t.Fatal(err)
	}
	keys, err := pgx.CollectRows(rows, pgx.RowToStructByPos[reader])
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 1 || keys[0].Name != fmt.Sprintf("_slot_keys_%d", qid) || keys[0].Definer ||
		keys[0].Reader || keys[0].Writer || keys[0].Admin || keys[0].Public ||
		keys[0].Config != "search_path=pg_catalog, pg_temp,plan_cache_mode=force_generic_plan" {
		t.Errorf("key readers %+v: want _slot_keys_%d, SECURITY INVOKER, search_path pinned, executable by no role", keys, qid)
	}

	// Every read runs on this one session, so the readers' plans are made
	// once, now, while the tables are empty, and then serve a table of
	// thousands of rows: nothing tells the session to plan again.
	conn, err := d.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	drainAll := func() {
		for len(receiveIDs(t, conn, "q", "small", 100)) > 0 {
		}
		for len(receiveIDs(t, conn, "q", "large", 1000)) > 0 {
		}
		for _, s := range slots {
			drain(t, conn, s)
		}
	}
	d.tick("q") // an empty batch: the readers run (and plan) on empty tables
	if c := measureRead(t, conn, func(pgx.Tx) { drainAll() }); c.readerCalls == 0 {
		t.Fatal("the first reads made no reader call")
	}

	// History: 3000 keyed events, acknowledged by everyone. A chunk of up
	// to 1000 of them is read inline, chunks of 100 by the reader.
	d.exec(`select count(pgque.send('q', 't', '{}'::text, 'k' || (g % 7))) from generate_series(1, 3000) g`)
	d.tick("q")
	if c := measureRead(t, conn, func(tx pgx.Tx) { receiveIDs(t, tx, "q", "large", 1000) }); c.readerCalls != 0 {
		t.Errorf("a chunk of 1000 events of a 3000-event batch: %d reader calls, want none", c.readerCalls)
	}
	if c := measureRead(t, conn, func(tx pgx.Tx) { receiveIDs(t, tx, "q", "small", 100) }); c.readerCalls == 0 {
		t.Error("a chunk of 100 events: no reader call")
	}
	drainAll()

	// A batch whose first tick saw a transaction running: the one event
	// that transaction sent is read by the probe of running xids.
	other, err := d.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Release()
	tx, err := other.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	late := one[int64](t, tx, "select pgque.send('q', 't', '{}'::text, 'k1')")
	d.tick("q")
	var sent []int64
	for g := range 3 {
		sent = append(sent, one[int64](t, d.pool, "select pgque.send('q', 't', '{}'::text, $1)", fmt.Sprintf("k%d", g)))
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	d.tick("q")
	sent = append(sent, late)
	slices.Sort(sent)

	const most = 50
	var small, large, parts []int64
	c := measureRead(t, conn, func(tx pgx.Tx) { small = receiveIDs(t, tx, "q", "small", 100) })
	if c.readerCalls == 0 || c.rows > most {
		t.Errorf("receive_raw max 100: %d reader calls, %d event rows read; want the reader, at most %d rows", c.readerCalls, c.rows, most)
	}
	// The same batch inline: without the reader (whose absence the entry
	// points survive).
	d.exec(fmt.Sprintf("drop function pgque._read_%d_1", qid))
	c = measureRead(t, conn, func(tx pgx.Tx) { large = receiveIDs(t, tx, "q", "large", 1000) })
	if c.readerCalls != 0 || c.rows > most {
		t.Errorf("receive_raw without a reader: %d reader calls, %d event rows read; want none, at most %d rows", c.readerCalls, c.rows, most)
	}
	d.exec("select pgque._make_reader($1, 1, false)", qid)
	for _, s := range slots {
		c = measureRead(t, conn, func(tx pgx.Tx) {
			ms := mustReceive(t, tx, s)
			for _, m := range ms {
				parts = append(parts, m.ID)
			}
			if len(ms) > 0 {
				mustAck(t, tx, s)
			}
		})
		if c.readerCalls == 0 || c.rows > most {
			t.Errorf("slot %d: %d reader calls, %d event rows read; want the reader, at most %d rows", s.slot, c.readerCalls, c.rows, most)
		}
	}
	slices.Sort(parts)
	if !slices.Equal(small, sent) || !slices.Equal(large, sent) || !slices.Equal(parts, sent) {
		t.Fatalf("sent %v; read through the reader %v, inline %v, by the slots %v", sent, small, large, parts)
	}
	drainAll()

	// A reader made again serves the next chunk, even with max 1000: the
	// batch holds one event. (Ticked by the ticker's own rule, once
	// ticker_max_lag has passed: force_next_tick moves the event sequence
	// past the events it counts.)
	id := d.send("q", nil)
	if !pgtest.Eventually(context.Background(), 10*time.Second, func() bool {
		return one[*int64](t, d.pool, "select pgque.ticker('q')") != nil
	}) {
		t.Fatal("the ticker made no tick for a pending event in 10 s")
	}
	c = measureRead(t, conn, func(tx pgx.Tx) { large = receiveIDs(t, tx, "q", "large", 1000) })
	if c.readerCalls == 0 || !slices.Equal(large, []int64{id}) {
		t.Errorf("after _make_reader: %d reader calls, events %v; want the reader, [%d]", c.readerCalls, large, id)
	}

	// A dropped queue's readers go with the next maint.
	d.createQueue("gone")
	d.exec("select pgque.subscribe('gone', 'c')")
	d.exec("select pgque.drop_queue('gone', true)")
	d.exec("select pgque.maint()")
	if left := one[int64](t, d.pool, `select count(*) from pg_proc where pronamespace = 'pgque'::regnamespace
		and proname ~ '^_read_' and not exists (select 1 from pgque.queue q where proname like '\_read\_' || q.queue_id || '\_%')`); left != 0 {
		t.Errorf("%d readers of dropped queues left after maint", left)
	}
}

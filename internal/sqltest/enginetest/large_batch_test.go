package enginetest

import (
	"context"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgque/pgque/internal/testing/pgtest"
)

// TestLargeBatchChunks: batches far larger than a chunk, of every shape
// the read path tells apart, are handed out in full chunks of exactly max
// rows in ev_id order, every event exactly once, the same events an engine
// consumer gets batch by batch; and draining them reads each event from the
// index a bounded number of times, not once per chunk (the window of
// "Large batches" in docs/design.md). The shapes:
//   - a transaction that spans ticks (in the batch through the previous
//     tick's running transactions), with single sends committed between
//     its pieces and a transaction that stays open across it and commits
//     after it (its events, interleaved by ev_id, belong to a later batch);
//   - a transaction committed between two ticks with a few other xids
//     (the range short enough to be read as a list of xids);
//   - a transaction committed between two ticks with hundreds of other
//     xids taken meanwhile (the range read as a range);
//   - a thousand one-event transactions between two ticks.
func TestLargeBatchChunks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn, pool := setupDB(t)
	exec(t, pool, "select pgque.create_queue('q')")
	exec(t, pool, "select pgque.subscribe('q', 'c')")
	exec(t, pool, "select pgque.register_consumer('q', 'ref')")
	send := func(q db, n int) {
		t.Helper()
		sendN(t, q, n, "big")
	}
	burnXids := func(n int) {
		t.Helper()
		for range n {
			exec(t, pool, "select pg_current_xact_id()")
		}
	}
	tick(t, pool, "q")

	// 1. A transaction spanning ticks, interleaved with others.
	big, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer big.Rollback(ctx)
	open, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer open.Rollback(ctx)
	for i := range 6 {
		send(big, 500)
		send(open, 3)
		sendN(t, pool, 2, "single")
		if i%2 == 1 {
			tick(t, pool, "q")
		}
	}
	if err := big.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	tick(t, pool, "q")
	if err := open.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	tick(t, pool, "q")

	// 2. Between two ticks, a short xid range.
	send(pool, 3000)
	tick(t, pool, "q")

	// 3. Between two ticks, a long xid range.
	burnXids(150)
	send(pool, 3000)
	burnXids(150)
	tick(t, pool, "q")

	// 4. Many small transactions in one tick.
	for range 1000 {
		sendN(t, pool, 1, "one")
	}
	tick(t, pool, "q")
	total := countEvents(t, pool, "q")

	// The engine's batches: what c must receive, batch by batch.
	var want []int64
	for _, b := range drainBatches(t, pool, "q", "ref") {
		checkOrdered(t, "ref batch", b)
		want = append(want, evIDs(b)...)
	}
	if int64(len(want)) != total {
		t.Fatalf("the engine consumer got %d events of the %d sent", len(want), total)
	}

	// c drains in chunks of 37 on one connection, whose reads of the
	// event indexes are counted.
	conn := pgtest.Conn(t, dsn)
	indexReads := func() int64 {
		t.Helper()
		pgtest.SkipWithoutStatsFlush(t)
		exec(t, conn, "select pg_stat_force_next_flush()")
		return scalar[int64](t, conn, `select coalesce(sum(s.idx_tup_read), 0)::bigint from pg_catalog.pg_stat_all_indexes s
			 where s.relid::regclass::text = any($1)`, eventTables(t, pool, "q"))
	}
	before := indexReads()
	const maxRows = 37
	var got []int64
	var chunks [][]int64
	var batch int64
	// checkFull: every chunk of a batch but its last holds max rows.
	checkFull := func(batch int64, chunks [][]int64) {
		t.Helper()
		for i, c := range chunks[:max(len(chunks)-1, 0)] {
			if len(c) != maxRows {
				t.Errorf("batch %d: chunk %d of %d has %d rows, want %d", batch, i+1, len(chunks), len(c), maxRows)
			}
		}
	}
	for {
		var ack any
		if batch != 0 {
			ack = batch
		}
		rows, _ := conn.Query(ctx, "select msg_id, batch_id from pgque.receive_raw('q', 'c', $1, $2)", maxRows, ack)
		type row struct{ ID, Batch int64 }
		rs, err := pgx.CollectRows(rows, pgx.RowToStructByPos[row])
		if err != nil {
			t.Fatal(err)
		}
		if len(rs) == 0 {
			break
		}
		if rs[0].Batch != batch {
			checkFull(batch, chunks)
			chunks = nil
		}
		batch = rs[0].Batch
		var ids []int64
		for _, r := range rs {
			if r.Batch != batch {
				t.Fatalf("one chunk holds batches %d and %d", batch, r.Batch)
			}
			ids = append(ids, r.ID)
		}
		if len(chunks) > 0 {
			prev := chunks[len(chunks)-1]
			if ids[0] <= prev[len(prev)-1] {
				t.Fatalf("batch %d: chunk starts at %d after %d", batch, ids[0], prev[len(prev)-1])
			}
		}
		chunks = append(chunks, ids)
		got = append(got, ids...)
	}
	checkFull(batch, chunks)
	reads := indexReads() - before

	slices.Sort(got)
	sorted := slices.Clone(want)
	slices.Sort(sorted)
	if !slices.Equal(got, sorted) {
		t.Fatalf("c received %d events, the engine consumer %d; first difference at %d", len(got), len(sorted), firstDiff(got, sorted))
	}
	// Each batch's first and last chunk read its remaining rows whole; every
	// other chunk reads its window (max+1 rows, a quarter more, as many
	// again to return them). Reading the remaining rows on every chunk would
	// be hundreds of reads per event here.
	if perEvent := float64(reads) / float64(total); perEvent > 8 {
		t.Errorf("draining %d events in chunks of %d read %d index entries, %.1f per event; want at most 8",
			total, maxRows, reads, perEvent)
	} else {
		t.Logf("draining %d events in chunks of %d read %d index entries, %.1f per event", total, maxRows, reads, perEvent)
	}
}

// firstDiff is the first index where a and b differ.
func firstDiff(a, b []int64) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

package partitiontest

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgque/pgque/internal/testing/pgtest"
)

// deadTuples sums pg_stat_get_dead_tuples over every table of schema pgque
// (partitions included). conn must be the connection that did the work, so
// its statistics are flushed first and the counts are exact.
func deadTuples(t *testing.T, conn *pgx.Conn) (int64, map[string]int64) {
	t.Helper()
	ctx := context.Background()
	pgtest.SkipWithoutStatsFlush(t)
	if _, err := conn.Exec(ctx, "select pg_catalog.pg_stat_force_next_flush()"); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "select pg_catalog.pg_stat_clear_snapshot()"); err != nil {
		t.Fatal(err)
	}
	rows, err := conn.Query(ctx, `select c.relname, pg_catalog.pg_stat_get_dead_tuples(c.oid)
		  from pg_catalog.pg_class c
		 where c.relnamespace = 'pgque'::regnamespace and c.relkind = 'r'`)
	if err != nil {
		t.Fatal(err)
	}
	per := map[string]int64{}
	var total int64
	for rows.Next() {
		var name string
		var n int64
		if err := rows.Scan(&name, &n); err != nil {
			t.Fatal(err)
		}
		if n != 0 {
			per[name] = n
		}
		total += n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return total, per
}

// T-held-horizon: with a REPEATABLE READ snapshot held open in another
// session (nothing can be pruned), consuming through 16 slots and renewing
// the ticker lease every round leaves a number of dead tuples in pgque's
// tables that does not grow with the number of batches or renewals: the
// same after 200 slot batches as after 2000, none of them in ticker_lease. maint() runs
// between the phases and must still reclaim the append-only state by
// TRUNCATE, so the live rows of sub_state and tick stay bounded too.
func TestHeldHorizonNoDeadTuples(t *testing.T) {
	t.Parallel()
	const (
		q = "held"
		n = 16
	)
	d := setup(t)
	ctx := context.Background()
	conn := pgtest.Conn(t, d.dsn)
	one[int32](t, conn, "select pgque.create_queue($1)", q)
	for k := range n {
		one[int32](t, conn, "select pgque.subscribe_slot($1, 'c', $2, $3)", q, k, n)
	}
	var slots []slotRef
	for k := range n {
		mustClaim(t, conn, q, "c", k, "w", "1 hour")
		slots = append(slots, slotRef{q: q, c: "c", slot: k, n: n, worker: "w", max: 100})
	}
	// One key per slot, so every slot has a batch every round.
	keys := make([]*string, n)
	for i, found := 0, 0; found < n; i++ {
		k := ptr(fmt.Sprintf("tenant-%d", i))
		if s := expectedSlot(t, conn, k, n); keys[s] == nil {
			keys[s] = k
			found++
		}
	}

	// The held horizon: a REPEATABLE READ transaction with its snapshot taken.
	holder := pgtest.Conn(t, d.dsn)
	htx, err := holder.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	defer htx.Rollback(ctx)
	if _, err := htx.Exec(ctx, "select pg_catalog.txid_current()"); err != nil {
		t.Fatal(err)
	}
	xmin := one[*string](t, conn, `select backend_xmin::text from pg_catalog.pg_stat_activity
		where pid = $1`, holder.PgConn().PID())
	if xmin == nil {
		t.Fatal("the holding transaction has no xmin: the horizon is not held")
	}

	batches := 0
	round := func() {
		if _, err := conn.Exec(ctx, "select pgque.send_batch($1, 'test', $2::jsonb[], $3::text[])",
			q, fillPayloads(n), keys); err != nil {
			t.Fatal(err)
		}
		tick(t, conn, q)
		// The ticker daemon's lease, renewed every round (a 2 ms TTL is
		// half gone by the next one): renewals must not leave versions.
		if !one[bool](t, conn, "select pgque.ticker_lead('ticker', '2 milliseconds')") {
			t.Fatal("ticker_lead lost the uncontended ticker lease")
		}
		for _, s := range slots {
			ms, st := drain(t, conn, s)
			if len(ms) != 1 {
				t.Fatalf("slot %d received %d events in a round, want 1", s.slot, len(ms))
			}
			batches += st.finishingAcks
		}
	}
	measure := func(upto int) int64 {
		for batches < upto {
			round()
		}
		if _, err := conn.Exec(ctx, "select pgque.maint()"); err != nil {
			t.Fatal(err)
		}
		dead, per := deadTuples(t, conn)
		t.Logf("after %d slot batches: %d dead tuples in pgque tables %v", batches, dead, per)
		if per["ticker_lease"] > 0 {
			t.Errorf("the ticker lease left %d dead versions after %d renewals", per["ticker_lease"], batches/n)
		}
		return dead
	}
	dead1 := measure(200)
	dead2 := measure(2000)
	// Nothing is written per batch but appends; what may be dead is bounded
	// by time (lease renewals, a rotation), not by the number of batches.
	const bound = 20
	if dead2 > dead1+bound || dead2 > 2*bound {
		t.Errorf("dead tuples grow with the number of batches under a held horizon: %d after 200 slot batches, %d after %d",
			dead1, dead2, batches)
	}
	// The flips reclaimed the appended state despite the held horizon.
	if live := one[int64](t, conn, "select count(*) from pgque.sub_state"); live > 4*n {
		t.Errorf("sub_state holds %d records after maint() for %d subscriptions: the flip did not reclaim them", live, n)
	}
	if live := one[int64](t, conn, "select count(*) from pgque.tick where tick_queue = (select queue_id from pgque.queue where queue_name = $1)", q); live > 2 {
		t.Errorf("%d ticks of a caught-up queue survive maint()", live)
	}
	if err := htx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}

func fillPayloads(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = `{"x":1}`
	}
	return out
}

// T-old-snapshot: a REPEATABLE READ transaction whose snapshot predates a
// maint() flip cannot see the delivery state (TRUNCATE is not MVCC-safe).
// It must get a clear error, never act on an older state: receiving there
// would otherwise redeliver from an old cursor and append that old state.
func TestOldSnapshotCannotConsume(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := setup(t)
	d.createQueue("q")
	d.exec("select pgque.subscribe('q', 'p')")
	for range 3 {
		d.send("q", ptr("k"))
		d.tick("q")
		for {
			var batch *int64
			var n int
			rows, err := d.pool.Query(ctx, "select batch_id from pgque.receive('q', 'p', 100)")
			if err != nil {
				t.Fatal(err)
			}
			for rows.Next() {
				if err := rows.Scan(&batch); err != nil {
					t.Fatal(err)
				}
				n++
			}
			rows.Close()
			if n == 0 {
				break
			}
			d.exec("select pgque.ack($1)", *batch)
		}
	}
	old := pgtest.Conn(t, d.dsn)
	tx, err := old.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, "select 1"); err != nil {
		t.Fatal(err)
	}
	// The flip: the state partition holds superseded records, so it is retired.
	if n := one[int32](t, d.pool, "select pgque.maint()"); n < 1 {
		t.Fatalf("maint() did nothing (%d): no flip to test", n)
	}
	before := one[int64](t, d.pool, "select count(*) from pgque.sub_state")
	rows, err := tx.Query(ctx, "select msg_id from pgque.receive('q', 'p', 100)")
	if err == nil {
		for rows.Next() {
		}
		rows.Close()
		err = rows.Err()
	}
	wantState(t, err, "PQ011", "receive in a REPEATABLE READ transaction older than the last flip")
	tx.Rollback(ctx)
	if after := one[int64](t, d.pool, "select count(*) from pgque.sub_state"); after != before {
		t.Errorf("the refused receive changed the state log: %d records, then %d", before, after)
	}
	// READ COMMITTED consumers are unaffected.
	d.send("q", ptr("k"))
	d.tick("q")
	if got := one[int64](t, d.pool, "select count(*) from pgque.receive('q', 'p', 100)"); got != 1 {
		t.Errorf("after the flip a READ COMMITTED receive got %d events, want 1", got)
	}
}

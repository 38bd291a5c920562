package enginetest

import (
	"context"
	"testing"

	"github.com/pgque/pgque/internal/testing/pgtest"
)

// setupBloat gives the bloat test a database with queue "q", consumer "c"
// subscribed, and a single connection: table statistics are flushed per
// backend, so everything runs on one.
func setupBloat(t *testing.T) db {
	t.Helper()
	conn := pgtest.Conn(t, pgtest.NewInstalledDB(t))
	exec(t, conn, "select pgque.create_queue('q')")
	exec(t, conn, "select pgque.subscribe('q', 'c')")
	return conn
}

// TestZeroBloat: after 100k events are sent (send_batch in chunks) and
// consumed (receive/ack), no event partition has a dead tuple, and no
// UPDATE or DELETE ever touched one.
func TestZeroBloat(t *testing.T) {
	t.Parallel()
	const (
		total = 100_000
		chunk = 10_000
		recv  = 2_500
	)
	ctx := context.Background()
	conn := setupBloat(t)
	beginConn := conn.(beginner)
	tables := eventTables(t, conn, "q")

	for from := 1; from <= total; from += chunk {
		ids := scalar[[]int64](t, conn, `select pgque.send_batch('q', 'bloat',
			array(select jsonb_build_object('i', g) from generate_series($1::int, $2::int) g),
			array(select 'tenant-' || (g % 97) from generate_series($1::int, $2::int) g))`, from, from+chunk-1)
		if len(ids) != chunk {
			t.Fatalf("send_batch returned %d ids, want %d", len(ids), chunk)
		}
		tick(t, beginConn, "q")
	}

	seen := make(map[int64]bool, total)
	for range 2 * total / recv {
		ms := mustReceive(t, conn, "q", "c", recv)
		if len(ms) == 0 {
			break
		}
		for _, m := range ms {
			if seen[m.MsgID] {
				t.Fatalf("message %d received twice", m.MsgID)
			}
			seen[m.MsgID] = true
		}
		ack(t, conn, ms[0].BatchID)
	}
	if len(seen) != total {
		t.Fatalf("consumed %d distinct messages, want %d", len(seen), total)
	}

	// Flush this backend's statistics at the end of the next transaction,
	// then read them in a later one.
	pgtest.SkipWithoutStatsFlush(t)
	exec(t, conn, "select pg_catalog.pg_stat_force_next_flush()")
	exec(t, conn, "select pg_catalog.pg_stat_clear_snapshot()")
	var ins int64
	for _, tbl := range tables {
		var dead, upd, hot, del, tins int64
		err := conn.QueryRow(ctx, `select n_dead_tup, n_tup_upd, n_tup_hot_upd, n_tup_del, n_tup_ins
			from pg_catalog.pg_stat_user_tables where relid = $1::regclass`, tbl).Scan(&dead, &upd, &hot, &del, &tins)
		if err != nil {
			t.Fatalf("statistics of %s: %v", tbl, err)
		}
		// The same counters straight from the stats functions.
		fdead := scalar[int64](t, conn, "select pg_catalog.pg_stat_get_dead_tuples($1::regclass)", tbl)
		t.Logf("%s: inserted %d, dead %d (%d), updated %d (hot %d), deleted %d", tbl, tins, dead, fdead, upd, hot, del)
		if dead != 0 || fdead != 0 {
			t.Errorf("%s has %d dead tuples after the events were consumed, want 0", tbl, dead)
		}
		if upd != 0 || hot != 0 || del != 0 {
			t.Errorf("%s saw %d updates and %d deletes, want none: event tables are append-only", tbl, upd, del)
		}
		ins += tins
	}
	// The counters are live: they saw every insert.
	if ins != total {
		t.Errorf("event partitions counted %d inserts, want %d: statistics not flushed, the zero counts prove nothing", ins, total)
	}
}

package partitiontest

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgque/pgque/internal/testing/pgtest"
)

// tableStats is one table's cumulative write counters.
type tableStats struct{ ins, upd, hot, del int64 }

func (a tableStats) minus(b tableStats) tableStats {
	return tableStats{a.ins - b.ins, a.upd - b.upd, a.hot - b.hot, a.del - b.del}
}

// writeStats reads the write counters of every pgque table, with the
// partitions of a partitioned table (pgque.event, pgque.tick,
// pgque.sub_state) summed under its name. All the
// measured work runs on conn, and conn flushes its pending statistics first,
// so the counters are exact rather than eventually consistent.
func writeStats(t *testing.T, conn *pgx.Conn) map[string]tableStats {
	t.Helper()
	ctx := context.Background()
	pgtest.SkipWithoutStatsFlush(t)
	if _, err := conn.Exec(ctx, "select pg_catalog.pg_stat_force_next_flush()"); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "select pg_catalog.pg_stat_clear_snapshot()"); err != nil {
		t.Fatal(err)
	}
	rows, err := conn.Query(ctx, `select coalesce((select p.relname from pg_catalog.pg_inherits i
	                                                 join pg_catalog.pg_class p on p.oid = i.inhparent
	                                                where i.inhrelid = s.relid), s.relname),
	                                     s.n_tup_ins, s.n_tup_upd, s.n_tup_hot_upd, s.n_tup_del
	                                from pg_catalog.pg_stat_user_tables s where s.schemaname = 'pgque'`)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]tableStats{}
	for rows.Next() {
		var name string
		var s tableStats
		if err := rows.Scan(&name, &s.ins, &s.upd, &s.hot, &s.del); err != nil {
			t.Fatal(err)
		}
		o := out[name]
		out[name] = tableStats{o.ins + s.ins, o.upd + s.upd, o.hot + s.hot, o.del + s.del}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// T-no-bloat: on the happy path (every event acked), events leave no
// retry_queue or dead_letter rows, and no row of any pgque table is updated
// or deleted per batch (a held xmin horizon could not prune the versions
// that would leave); the appends to the metadata tables (sub_state,
// slot_lease, tick) per batch are bounded by a small constant that does not
// grow with the batch size.
func TestNoBloat(t *testing.T) {
	t.Parallel()
	const (
		q      = "nb"
		n      = 4  // slots
		ticks  = 10 // batches per slot per measurement
		perKey = 8  // keys per slot
	)
	d := setup(t)
	// Every statement of this test runs on conn, so that nothing else's
	// statistics can land in the measured window.
	conn := pgtest.Conn(t, d.dsn)
	ctx := context.Background()
	one[int32](t, conn, "select pgque.create_queue($1)", q)
	for k := range n {
		one[int32](t, conn, "select pgque.subscribe_slot($1, 'c', $2, $3)", q, k, n)
	}
	var slots []slotRef
	for k := range n {
		mustClaim(t, conn, q, "c", k, "w", "1 hour")
		slots = append(slots, slotRef{q: q, c: "c", slot: k, n: n, worker: "w", max: 100000})
	}
	// Keys for every slot, so every slot's batch holds events.
	keys := make([][]*string, n)
	for i := 0; slices.ContainsFunc(keys, func(ks []*string) bool { return len(ks) < perKey }); i++ {
		k := ptr(fmt.Sprintf("tenant-%d", i))
		s := expectedSlot(t, conn, k, n)
		if len(keys[s]) < perKey {
			keys[s] = append(keys[s], k)
		}
	}

	metadata := []string{"subscription", "sub_state", "slot_lease", "tick"}
	empty := []string{"retry_queue", "dead_letter", "deferred", "key_block"}
	perBatch := map[int]float64{}
	for _, size := range []int{8, 400} {
		batchKeys := make([]*string, size)
		for i := range batchKeys {
			batchKeys[i] = keys[i%n][(i/n)%perKey]
		}
		payloads := make([]string, size)
		for i := range payloads {
			payloads[i] = `{"x":1}`
		}
		before := writeStats(t, conn)
		delivered := 0
		for range ticks {
			if _, err := conn.Exec(ctx, "select pgque.send_batch($1, 'test', $2::jsonb[], $3::text[])", q, payloads, batchKeys); err != nil {
				t.Fatal(err)
			}
			tick(t, conn, q)
			for _, s := range slots {
				ms, st := drain(t, conn, s)
				delivered += len(ms)
				if st.partialAcks != 0 {
					t.Fatalf("slot %d delivered a batch in %d chunks with max %d", s.slot, st.partialAcks+1, s.max)
				}
			}
		}
		after := writeStats(t, conn)
		if delivered != size*ticks {
			t.Fatalf("batch size %d: delivered %d events, sent %d", size, delivered, size*ticks)
		}

		ev := after["event"].minus(before["event"])
		if ev.upd != 0 || ev.del != 0 || ev.hot != 0 {
			t.Errorf("batch size %d: event tables saw %d updates and %d deletes; the log must be append-only", size, ev.upd, ev.del)
		}
		if ev.ins != int64(size*ticks) {
			t.Errorf("batch size %d: event tables saw %d inserts for %d events sent", size, ev.ins, size*ticks)
		}
		for _, name := range slices.Sorted(maps.Keys(after)) {
			if dl := after[name].minus(before[name]); dl.upd != 0 || dl.del != 0 {
				t.Errorf("batch size %d: %s saw %d updates and %d deletes while consuming; state must be appended, not rewritten",
					size, name, dl.upd, dl.del)
			}
		}
		for _, name := range empty {
			dl := after[name].minus(before[name])
			if dl != (tableStats{}) {
				t.Errorf("batch size %d: %s was written on the happy path: %+v", size, name, dl)
			}
		}
		var total int64
		var report []string
		for _, name := range metadata {
			dl := after[name].minus(before[name])
			w := dl.ins + dl.upd + dl.del
			total += w
			report = append(report, fmt.Sprintf("%s ins %.2f upd %.2f (hot %.2f) del %.2f",
				name, per(dl.ins, ticks*n), per(dl.upd, ticks*n), per(dl.hot, ticks*n), per(dl.del, ticks*n)))
		}
		perBatch[size] = per(total, ticks*n)
		t.Logf("batch size %d events per tick (%d per slot batch), writes per slot batch: %s; total %.2f",
			size, size/n, strings.Join(report, ", "), perBatch[size])
		for _, name := range slices.Sorted(maps.Keys(after)) {
			if !slices.Contains(metadata, name) && !slices.Contains(empty, name) && name != "event" {
				if dl := after[name].minus(before[name]); dl != (tableStats{}) {
					t.Logf("  also written: %s %+v", name, dl)
				}
			}
		}
	}
	// Opening a batch, recording what was handed out, finishing it and the
	// tick's own row: a handful of row writes per batch, whatever its size.
	const bound = 5.0
	for size, w := range perBatch {
		if w > bound {
			t.Errorf("batch size %d: %.2f metadata writes per slot batch, want at most %.0f", size, w, bound)
		}
	}
	if perBatch[400] > perBatch[8]+0.5 {
		t.Errorf("metadata writes grow with the batch size: %.2f per batch at 400 events per tick, %.2f at 8",
			perBatch[400], perBatch[8])
	}
}

func per(v int64, n int) float64 { return float64(v) / float64(n) }

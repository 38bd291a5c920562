package partitiontest

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/pgque/pgque/internal/testing/pgtest"
)

// TestLargeBatchSlots: a batch far larger than a chunk (one transaction
// of 16 000 events over 500 keys) drained by 4 slots in chunks of 50: each
// slot gets exactly the events of its keys, in ev_id order, in full chunks,
// and the drain reads each event from the event indexes a bounded number
// of times, not once per chunk (the window of "Large batches" in
// docs/design.md, one in nslots of whose rows are the slot's).
func TestLargeBatchSlots(t *testing.T) {
	t.Parallel()
	d := setup(t)
	d.createQueue("q")
	const n, max, events = 4, 50, 16000
	d.subscribeSlots("q", "c", n)
	d.tick("q")
	keys := make([]*string, events)
	for i := range keys {
		keys[i] = ptr(fmt.Sprintf("tenant-%d", i%500))
	}
	sent := d.sendBatch("q", keys)
	d.tick("q")

	conn := pgtest.Conn(t, d.dsn)
	tables := one[[]string](t, d.pool, `select array_agg(c.oid::regclass::text) from pg_catalog.pg_inherits i
		join pg_catalog.pg_class c on c.oid = i.inhrelid
		where i.inhparent = 'pgque.event'::regclass
		  and c.relname like (select 'event\_' || queue_id || '\_%' from pgque.queue where queue_name = 'q')`)
	indexReads := func() int64 {
		t.Helper()
		pgtest.SkipWithoutStatsFlush(t)
		if _, err := conn.Exec(context.Background(), "select pg_stat_force_next_flush()"); err != nil {
			t.Fatal(err)
		}
		return one[int64](t, conn, `select coalesce(sum(s.idx_tup_read), 0)::bigint from pg_catalog.pg_stat_all_indexes s
			where s.relid::regclass::text = any($1)`, tables)
	}
	before := indexReads()
	slotOf := map[string]int{}
	var got []int64
	for _, s := range d.claimAll("q", "c", n, "w", max) {
		ms, st := drain(t, conn, s)
		for i, m := range ms {
			k := *m.Key
			if _, ok := slotOf[k]; !ok {
				slotOf[k] = expectedSlot(t, d.pool, m.Key, n)
			}
			if slotOf[k] != s.slot {
				t.Fatalf("%s received event %d of key %s, which maps to slot %d", s, m.ID, k, slotOf[k])
			}
			if i > 0 && m.ID <= ms[i-1].ID {
				t.Fatalf("%s received %d after %d", s, m.ID, ms[i-1].ID)
			}
		}
		// The share is one batch, in full chunks but the last.
		if len(ms) > 0 && ms[0].Batch != ms[len(ms)-1].Batch {
			t.Errorf("%s: the transaction came in batches %d to %d, want one", s, ms[0].Batch, ms[len(ms)-1].Batch)
		}
		if chunks, want := st.partialAcks+st.finishingAcks, (len(ms)+max-1)/max; chunks != want {
			t.Errorf("%s: %d events came in %d chunks, want %d", s, len(ms), chunks, want)
		}
		got = append(got, ids(ms)...)
	}
	reads := indexReads() - before
	slices.Sort(got)
	if !slices.Equal(got, sent) {
		t.Fatalf("the slots received %d events, %d were sent", len(got), len(sent))
	}
	// Reading every slot's remaining rows on every chunk would be about 40
	// reads per event here.
	if perEvent := float64(reads) / events; perEvent > 20 {
		t.Errorf("draining %d events over %d slots in chunks of %d read %d index entries, %.1f per event; want at most 20",
			events, n, max, reads, perEvent)
	} else {
		t.Logf("draining %d events over %d slots in chunks of %d read %d index entries, %.1f per event", events, n, max, reads, perEvent)
	}
}

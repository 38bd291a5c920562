package partitiontest

import (
	"context"
	"testing"
	"time"

	"github.com/pgque/pgque/internal/testing/pgtest"
)

// tickByRule waits for the ticker's own rule to tick q (events pending and
// ticker_max_lag passed) and returns the tick id. Unlike force_next_tick it
// leaves the event sequence alone, so the ticks record how many events each
// covers, which is what a catch-up batch is cut by.
func tickByRule(t *testing.T, d *db, q string) int64 {
	t.Helper()
	var id *int64
	pgtest.WaitFor(t, 10*time.Second, "the ticker's rule to tick "+q, func() bool {
		id = one[*int64](t, d.pool, "select pgque.ticker($1)", q)
		return id != nil
	})
	return *id
}

// T-catch-up: a consumer that is behind takes as many ticks per batch as
// its chunk holds (span: max events, max × N for a slot), so a backlog of
// small ticks drains in batches of about a chunk, while PgQ's next_batch
// still takes one tick per batch. 40 ticks of 5 events: receive_raw(100)
// needs 2 batches plus at most one for rounding, each of 2 slots with
// max 50 as many, next_batch 40.
func TestCatchUpBatches(t *testing.T) {
	d := setup(t)
	ctx := context.Background()
	d.createQueue("q")
	d.exec("select pgque.subscribe('q', 'plain')")
	d.exec("select pgque.register_consumer('q', 'pgq')")
	const n = 2
	d.subscribeSlots("q", "s", n)
	slots := d.claimAll("q", "s", n, "w", 50)
	const ticks, per = 40, 5
	for i := range ticks {
		d.exec(`select count(pgque.send('q', 't', '{}'::text, 'k' || g)) from generate_series($1::int, $1::int + $2::int - 1) g`,
			i*per, per)
		tickByRule(t, d, "q")
	}

	batches := map[int64]bool{}
	events := 0
	for range 100 {
		var ids []int64
		var batch *int64
		if err := d.pool.QueryRow(ctx, `select coalesce(array_agg(msg_id), '{}'), max(batch_id)
			from pgque.receive_raw('q', 'plain', 100)`).Scan(&ids, &batch); err != nil {
			t.Fatal(err)
		}
		if batch == nil {
			break
		}
		batches[*batch] = true
		events += len(ids)
		d.exec("select pgque.ack($1)", *batch)
	}
	if events != ticks*per || len(batches) > 3 {
		t.Errorf("receive_raw(100): %d events in %d batches, want %d in at most 3", events, len(batches), ticks*per)
	}

	total := 0
	for _, s := range slots {
		ms, _ := drain(t, d.pool, s)
		sb := map[int64]bool{}
		for _, m := range ms {
			sb[m.Batch] = true
		}
		total += len(ms)
		if len(sb) > 3 {
			t.Errorf("slot %d (max 50 of %d slots): %d batches, want at most 3", s.slot, n, len(sb))
		}
	}
	if total != ticks*per {
		t.Errorf("the slots received %d events, want %d", total, ticks*per)
	}

	pgq := 0
	for range 1000 {
		var batch *int64
		if err := d.pool.QueryRow(ctx, "select pgque.next_batch('q', 'pgq')").Scan(&batch); err != nil {
			t.Fatal(err)
		}
		if batch == nil {
			break
		}
		pgq++
		d.exec("select pgque.finish_batch($1)", *batch)
	}
	if pgq != ticks {
		t.Errorf("next_batch: %d batches, want one per tick (%d)", pgq, ticks)
	}
}

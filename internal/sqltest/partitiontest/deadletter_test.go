package partitiontest

import (
	"context"
	"strings"
	"testing"
)

// TestDeadLettersOfAnUnknownConsumer: dlq_list and dlq_purge answer a
// consumer the queue does not know with PQ002 naming it, instead of an
// empty list or 0 that reads as "nothing failed". A slot consumer (by
// its name, without a slot), a plain consumer and a consumer that is gone
// but left dead letters are known.
func TestDeadLettersOfAnUnknownConsumer(t *testing.T) {
	t.Parallel()
	d := setup(t)
	ctx := context.Background()
	d.createQueue("q")
	d.subscribeSlots("q", "s", 4)
	d.exec("select pgque.subscribe('q', 'p')")
	// A consumer unsubscribed since, whose dead letter is kept.
	d.exec(`insert into pgque.dead_letter (dl_queue, dl_consumer, dl_reason, ev_id, ev_time, ev_txid, ev_retry, ev_type, ev_data)
	        select queue_id, 'gone#1/4', 'failed', 1, now(), NULL, 3, 't', '{}' from pgque.queue where queue_name = 'q'`)

	for _, c := range []string{"s", "p", "gone"} {
		if _, err := d.pool.Exec(ctx, "select * from pgque.dlq_list('q', $1)", c); err != nil {
			t.Errorf("dlq_list of known consumer %q: %v", c, err)
		}
	}
	if n := one[int64](t, d.pool, "select pgque.dlq_purge('q', 's')"); n != 0 {
		t.Errorf("dlq_purge of s = %d, want 0", n)
	}
	if n := one[int64](t, d.pool, "select pgque.dlq_purge('q', 'gone')"); n != 1 {
		t.Errorf("dlq_purge of gone = %d, want 1", n)
	}
	for _, c := range []string{"ghost", "gone", "s#1/4x", "S"} {
		for _, call := range []string{"select * from pgque.dlq_list('q', $1)", "select pgque.dlq_purge('q', $1)"} {
			_, err := d.pool.Exec(ctx, call, c)
			wantState(t, err, "PQ002", call+" "+c)
			if err != nil && !strings.Contains(err.Error(), c) {
				t.Errorf("%s %s: %v does not name the consumer", call, c, err)
			}
		}
	}
}

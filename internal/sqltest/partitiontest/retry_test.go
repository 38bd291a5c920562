package partitiontest

import (
	"context"
	"testing"
)

// T-retry-affinity: an event nacked on its slot comes back, after
// maint_retry_events and a tick, to that slot only, with retry_count 1 and
// its key; the other slots and a plain consumer of the same queue never see
// the retried copy.
func TestRetryAffinity(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := setup(t)
	d.createQueue("ra")
	d.subscribeSlots("ra", "c", 8)
	if got := one[int32](t, d.pool, "select pgque.subscribe('ra', 'plain')"); got != 1 {
		t.Fatalf("subscribe(ra, plain) = %d", got)
	}

	key := ptr("tenant-3") // pinned: slot 2 of 8
	home := pinnedSlot(t, key, 8)
	var all []int64
	for _, p := range pinnedKeys {
		all = append(all, d.send("ra", p.key))
	}
	failing := d.send("ra", key)
	all = append(all, failing, d.send("ra", key))
	d.tick("ra")

	slots := d.claimAll("ra", "c", 8, "w", 100)
	// The home slot receives the event and nacks it, then acks the chunk.
	first := mustReceive(t, d.pool, slots[home])
	var found bool
	for _, m := range first {
		found = found || m.ID == failing
	}
	if !found {
		t.Fatalf("slot %d did not receive event %d of key %s: %v", home, failing, *key, ids(first))
	}
	if n, err := nack(ctx, d.pool, slots[home], failing, "0 seconds"); err != nil || n != 1 {
		t.Fatalf("nack_partitioned(%d) = %d, %v; want 1 (scheduled for retry)", failing, n, err)
	}
	if n := mustAck(t, d.pool, slots[home]); n != 1 {
		t.Fatalf("ack_partitioned after nack = %d, want 1 (batch finished)", n)
	}
	for _, s := range slots {
		drain(t, d.pool, s)
	}

	if n := one[int32](t, d.pool, "select pgque.maint_retry_events()"); n != 1 {
		t.Fatalf("maint_retry_events() = %d, want 1", n)
	}
	d.tick("ra")

	for _, s := range slots {
		ms, _ := drain(t, d.pool, s)
		if s.slot != home {
			if len(ms) != 0 {
				t.Errorf("slot %d received %v after the retry; only slot %d may see the retried event", s.slot, ids(ms), home)
			}
			continue
		}
		if len(ms) != 1 {
			t.Fatalf("home slot %d received %d rows after the retry (%v), want exactly the retried event %d",
				home, len(ms), ids(ms), failing)
		}
		m := ms[0]
		if m.ID != failing || m.Retry != 1 || m.Key == nil || *m.Key != *key {
			t.Errorf("retried delivery = id %d retry_count %d key %s; want id %d retry_count 1 key %q",
				m.ID, m.Retry, keyString(m.Key), failing, *key)
		}
	}

	// The plain consumer saw every original event once and no retried copy.
	seen := map[int64]int{}
	for {
		rows, err := d.pool.Query(ctx, "select msg_id, retry_count from pgque.receive('ra', 'plain', 1000)")
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for rows.Next() {
			var id int64
			var retry int32
			if err := rows.Scan(&id, &retry); err != nil {
				t.Fatal(err)
			}
			if retry != 0 {
				t.Errorf("plain consumer received event %d with retry_count %d: another subscription's retry leaked", id, retry)
			}
			seen[id]++
			n++
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
		d.exec("select pgque.ack(current_batch) from pgque.get_consumer_info('ra', 'plain')")
	}
	for _, id := range all {
		if seen[id] != 1 {
			t.Errorf("plain consumer received event %d %d times, want once", id, seen[id])
		}
	}
	if len(seen) != len(all) {
		t.Errorf("plain consumer received %d distinct events, want %d", len(seen), len(all))
	}
}

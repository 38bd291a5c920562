package enginetest

import (
	"context"
	"testing"
)

// TestRewindNewSubscription: a subscription created after events were sent
// misses them (events_before_subscription says how many), unless the
// transaction that creates it rewinds it to the oldest cursor of the
// queue's other subscriptions: it then receives every event from there on,
// in order. Only a subscription of this transaction can be rewound; with
// no other subscription there is nothing kept to rewind to.
func TestRewindNewSubscription(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, pool := setupEngine(t) // queue q, consumer c subscribed
	var sent []int64
	for range 2 {
		sent = append(sent, scalar[int64](t, pool, `select pgque.send('q', 't', '{}'::jsonb)`))
		tick(t, pool, "q")
	}

	// Subscribed late without a rewind: nothing of the earlier events.
	exec(t, pool, "select pgque.subscribe('q', 'late')")
	if n := scalar[int64](t, pool, "select pgque.events_before_subscription('q', 'late')"); n < 2 {
		t.Errorf("events_before_subscription of a late subscription = %d, want at least 2", n)
	}
	// Subscribed late and rewound in the same transaction: everything.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	exec(t, tx, "select pgque.subscribe('q', 'rewound')")
	if n := scalar[int64](t, tx, "select pgque.rewind_new_subscription('q', 'rewound')"); n < 2 {
		t.Errorf("rewind_new_subscription = %d, want at least 2 events gained", n)
	}
	if n := scalar[int64](t, tx, "select pgque.events_before_subscription('q', 'rewound')"); n != 0 {
		t.Errorf("events_before_subscription after the rewind = %d, want 0", n)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	sent = append(sent, scalar[int64](t, pool, `select pgque.send('q', 't', '{}'::jsonb)`))
	tick(t, pool, "q")

	drained := func(consumer string) []int64 {
		var got []int64
		for range 10 {
			ms := mustReceive(t, pool, "q", consumer, 100)
			for _, m := range ms {
				got = append(got, m.MsgID)
			}
			if len(ms) == 0 {
				break
			}
			ack(t, pool, ms[0].BatchID)
		}
		return got
	}
	if got := drained("rewound"); len(got) != 3 || got[0] != sent[0] || got[1] != sent[1] || got[2] != sent[2] {
		t.Errorf("rewound subscription received %v, want %v", got, sent)
	}
	if got := drained("late"); len(got) != 1 || got[0] != sent[2] {
		t.Errorf("late subscription received %v, want only %d", got, sent[2])
	}

	// A subscription of an earlier transaction cannot be rewound.
	wantCode(t, "rewinding a committed subscription", queryErr(pool, "select pgque.rewind_new_subscription('q', 'late')"), "PQ011", "late")
	wantCode(t, "rewinding an unknown consumer", queryErr(pool, "select pgque.rewind_new_subscription('q', 'nobody')"), "PQ002")
	wantCode(t, "events before an unknown consumer", queryErr(pool, "select pgque.events_before_subscription('q', 'nobody')"), "PQ002")

	// A queue nobody subscribes to keeps nothing: no rewind.
	newQueue(t, pool, "lonely")
	exec(t, pool, `select pgque.send('lonely', 't', '{}'::jsonb)`)
	tick(t, pool, "lonely")
	tx, err = pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	exec(t, tx, "select pgque.subscribe('lonely', 'first')")
	if n := scalar[int64](t, tx, "select pgque.rewind_new_subscription('lonely', 'first')"); n != 0 {
		t.Errorf("rewind on a queue without other subscriptions = %d, want 0", n)
	}
}

package pgque_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/pgque/pgque"
	"github.com/pgque/pgque/internal/testing/pgtest"
)

// A slot fed one event per tick makes one call per event: the chunk that
// ended its batch is acknowledged by the receive of its next wake-up, not
// by a call of its own that finds nothing. The last chunk's
// acknowledgement goes on its own within moments, with a poll fallback
// (30 s) longer than the test: the batch closes, and a second consumer
// process started after Stop receives nothing again.
func TestPartitionedFoldsAckIntoNextWakeUp(t *testing.T) {
	t.Parallel()
	env := setup(t)
	startTicker(t, env.client)
	client := newClient(t, env.pool)
	var chk checker
	delivered := make(chan int64, 100)
	newConsumer := func(worker string) *pgque.PartitionedConsumer {
		pc, err := client.NewPartitionedConsumer(&pgque.PartitionedConsumerConfig{
			Queue: env.queue, Consumer: "c", Slots: 1, WorkerID: worker,
			PollInterval: 30 * time.Second,
			Handler: func(_ context.Context, m *pgque.Message) error {
				defer chk.begin(worker, m)()
				delivered <- m.ID
				return nil
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		return pc
	}
	pc := newConsumer("first")
	calls := &slotCalls{n: make(map[int]int)}
	pgque.SetWorkHook(pc, calls.add)
	ctx := context.Background()
	if err := pc.Start(ctx); err != nil {
		t.Fatal(err)
	}
	pgtest.WaitFor(t, 30*time.Second, "the slot claimed", func() bool { return len(pc.OwnedSlots()) == 1 })

	const n = 40
	sent := make(map[int64]string)
	before := calls.snapshot()[0]
	for i := range n {
		key := fmt.Sprintf("k%d", i%3)
		sent[sendAwait(t, env, delivered, pgque.Event{Type: "e", Payload: i, PartitionKey: key})] = key
	}
	// Each event is a chunk of one that ends its batch. Folded, that is a
	// call per event (and one on its own after the last); unfolded, two.
	if got := calls.snapshot()[0] - before; got > n+n/4 {
		t.Errorf("%d calls for %d events, one per event expected", got, n)
	} else {
		t.Logf("%d calls for %d events", got, n)
	}
	pgtest.WaitFor(t, 10*time.Second, "the last chunk acknowledged without a poll", func() bool {
		st, err := client.Slots(ctx, env.queue, "c")
		if err != nil {
			t.Fatal(err)
		}
		return len(st) == 1 && st[0].OpenBatch == nil
	})
	stopCtx, stop := context.WithTimeout(ctx, 15*time.Second)
	defer stop()
	if err := pc.Stop(stopCtx); err != nil {
		t.Fatal(err)
	}

	// Nothing acknowledged is delivered again.
	again := newConsumer("second")
	if err := again.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = again.Stop(context.Background()) }) // idempotent
	pgtest.WaitFor(t, 30*time.Second, "the slot claimed again", func() bool { return len(again.OwnedSlots()) == 1 })
	sent[sendAwait(t, env, delivered, pgque.Event{Type: "e", Payload: "last", PartitionKey: "k0"})] = "k0"
	// Stop waits for the last handler, which signalled before it returned,
	// and anything delivered again would have come before that event.
	if err := again.Stop(stopCtx); err != nil {
		t.Fatal(err)
	}
	select {
	case id := <-delivered:
		t.Fatalf("event %d delivered again after a graceful stop", id)
	default:
	}
	r, err := chk.verify(sent)
	if err != nil {
		t.Fatal(err)
	}
	if r.redeliveries != 0 {
		t.Fatalf("%d redeliveries", r.redeliveries)
	}
}

package pgque_test

import (
	"context"
	"fmt"
	"sync"
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

// A slot catching up on a backlog takes its batches one after another: a
// chunk that ends its batch while later ticks wait wakes the slot through
// the server (TestBehindSlotWakesItself in the partition suite), so its
// deferred acknowledgement does not wait for its bound. Here the bound is
// a minute and the poll too: 120 events over 60 ticks, sent before the
// consumer started (no tick notification is left for it), drain in well
// under that, in key order. Without the server's wake-up the first short
// chunk would stall its slot for the minute.
func TestPartitionedCatchUpDoesNotWaitForFoldBound(t *testing.T) {
	t.Parallel()
	env := setup(t)
	ctx := context.Background()
	if _, err := env.client.SubscribeSlots(ctx, env.queue, "c", 2, pgque.FailurePolicySkip); err != nil {
		t.Fatal(err)
	}
	const ticks, perTick = 60, 2
	sent := make(map[int64]string)
	for i := range ticks {
		for j := range perTick {
			key := fmt.Sprintf("k%d", j)
			id, err := env.client.Send(ctx, env.queue, pgque.Event{Type: "e", Payload: i*perTick + j, PartitionKey: key})
			if err != nil {
				t.Fatal(err)
			}
			sent[id] = key
		}
		if _, err := env.pool.Exec(ctx, "select pgque.force_next_tick($1), pgque.ticker($1)", env.queue); err != nil {
			t.Fatal(err)
		}
	}
	var chk checker
	var mu sync.Mutex
	seen := 0
	done := make(chan struct{})
	pc, err := env.client.NewPartitionedConsumer(&pgque.PartitionedConsumerConfig{
		Queue: env.queue, Consumer: "c", Slots: 2, WorkerID: "w", BatchSize: 5,
		PollInterval: time.Minute,
		Handler: func(_ context.Context, m *pgque.Message) error {
			defer chk.begin("w", m)()
			mu.Lock()
			defer mu.Unlock()
			if seen++; seen == ticks*perTick {
				close(done)
			}
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	pgque.SetAckFoldWait(pc, time.Minute)
	if err := pc.Start(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		mu.Lock()
		t.Fatalf("%d of %d events handled within 20 s", seen, ticks*perTick)
	}
	stopCtx, stop := context.WithTimeout(ctx, 15*time.Second)
	defer stop()
	if err := pc.Stop(stopCtx); err != nil {
		t.Fatal(err)
	}
	if _, err := chk.verify(sent); err != nil {
		t.Fatal(err)
	}
}

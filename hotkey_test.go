package pgque_test

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/pgque/pgque"
)

// TestHotKeyDoesNotHoldItsSlot: a key with a backlog of 400 events of 5 ms
// each (no handler near the hold time) shares the only slot with a cold
// key. The cold key's event, sent once the hot key's chunk is running, is
// handled while the hot key still has most of its backlog to go: the hot
// key's lane is held as soon as its events left would take ten hold
// times, and the slot fetches on. The hot key's events are each handled once, in
// order.
func TestHotKeyDoesNotHoldItsSlot(t *testing.T) {
	t.Parallel()
	env := setup(t)
	startTicker(t, env.client)
	ctx := context.Background()
	const hot = 400
	var mu sync.Mutex
	var hotRan []int
	firstHot, allHot, cold := make(chan struct{}), make(chan struct{}), make(chan int, 1)
	var once sync.Once
	p := startProcess(t, env, pgque.PartitionedConsumerConfig{Queue: env.queue, Consumer: "c", Slots: 1,
		Handler: func(ctx context.Context, m *pgque.Message) error {
			if m.PartitionKey == "cold" {
				mu.Lock()
				cold <- len(hotRan)
				mu.Unlock()
				return nil
			}
			select {
			case <-time.After(5 * time.Millisecond):
			case <-ctx.Done():
				return ctx.Err()
			}
			n, err := strconv.Atoi(string(m.Payload))
			if err != nil {
				t.Errorf("payload %q: %v", m.Payload, err)
			}
			mu.Lock()
			hotRan = append(hotRan, n)
			if len(hotRan) == hot {
				close(allHot)
			}
			mu.Unlock()
			once.Do(func() { close(firstHot) })
			return nil
		}})
	events := make([]pgque.Event, hot)
	for i := range events {
		events[i] = pgque.Event{Type: "e", Payload: i, PartitionKey: "hot"}
	}
	if _, err := env.client.SendBatch(ctx, env.queue, events); err != nil {
		t.Fatal(err)
	}
	select {
	case <-firstHot:
	case <-time.After(20 * time.Second):
		t.Fatal("the hot key's first event was not handled")
	}
	if _, err := env.client.Send(ctx, env.queue, pgque.Event{Type: "e", Payload: 0, PartitionKey: "cold"}); err != nil {
		t.Fatal(err)
	}
	select {
	case n := <-cold:
		if n >= hot/2 {
			t.Fatalf("the cold key's event waited for %d of the hot key's %d events", n, hot)
		}
		t.Logf("the cold key's event was handled after %d of the hot key's %d events", n, hot)
	case <-time.After(30 * time.Second):
		t.Fatal("the cold key's event was not handled")
	}
	select {
	case <-allHot:
	case <-time.After(60 * time.Second):
		mu.Lock()
		defer mu.Unlock()
		t.Fatalf("%d of the hot key's %d events were handled", len(hotRan), hot)
	}
	// Stopped, so that a second delivery of any of them would show.
	if err := p.pc.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	for i, n := range hotRan {
		if n != i {
			t.Fatalf("the hot key's events ran as %v, want 0 … %d once each, in order", hotRan, hot-1)
		}
	}
	if len(hotRan) != hot {
		t.Fatalf("the hot key's events ran %d times, want %d", len(hotRan), hot)
	}
}

package pgque_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pgque/pgque"
	"github.com/pgque/pgque/internal/testing/pgtest"
)

// signalWriter is a log destination that closes seen once a line contains
// want.
type signalWriter struct {
	want string
	once sync.Once
	seen chan struct{}
}

func (w *signalWriter) Write(p []byte) (int, error) {
	if bytes.Contains(p, []byte(w.want)) {
		w.once.Do(func() { close(w.seen) })
	}
	return len(p), nil
}

// TestPartitionedStopHandsBack: Stop waits for the handlers running, not
// for the chunk. With lanes, a hot key blocked in its third event when
// Stop begins runs no fourth, and keys whose lanes wait for a place run
// nothing more; inline (MaxWorkersPerSlot 1), no event after the running
// one starts. The next consumer handles every event the first did not,
// each key in order, and nothing twice.
func TestPartitionedStopHandsBack(t *testing.T) {
	t.Parallel()
	t.Run("lanes", func(t *testing.T) {
		t.Parallel()
		// Two places: hot and slow take them, blocked in a handler; the
		// other keys' lanes wait for one.
		first := stopWhileBlocked(t, pgque.PartitionedConsumerConfig{MaxWorkers: 2}, func(k, payload string) bool {
			return (k == "hot" && payload == "2") || (k == "slow" && payload == "0")
		})
		if got := ran(first, "hot"); !slices.Equal(got, []string{"0", "1", "2"}) {
			t.Errorf("the stopping consumer ran hot's %v, want 0 1 2: the events after the running one go back", got)
		}
		if got := ran(first, "slow"); !slices.Equal(got, []string{"0"}) {
			t.Errorf("the stopping consumer ran slow's %v, want 0", got)
		}
	})
	t.Run("inline", func(t *testing.T) {
		t.Parallel()
		first := stopWhileBlocked(t, pgque.PartitionedConsumerConfig{MaxWorkersPerSlot: 1}, func(k, payload string) bool {
			return k == "hot" && payload == "2"
		})
		var got []string
		for _, m := range first {
			got = append(got, m.PartitionKey+string(m.Payload))
		}
		want := []string{"hot0", "slow0", "a0", "b0", "c0", "hot1", "slow1", "a1", "b1", "c1", "hot2"}
		if !slices.Equal(got, want) {
			t.Errorf("the stopping consumer ran %v, want %v: nothing after the running event", got, want)
		}
	})
}

// stopWhileBlocked sends 10 events to each of the keys hot, slow, a, b
// and c (interleaved) to a consumer configured by cfg whose handler
// blocks on the events block names; it stops the consumer once the
// handler blocks on hot's third event, lets the handlers go once Stop gave
// the slot up, and has a second consumer handle the rest. It checks that
// every event was handled once and each key in order, and returns what
// the first consumer ran.
func stopWhileBlocked(t *testing.T, cfg pgque.PartitionedConsumerConfig, block func(key, payload string) bool) []*pgque.Message {
	env := setup(t)
	startTicker(t, env.client)
	ctx := context.Background()
	keys := []string{"hot", "slow", "a", "b", "c"}
	var events []pgque.Event
	for i := range 10 {
		for _, k := range keys {
			events = append(events, pgque.Event{Type: "e", Payload: i, PartitionKey: k})
		}
	}

	var mu sync.Mutex
	var first, next []*pgque.Message
	blocked, release := make(chan struct{}), make(chan struct{})
	var blockOnce sync.Once
	stopping := &signalWriter{want: "hands back what it has not started", seen: make(chan struct{})}
	logger := slog.New(slog.NewTextHandler(stopping, &slog.HandlerOptions{Level: slog.LevelDebug}))
	cfg.Queue, cfg.Consumer, cfg.Slots, cfg.WorkerID = env.queue, "c", 1, "first"
	cfg.Handler = func(ctx context.Context, m *pgque.Message) error {
		mu.Lock()
		first = append(first, m)
		mu.Unlock()
		if block(m.PartitionKey, string(m.Payload)) {
			if m.PartitionKey == "hot" {
				blockOnce.Do(func() { close(blocked) })
			}
			<-release
		}
		return nil
	}
	p1 := startProcessLogger(t, env, cfg, logger)
	// Sent once the consumer is subscribed: events before its subscription
	// are not its own.
	ids, err := env.client.SendBatch(ctx, env.queue, events)
	if err != nil {
		t.Fatal(err)
	}
	keyOf := make(map[int64]string, len(ids))
	for i, id := range ids {
		keyOf[id] = events[i].PartitionKey
	}
	select {
	case <-blocked:
	case <-time.After(20 * time.Second):
		mu.Lock()
		var seen []string
		for _, m := range first {
			seen = append(seen, m.PartitionKey+":"+string(m.Payload)+fmt.Sprintf("/r%d", m.RetryCount))
		}
		mu.Unlock()
		t.Fatalf("hot's third event did not start; ran %v", seen)
	}
	stopped := make(chan error, 1)
	go func() { stopped <- p1.pc.Stop(ctx) }()
	select {
	case <-stopping.seen:
	case <-time.After(20 * time.Second):
		t.Fatal("Stop did not give the slot up")
	}
	select {
	case err := <-stopped:
		t.Fatalf("Stop returned (%v) while a handler still ran", err)
	default:
	}
	close(release)
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}

	startProcess(t, env, pgque.PartitionedConsumerConfig{
		Queue: env.queue, Consumer: "c", Slots: 1, WorkerID: "next",
		Handler: func(ctx context.Context, m *pgque.Message) error {
			mu.Lock()
			next = append(next, m)
			mu.Unlock()
			return nil
		},
	})
	pgtest.WaitFor(t, 30*time.Second, "every event handled", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(first)+len(next) >= len(ids)
	})
	mu.Lock()
	defer mu.Unlock()
	all := append(slices.Clone(first), next...)
	seen := make(map[int64]int)
	for _, m := range all {
		seen[m.ID]++
	}
	for _, id := range ids {
		if seen[id] != 1 {
			t.Errorf("event %d (key %s) handled %d times, want once", id, keyOf[id], seen[id])
		}
	}
	for _, k := range keys {
		if got := strings.Join(ran(all, k), " "); got != "0 1 2 3 4 5 6 7 8 9" {
			t.Errorf("key %s handled in the order %s", k, got)
		}
	}
	return slices.Clone(first)
}

// ran lists the payloads of key's events in ms, in order.
func ran(ms []*pgque.Message, key string) []string {
	var out []string
	for _, m := range ms {
		if m.PartitionKey == key {
			out = append(out, string(m.Payload))
		}
	}
	return out
}

package pgque_test

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pgque/pgque"
	"github.com/pgque/pgque/internal/testing/pgtest"
)

// TestPartitionedConsumerSubscribedLate: a pool that creates its
// subscription after events were sent and ticked warns that it misses
// them; with StartFromOldest it receives them, from the oldest cursor of
// the queue's other subscription, and does not warn.
func TestPartitionedConsumerSubscribedLate(t *testing.T) {
	t.Parallel()
	env := setup(t)
	ctx := context.Background()
	if _, err := env.client.Subscribe(ctx, env.queue, "archive"); err != nil {
		t.Fatal(err)
	}
	ids, err := env.client.SendBatch(ctx, env.queue, []pgque.Event{
		{Type: "FileCreated", Payload: 1, PartitionKey: "t1"},
		{Type: "FileCreated", Payload: 2, PartitionKey: "t2"},
		{Type: "FileDeleted", Payload: 3, PartitionKey: "t1"},
	})
	if err != nil {
		t.Fatal(err)
	}
	startFastTicker(t, env.client)
	pgtest.WaitFor(t, 10*time.Second, "a tick after the sends", func() bool {
		qs, err := env.client.Queues(ctx, env.queue)
		return err == nil && len(qs) == 1 && qs[0].Unticked == 0 && qs[0].LastTickID > 1
	})

	var mu sync.Mutex
	got := map[string][]int64{}
	handler := func(consumer string) pgque.HandlerFunc {
		return func(_ context.Context, m *pgque.Message) error {
			mu.Lock()
			defer mu.Unlock()
			got[consumer] = append(got[consumer], m.ID)
			return nil
		}
	}
	var lateLog, oldestLog syncBuffer
	startProcessLogger(t, env, pgque.PartitionedConsumerConfig{
		Queue: env.queue, Consumer: "late", Slots: 2, PollInterval: 100 * time.Millisecond, Handler: handler("late"),
	}, slog.New(slog.NewTextHandler(&lateLog, &slog.HandlerOptions{Level: slog.LevelWarn})))
	startProcessLogger(t, env, pgque.PartitionedConsumerConfig{
		Queue: env.queue, Consumer: "oldest", Slots: 2, PollInterval: 100 * time.Millisecond, Handler: handler("oldest"),
		StartFromOldest: true,
	}, slog.New(slog.NewTextHandler(&oldestLog, &slog.HandlerOptions{Level: slog.LevelWarn})))

	if s := lateLog.String(); !strings.Contains(s, "already had events") || !strings.Contains(s, "events_missed=") {
		t.Errorf("a pool subscribed after the sends logged %q, want a warning that it misses events", s)
	}
	pgtest.WaitFor(t, 10*time.Second, "the StartFromOldest pool to receive the earlier events", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got["oldest"]) == len(ids)
	})
	if s := oldestLog.String(); strings.Contains(s, "already had events") {
		t.Errorf("the StartFromOldest pool warned: %q", s)
	}
	// A later event reaches both: the late pool is working, and the
	// earlier ones were simply never its own.
	later, err := env.client.Send(ctx, env.queue, pgque.Event{Type: "FileCreated", Payload: 4, PartitionKey: "t3"})
	if err != nil {
		t.Fatal(err)
	}
	pgtest.WaitFor(t, 10*time.Second, "the later event at both pools", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got["late"]) == 1 && len(got["oldest"]) == len(ids)+1
	})
	mu.Lock()
	defer mu.Unlock()
	if got["late"][0] != later {
		t.Errorf("late pool received %v, want only %d", got["late"], later)
	}
}

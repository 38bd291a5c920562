package pgque_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/pgque/pgque"
	"github.com/pgque/pgque/internal/testing/pgtest"
)

// TestHandlerDeadLetterNow: a handler returning DeadLetter(err) sends the
// event straight to the dead letters with err as the reason, on its first
// delivery, though the queue allows retries.
func TestHandlerDeadLetterNow(t *testing.T) {
	t.Parallel()
	env := setup(t)
	ctx := context.Background()
	obs := &recorder{}
	client, err := pgque.NewClient(env.pool, &pgque.Config{Observer: obs, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	startTicker(t, client)
	c := &collector{}
	con, err := client.NewConsumer(&pgque.ConsumerConfig{Queue: env.queue, Consumer: "c",
		Handler: func(ctx context.Context, m *pgque.Message) error {
			_ = c.handle(ctx, m)
			return pgque.DeadLetter(errors.New("tenant was deleted"))
		}})
	if err != nil {
		t.Fatal(err)
	}
	if err := con.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer con.Stop(ctx)
	id, err := client.Send(ctx, env.queue, pgque.Event{Payload: 1})
	if err != nil {
		t.Fatal(err)
	}
	var dls []pgque.DeadLetterEntry
	pgtest.WaitFor(t, 20*time.Second, "the dead letter", func() bool {
		dls, err = client.DeadLetters(ctx, env.queue, nil)
		return err == nil && len(dls) == 1
	})
	if d := dls[0]; d.EventID != id || d.Reason != "tenant was deleted" || d.RetryCount != 0 {
		t.Fatalf("dead letter %+v: want event %d, the handler's reason, no retries", d, id)
	}
	// The counters move once the settling transaction has committed, just
	// after the dead letter became visible: wait for that, then check.
	pgtest.WaitFor(t, 20*time.Second, "the dead-lettered counter", func() bool {
		return obs.total(pgque.MetricEventsDeadLettered) >= 1
	})
	if n := obs.total(pgque.MetricEventsDeadLettered); n != 1 {
		t.Fatalf("dead-lettered counter %v, want 1", n)
	}
	if n := obs.total(pgque.MetricEventsRetried); n != 0 {
		t.Fatalf("%v retries scheduled, want none", n)
	}
	if got := c.snapshot(); len(got) != 1 {
		t.Fatalf("handled %d times, want once", len(got))
	}
	if err := pgque.DeadLetter(errors.New("x")); !errors.Is(err, pgque.ErrDeadLetter) || err.Error() != "x" {
		t.Fatalf("DeadLetter(x) = %v", err)
	}
}

// TestPartitionedDeadLetterReleasesPausedKey: under the pause policy, a
// head dead-lettered by its handler releases the key's held events at once.
func TestPartitionedDeadLetterReleasesPausedKey(t *testing.T) {
	t.Parallel()
	env := setup(t)
	ctx := context.Background()
	startTicker(t, env.client)
	var mu sync.Mutex
	var order []int64
	pc, err := env.client.NewPartitionedConsumer(&pgque.PartitionedConsumerConfig{
		Queue: env.queue, Consumer: "c", Slots: 2, FailurePolicy: pgque.FailurePolicyPause,
		Handler: func(_ context.Context, m *pgque.Message) error {
			mu.Lock()
			order = append(order, m.ID)
			first := len(order) == 1
			mu.Unlock()
			if first {
				return pgque.DeadLetter(errors.New("cannot be processed"))
			}
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := pc.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer pc.Stop(ctx)
	ids, err := env.client.SendBatch(ctx, env.queue, []pgque.Event{
		{Payload: 1, PartitionKey: "k"}, {Payload: 2, PartitionKey: "k"}, {Payload: 3, PartitionKey: "k"},
	})
	if err != nil {
		t.Fatal(err)
	}
	pgtest.WaitFor(t, 20*time.Second, "the held events", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(order) >= 3
	})
	mu.Lock()
	got := append([]int64(nil), order...)
	mu.Unlock()
	if len(got) != 3 || got[0] != ids[0] || got[1] != ids[1] || got[2] != ids[2] {
		t.Fatalf("handled %v, want %v once each in order", got, ids)
	}
	dls, err := env.client.DeadLetters(ctx, env.queue, nil)
	if err != nil || len(dls) != 1 || dls[0].EventID != ids[0] {
		t.Fatalf("dead letters %+v, %v; want the head", dls, err)
	}
	// The block ends when the chunk holding the last released event is
	// acknowledged, just after its handler returned.
	var keys []pgque.BlockedKey
	pgtest.WaitFor(t, 20*time.Second, "the key's block to end", func() bool {
		keys, err = env.client.BlockedKeys(ctx, env.queue, "c")
		return err == nil && len(keys) == 0
	})
}

// TestHandlerTimeout: a handler that outlives HandlerTimeout sees its
// context end with ErrHandlerTimeout, its failure wraps it, and the event
// is retried.
func TestHandlerTimeout(t *testing.T) {
	t.Parallel()
	env := setup(t)
	ctx := context.Background()
	obs := &recorder{}
	client, err := pgque.NewClient(env.pool, &pgque.Config{Observer: obs, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	startTicker(t, client)
	causes := make(chan error, 4)
	con, err := client.NewConsumer(&pgque.ConsumerConfig{Queue: env.queue, Consumer: "c",
		HandlerTimeout: 100 * time.Millisecond, RetryDelay: func(int) time.Duration { return 0 },
		Handler: func(ctx context.Context, m *pgque.Message) error {
			if m.RetryCount > 0 {
				return nil
			}
			<-ctx.Done()
			causes <- context.Cause(ctx)
			return ctx.Err()
		}})
	if err != nil {
		t.Fatal(err)
	}
	if err := con.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer con.Stop(ctx)
	if _, err := client.Send(ctx, env.queue, pgque.Event{Payload: 1}); err != nil {
		t.Fatal(err)
	}
	select {
	case cause := <-causes:
		if !errors.Is(cause, pgque.ErrHandlerTimeout) {
			t.Fatalf("handler context cause %v, want ErrHandlerTimeout", cause)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the handler was never timed out")
	}
	pgtest.WaitFor(t, 20*time.Second, "the retry to succeed", func() bool { return obs.total(pgque.MetricEventsProcessed) == 1 })
	obs.mu.Lock()
	defer obs.mu.Unlock()
	if len(obs.results) != 2 || !errors.Is(obs.results[0].Err, pgque.ErrHandlerTimeout) || obs.results[1].Err != nil {
		t.Fatalf("handler results %+v: want a timeout, then success", obs.results)
	}
	if _, err := client.NewConsumer(&pgque.ConsumerConfig{Queue: env.queue, Consumer: "x", HandlerTimeout: -1,
		Handler: func(context.Context, *pgque.Message) error { return nil }}); !errors.Is(err, pgque.ErrInvalidArgument) {
		t.Fatalf("negative HandlerTimeout: %v, want ErrInvalidArgument", err)
	}
}

// TestOnErrorReceivesBackgroundErrors: when the queue under a running
// consumer is dropped, Config.OnError hears about it as ErrQueueNotFound
// (not only the log).
func TestOnErrorReceivesBackgroundErrors(t *testing.T) {
	t.Parallel()
	env := setup(t)
	ctx := context.Background()
	errs := make(chan error, 100)
	client, err := pgque.NewClient(env.pool, &pgque.Config{Logger: testLogger(t), PollOnly: true,
		OnError: func(_ context.Context, err error) {
			select {
			case errs <- err:
			default:
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	con, err := client.NewConsumer(&pgque.ConsumerConfig{Queue: env.queue, Consumer: "c", PollInterval: 20 * time.Millisecond,
		Handler: func(context.Context, *pgque.Message) error { return nil }})
	if err != nil {
		t.Fatal(err)
	}
	if err := con.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer con.Stop(ctx)
	if err := client.DropQueue(ctx, env.queue, true); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errs:
		var pe *pgque.Error
		if !errors.As(err, &pe) || !(errors.Is(err, pgque.ErrQueueNotFound) || errors.Is(err, pgque.ErrConsumerNotFound)) {
			t.Fatalf("OnError got %v, want an *Error for the dropped queue", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("OnError was never called after the queue was dropped")
	}
}

package pgque_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/pgque/pgque/internal/testing/leakcheck"

	"github.com/pgque/pgque"
	"github.com/pgque/pgque/internal/testing/pgtest"
)

// collector records what a consumer's handler saw.
type collector struct {
	mu   sync.Mutex
	msgs []pgque.Message
}

func (c *collector) handle(_ context.Context, m *pgque.Message) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.msgs = append(c.msgs, *m)
	return nil
}

func (c *collector) snapshot() []pgque.Message {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]pgque.Message(nil), c.msgs...)
}

// wait returns the messages once at least n arrived.
func (c *collector) wait(t *testing.T, n int) []pgque.Message {
	t.Helper()
	pgtest.WaitFor(t, 20*time.Second, "messages", func() bool { return len(c.snapshot()) >= n })
	return c.snapshot()
}

// collect starts a ticker and a consumer that records every message; both
// stop when the test ends.
func collect(t *testing.T, env *testEnv, consumer string) *collector {
	t.Helper()
	c := &collector{}
	startTicker(t, env.client)
	startConsumer(t, env, &pgque.ConsumerConfig{Queue: env.queue, Consumer: consumer, Handler: c.handle})
	return c
}

// startConsumer starts a consumer stopped when the test ends.
func startConsumer(t *testing.T, env *testEnv, cfg *pgque.ConsumerConfig) *pgque.Consumer {
	t.Helper()
	con, err := env.client.NewConsumer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := con.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := con.Stop(ctx); err != nil {
			t.Error("stopping consumer:", err)
		}
	})
	return con
}

func TestConsumerReceivesInOrder(t *testing.T) {
	t.Parallel()
	env := setup(t)
	ctx := context.Background()
	c := collect(t, env, "c")
	var want []int64
	for i := range 250 {
		id, err := env.client.Send(ctx, env.queue, pgque.Event{Type: "n", Payload: i, PartitionKey: "k"})
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, id)
	}
	got := c.wait(t, len(want))
	if len(got) != len(want) {
		t.Fatalf("got %d messages, want %d", len(got), len(want))
	}
	for i, m := range got {
		if m.ID != want[i] {
			t.Fatalf("message %d has id %d, want %d", i, m.ID, want[i])
		}
		if m.Type != "n" || m.PartitionKey != "k" || m.Queue != env.queue || m.Consumer != "c" {
			t.Fatalf("message %d: %+v", i, m)
		}
	}
}

func TestConsumerHandlerPanicBecomesNack(t *testing.T) {
	t.Parallel()
	env := setup(t)
	ctx := context.Background()
	startTicker(t, env.client)
	var mu sync.Mutex
	var deliveries []int
	done := make(chan struct{})
	startConsumer(t, env, &pgque.ConsumerConfig{
		Queue: env.queue, Consumer: "c",
		RetryDelay: func(int) time.Duration { return 10 * time.Millisecond },
		Handler: func(_ context.Context, m *pgque.Message) error {
			mu.Lock()
			defer mu.Unlock()
			deliveries = append(deliveries, m.RetryCount)
			if m.RetryCount == 0 {
				panic("boom")
			}
			close(done)
			return nil
		},
	})
	if _, err := env.client.Send(ctx, env.queue, pgque.Event{Payload: "x"}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("the panicking event was never redelivered")
	}
	mu.Lock()
	defer mu.Unlock()
	if len(deliveries) != 2 || deliveries[0] != 0 || deliveries[1] != 1 {
		t.Fatalf("deliveries (retry counts) = %v, want [0 1]", deliveries)
	}
}

func TestConsumerHandlerErrorIsRetriedThenDeadLettered(t *testing.T) {
	t.Parallel()
	env := setup(t)
	ctx := context.Background()
	if err := env.client.SetQueueConfig(ctx, env.queue, pgque.QueueMaxRetries(2)); err != nil {
		t.Fatal(err)
	}
	startTicker(t, env.client)
	var mu sync.Mutex
	var retries []int
	startConsumer(t, env, &pgque.ConsumerConfig{
		Queue: env.queue, Consumer: "c",
		RetryDelay: func(int) time.Duration { return 10 * time.Millisecond },
		Handler: func(_ context.Context, m *pgque.Message) error {
			mu.Lock()
			defer mu.Unlock()
			retries = append(retries, m.RetryCount)
			return errors.New("always fails")
		},
	})
	id, err := env.client.Send(ctx, env.queue, pgque.Event{Payload: "x"})
	if err != nil {
		t.Fatal(err)
	}
	pgtest.WaitFor(t, 20*time.Second, "three deliveries", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(retries) >= 3
	})
	// The third failure (retry count 2 = max_retries) dead-letters the
	// event; a dead letter is never delivered again.
	var dls []pgque.DeadLetterEntry
	pgtest.WaitFor(t, 20*time.Second, "the dead letter", func() bool {
		var err error
		dls, err = env.client.DeadLetters(ctx, env.queue, nil)
		return err == nil && len(dls) == 1
	})
	if d := dls[0]; d.EventID != id || d.Consumer != "c" || d.RetryCount != 2 || d.Reason != "always fails" {
		t.Fatalf("dead letter %+v: want event %d of c after 2 retries, reason \"always fails\"", d, id)
	}
	if qs, err := env.client.Queues(ctx, env.queue); err != nil || qs[0].RetryPending != 0 {
		t.Fatalf("retries still pending after the dead letter: %+v, %v", qs, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(retries) != 3 || retries[0] != 0 || retries[1] != 1 || retries[2] != 2 {
		t.Fatalf("retry counts seen = %v, want [0 1 2] then dead-lettered", retries)
	}
}

func TestConsumerConfigValidation(t *testing.T) {
	t.Parallel()
	env := setup(t)
	for _, cfg := range []*pgque.ConsumerConfig{
		nil,
		{Consumer: "c", Handler: func(context.Context, *pgque.Message) error { return nil }},
		{Queue: "q", Handler: func(context.Context, *pgque.Message) error { return nil }},
		{Queue: "q", Consumer: "c"},
		{Queue: "q", Consumer: "c", BatchSize: -1, Handler: func(context.Context, *pgque.Message) error { return nil }},
	} {
		if _, err := env.client.NewConsumer(cfg); !errors.Is(err, pgque.ErrInvalidArgument) {
			t.Errorf("NewConsumer(%+v) = %v, want ErrInvalidArgument", cfg, err)
		}
	}
}

func TestConsumerStartUnknownQueue(t *testing.T) {
	t.Parallel()
	env := setup(t)
	con, err := env.client.NewConsumer(&pgque.ConsumerConfig{Queue: "missing", Consumer: "c",
		Handler: func(context.Context, *pgque.Message) error { return nil }})
	if err != nil {
		t.Fatal(err)
	}
	if err := con.Start(context.Background()); !errors.Is(err, pgque.ErrQueueNotFound) {
		t.Fatalf("Start = %v, want ErrQueueNotFound", err)
	}
}

// TestConsumerStopLeavesNoGoroutines is not parallel: leakcheck inspects every
// goroutine of the binary.
func TestConsumerStopLeavesNoGoroutines(t *testing.T) {
	env := setup(t)
	ctx := context.Background()
	before := leakcheck.Take()
	tk, err := env.client.NewTicker(nil)
	if err != nil {
		t.Fatal(err)
	}
	c := &collector{}
	con, err := env.client.NewConsumer(&pgque.ConsumerConfig{Queue: env.queue, Consumer: "c", Handler: c.handle})
	if err != nil {
		t.Fatal(err)
	}
	if err := tk.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := con.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := env.client.Send(ctx, env.queue, pgque.Event{Payload: 1}); err != nil {
		t.Fatal(err)
	}
	c.wait(t, 1)
	for range 2 { // Stop is idempotent
		if err := con.Stop(ctx); err != nil {
			t.Fatal(err)
		}
		if err := tk.Stop(ctx); err != nil {
			t.Fatal(err)
		}
	}
	leakcheck.Verify(t, before)
}

func TestConsumerGracefulStopAcksInFlightChunk(t *testing.T) {
	t.Parallel()
	env := setup(t)
	ctx := context.Background()
	startTicker(t, env.client)
	started := make(chan struct{}, 1)
	release := make(chan struct{})
	var handled sync.Map
	con, err := env.client.NewConsumer(&pgque.ConsumerConfig{Queue: env.queue, Consumer: "c",
		Handler: func(ctx context.Context, m *pgque.Message) error {
			select {
			case started <- struct{}{}:
			default:
			}
			<-release
			handled.Store(m.ID, true)
			return nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	if err := con.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := env.client.SendBatch(ctx, env.queue, []pgque.Event{{Payload: 1}, {Payload: 2}}); err != nil {
		t.Fatal(err)
	}
	<-started
	stopped := make(chan error, 1)
	go func() { stopped <- con.Stop(ctx) }()
	// Release the handler only once Stop is in flight, so the chunk is
	// finished under a stop that already happened.
	<-pgque.ConsumerStopping(con)
	select {
	case err := <-stopped:
		t.Fatalf("Stop returned (%v) while the handler was still running", err)
	default:
	}
	close(release)
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
	if n := countHandled(&handled); n != 2 {
		t.Fatalf("the graceful stop let %d of the chunk's 2 events finish, want 2", n)
	}
	// The chunk was acked: the subscription has no open batch, and a new
	// consumer of it sees only a new event.
	subs, err := env.client.Consumers(ctx, env.queue)
	if err != nil || len(subs) != 1 || subs[0].OpenBatch != nil || subs[0].RetryPending != 0 {
		t.Fatalf("after a graceful stop the subscription is %+v (%v), want no open batch", subs, err)
	}
	c := collect(t, env, "c")
	if _, err := env.client.Send(ctx, env.queue, pgque.Event{Payload: 3}); err != nil {
		t.Fatal(err)
	}
	if got := c.wait(t, 1); len(got) != 1 || string(got[0].Payload) != "3" {
		t.Fatalf("after a graceful stop the next consumer got %d messages (%v), want only the new one", len(got), got)
	}
}

func TestConsumerHardStopAbandonsChunk(t *testing.T) {
	t.Parallel()
	env := setup(t)
	ctx := context.Background()
	startTicker(t, env.client)
	started := make(chan struct{}, 1)
	con, err := env.client.NewConsumer(&pgque.ConsumerConfig{Queue: env.queue, Consumer: "c",
		Handler: func(ctx context.Context, m *pgque.Message) error {
			select {
			case started <- struct{}{}:
			default:
			}
			<-ctx.Done()
			return ctx.Err()
		}})
	if err != nil {
		t.Fatal(err)
	}
	if err := con.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := env.client.Send(ctx, env.queue, pgque.Event{Payload: 1}); err != nil {
		t.Fatal(err)
	}
	<-started
	stopCtx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if err := con.Stop(stopCtx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Stop = %v, want DeadlineExceeded", err)
	}
	// Not acked: the next consumer gets the same event again.
	c := collect(t, env, "c")
	got := c.wait(t, 1)
	if string(got[0].Payload) != "1" || got[0].RetryCount != 0 {
		t.Fatalf("redelivered %+v, want the abandoned event", got[0])
	}
}

// countHandled counts the entries of a sync.Map.
func countHandled(m *sync.Map) int {
	n := 0
	m.Range(func(any, any) bool { n++; return true })
	return n
}

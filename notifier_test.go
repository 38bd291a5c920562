package pgque_test

import (
	"context"
	"testing"
	"time"

	"github.com/pgque/pgque"
)

// TestConsumerWakesUpAfterListenSessionDies kills the LISTEN session: the
// notifier reconnects and wake-ups keep coming, well before the (here very
// long) poll interval.
func TestConsumerWakesUpAfterListenSessionDies(t *testing.T) {
	t.Parallel()
	env := setup(t)
	ctx := context.Background()
	startTicker(t, env.client)
	c := &collector{}
	startConsumer(t, env, &pgque.ConsumerConfig{Queue: env.queue, Consumer: "c", Handler: c.handle, PollInterval: time.Hour})
	send := func(n int) time.Duration {
		start := time.Now()
		if _, err := env.client.Send(ctx, env.queue, pgque.Event{Payload: n}); err != nil {
			t.Fatal(err)
		}
		c.wait(t, n)
		return time.Since(start)
	}
	// The consumer's first receive subscribes before LISTEN may be up: give
	// the session a moment, then measure.
	time.Sleep(200 * time.Millisecond)
	t.Logf("first event consumed after %v", send(1))
	var killed int
	err := env.pool.QueryRow(ctx, `select count(pg_terminate_backend(pid)) from pg_stat_activity
		where datname = current_database() and query ilike 'listen%'`).Scan(&killed)
	if err != nil || killed != 1 {
		t.Fatalf("terminated %d LISTEN sessions (%v), want 1", killed, err)
	}
	time.Sleep(500 * time.Millisecond) // reconnect backoff
	if d := send(2); d > 5*time.Second {
		t.Fatalf("after the LISTEN session died the event took %v", d)
	} else {
		t.Logf("after reconnect, event consumed after %v", d)
	}
}

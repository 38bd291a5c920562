package pgque_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgque/pgque"
	"github.com/pgque/pgque/internal/testing/pgtest"
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
	// The consumer subscribes before LISTEN is up: measure once its
	// session listens.
	pgtest.WaitFor(t, 10*time.Second, "the LISTEN session", func() bool { return pgque.NotifierSessions(env.client) == 1 })
	t.Logf("first event consumed after %v", send(1))
	var killed int
	err := env.pool.QueryRow(ctx, `select count(pg_terminate_backend(pid)) from pg_stat_activity
		where datname = current_database() and query ilike 'listen%'`).Scan(&killed)
	if err != nil || killed != 1 {
		t.Fatalf("terminated %d LISTEN sessions (%v), want 1", killed, err)
	}
	// The notifier reconnects after a backoff; a wake-up sent before its
	// new session listens would be lost (the consumer then re-checks once,
	// which this test must not count as a wake-up).
	pgtest.WaitFor(t, 10*time.Second, "the notifier to reconnect", func() bool { return pgque.NotifierSessions(env.client) == 2 })
	if d := send(2); d > 5*time.Second {
		t.Fatalf("after the LISTEN session died the event took %v", d)
	} else {
		t.Logf("after reconnect, event consumed after %v", d)
	}
}

// TestNotifierSessionHonoursPoolHooks: the LISTEN session is opened through
// the application's pool, so its BeforeConnect hook (which here names the
// session) applies to it as to every other connection.
func TestNotifierSessionHonoursPoolHooks(t *testing.T) {
	t.Parallel()
	env := setup(t)
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(env.dsn)
	if err != nil {
		t.Fatal(err)
	}
	var hooked atomic.Int64
	cfg.BeforeConnect = func(_ context.Context, cc *pgx.ConnConfig) error {
		hooked.Add(1)
		cc.RuntimeParams["application_name"] = "pgque-hooked"
		return nil
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	client := newClient(t, pool)
	defer client.Close()
	startTicker(t, client)
	c := &collector{}
	con, err := client.NewConsumer(&pgque.ConsumerConfig{Queue: env.queue, Consumer: "c", Handler: c.handle, PollInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if err := con.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer con.Stop(ctx)
	var app string
	pgtest.WaitFor(t, 10*time.Second, "the LISTEN session", func() bool {
		err := env.pool.QueryRow(ctx, `select application_name from pg_stat_activity
			where datname = current_database() and query ilike 'listen%'`).Scan(&app)
		return err == nil
	})
	if app != "pgque-hooked" {
		t.Fatalf("the LISTEN session has application_name %q: the pool's BeforeConnect was bypassed", app)
	}
	// And it works: a wake-up arrives long before the hour-long poll.
	if _, err := client.Send(ctx, env.queue, pgque.Event{Payload: 1}); err != nil {
		t.Fatal(err)
	}
	c.wait(t, 1)
}

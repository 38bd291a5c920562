package pgque_test

import (
	"context"
	"log/slog"
	"strings"
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

// TestNotifierProbe: each LISTEN session is sent a notification through
// the pool. On a direct connection it comes back and nothing is logged;
// through PgBouncer in transaction mode it never does (the pooler drops
// notifications that arrive while no client is linked to the server
// connection), so the client logs that wake-ups do not arrive and names
// PollOnly, and still delivers by its polls.
func TestNotifierProbe(t *testing.T) {
	t.Parallel()
	env := setup(t)
	ctx := context.Background()
	startTicker(t, env.client)
	t.Cleanup(func() {
		if t.Failed() {
			ok, failed := pgque.NotifierProbes(env.client)
			t.Logf("the direct client's probes: %d ok, %d failed", ok, failed)
		}
	})
	direct := &collector{}
	startConsumer(t, env, &pgque.ConsumerConfig{Queue: env.queue, Consumer: "direct", Handler: direct.handle, PollInterval: time.Hour})
	pgtest.WaitFor(t, 10*time.Second, "the direct session's probe to come back", func() bool {
		ok, _ := pgque.NotifierProbes(env.client)
		return ok == 1
	})
	if _, failed := pgque.NotifierProbes(env.client); failed != 0 {
		t.Errorf("%d probes of the direct session failed", failed)
	}

	cfg := pgtest.PgBouncer(t, env.dsn, 2)
	bp, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(bp.Close)
	var logs syncBuffer
	bc, err := pgque.NewClient(bp, &pgque.Config{Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			dok, dfailed := pgque.NotifierProbes(env.client)
			pok, pfailed := pgque.NotifierProbes(bc)
			t.Logf("probes: direct %d ok %d failed, pooled %d ok %d failed; the pooled client's log:\n%s", dok, dfailed, pok, pfailed, logs.String())
		}
	})
	pooled := &collector{}
	startConsumer(t, &testEnv{dsn: env.dsn, pool: bp, client: bc, queue: env.queue},
		&pgque.ConsumerConfig{Queue: env.queue, Consumer: "pooled", Handler: pooled.handle, PollInterval: 100 * time.Millisecond})
	pgtest.WaitFor(t, 15*time.Second, "the pooled session's probe to fail", func() bool {
		_, failed := pgque.NotifierProbes(bc)
		return failed == 1
	})
	if !strings.Contains(logs.String(), "PollOnly") {
		t.Errorf("the warning does not name PollOnly: %s", logs.String())
	}
	if ok, _ := pgque.NotifierProbes(bc); ok != 0 {
		t.Errorf("%d probes came back through the pooler", ok)
	}
	if _, err := env.client.Send(ctx, env.queue, pgque.Event{Payload: 1}); err != nil {
		t.Fatal(err)
	}
	pooled.wait(t, 1)
	direct.wait(t, 1)
}

package pgque_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgque/pgque"
	"github.com/pgque/pgque/internal/testing/pgtest"
)

func TestTickerExactlyOneLeads(t *testing.T) {
	t.Parallel()
	env := setup(t)
	ctx := context.Background()
	var tickers []*pgque.Ticker
	for _, id := range []string{"t1", "t2", "t3"} {
		tk, err := newClient(t, env.pool).NewTicker(&pgque.TickerConfig{WorkerID: id, LeaseTTL: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if err := tk.Start(ctx); err != nil {
			t.Fatal(err)
		}
		defer tk.Stop(ctx)
		tickers = append(tickers, tk)
	}
	leaders := func() (n int, leader *pgque.Ticker) {
		for _, tk := range tickers {
			if tk.IsLeader() {
				n++
				leader = tk
			}
		}
		return n, leader
	}
	pgtest.WaitFor(t, 5*time.Second, "a leader", func() bool { n, _ := leaders(); return n == 1 })
	for range 3 {
		// Half a second of lease renewals (LeaseTTL/4 apart) with never
		// two leaders: the window is what is checked, not a wait.
		from := time.Now()
		pgtest.WaitFor(t, 5*time.Second, "half a second of leadership", func() bool {
			if n, _ := leaders(); n > 1 {
				t.Fatalf("%d tickers lead at once", n)
			}
			return time.Since(from) >= 500*time.Millisecond
		})
		// Under load a renewal can come late enough for the leader's own
		// conservative view to lapse for a moment: stop the one that leads.
		pgtest.WaitFor(t, 10*time.Second, "a leader to stop", func() bool { n, _ := leaders(); return n == 1 })
		_, leader := leaders()
		if err := leader.Stop(ctx); err != nil {
			t.Fatal(err)
		}
		if leader.IsLeader() {
			t.Fatal("a stopped ticker still leads")
		}
		start := time.Now()
		remaining := tickers[:0:0]
		for _, tk := range tickers {
			if tk != leader {
				remaining = append(remaining, tk)
			}
		}
		tickers = remaining
		if len(tickers) == 0 {
			break
		}
		pgtest.WaitFor(t, 10*time.Second, "a new leader", func() bool { n, _ := leaders(); return n == 1 })
		t.Logf("new leader after %v", time.Since(start))
	}
}

func TestTickerConfigValidation(t *testing.T) {
	t.Parallel()
	env := setup(t)
	for _, c := range []struct {
		cfg  pgque.TickerConfig
		want string
	}{
		{pgque.TickerConfig{LeaseTTL: time.Millisecond}, "LeaseTTL 1ms is below the minimum"},
		{pgque.TickerConfig{TickInterval: -time.Second}, "must not be negative"},
		{pgque.TickerConfig{RetryInterval: -time.Second}, "must not be negative"},
		{pgque.TickerConfig{MaintInterval: -time.Second}, "must not be negative"},
	} {
		_, err := env.client.NewTicker(&c.cfg)
		if !errors.Is(err, pgque.ErrInvalidArgument) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("NewTicker(%+v) = %v, want ErrInvalidArgument saying %q", c.cfg, err, c.want)
		}
	}
	if _, err := env.client.NewTicker(&pgque.TickerConfig{LeaseTTL: pgque.LeaseTTLMin}); err != nil {
		t.Errorf("the minimum lease was refused: %v", err)
	}
	tk, err := env.client.NewTicker(nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := tk.Stop(context.Background()); err != nil {
		t.Fatalf("Stop before Start = %v, want nil", err)
	}
}

// TestTickerStopHandsOverAtOnce: with a long lease (standing tickers check
// it every LeaseTTL/4 = 30 s), a stopped leader's resignation notice makes
// a standing ticker take over well before its next check. The wait, a
// quarter of that period, leaves room for a loaded machine (a hand-over is
// about 10 ms when idle, under half a second beside the package's other
// tests) while a take-over at the next check could not pass it.
func TestTickerStopHandsOverAtOnce(t *testing.T) {
	t.Parallel()
	env := setup(t)
	ctx := context.Background()
	const ttl = 2 * time.Minute
	first, err := newClient(t, env.pool).NewTicker(&pgque.TickerConfig{WorkerID: "first", LeaseTTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	if err := first.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer first.Stop(ctx)
	pgtest.WaitFor(t, 5*time.Second, "the first ticker to lead", first.IsLeader)
	secondClient := newClient(t, env.pool)
	second, err := secondClient.NewTicker(&pgque.TickerConfig{WorkerID: "second", LeaseTTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	if err := second.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer second.Stop(ctx)
	// The second ticker has asked for the lease and been refused, and its
	// session listens for the resignation: it now stands by until its next
	// check, a quarter of the TTL away, unless the notice wakes it.
	pgtest.WaitFor(t, 5*time.Second, "the second ticker to be refused and listen", func() bool {
		return pgque.TickerRefused(second) > 0 && pgque.NotifierSessions(secondClient) > 0
	})
	if second.IsLeader() {
		t.Fatal("the second ticker leads beside the first")
	}
	stopped := time.Now()
	if err := first.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	logged := false
	pgtest.WaitFor(t, ttl/8, "the second ticker to take over", func() bool {
		if second.IsLeader() {
			return true
		}
		if !logged && time.Since(stopped) > ttl/16 {
			// Halfway: say where the hand-over stands, for a failure to
			// tell a lost notice from a slow machine.
			logged = true
			var owner string
			err := env.pool.QueryRow(ctx, `select coalesce(owner, '(none)') from pgque.ticker_lease`).Scan(&owner)
			t.Logf("after %v: lease owner %q (%v), second refused %d times, its notifier sessions %d",
				time.Since(stopped).Round(time.Millisecond), owner, err, pgque.TickerRefused(second), pgque.NotifierSessions(secondClient))
		}
		return false
	})
	t.Logf("the second ticker took over %v after the first stopped", time.Since(stopped))
}

// TestTickerStopLetsItsLeaseCallFinish: a leader stopped while its lease
// call waits lets the call finish before it resigns. Cancelled instead, the
// call is only abandoned by the client: a server that had not yet read it
// runs it after the resignation and gives the lease back to the stopped
// ticker, and no queue ticks until it expires. Here the call is a renewal
// that waits on the lease row, which the test holds locked.
func TestTickerStopLetsItsLeaseCallFinish(t *testing.T) {
	t.Parallel()
	env := setup(t)
	ctx := context.Background()
	// A renewal locks the row once half the lease is left: with 8 s, the
	// lease is checked every 2 s and locked about 4 s in; each call is
	// bounded by the lease, so the test has 8 s to end the wait.
	tk, err := env.client.NewTicker(&pgque.TickerConfig{WorkerID: "held", LeaseTTL: 8 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := tk.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer tk.Stop(ctx)
	pgtest.WaitFor(t, 5*time.Second, "the ticker to lead", tk.IsLeader)
	holder, err := env.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback(ctx)
	if _, err := holder.Exec(ctx, "select 1 from pgque.ticker_lease for update"); err != nil {
		t.Fatal(err)
	}
	// waiting counts the sessions waiting on the row in ticker_lead and in
	// ticker_resign.
	waiting := func() (lead, resign int) {
		return lockWaiters(t, env, "ticker_lead"), lockWaiters(t, env, "ticker_resign")
	}
	pgtest.WaitFor(t, 15*time.Second, "the renewal to wait on the lease row", func() bool {
		lead, _ := waiting()
		return lead == 1
	})
	// A cancelled renewal would also let the resignation queue behind the
	// row in its place.
	stopLetsFinish(t, env, holder, tk.Stop, func() <-chan struct{} { return pgque.TickerStopping(tk) },
		"the renewal", func() bool { lead, resign := waiting(); return lead == 1 && resign == 0 })
	var owner *string
	if err := env.pool.QueryRow(ctx, "select owner from pgque.ticker_lease").Scan(&owner); err != nil {
		t.Fatal(err)
	}
	if owner != nil {
		t.Fatalf("the lease is held by %q after Stop, want it resigned", *owner)
	}
}

// roundCounter counts the ticker's rounds (MetricTickerRounds).
type roundCounter struct {
	pgque.NopObserver
	n atomic.Int64
}

func (o *roundCounter) Metric(m pgque.Measurement) {
	if m.Name == pgque.MetricTickerRounds {
		o.n.Add(int64(m.Value))
	}
}

// TestTickerTicksAtItsInterval checks that a queue with events always
// pending is ticked in every round of the ticker when ticker_max_lag equals
// TickInterval (as the defaults do, both 10 ms), not in every other round.
// A tick is due when the last is max_lag old; if ticks were stamped when
// the round reached the queue instead of when the round started, each next
// round would find the last tick short of due by the time the round takes
// to reach it, and the queue would be ticked in half the rounds. Sixty idle
// queues ahead of this one make that time a few milliseconds. The test
// counts rounds as the ticker reports them, not as the clock predicts, so a
// slow machine that makes fewer rounds does not fail it; such a machine
// only makes rounds too late for the fault to show (each finds the tick
// due), which the log says.
func TestTickerTicksAtItsInterval(t *testing.T) {
	t.Parallel()
	env := setup(t)
	ctx := context.Background()
	const interval = 40 * time.Millisecond
	if _, err := env.pool.Exec(ctx, "select pgque.create_queue('idle' || g) from generate_series(1, 60) g"); err != nil {
		t.Fatal(err)
	}
	queue := env.queue + "_last" // ticked after the idle queues
	if _, err := env.client.CreateQueue(ctx, queue); err != nil {
		t.Fatal(err)
	}
	if err := env.client.SetQueueConfig(ctx, queue, pgque.QueueTickerMaxLag(40*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	rounds := &roundCounter{}
	client, err := pgque.NewClient(env.pool, &pgque.Config{Logger: testLogger(t), Observer: rounds})
	if err != nil {
		t.Fatal(err)
	}
	tk := startTickerWith(t, client, &pgque.TickerConfig{TickInterval: interval})
	pgtest.WaitFor(t, 10*time.Second, "the ticker to lead", tk.IsLeader)

	// Events always pending: a producer keeps one unticked event in the
	// queue, sending again as soon as a tick covered its last one.
	count := func() int {
		var n int
		if err := env.pool.QueryRow(ctx, `select count(*) from pgque.tick t join pgque.queue q on q.queue_id = t.tick_queue
		                                   where q.queue_name = $1`, queue).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	sendCtx, stopSending := context.WithCancel(ctx)
	sent := make(chan error, 1)
	go func() {
		for sendCtx.Err() == nil {
			if _, err := env.client.Send(sendCtx, queue, pgque.Event{Type: "t", Payload: []byte(`{}`)}); err != nil && sendCtx.Err() == nil {
				sent <- err
				return
			}
		}
		sent <- nil
	}()
	// Measure over 50 rounds once 5 have passed with the producer running.
	r0 := rounds.n.Load()
	pgtest.WaitFor(t, 30*time.Second, "5 ticker rounds", func() bool { return rounds.n.Load() >= r0+5 })
	before, r1, start := count(), rounds.n.Load(), time.Now()
	pgtest.WaitFor(t, 60*time.Second, "50 ticker rounds", func() bool { return rounds.n.Load() >= r1+50 })
	ticks, made, took := count()-before, int(rounds.n.Load()-r1), time.Since(start)
	stopSending()
	if err := <-sent; err != nil {
		t.Fatalf("sending: %v", err)
	}
	if want := made * 3 / 4; ticks < want {
		t.Fatalf("%d ticks in %d ticker rounds (%v) with events always pending; want one a round, at least %d",
			ticks, made, took, want)
	}
	if per := took / time.Duration(made); per > interval*5/4 {
		t.Logf("rounds took %v each against a %v interval: too slow for a late stamp to skip rounds", per, interval)
	}
	t.Logf("%d ticks in %d ticker rounds (%v)", ticks, made, took)
}

// TestTickerBuildsRoutingIndexesWhenAsked: a slot group's routing indexes
// are built by the ticker's maint_route_indexes(), since a subscribe that
// built them held its queue's producers until its transaction ended. The
// committed subscribe asks the leader for them, which builds them at once
// rather than at its next maint() (an hour away here). The first group's
// indexes show that the leader's first maint() is done.
func TestTickerBuildsRoutingIndexesWhenAsked(t *testing.T) {
	t.Parallel()
	env := setup(t)
	ctx := context.Background()
	routeIndexes := func(n int) int {
		var c int
		if err := env.pool.QueryRow(ctx, `select count(*) from pg_catalog.pg_class c join pgque.queue q on q.queue_name = $1
			where c.relkind = 'i' and c.relname ~ ('^event_' || q.queue_id || '_[0-9]+_route' || $2::int || '$')`, env.queue, n).Scan(&c); err != nil {
			t.Fatal(err)
		}
		return c
	}
	subscribe := func(consumer string, n int) {
		if _, err := env.pool.Exec(ctx, `select pgque.subscribe_slot($1, $2, k, $3) from generate_series(0, $3 - 1) k`, env.queue, consumer, n); err != nil {
			t.Fatal(err)
		}
	}
	subscribe("early", 4)
	if n := routeIndexes(4); n != 0 {
		t.Fatalf("%d routing indexes right after the subscribe, want none before maint_route_indexes", n)
	}
	startTickerWith(t, env.client, &pgque.TickerConfig{LeaseTTL: 2 * time.Second, MaintInterval: time.Hour})
	pgtest.WaitFor(t, 20*time.Second, "the first maint's routing indexes", func() bool { return routeIndexes(4) == 3 })
	subscribe("late", 8)
	pgtest.WaitFor(t, 20*time.Second, "the routing indexes the subscribe asked for", func() bool { return routeIndexes(8) == 3 })
}

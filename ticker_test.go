package pgque_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/pgque/pgque"
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
	waitFor(t, 5*time.Second, "a leader", func() bool { n, _ := leaders(); return n == 1 })
	for range 3 {
		deadline := time.Now().Add(500 * time.Millisecond)
		for time.Now().Before(deadline) {
			if n, _ := leaders(); n > 1 {
				t.Fatalf("%d tickers lead at once", n)
			}
			time.Sleep(5 * time.Millisecond)
		}
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
		waitFor(t, 3*time.Second, "a new leader", func() bool { n, _ := leaders(); return n == 1 })
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
// it every LeaseTTL/4 = 7.5 s), a stopped leader's resignation notice makes
// a standing ticker take over well before its next check.
func TestTickerStopHandsOverAtOnce(t *testing.T) {
	t.Parallel()
	env := setup(t)
	ctx := context.Background()
	const ttl = 30 * time.Second
	first, err := newClient(t, env.pool).NewTicker(&pgque.TickerConfig{WorkerID: "first", LeaseTTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	if err := first.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer first.Stop(ctx)
	waitFor(t, 5*time.Second, "the first ticker to lead", first.IsLeader)
	second, err := newClient(t, env.pool).NewTicker(&pgque.TickerConfig{WorkerID: "second", LeaseTTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	if err := second.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer second.Stop(ctx)
	// The second ticker has asked for the lease and been refused: it now
	// stands by until its next check, a quarter of the TTL away.
	waitFor(t, 5*time.Second, "the second ticker to stand by", func() bool {
		var owner string
		err := env.pool.QueryRow(ctx, `select coalesce(owner, '') from pgque.ticker_lease`).Scan(&owner)
		return err == nil && owner == "first" && !second.IsLeader()
	})
	time.Sleep(100 * time.Millisecond) // let its refused ticker_lead return
	if err := first.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ttl/8, "the second ticker to take over", second.IsLeader)
}

// TestTickerTicksAtItsInterval checks that a queue with events always
// pending is ticked once per TickInterval when ticker_max_lag equals it (as
// the defaults do, both 10 ms), not once every other poll. A tick is due
// when the last is max_lag old; if ticks were stamped when the poll reached
// the queue instead of when the poll started, each next poll would find
// the last tick short of due by the time the poll takes to reach it, and
// ticks would come at half the rate. Sixty idle queues ahead of this one
// make that time a few milliseconds. Intervals of 40 ms leave room for a
// slow machine: about 50 ticks in 2 s expected, about 25 at half rate, at
// least 37 required.
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
	if err := env.client.SetQueueConfig(ctx, queue, "ticker_max_lag", "40 ms"); err != nil {
		t.Fatal(err)
	}
	tk := startTickerWith(t, env.client, &pgque.TickerConfig{TickInterval: interval})
	waitFor(t, 10*time.Second, "the ticker to lead", tk.IsLeader)

	// Events always pending: a send every 4 ms.
	sendCtx, stopSending := context.WithCancel(ctx)
	sent := make(chan error, 1)
	go func() {
		for sendCtx.Err() == nil {
			if _, err := env.client.Send(sendCtx, queue, pgque.Event{Type: "t", Payload: []byte(`{}`)}); err != nil && sendCtx.Err() == nil {
				sent <- err
				return
			}
			time.Sleep(4 * time.Millisecond)
		}
		sent <- nil
	}()
	time.Sleep(200 * time.Millisecond) // let the first ticks settle
	count := func() int {
		var n int
		if err := env.pool.QueryRow(ctx, `select count(*) from pgque.tick t join pgque.queue q on q.queue_id = t.tick_queue
		                                   where q.queue_name = $1`, queue).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := count()
	const window = 2 * time.Second
	time.Sleep(window)
	ticks := count() - before
	stopSending()
	if err := <-sent; err != nil {
		t.Fatalf("sending: %v", err)
	}
	if want := int(window/interval) * 3 / 4; ticks < want {
		t.Fatalf("%d ticks in %v at a %v interval with events always pending; want at least %d (about %d)",
			ticks, window, interval, want, window/interval)
	}
	t.Logf("%d ticks in %v at a %v interval", ticks, window, interval)
}

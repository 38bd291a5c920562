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

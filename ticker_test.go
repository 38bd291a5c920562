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

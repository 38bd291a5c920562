package relay_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/pgque/pgque"
	"github.com/pgque/pgque/internal/testing/pgtest"
)

// startTestTicker runs a fast ticker in the test process.
func startTestTicker(t *testing.T, dsn string) {
	t.Helper()
	client, err := pgque.NewClient(pgtest.Pool(t, dsn), &pgque.Config{PollOnly: true, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	tk, err := client.NewTicker(&pgque.TickerConfig{LeaseTTL: 2 * time.Second, RetryInterval: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := tk.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = tk.Stop(ctx)
	})
}

package relay_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgque/pgque"
	"github.com/pgque/pgque/cmd/pgque/internal/relay"
	"github.com/pgque/pgque/internal/testing/pgtest"
)

// TestRelayTickerNeedsAdmin: a relay with a ticker whose role is only
// pgque_reader fails at start, naming the role and ticker_lead, instead of
// running and logging permission errors while nothing is ticked.
func TestRelayTickerNeedsAdmin(t *testing.T) {
	dsn := pgtest.NewInstalledDB(t)
	ctx := context.Background()
	admin := pgtest.Pool(t, dsn)
	if _, err := admin.Exec(ctx, `select pgque.create_queue('q')`); err != nil {
		t.Fatal(err)
	}
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
		_, err := c.Exec(ctx, `set role pgque_reader`)
		return err
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	client, err := pgque.NewClient(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	err = relay.Run(runCtx, &relay.RunConfig{
		Client:   client,
		Consumer: pgque.PartitionedConsumerConfig{Queue: "q", Consumer: "c", Slots: 2, WorkerID: "w"},
		Relay:    relay.Config{URL: "http://127.0.0.1:1/in"},
		Ticker:   &pgque.TickerConfig{},
	})
	if runCtx.Err() != nil {
		t.Fatal("Run kept running with a ticker its role may not run")
	}
	if !errors.Is(err, pgque.ErrPermissionDenied) || !strings.Contains(err.Error(), "ticker_lead") ||
		!strings.Contains(err.Error(), "pgque_reader") {
		t.Fatalf("Run = %v, want ErrPermissionDenied naming pgque_reader and ticker_lead", err)
	}
}

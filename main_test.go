package pgque_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgque/pgque"
	"github.com/pgque/pgque/internal/testing/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// testEnv is what most tests need: a fresh installed database, a pool, a
// client and a queue.
type testEnv struct {
	dsn    string
	pool   *pgxpool.Pool
	client *pgque.Client
	queue  string
}

// queueSeq makes queue names unique within the binary.
var queueSeq atomic.Int64

// setup gives the test its own database with pgque installed, a client and
// an empty queue.
func setup(t *testing.T) *testEnv {
	t.Helper()
	dsn := pgtest.NewInstalledDB(t)
	pool := pgtest.Pool(t, dsn)
	client := newClient(t, pool)
	queue := fmt.Sprintf("q%d", queueSeq.Add(1))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := client.CreateQueue(ctx, queue); err != nil {
		t.Fatal(err)
	}
	return &testEnv{dsn: dsn, pool: pool, client: client, queue: queue}
}

// newClient returns a client over pool that logs through t.
func newClient(t *testing.T, pool *pgxpool.Pool) *pgque.Client {
	t.Helper()
	client, err := pgque.NewClient(pool, &pgque.Config{Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	return client
}

// testLogger writes warnings and errors to the test log.
func testLogger(t *testing.T) *slog.Logger {
	level := slog.LevelWarn
	if os.Getenv("PGQUE_TEST_DEBUG") != "" {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: level}))
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	defer func() { _ = recover() }() // logging after the test ended
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// startTicker runs a fast ticker for the test.
func startTicker(t *testing.T, client *pgque.Client) *pgque.Ticker {
	t.Helper()
	return startTickerWith(t, client, &pgque.TickerConfig{LeaseTTL: 2 * time.Second})
}

// startTickerWith runs a ticker with cfg for the test, stopped when it ends.
func startTickerWith(t *testing.T, client *pgque.Client, cfg *pgque.TickerConfig) *pgque.Ticker {
	t.Helper()
	tk, err := client.NewTicker(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := tk.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := tk.Stop(ctx); err != nil {
			t.Error("stopping ticker:", err)
		}
	})
	return tk
}

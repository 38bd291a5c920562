// Command tsinterop runs a Go worker pool (PartitionedConsumer) beside the
// TypeScript package's workers of the same consumer, for the package's
// interoperability test (clients/typescript/test/worker_go.test.ts).
//
// Usage: tsinterop DSN QUEUE CONSUMER SLOTS. Each handled event is
// recorded in the test's table ts_interop (key, event id, who, and a
// sequence value taken when the handler starts and when it ends), so the
// test can check order and exclusivity per key across both languages. It
// prints "started" once its pool runs and stops gracefully on SIGTERM.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/pgque/pgque"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "tsinterop:", err)
		os.Exit(1)
	}
}

func run() error {
	if len(os.Args) != 5 {
		return fmt.Errorf("usage: tsinterop DSN QUEUE CONSUMER SLOTS")
	}
	slots, err := strconv.Atoi(os.Args[4])
	if err != nil {
		return fmt.Errorf("reading SLOTS: %w", err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	client, err := pgque.Connect(ctx, os.Args[1], nil)
	if err != nil {
		return fmt.Errorf("connecting: %w", err)
	}
	defer client.Close()
	pool := client.Pool()
	pc, err := client.NewPartitionedConsumer(&pgque.PartitionedConsumerConfig{
		Queue: os.Args[2], Consumer: os.Args[3], Slots: slots,
		LeaseTTL: 2 * time.Second, ClaimInterval: 100 * time.Millisecond, PollInterval: 50 * time.Millisecond,
		Handler: func(ctx context.Context, m *pgque.Message) error {
			var begin int64
			if err := pool.QueryRow(ctx, "select nextval('ts_interop_seq')").Scan(&begin); err != nil {
				return err
			}
			time.Sleep(time.Millisecond)
			_, err := pool.Exec(ctx, "insert into ts_interop (key, id, who, began, ended) values ($1, $2, 'go', $3, nextval('ts_interop_seq'))",
				m.PartitionKey, m.ID, begin)
			return err
		},
	})
	if err != nil {
		return fmt.Errorf("configuring the pool: %w", err)
	}
	if err := pc.Start(ctx); err != nil {
		return fmt.Errorf("starting the pool: %w", err)
	}
	fmt.Println("started")
	<-ctx.Done()
	return pc.Stop(context.Background())
}

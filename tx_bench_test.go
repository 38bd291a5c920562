package pgque_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgque/pgque"
	"github.com/pgque/pgque/internal/testing/pgtest"
)

// BenchmarkTxHandler compares a 1 ms handler that writes one row as a
// HandlerTx (the row commits with the event's completion) with today's
// way: a Handler whose row is an application-side upsert on (consumer,
// ev_id). One plain consumer drains 2000 events; the metric is ev/s.
func BenchmarkTxHandler(b *testing.B) {
	for _, mode := range []string{"tx", "upsert"} {
		b.Run(mode, func(b *testing.B) {
			for range b.N {
				benchTxHandler(b, mode)
			}
		})
	}
}

func benchTxHandler(b *testing.B, mode string) {
	const total = 2000
	pool, client, queue := benchEnv(b)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `create table applied (consumer text, ev_id bigint, primary key (consumer, ev_id))`); err != nil {
		b.Fatal(err)
	}
	if _, err := client.Subscribe(ctx, queue, "c"); err != nil {
		b.Fatal(err)
	}
	loadBacklog(b, client, queue, total)
	var done atomic.Int64
	all := make(chan struct{})
	handled := func() {
		if done.Add(1) == total {
			close(all)
		}
	}
	cfg := &pgque.ConsumerConfig{Queue: queue, Consumer: "c"}
	if mode == "tx" {
		cfg.HandlerTx = func(ctx context.Context, tx pgx.Tx, m *pgque.Message) error {
			_ = pgtest.Work(ctx, time.Millisecond) // the handler cost the benchmark measures
			if _, err := tx.Exec(ctx, `insert into applied values ('c', $1)`, m.ID); err != nil {
				return err
			}
			handled()
			return nil
		}
	} else {
		cfg.Handler = func(ctx context.Context, m *pgque.Message) error {
			_ = pgtest.Work(ctx, time.Millisecond) // the handler cost the benchmark measures
			if _, err := pool.Exec(ctx, `insert into applied values ('c', $1) on conflict do nothing`, m.ID); err != nil {
				return err
			}
			handled()
			return nil
		}
	}
	con, err := client.NewConsumer(cfg)
	if err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	if err := con.Start(ctx); err != nil {
		b.Fatal(err)
	}
	defer func() { _ = con.Stop(ctx) }()
	startBenchTicker(b, client)
	waitDrained(b, all, &done, total)
	b.ReportMetric(total/time.Since(start).Seconds(), "ev/s")
}

package enginetest

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/pgque/pgque/internal/testing/pgtest"
)

// BenchmarkLargeBatchDrain: how long one plain consumer takes to drain one
// batch far larger than its chunk, calling receive_raw with the previous
// chunk's acknowledgement once per chunk (each call its own transaction),
// for the three shapes of "Large batches" in docs/design.md:
//   - range: one transaction of B events committed between two ticks;
//   - xip: one transaction of B events sent in 10 pieces with a tick after
//     each (in the batch as a running transaction of the previous tick);
//   - many: B/4 one-event transactions, then one tick.
//
// Reported as seconds per drain (s/drain) and events per second.
//
//	go test -run '^$' -bench BenchmarkLargeBatchDrain -benchtime 1x ./internal/sqltest/enginetest/
//
// PGQUE_LARGE_BATCH_EVENTS sets B (default 80000).
func BenchmarkLargeBatchDrain(b *testing.B) {
	events := 80000
	if v := os.Getenv("PGQUE_LARGE_BATCH_EVENTS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			b.Fatalf("PGQUE_LARGE_BATCH_EVENTS=%q: want a positive count", v)
		}
		events = n
	}
	dsn := pgtest.NewInstalledDB(b)
	pool := pgtest.Pool(b, dsn)
	conn := pgtest.Conn(b, dsn)
	ctx := context.Background()
	queue := 0
	for _, shape := range []string{"range", "xip", "many"} {
		for _, max := range []int{100, 1000} {
			b.Run(fmt.Sprintf("%s/max%d", shape, max), func(b *testing.B) {
				var total time.Duration
				var drained int
				for range b.N {
					queue++
					q := fmt.Sprintf("q%d", queue)
					exec(b, pool, "select pgque.create_queue($1)", q)
					exec(b, pool, "select pgque.subscribe($1, 'c')", q)
					tick(b, pool, q)
					n := fillLargeBatch(b, pool, q, shape, events)
					tick(b, pool, q)
					start := time.Now()
					var batch any
					got := 0
					for {
						var count int
						var last *int64
						if err := conn.QueryRow(ctx, "select count(*), max(batch_id) from pgque.receive_raw($1, 'c', $2, $3)",
							q, max, batch).Scan(&count, &last); err != nil {
							b.Fatal(err)
						}
						if count == 0 {
							break
						}
						got += count
						batch = *last
					}
					total += time.Since(start)
					if got != n {
						b.Fatalf("drained %d events of %d", got, n)
					}
					drained += got
					exec(b, pool, "select pgque.drop_queue($1, true)", q)
				}
				b.ReportMetric(total.Seconds()/float64(b.N), "s/drain")
				b.ReportMetric(float64(drained)/total.Seconds(), "events/s")
				b.ReportMetric(0, "ns/op")
			})
		}
	}
}

// fillLargeBatch sends one large batch's events of the given shape to q
// (the caller ticks after it) and returns how many it sent.
func fillLargeBatch(b *testing.B, pool beginner, q, shape string, events int) int {
	b.Helper()
	ctx := context.Background()
	sendIn := func(on db, n int) {
		exec(b, on, `select pgque.send_batch($1, 'r', array(select jsonb_build_object('i', g) from generate_series(1, $2) g))`, q, n)
	}
	switch shape {
	case "range":
		sendIn(pool, events)
		return events
	case "xip":
		tx, err := pool.Begin(ctx)
		if err != nil {
			b.Fatal(err)
		}
		defer tx.Rollback(ctx)
		for range 10 {
			sendIn(tx, events/10)
			tick(b, pool, q)
		}
		if err := tx.Commit(ctx); err != nil {
			b.Fatal(err)
		}
		return events / 10 * 10
	default:
		for range events / 4 {
			exec(b, pool, "select pgque.send($1, '{}'::jsonb)", q)
		}
		return events / 4
	}
}

package partitiontest

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgque/pgque/internal/testing/pgtest"
)

// pgbouncerPoolSize is the number of server connections pgbouncer may open:
// fewer than the clients, so clients share them.
const pgbouncerPoolSize = 2

// startPgBouncer starts pgbouncer in transaction pooling mode in front of
// the server dsn points at (pgtest.PgBouncer).
func startPgBouncer(t *testing.T, dsn string) *pgxpool.Config {
	t.Helper()
	return pgtest.PgBouncer(t, dsn, pgbouncerPoolSize)
}

// Through PgBouncer in transaction mode: several workers, each on its own
// client connection, claim, receive and ack their slots concurrently over
// two shared server connections, and every event arrives once on its slot;
// a receive and its ack work on different server connections (the protocol
// keeps no session state); leases are enforced through the pooler.
func TestPgBouncerTransactionMode(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := setup(t)
	cfg := startPgBouncer(t, d.dsn)
	cfg.MaxConns = 12
	bp, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(bp.Close)

	const q, n = "pb", 4
	if one[int32](t, bp, "select pgque.create_queue($1)", q) != 1 {
		t.Fatal("create_queue through pgbouncer failed")
	}
	for k := range n {
		one[int32](t, bp, "select pgque.subscribe_slot($1, 'c', $2, $3)", q, k, n)
	}
	keyOf := map[int64]*string{}
	for round := range 4 {
		for i := range 30 {
			var k *string
			if i%10 != 0 {
				k = ptr(fmt.Sprintf("t-%d", (i+round)%17))
			}
			keyOf[send(t, bp, q, k)] = k
		}
		tick(t, bp, q)
	}

	// The routing formula's slot of every event, computed up front (the
	// workers run in goroutines, where the test may not stop).
	slotOf := map[int64]int{}
	for id, k := range keyOf {
		slotOf[id] = expectedSlot(t, d.pool, k, n)
	}
	var mu sync.Mutex
	seen := map[int64]int{}
	record := func(ms []msg) {
		mu.Lock()
		defer mu.Unlock()
		for _, m := range ms {
			seen[m.ID]++
		}
	}

	t.Run("no session state", func(t *testing.T) {
		// Slot 0's worker receives on one server connection and acks on
		// the other: two clients hold both server connections in open
		// transactions, and the one on the receive's server is kept.
		c1, c2, c3 := acquire(t, bp), acquire(t, bp), acquire(t, bp)
		mustClaim(t, c1, q, "c", 0, "w0", "1 hour")
		s := slotRef{q: q, c: "c", slot: 0, n: n, worker: "w0", max: 3}
		var recvPID int32
		var got []msg
		err := pgx.BeginFunc(ctx, c1, func(tx pgx.Tx) error {
			var err error
			got, err = receive(ctx, tx, s)
			if err == nil {
				err = tx.QueryRow(ctx, "select pg_backend_pid()").Scan(&recvPID)
			}
			return err
		})
		if err != nil || len(got) == 0 {
			t.Fatalf("receive through pgbouncer: %v, %d rows", err, len(got))
		}
		tx2, tx3 := begin(t, c2), begin(t, c3)
		p2, p3 := one[int32](t, tx2, "select pg_backend_pid()"), one[int32](t, tx3, "select pg_backend_pid()")
		if p2 == p3 || (p2 != recvPID && p3 != recvPID) {
			t.Fatalf("two open transactions run on backends %d and %d, the receive ran on %d: pgbouncer is not pooling %d server connections",
				p2, p3, recvPID, pgbouncerPoolSize)
		}
		keep, free := tx2, tx3
		if p3 == recvPID {
			keep, free = tx3, tx2
		}
		if err := free.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		var ackPID int32
		err = pgx.BeginFunc(ctx, c1, func(tx pgx.Tx) error {
			if err := tx.QueryRow(ctx, "select pg_backend_pid()").Scan(&ackPID); err != nil {
				return err
			}
			_, err := ack(ctx, tx, s)
			return err
		})
		if err != nil {
			t.Fatalf("ack through pgbouncer on another server connection: %v", err)
		}
		if ackPID == recvPID {
			t.Fatalf("the ack ran on backend %d like the receive; the test did not move the worker", ackPID)
		}
		record(got)
		// The next receive returns the next chunk, not the acked one.
		next := mustReceive(t, c1, s)
		for _, m := range next {
			for _, g := range got {
				if m.ID == g.ID {
					t.Errorf("event %d came back after its ack on another server connection", m.ID)
				}
			}
		}
		if err := keep.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		for _, c := range []*pgxpool.Conn{c1, c2, c3} {
			c.Release()
		}
		if e := claim(t, bp, q, "c", 0, "intruder", "1 hour"); e != nil {
			t.Errorf("claim of w0's live lease through pgbouncer = %d, want NULL", *e)
		}
		_, err = receive(ctx, bp, slotRef{q: q, c: "c", slot: 0, n: n, worker: "intruder", max: 10})
		wantState(t, err, "PQ085", "receive_partitioned through pgbouncer without the lease")
	})

	t.Run("concurrent workers", func(t *testing.T) {
		// Slot 0 is already partly consumed by w0, who continues.
		var wg sync.WaitGroup
		errs := make(chan error, n)
		for k := range n {
			wg.Go(func() {
				worker := fmt.Sprintf("w%d", k)
				c, err := bp.Acquire(ctx)
				if err != nil {
					errs <- err
					return
				}
				defer c.Release()
				if epoch := claim(t, c, q, "c", k, worker, "1 hour"); epoch == nil {
					errs <- fmt.Errorf("slot %d: claim through pgbouncer = NULL; want an epoch", k)
					return
				}
				s := slotRef{q: q, c: "c", slot: k, n: n, worker: worker, max: 4}
				for i := 0; i < 10000; i++ {
					ms, err := receive(ctx, c, s)
					if err != nil {
						errs <- fmt.Errorf("slot %d: receive: %w", k, err)
						return
					}
					if len(ms) == 0 {
						var behind bool
						err := c.QueryRow(ctx, `select c.current_batch is not null or c.last_tick < qi.last_tick_id
							from pgque.get_consumer_info($1, $2) c, pgque.get_queue_info($1) qi`,
							q, fmt.Sprintf("c#%d/%d", k, n)).Scan(&behind)
						if err != nil {
							errs <- fmt.Errorf("slot %d: consumer info: %w", k, err)
							return
						}
						if !behind {
							return
						}
						continue
					}
					record(ms)
					for _, m := range ms {
						if want := slotOf[m.ID]; want != k {
							errs <- fmt.Errorf("event %d (key %s) delivered on slot %d, belongs to %d", m.ID, keyString(keyOf[m.ID]), k, want)
							return
						}
					}
					if _, err := ack(ctx, c, s); err != nil {
						errs <- fmt.Errorf("slot %d: ack: %w", k, err)
						return
					}
				}
				errs <- fmt.Errorf("slot %d never caught up", k)
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
		t.Logf("%d client connections through pgbouncer over %d server connections", bp.Stat().TotalConns(), pgbouncerPoolSize)
		missing := 0
		for id := range keyOf {
			if seen[id] != 1 {
				missing++
				if missing <= 5 {
					t.Errorf("event %d (key %s) delivered and acked %d times through pgbouncer, want once", id, keyString(keyOf[id]), seen[id])
				}
			}
		}
	})
}

// acquire takes a connection of its own from p, for the test's duration.
func acquire(t *testing.T, p *pgxpool.Pool) *pgxpool.Conn {
	t.Helper()
	c, err := p.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// begin opens a transaction on c.
func begin(t *testing.T, c *pgxpool.Conn) pgx.Tx {
	t.Helper()
	tx, err := c.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	return tx
}

package enginetest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgque/pgque/internal/testing/pgtest"
)

// setupPgq gives the comparison test a database holding both pgque and the
// real PgQ extension, each with queue "cmp" and consumer "c".
func setupPgq(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pgtest.SkipWithoutExtension(t, "pgq")
	ctx := context.Background()
	dsn := pgtest.NewInstalledDB(t)
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 16
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := pool.Exec(ctx, "create extension pgq"); err != nil {
		t.Fatalf("create extension pgq (Debian package postgresql-15-pgq3): %v", err)
	}
	if v := scalar[string](t, pool, "select extversion from pg_catalog.pg_extension where extname = 'pgq'"); v != "3.5" {
		t.Fatalf("pgq extension version %s, want 3.5", v)
	}
	exec(t, pool, "select pgq.create_queue('cmp')")
	exec(t, pool, "select pgque.create_queue('cmp')")
	exec(t, pool, "select pgq.register_consumer('cmp', 'c')")
	exec(t, pool, "select pgque.register_consumer('cmp', 'c')")
	return pool
}

// tickBoth ticks both engines in one transaction under the exclusive
// advisory lock 42, so that no producer commits between the two ticks'
// snapshots. It returns the tick ids.
func tickBoth(ctx context.Context, pool *pgxpool.Pool) (pgqTick, pgqueTick int64, err error) {
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "select pg_catalog.pg_advisory_xact_lock(42)"); err != nil {
			return err
		}
		var a, b *int64
		if _, err := tx.Exec(ctx, "select pgq.force_tick('cmp')"); err != nil {
			return err
		}
		if err := tx.QueryRow(ctx, "select pgq.ticker('cmp')").Scan(&a); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "select pgque.force_next_tick('cmp')"); err != nil {
			return err
		}
		if err := tx.QueryRow(ctx, "select pgque.ticker('cmp')").Scan(&b); err != nil {
			return err
		}
		if a == nil || b == nil {
			return fmt.Errorf("a forced tick did not tick: pgq %v, pgque %v", a, b)
		}
		pgqTick, pgqueTick = *a, *b
		return nil
	})
	return pgqTick, pgqueTick, err
}

// pgqBatch opens, reads and finishes the next PgQ batch; ok is false when
// there is none.
func pgqBatch(ctx context.Context, q db) (ids []int64, payloads []string, ok bool, err error) {
	var b *int64
	if err := q.QueryRow(ctx, "select pgq.next_batch('cmp', 'c')").Scan(&b); err != nil {
		return nil, nil, false, err
	}
	if b == nil {
		return nil, nil, false, nil
	}
	rows, _ := q.Query(ctx, "select ev_id, ev_data from pgq.get_batch_events($1)", *b)
	type row struct {
		ID   int64
		Data string
	}
	rs, err := pgx.CollectRows(rows, pgx.RowToStructByPos[row])
	if err != nil {
		return nil, nil, false, err
	}
	for _, r := range rs {
		ids = append(ids, r.ID)
		payloads = append(payloads, r.Data)
	}
	if _, err := q.Exec(ctx, "select pgq.finish_batch($1)", *b); err != nil {
		return nil, nil, false, err
	}
	return ids, payloads, true, nil
}

// TestBatchesMatchPgQ: batch membership is PgQ 3.5's rule. Producers write
// the same payload to PgQ and pgque in one transaction (same txid, same
// commit moment); some stay open across ticks, some roll back. A ticker
// ticks both queues in one transaction. Consumed tick by tick, batch k of
// PgQ holds exactly the payloads of batch k of pgque.
func TestBatchesMatchPgQ(t *testing.T) {
	t.Parallel()
	const (
		producers   = 6
		duration    = 1500 * time.Millisecond
		maxDuration = 20 * time.Second
	)
	ctx := context.Background()
	pool := setupPgq(t)
	// Align the two consumers: both start at the registration tick; the
	// first common tick closes an empty first batch in both.
	if _, _, err := tickBoth(ctx, pool); err != nil {
		t.Fatal(err)
	}

	var (
		stop      atomic.Bool
		ticks     atomic.Int64
		mu        sync.Mutex
		committed = map[string]bool{}
		spanning  int // committed transactions that stayed open across 2+ ticks
		rollbacks int
		wg        sync.WaitGroup
	)
	fail := func(format string, args ...any) {
		t.Errorf(format, args...)
		stop.Store(true)
	}
	for p := range producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(p), uint64(time.Now().UnixNano())))
			for txn := 0; !stop.Load(); txn++ {
				startTick := ticks.Load()
				tx, err := pool.Begin(ctx)
				if err != nil {
					fail("producer %d: %v", p, err)
					return
				}
				var payloads []string
				long := rng.IntN(8) == 0
				for i := range 1 + rng.IntN(4) {
					d := fmt.Sprintf("p%d-t%d-e%d", p, txn, i)
					if _, err := tx.Exec(ctx, "select pgq.insert_event('cmp', 't', $1), pgque.insert_event('cmp', 't', $1)", d); err != nil {
						fail("producer %d: insert: %v", p, err)
						tx.Rollback(ctx)
						return
					}
					payloads = append(payloads, d)
					// Workload: the transaction stays open across ticks.
					if long {
						_ = pgtest.Work(ctx, time.Duration(10+rng.IntN(40))*time.Millisecond)
					} else {
						_ = pgtest.Work(ctx, time.Duration(rng.IntN(2000))*time.Microsecond)
					}
				}
				if rng.IntN(4) == 0 {
					if err := tx.Rollback(ctx); err != nil {
						fail("producer %d: rollback: %v", p, err)
						return
					}
					mu.Lock()
					rollbacks++
					mu.Unlock()
					continue
				}
				// The shared lock keeps this commit out of the ticker's
				// transaction: both engines' ticks see the same commits.
				if _, err := tx.Exec(ctx, "select pg_catalog.pg_advisory_xact_lock_shared(42)"); err != nil {
					fail("producer %d: %v", p, err)
					tx.Rollback(ctx)
					return
				}
				if err := tx.Commit(ctx); err != nil {
					fail("producer %d: commit: %v", p, err)
					return
				}
				mu.Lock()
				for _, d := range payloads {
					committed[d] = true
				}
				if ticks.Load()-startTick >= 2 {
					spanning++
				}
				mu.Unlock()
			}
		}()
	}
	wg.Add(1)
	go func() { // the ticker
		defer wg.Done()
		for !stop.Load() {
			if _, _, err := tickBoth(ctx, pool); err != nil {
				fail("ticker: %v", err)
				return
			}
			ticks.Add(1)
			_ = pgtest.Work(ctx, 4*time.Millisecond) // workload: the ticker's pace
		}
	}()
	// Run for duration, longer (up to maxDuration) on a slow machine until
	// long transactions and rollbacks have happened.
	start := time.Now()
	pgtest.Eventually(ctx, maxDuration, func() bool {
		mu.Lock()
		// Ticks too: on a loaded machine a tick can take long enough that
		// the events above fall into fewer than the 10 batches the checks
		// below need.
		enough := spanning >= 3 && rollbacks >= 5 && len(committed) >= 100 && ticks.Load() >= 20
		mu.Unlock()
		return stop.Load() || (time.Since(start) >= duration && enough)
	})
	stop.Store(true)
	wg.Wait()
	if t.Failed() {
		return
	}
	if _, _, err := tickBoth(ctx, pool); err != nil {
		t.Fatal(err)
	}

	// Consume both, tick by tick.
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	seen := map[string]int{}
	nonEmpty, batches := 0, 0
	for k := 0; ; k++ {
		pgqIDs, pgqData, pgqOK, err := pgqBatch(ctx, conn)
		if err != nil {
			t.Fatalf("pgq batch %d: %v", k, err)
		}
		evs, pgqueOK, err := consumeBatch(conn, "cmp", "c")
		if err != nil {
			t.Fatalf("pgque batch %d: %v", k, err)
		}
		if pgqOK != pgqueOK {
			t.Fatalf("batch %d: PgQ has a batch: %v, pgque has one: %v", k, pgqOK, pgqueOK)
		}
		if !pgqOK {
			break
		}
		batches++
		if !slices.IsSorted(pgqIDs) {
			t.Errorf("PgQ batch %d is not in ev_id order: %v", k, pgqIDs)
		}
		checkOrdered(t, fmt.Sprint("pgque batch ", k), evs)
		var pgqueData []string
		for _, e := range evs {
			pgqueData = append(pgqueData, e.data())
		}
		// Each engine numbers events with its own sequence, so compare the
		// payload sets (each is in its own ev_id order).
		slices.Sort(pgqData)
		slices.Sort(pgqueData)
		if !slices.Equal(pgqData, pgqueData) {
			t.Errorf("batch %d differs:\n PgQ:   %v\n pgque: %v", k, pgqData, pgqueData)
		}
		if len(pgqueData) > 0 {
			nonEmpty++
		}
		for _, d := range pgqueData {
			seen[d]++
		}
	}
	t.Logf("%d ticks, %d batches (%d non-empty), %d events committed, %d transactions spanned 2+ ticks, %d rolled back",
		ticks.Load(), batches, nonEmpty, len(committed), spanning, rollbacks)
	for d := range committed {
		if seen[d] != 1 {
			t.Errorf("committed payload %s was delivered %d times", d, seen[d])
		}
	}
	for d, n := range seen {
		if !committed[d] {
			t.Errorf("payload %s delivered %d times but never committed", d, n)
		}
	}
	if int64(batches) < ticks.Load() || nonEmpty < 10 || spanning < 3 || rollbacks < 5 {
		t.Errorf("the run proves too little: %d batches for %d ticks, %d non-empty, %d spanning, %d rollbacks",
			batches, ticks.Load(), nonEmpty, spanning, rollbacks)
	}
}

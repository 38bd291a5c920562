package pgque_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgque/pgque"
	"github.com/pgque/pgque/internal/testing/pgtest"
)

// txTick sends nothing itself: it forces a tick so that what was sent
// becomes a batch.
func txTick(t *testing.T, env *testEnv) {
	t.Helper()
	ctx := context.Background()
	err := pgx.BeginFunc(ctx, env.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "select pgque.force_next_tick($1)", env.queue); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, "select pgque.ticker($1)", env.queue)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// receiveIDs receives consumer c's next chunk of queue through
// receive_raw and returns its batch and event ids.
func receiveIDs(t *testing.T, db interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}, queue string) (int64, []int64) {
	t.Helper()
	rows, err := db.Query(context.Background(), `select batch_id, msg_id from pgque.receive_raw($1, 'c', 1000, null)`, queue)
	if err != nil {
		t.Fatal(err)
	}
	var batch int64
	var ids []int64
	for rows.Next() {
		var id int64
		if err := rows.Scan(&batch, &id); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return batch, ids
}

// sqlState is err's SQLSTATE, or "" when it has none.
func sqlState(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// TestTxCompleteSQL runs the documented SQL call sequence: an effect and
// complete_in_tx commit together; after a simulated crash before the ack the
// chunk comes back, and completing a done event again is refused (PQ038)
// and rolls its second effect back; a done event cannot be nacked; after the
// ack the chunk's events are no longer completable (PQ039).
func TestTxCompleteSQL(t *testing.T) {
	t.Parallel()
	env := setup(t)
	ctx := context.Background()
	if _, err := env.pool.Exec(ctx, `create table effects (consumer text, ev_id bigint)`); err != nil {
		t.Fatal(err)
	}
	if _, err := env.client.Subscribe(ctx, env.queue, "c"); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if _, err := env.client.Send(ctx, env.queue, pgque.Event{Payload: i}); err != nil {
			t.Fatal(err)
		}
	}
	txTick(t, env)
	receive := func() (int64, []int64) { return receiveIDs(t, env.pool, env.queue) }
	complete := func(batch, id int64) error {
		return pgx.BeginFunc(ctx, env.pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `insert into effects values ('c', $1)`, id); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `select pgque.complete_in_tx($1, 'c', $2, $3)`, env.queue, batch, id)
			return err
		})
	}
	effects := func(id int64) int {
		var n int
		if err := env.pool.QueryRow(ctx, `select count(*) from effects where ev_id = $1`, id).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	batch, ids := receive()
	if len(ids) != 3 {
		t.Fatalf("received %v, want 3 events", ids)
	}
	if err := complete(batch, ids[0]); err != nil {
		t.Fatal(err)
	}
	// A crash here: the chunk was never acknowledged, so it comes back.
	batch2, ids2 := receive()
	if batch2 != batch || len(ids2) != 3 {
		t.Fatalf("redelivery: batch %d %v, want batch %d and the same 3 events", batch2, ids2, batch)
	}
	// A crash can move the generation without a flip (a sequence is
	// WAL-logged ahead): the record must still be found.
	if _, err := env.pool.Exec(ctx, `select setval('pgque.done_gen_seq', pgque._done_gen() + 1)`); err != nil {
		t.Fatal(err)
	}
	if err := complete(batch, ids[0]); sqlState(err) != "PQ038" {
		t.Fatalf("completing a done event again: %v, want PQ038", err)
	}
	if n := effects(ids[0]); n != 1 {
		t.Fatalf("event %d has %d effects, want 1", ids[0], n)
	}
	if _, err := env.pool.Exec(ctx, `select pgque.nack($1, $2, '1 second')`, batch, ids[0]); sqlState(err) != "PQ038" {
		t.Fatalf("nacking a done event: %v, want PQ038", err)
	}
	// REPEATABLE READ could see a stale chunk: refused.
	err := pgx.BeginTxFunc(ctx, env.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead}, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `select pgque.complete_in_tx($1, 'c', $2, $3)`, env.queue, batch, ids[1])
		return err
	})
	if sqlState(err) != "PQ011" {
		t.Fatalf("completing in REPEATABLE READ: %v, want PQ011", err)
	}
	if err := complete(batch, ids[1]); err != nil {
		t.Fatal(err)
	}
	if _, err := env.pool.Exec(ctx, `select pgque.ack($1)`, batch); err != nil {
		t.Fatal(err)
	}
	if err := complete(batch, ids[2]); sqlState(err) != "PQ039" {
		t.Fatalf("completing an event of an acknowledged chunk: %v, want PQ039", err)
	}
	for i, id := range ids {
		want := 1
		if i == 2 {
			want = 0
		}
		if n := effects(id); n != want {
			t.Errorf("event %d has %d effects, want %d", id, n, want)
		}
	}
	// maint() flips the records of the finished batch away: two flips, as
	// the generation was moved above and records live in both.
	for range 2 {
		if _, err := env.pool.Exec(ctx, `select pgque.maint()`); err != nil {
			t.Fatal(err)
		}
	}
	var left int
	if err := env.pool.QueryRow(ctx, `select count(*) from pgque.event_done`).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != 0 {
		t.Errorf("%d completion records left after maint, want 0 (their batch is finished)", left)
	}
}

// TestTxExactlyOnceHeldHorizon completes 10 000 events in their handlers'
// transactions while a REPEATABLE READ snapshot holds the xmin horizon:
// the dead tuples in pgque's tables are the same after 1 000 events as
// after 10 000 (completion records are only inserted, and maint() reclaims
// them by TRUNCATE), and every event has its effect once.
func TestTxExactlyOnceHeldHorizon(t *testing.T) {
	t.Parallel()
	env := setup(t)
	pgtest.SkipWithoutStatsFlush(t)
	ctx := context.Background()
	conn := pgtest.Conn(t, env.dsn)
	if _, err := conn.Exec(ctx, `create table effects (ev_id bigint primary key)`); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `select pgque.subscribe($1, 'c')`, env.queue); err != nil {
		t.Fatal(err)
	}
	holder := pgtest.Conn(t, env.dsn)
	htx, err := holder.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	defer htx.Rollback(ctx)
	if _, err := htx.Exec(ctx, "select pg_catalog.txid_current()"); err != nil {
		t.Fatal(err)
	}
	events := 0
	run := func(upto int) int64 {
		for events < upto {
			if _, err := conn.Exec(ctx, `select pgque.send_batch($1, 'n', array_fill('{}'::jsonb, array[100]), null)`, env.queue); err != nil {
				t.Fatal(err)
			}
			if _, err := conn.Exec(ctx, `select pgque.force_next_tick($1)`, env.queue); err != nil {
				t.Fatal(err)
			}
			if _, err := conn.Exec(ctx, `select pgque.ticker($1)`, env.queue); err != nil {
				t.Fatal(err)
			}
			batch, ids := receiveIDs(t, conn, env.queue)
			if len(ids) != 100 {
				t.Fatalf("received %d events, want 100", len(ids))
			}
			for _, id := range ids {
				err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
					if _, err := tx.Exec(ctx, `insert into effects values ($1)`, id); err != nil {
						return err
					}
					_, err := tx.Exec(ctx, `select pgque.complete_in_tx($1, 'c', $2, $3)`, env.queue, batch, id)
					return err
				})
				if err != nil {
					t.Fatal(err)
				}
			}
			if _, err := conn.Exec(ctx, `select pgque.ack($1)`, batch); err != nil {
				t.Fatal(err)
			}
			events += len(ids)
		}
		if _, err := conn.Exec(ctx, "select pgque.maint()"); err != nil {
			t.Fatal(err)
		}
		return pgqueDeadTuples(t, conn)
	}
	dead1 := run(1000)
	dead2 := run(10000)
	var live int
	if err := conn.QueryRow(ctx, `select count(*) from pgque.event_done`).Scan(&live); err != nil {
		t.Fatal(err)
	}
	t.Logf("dead tuples in pgque tables under a held horizon: %d after 1000 events, %d after 10000; %d completion records live after maint",
		dead1, dead2, live)
	if dead2 > dead1+20 {
		t.Errorf("dead tuples grew with the events completed: %d after 1000, %d after 10000", dead1, dead2)
	}
	if live != 0 {
		t.Errorf("%d completion records of finished batches survived maint()", live)
	}
}

// pgqueDeadTuples sums the dead tuples of schema pgque's tables; conn must
// be the connection that did the work (its statistics are flushed first).
func pgqueDeadTuples(t *testing.T, conn *pgx.Conn) int64 {
	t.Helper()
	ctx := context.Background()
	var n int64
	err := conn.QueryRow(ctx, `select pg_catalog.pg_stat_force_next_flush(), pg_catalog.pg_stat_clear_snapshot()`).Scan(nil, nil)
	if err == nil {
		err = conn.QueryRow(ctx, `select coalesce(sum(pg_catalog.pg_stat_get_dead_tuples(c.oid)), 0)::bigint
			from pg_catalog.pg_class c where c.relnamespace = 'pgque'::regnamespace and c.relkind = 'r'`).Scan(&n)
	}
	if err != nil {
		t.Fatal(err)
	}
	return n
}

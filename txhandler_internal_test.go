package pgque

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgque/pgque/internal/dbq"
	"github.com/pgque/pgque/internal/testing/pgtest"
)

// TestTxHandlerSaysWhyItsContextEnded: when the pool fences a slot while
// a transactional handler runs, the handler's context ends with cause
// ErrLeaseLost, and the completion's statement fails only with "context
// canceled". The handler's error carries the cause, so the outcome reads
// as a lost lease, as when the server refuses the completion itself.
func TestTxHandlerSaysWhyItsContextEnded(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, pgtest.NewDB(t))
	ctx, fence := context.WithCancelCause(context.Background())
	h := func(context.Context, pgx.Tx, *Message) error {
		fence(ErrLeaseLost) // the pool fences the slot meanwhile
		return nil
	}
	complete := func(ctx context.Context, q *dbq.Queries, _ *Message) error {
		_, err := q.QueueInfo(ctx, nil)
		return err
	}
	err := txHandler(pool, h, complete)(ctx, &Message{ID: 1})
	if !errors.Is(err, ErrLeaseLost) || !errors.Is(err, context.Canceled) {
		t.Fatalf("handler after the fence: %v, want ErrLeaseLost (and context.Canceled)", err)
	}
}

// TestTxHandlerRunsAgainAfterALockTimeout: a completion that waits out its
// lock timeout (55P03; the lease row held by a claim in progress) runs the transaction again
// instead of failing the handler, which would count a retry; a lock
// timeout of the handler's own statements, or one that lasts, still fails.
func TestTxHandlerRunsAgainAfterALockTimeout(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := pgtest.NewDB(t)
	pool := pgtest.Pool(t, dsn)
	if _, err := pool.Exec(ctx, `create table done (id bigint); create table row_lock (id int)`); err != nil {
		t.Fatal(err)
	}
	holder := pgtest.Conn(t, dsn)
	hold := func() pgx.Tx {
		tx, err := holder.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, `lock table row_lock in access exclusive mode`); err != nil {
			t.Fatal(err)
		}
		return tx
	}
	// The completion writes through the handler's transaction and then
	// waits 100 ms at most for a lock the holder may keep.
	completions := 0
	var held, handlerTx pgx.Tx
	complete := func(ctx context.Context, _ *dbq.Queries, m *Message) error {
		completions++
		if completions == 2 && held != nil {
			_ = held.Rollback(ctx) // the holder lets go after the first timeout
			held = nil
		}
		_, err := handlerTx.Exec(ctx, `set local lock_timeout = '100ms'; lock table row_lock in access share mode`)
		return err
	}
	runs := 0
	h := func(ctx context.Context, tx pgx.Tx, m *Message) error {
		runs++
		handlerTx = tx
		_, err := tx.Exec(ctx, `insert into done values ($1)`, m.ID)
		return err
	}

	held = hold()
	if err := txHandler(pool, h, complete)(ctx, &Message{ID: 7}); err != nil {
		t.Fatalf("a completion that timed out once: %v, want it run again and committed", err)
	}
	var n int
	if err := pool.QueryRow(ctx, `select count(*) from done where id = 7`).Scan(&n); err != nil || runs != 2 || n != 1 {
		t.Fatalf("runs %d, committed rows %d (%v): want 2 runs and the second one's row alone", runs, n, err)
	}

	runs, completions = 0, 0
	held = hold()
	defer func() {
		if held != nil {
			_ = held.Rollback(ctx)
		}
	}()
	keep := held
	held = nil // this time the holder keeps the lock
	err := txHandler(pool, h, complete)(ctx, &Message{ID: 8})
	if !isLockTimeout(err) || runs != completionAttempts {
		t.Fatalf("a lock held throughout: %v after %d runs, want 55P03 after %d", err, runs, completionAttempts)
	}
	_ = keep.Rollback(ctx)

	// The handler's own lock timeout is its failure: not run again.
	runs = 0
	keep = hold()
	defer keep.Rollback(ctx)
	own := func(ctx context.Context, tx pgx.Tx, m *Message) error {
		runs++
		handlerTx = tx
		_, err := tx.Exec(ctx, `set local lock_timeout = '100ms'; lock table row_lock in access share mode`)
		return err
	}
	if err := txHandler(pool, own, complete)(ctx, &Message{ID: 9}); !isLockTimeout(err) || runs != 1 {
		t.Fatalf("the handler's own lock timeout: %v after %d runs, want 55P03 after 1", err, runs)
	}
}

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

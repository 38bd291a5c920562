package enginetest

import (
	"context"
	"testing"

	"github.com/pgque/pgque/internal/testing/pgtest"
)

// TestForceNextTickThenTickerAlwaysTicks: force_next_tick followed by
// ticker(queue) in one transaction makes a tick even when another ticker
// (a daemon) ticks the queue in between and uses the forced advance up;
// a second ticker(queue) in that transaction is not forced again.
func TestForceNextTickThenTickerAlwaysTicks(t *testing.T) {
	t.Parallel()
	dsn, pool := setupDB(t)
	ctx := context.Background()
	newQueue(t, pool, "ft", "c")
	daemon := pgtest.Conn(t, dsn)
	for _, between := range []string{
		`select pgque.ticker('ft')`,
		`select pgque.ticker()`,
		`select pgque.force_next_tick('ft'), pgque.ticker('ft')`,
	} {
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, `select pgque.force_next_tick('ft')`); err != nil {
			t.Fatal(err)
		}
		if _, err := daemon.Exec(ctx, between); err != nil {
			t.Fatal(between, err)
		}
		var tick *int64
		if err := tx.QueryRow(ctx, `select pgque.ticker('ft')`).Scan(&tick); err != nil {
			t.Fatal(err)
		}
		if tick == nil {
			t.Fatalf("force_next_tick + ticker in one transaction made no tick after %q ticked in between", between)
		}
		if err := tx.QueryRow(ctx, `select pgque.ticker('ft')`).Scan(&tick); err != nil || tick != nil {
			t.Fatalf("a second ticker() in the transaction ticked again (%v, %v)", tick, err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

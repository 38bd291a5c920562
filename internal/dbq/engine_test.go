package dbq

import (
	"context"
	"testing"

	"github.com/pgque/pgque/internal/testing/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestTickerCommitsItsTickWithoutChangingTheSession: Ticker's statement
// turns synchronous_commit off for its own transaction only. The tick it
// made is committed and seen by another session, and the session it ran
// on (a pool's connection, which the next caller gets) still commits
// with the server's setting: a SET for the session would make every later
// transaction on that connection, a caller's writes among them, commit
// without a flush.
func TestTickerCommitsItsTickWithoutChangingTheSession(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.NewInstalledDB(t)
	conn, other := pgtest.Conn(t, dsn), pgtest.Conn(t, dsn)
	for _, stmt := range []string{
		"select pgque.create_queue('q')",
		"select pgque.set_queue_config('q', 'ticker_max_lag', '0')",
		`select pgque.send('q', '{}'::jsonb)`,
	} {
		if _, err := conn.Exec(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	var before string
	if err := conn.QueryRow(ctx, "show synchronous_commit").Scan(&before); err != nil {
		t.Fatal(err)
	}
	n, err := New(conn).Ticker(ctx)
	if err != nil || n != 1 {
		t.Fatalf("Ticker: %d queues ticked, %v; want 1", n, err)
	}
	var after string
	if err := conn.QueryRow(ctx, "show synchronous_commit").Scan(&after); err != nil {
		t.Fatal(err)
	}
	if after != before {
		t.Fatalf("synchronous_commit is %q on the session after Ticker, %q before", after, before)
	}
	var ticks int
	if err := other.QueryRow(ctx, `select count(*) from pgque.tick t join pgque.queue q on q.queue_id = t.tick_queue
		where q.queue_name = 'q'`).Scan(&ticks); err != nil || ticks != 2 {
		t.Fatalf("another session sees %d ticks of q (%v), want 2: the first and Ticker's", ticks, err)
	}
}

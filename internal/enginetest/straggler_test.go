package enginetest

import (
	"context"
	"testing"
)

// TestTickerSeesEventsCommittedAfterTheirTick: a producer takes its ev_id,
// a tick is made while it is still open, then it commits. The event
// sequence did not move since that tick, yet the next ticker() call must tick
// (within ticker_max_lag), not wait for ticker_idle_period.
func TestTickerSeesEventsCommittedAfterTheirTick(t *testing.T) {
	ctx := context.Background()
	_, pool := setupEngine(t)
	for _, q := range []string{
		"select pgque.set_queue_config('q', 'ticker_idle_period', '1 hour')",
		"select pgque.set_queue_config('q', 'ticker_max_lag', '0')",
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatal(q, err)
		}
	}

	producer, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer producer.Rollback(ctx)
	var id int64
	if err := producer.QueryRow(ctx, "select pgque.send('q', '{\"late\": true}')").Scan(&id); err != nil {
		t.Fatal(err)
	}

	// A tick while the producer is open: it covers the ev_id, not the event.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var tick *int64
	if err := tx.QueryRow(ctx, "select pgque.force_next_tick('q'), pgque.ticker('q')").Scan(new(int64), &tick); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil || tick == nil {
		t.Fatalf("forced tick: %v, %v", tick, err)
	}
	if err := pool.QueryRow(ctx, "select pgque.ticker('q')").Scan(&tick); err != nil || tick != nil {
		t.Fatalf("ticker with nothing committed since the last tick ticked (%v, %v)", tick, err)
	}

	if err := producer.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(ctx, "select pgque.ticker('q')").Scan(&tick); err != nil {
		t.Fatal(err)
	}
	if tick == nil {
		t.Fatal("ticker did not tick for an event committed after the last tick; it would wait for ticker_idle_period")
	}
	var got int64
	if err := pool.QueryRow(ctx, "select msg_id from pgque.receive('q', 'c') where msg_id = $1", id).Scan(&got); err != nil {
		t.Fatalf("the late event is not in the batch the new tick closed: %v", err)
	}
	if err := pool.QueryRow(ctx, "select pgque.ticker('q')").Scan(&tick); err != nil || tick != nil {
		t.Fatalf("ticker kept ticking an idle queue (%v, %v)", tick, err)
	}
}

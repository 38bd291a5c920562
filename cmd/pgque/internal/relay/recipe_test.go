package relay

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgque/pgque/internal/testing/pgtest"
)

// The idempotency recipe of docs/relay.md, as an HTTP handler's database
// side would run it: applyOnce applies an event's writes at most once per
// (consumer, ce-id), and never for a request whose pgque-epoch is lower
// than one already seen for its slot.

const recipeSchema = `
create table relay_applied (consumer text, ce_id text, primary key (consumer, ce_id));
create table relay_fence (consumer text, slot integer, epoch bigint not null, primary key (consumer, slot));
create table invoices (ce_id text, by_epoch bigint);`

// Outcomes of applyOnce, as the handler answers them.
const (
	outcomeApplied = "applied" // 204
	outcomeDone    = "done"    // 204: applied before
	outcomeStale   = "stale"   // 409: a newer owner has the slot
)

// applyOnce runs the recipe in one transaction. hold, when set, runs after
// the writes and before COMMIT (a test's way to keep the transaction open).
func applyOnce(ctx context.Context, db *pgxpool.Pool, consumer string, slot int, epoch int64, ceID string,
	write func(pgx.Tx) error, hold func()) (string, error) {
	outcome := outcomeApplied
	errRollback := errors.New("roll back")
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `insert into relay_fence values ($1, $2, $3)
			on conflict (consumer, slot) do update set epoch = excluded.epoch
			where relay_fence.epoch < excluded.epoch`, consumer, slot, epoch); err != nil {
			return err
		}
		var seen int64
		if err := tx.QueryRow(ctx, `select epoch from relay_fence where consumer = $1 and slot = $2 for share`,
			consumer, slot).Scan(&seen); err != nil {
			return err
		}
		if seen > epoch {
			outcome = outcomeStale
			return errRollback
		}
		tag, err := tx.Exec(ctx, `insert into relay_applied values ($1, $2) on conflict do nothing`, consumer, ceID)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			// Applied before: commit anyway, so that the epoch raised
			// above stays (nothing else was written).
			outcome = outcomeDone
			return nil
		}
		if err := write(tx); err != nil {
			return err
		}
		if hold != nil {
			hold()
		}
		return nil
	})
	if errors.Is(err, errRollback) {
		err = nil
	}
	return outcome, err
}

// TestIdempotencyRecipe runs the recipe from two handler processes (two
// pools): a redelivery after a takeover is not applied again, the old
// owner's late request is refused once the new owner was seen, and a
// request of the new owner that races an open one of the old owner waits
// for it and then finds the event applied.
func TestIdempotencyRecipe(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewDB(t)
	ctx := context.Background()
	a, b := pgtest.Pool(t, dsn), pgtest.Pool(t, dsn) // two handler processes
	if _, err := a.Exec(ctx, recipeSchema); err != nil {
		t.Fatal(err)
	}
	invoice := func(epoch int64, ceID string) func(pgx.Tx) error {
		return func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `insert into invoices values ($1, $2)`, ceID, epoch)
			return err
		}
	}
	apply := func(db *pgxpool.Pool, epoch int64, ceID string, want string) {
		t.Helper()
		got, err := applyOnce(ctx, db, "billing", 3, epoch, ceID, invoice(epoch, ceID), nil)
		if err != nil || got != want {
			t.Fatalf("%s at epoch %d: %s, %v; want %s", ceID, epoch, got, err, want)
		}
	}
	// Epoch 1 applies q/1; the slot is taken over, and epoch 2 is
	// delivered q/1 again (its chunk was never acknowledged).
	apply(a, 1, "q/1", outcomeApplied)
	// Epoch 1, still holding the slot as far as it knows, races epoch 2 on
	// q/2 with its transaction open: epoch 2 waits for it, then finds q/2
	// applied.
	entered, release := make(chan struct{}), make(chan struct{})
	var aOutcome string
	var aErr error
	aDone := make(chan struct{})
	go func() {
		defer close(aDone)
		aOutcome, aErr = applyOnce(ctx, a, "billing", 3, 1, "q/2", invoice(1, "q/2"),
			func() { close(entered); <-release })
	}()
	<-entered
	bDone := make(chan string, 1)
	go func() {
		got, err := applyOnce(ctx, b, "billing", 3, 2, "q/2", invoice(2, "q/2"), nil)
		if err != nil {
			got = err.Error()
		}
		bDone <- got
	}()
	pgtest.WaitFor(t, 10*time.Second, "epoch 2 to wait for epoch 1's open transaction", func() bool {
		var waiting bool
		if err := a.QueryRow(ctx, `select exists (select 1 from pg_stat_activity
			where datname = current_database() and wait_event_type = 'Lock')`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		return waiting
	})
	close(release)
	<-aDone
	if aErr != nil || aOutcome != outcomeApplied {
		t.Fatalf("epoch 1 on q/2: %s, %v; want applied", aOutcome, aErr)
	}
	if got := <-bDone; got != outcomeDone {
		t.Fatalf("epoch 2 on q/2 after epoch 1 committed it: %s, want done", got)
	}
	apply(b, 2, "q/1", outcomeDone)
	// The old owner's late request for a new event: refused.
	apply(a, 1, "q/3", outcomeStale)
	apply(b, 2, "q/3", outcomeApplied)
	var n, distinct int
	if err := a.QueryRow(ctx, `select count(*), count(distinct ce_id) from invoices`).Scan(&n, &distinct); err != nil {
		t.Fatal(err)
	}
	if n != 3 || distinct != 3 {
		t.Fatalf("%d invoices for %d events, want 3 for 3", n, distinct)
	}
}

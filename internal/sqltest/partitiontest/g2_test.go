package partitiontest

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgque/pgque/internal/testing/pgtest"
)

// T-G2-block: while a worker holds a slot's lease, a second worker is
// refused: claim_slot returns NULL and receive_partitioned,
// ack_partitioned and nack_partitioned raise PQ032, without disturbing the
// holder's lease or its open batch.
func TestG2Block(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := setup(t)
	d.createQueue("g2b")
	d.subscribeSlots("g2b", "c", 2)
	key := ptr("tenant-1") // pinned: slot 1 of 2
	slot := pinnedSlot(t, key, 2)
	d.send("g2b", key)
	d.tick("g2b")

	epoch := mustClaim(t, d.pool, "g2b", "c", slot, "w1", "1 hour")
	holder := slotRef{q: "g2b", c: "c", slot: slot, n: 2, worker: "w1", max: 100}
	intruder := holder
	intruder.worker = "w2"
	got := mustReceive(t, d.pool, holder)
	if len(got) != 1 {
		t.Fatalf("holder received %v, want the one event of slot %d", ids(got), slot)
	}

	if e := claim(t, d.pool, "g2b", "c", slot, "w2", "1 hour"); e != nil {
		t.Errorf("claim_slot by w2 on a slot w1 holds = %d, want NULL", *e)
	}
	_, err := receive(ctx, d.pool, intruder)
	wantState(t, err, "PQ085", "receive_partitioned by a worker without the lease")
	_, err = ack(ctx, d.pool, intruder)
	wantState(t, err, "PQ085", "ack_partitioned by a worker without the lease")
	_, err = nack(ctx, d.pool, intruder, got[0].ID, "0 seconds")
	wantState(t, err, "PQ085", "nack_partitioned by a worker without the lease")

	var owner string
	var ep, open int64
	if err := d.pool.QueryRow(ctx, `select owner, epoch, open_batch from pgque.partition_slot_status
		where queue = 'g2b' and consumer = 'c' and slot = $1`, slot).Scan(&owner, &ep, &open); err != nil {
		t.Fatal(err)
	}
	if owner != "w1" || ep != epoch || open != got[0].Batch {
		t.Errorf("after the refused calls: owner %s epoch %d open batch %d; want w1, %d, %d", owner, ep, open, epoch, got[0].Batch)
	}
	// The holder's batch is intact: the same row comes back, and acks.
	again := mustReceive(t, d.pool, holder)
	if len(again) != 1 || again[0].ID != got[0].ID || again[0].Batch != got[0].Batch {
		t.Errorf("holder's redelivery = %+v, want %+v", again, got)
	}
	if n := mustAck(t, d.pool, holder); n != 1 {
		t.Errorf("holder's ack = %d, want 1", n)
	}
}

// interval is when a worker held received events in an open transaction.
type interval struct{ start, end time.Time }

// holdBatch receives on s inside a transaction, tells the other worker
// (received), waits until the other worker has received too while this
// transaction is still open, keeps it open a little longer (pg_sleep, so the
// server sees it busy), acks and commits. It returns when the receive
// returned and when the commit did. If the other worker cannot receive
// while this one holds its batch, the wait times out: the slots serialize.
func holdBatch(ctx context.Context, conn *pgx.Conn, s slotRef, received chan<- struct{}, other <-chan struct{}) (interval, []msg, error) {
	var iv interval
	var got []msg
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		ms, err := receive(ctx, tx, s)
		if err != nil {
			return err
		}
		got = ms
		iv.start = time.Now()
		close(received)
		select {
		case <-other:
		case <-time.After(20 * time.Second):
			return fmt.Errorf("slot %d: the worker on the other slot did not receive within 20 s while this one held its batch", s.slot)
		}
		if _, err := tx.Exec(ctx, "select pg_sleep(0.2)"); err != nil {
			return err
		}
		_, err = ack(ctx, tx, s)
		return err
	})
	iv.end = time.Now()
	return iv, got, err
}

// T-G2-parallel: two workers on different slots hold their batches at the
// same time: both receive while the other's transaction is still open, so
// their holding intervals overlap. Two callers on the same slot (the lease
// holder on two connections) serialize on the lease row: the second waits
// for the first to commit and then gets the next chunk, never the rows the
// first one holds.
func TestG2Parallel(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := setup(t)
	d.createQueue("g2p")
	d.subscribeSlots("g2p", "c", 2)
	k0, k1 := ptr("tenant-3"), ptr("tenant-1") // pinned: slots 0 and 1 of 2
	// With max 2, several chunks per slot for both subtests.
	for range 8 {
		d.send("g2p", k0)
		d.send("g2p", k1)
	}
	d.tick("g2p")
	slots := d.claimAll("g2p", "c", 2, "w", 2)
	slots[1].worker = "v" // a different worker on slot 1
	release(t, d.pool, "g2p", "c", 1, "w")
	mustClaim(t, d.pool, "g2p", "c", 1, "v", "1 hour")

	t.Run("different slots overlap", func(t *testing.T) {
		conns := []*pgx.Conn{pgtest.Conn(t, d.dsn), pgtest.Conn(t, d.dsn)}
		var wg sync.WaitGroup
		ivs := make([]interval, 2)
		errs := make([]error, 2)
		got := make([][]msg, 2)
		received := []chan struct{}{make(chan struct{}), make(chan struct{})}
		for i := range 2 {
			wg.Go(func() {
				ivs[i], got[i], errs[i] = holdBatch(ctx, conns[i], slots[i], received[i], received[1-i])
			})
		}
		wg.Wait()
		for i := range 2 {
			if errs[i] != nil {
				t.Fatalf("worker on slot %d: %v", i, errs[i])
			}
			if len(got[i]) == 0 {
				t.Fatalf("worker on slot %d received nothing", i)
			}
		}
		overlap := earliest(ivs[0].end, ivs[1].end).Sub(latest(ivs[0].start, ivs[1].start))
		t.Logf("slot 0 held %v..%v, slot 1 held %v..%v: overlap %v",
			ivs[0].start.Format(time.StampMilli), ivs[0].end.Format(time.StampMilli),
			ivs[1].start.Format(time.StampMilli), ivs[1].end.Format(time.StampMilli), overlap)
		if overlap <= 0 {
			t.Errorf("workers on different slots did not overlap (overlap %v): slots serialize", overlap)
		}
	})

	t.Run("same slot serializes", func(t *testing.T) {
		s := slots[0]
		first, second := pgtest.Conn(t, d.dsn), pgtest.Conn(t, d.dsn)
		tx, err := first.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		held := mustReceive(t, tx, s)
		if len(held) == 0 {
			t.Fatal("first caller received nothing")
		}
		secondPID := one[int32](t, second, "select pg_backend_pid()")

		type result struct {
			ms  []msg
			at  time.Time
			err error
		}
		done := make(chan result, 1)
		go func() {
			ms, err := receive(ctx, second, s)
			done <- result{ms, time.Now(), err}
		}()
		// The second caller must be waiting on a lock while the first holds
		// its chunk.
		waitForLockWait(t, d, secondPID, "the second caller, blocked by the first")
		// ...on the slot's lease row: a row-lock waiter holds the tuple lock.
		if rel := one[string](t, d.pool, `select coalesce(string_agg(relation::regclass::text, ','), '')
			from pg_catalog.pg_locks where pid = $1 and locktype = 'tuple'`, secondPID); rel != "pgque.slot_lease" {
			t.Errorf("the second caller waits on a row of %q, want the lease row (pgque.slot_lease)", rel)
		}
		select {
		case r := <-done:
			t.Fatalf("second caller returned %v (err %v) while the first held the slot's rows", ids(r.ms), r.err)
		default:
		}
		if _, err := ack(ctx, tx, s); err != nil {
			t.Fatal(err)
		}
		// Taken before the commit is sent: the second caller may return
		// before Commit does here, once the server has committed.
		committing := time.Now()
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		r := <-done
		if r.err != nil {
			t.Fatalf("second caller: %v", r.err)
		}
		if r.at.Before(committing) {
			t.Errorf("second caller returned at %v, before the first committed (sent at %v)", r.at, committing)
		}
		for _, m := range r.ms {
			for _, h := range held {
				if m.ID == h.ID {
					t.Errorf("event %d was handed to both callers of slot %d", m.ID, s.slot)
				}
			}
		}
		if len(r.ms) == 0 {
			t.Errorf("second caller got nothing after the first acked its chunk of %d; the slot had more", len(held))
		}
	})
}

// waitForLockWait waits until backend pid (what: who it is) waits on a
// heavyweight lock.
func waitForLockWait(t *testing.T, d *db, pid int32, what string) {
	t.Helper()
	pgtest.WaitFor(t, 10*time.Second, fmt.Sprintf("%s (backend %d) to wait on a lock", what, pid), func() bool {
		return one[bool](t, d.pool, `select coalesce(wait_event_type = 'Lock', false)
			from pg_catalog.pg_stat_activity where pid = $1`, pid)
	})
}

func earliest(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

func latest(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

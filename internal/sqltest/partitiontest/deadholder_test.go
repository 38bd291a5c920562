package partitiontest

import (
	"context"
	"testing"
	"time"

	"github.com/pgque/pgque/internal/testing/pgtest"
)

// session opens a connection standing for a worker's LISTEN session and
// returns it with its backend pid.
func session(t *testing.T, d *db) (func(), int32) {
	t.Helper()
	conn := pgtest.Conn(t, d.dsn)
	pid := one[int32](t, conn, "select pg_backend_pid()")
	return func() { _ = conn.Close(context.Background()) }, pid
}

// waitGone waits until pid is no backend of the cluster: its connection
// was closed, and the backend has exited.
func waitGone(t *testing.T, d *db, pid int32) {
	t.Helper()
	pgtest.WaitFor(t, 10*time.Second, "the closed session's backend to exit", func() bool {
		return one[bool](t, d.pool, "select not exists (select 1 from pg_stat_activity where pid = $1)", pid)
	})
}

// TestDeadHolderTakenOverBeforeTTL: a lease bound to its holder's session
// is taken over a sixth of its ttl after a claim first found that session
// gone, not when the ttl runs out; until then, and while the session
// lives, it is refused as any live lease is. The old holder's token no
// longer proves the lease, and the record of the dead session goes with
// the takeover.
func TestDeadHolderTakenOverBeforeTTL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := setup(t)
	d.createQueue("q")
	d.subscribeSlots("q", "c", 1)
	closeHolder, pid := session(t, d)
	// A 1-hour ttl: only the dead session can end this lease in the test.
	e := claimBound(t, d.pool, "q", "c", 0, "holder", "1 hour", &pid)
	if e == nil {
		t.Fatal("the bound claim of a free slot was refused")
	}
	if c := claim(t, d.pool, "q", "c", 0, "other", "1 hour"); c != nil {
		t.Fatalf("another worker took a live lease whose session lives (epoch %d)", *c)
	}
	if n := one[int64](t, d.pool, "select count(*) from pgque.lease_orphan"); n != 0 {
		t.Fatalf("a refusal of a lease whose session lives recorded %d orphans", n)
	}

	closeHolder()
	waitGone(t, d, pid)
	first := time.Now()
	if c := claim(t, d.pool, "q", "c", 0, "other", "1 hour"); c != nil {
		t.Fatalf("the first claim to find the session gone took the lease at once (epoch %d)", *c)
	}
	if n := one[int64](t, d.pool, "select count(*) from pgque.lease_orphan where lo_session = $1", pid); n != 1 {
		t.Fatalf("lease_orphan holds %d records of the dead session, want 1", n)
	}
	// The grace is a sixth of the ttl: 10 minutes here, so move the record
	// back instead of waiting (the claim compares it with the server's
	// clock): 9 minutes old is still within it, 11 past it.
	d.exec("update pgque.lease_orphan set lo_seen = clock_timestamp() - interval '9 minutes'")
	if c := claim(t, d.pool, "q", "c", 0, "other", "1 hour"); c != nil {
		t.Fatalf("a claim within the grace took the lease (epoch %d)", *c)
	}
	if n := one[int64](t, d.pool, "select count(*) from pgque.lease_orphan"); n != 1 {
		t.Fatalf("a later refusal added a record: %d, want the first only", n)
	}
	d.exec("update pgque.lease_orphan set lo_seen = clock_timestamp() - interval '11 minutes'")
	got := claim(t, d.pool, "q", "c", 0, "other", "1 hour")
	if got == nil || *got != *e+1 {
		t.Fatalf("claim past the grace = %v, want epoch %d", got, *e+1)
	}
	if el := time.Since(first); el > 30*time.Second {
		t.Errorf("the takeover came %v after the session died", el)
	}
	if n := one[int64](t, d.pool, "select count(*) from pgque.lease_orphan"); n != 0 {
		t.Errorf("the takeover left %d orphan records", n)
	}
	// The dead holder's token proves nothing any more.
	_, err := receive(ctx, d.pool, slotRef{q: "q", c: "c", slot: 0, n: 1, worker: "holder", max: 10})
	wantState(t, err, "PQ085", "the dead holder's receive after the takeover")
	// The new lease is unbound: it waits out its ttl.
	if s := one[*int32](t, d.pool, "select sl_session from pgque.slot_lease"); s != nil {
		t.Errorf("the new owner's unbound claim left session %d", *s)
	}
}

// TestDeadHolderRebind: a renewal moves the binding to the session it
// names, so the holder's first session ending costs it nothing; a renewal
// naming none unbinds, and then no session's end frees the lease. Binding
// a pid that is no backend is refused (PQ011).
func TestDeadHolderRebind(t *testing.T) {
	t.Parallel()
	d := setup(t)
	d.createQueue("q")
	d.subscribeSlots("q", "c", 1)
	close1, pid1 := session(t, d)
	close2, pid2 := session(t, d)
	e := claimBound(t, d.pool, "q", "c", 0, "holder", "1 hour", &pid1)
	if e == nil {
		t.Fatal("the bound claim was refused")
	}
	if r := claimBound(t, d.pool, "q", "c", 0, "holder", "1 hour", &pid2); r == nil || *r != *e {
		t.Fatalf("the renewal binding another session = %v, want epoch %d", r, *e)
	}
	if s := one[int32](t, d.pool, "select sl_session from pgque.slot_lease"); s != pid2 {
		t.Fatalf("the lease is bound to %d, want %d", s, pid2)
	}
	close1()
	waitGone(t, d, pid1)
	d.exec("insert into pgque.lease_orphan select sl_sub, sl_epoch, $1, clock_timestamp() - interval '1 day' from pgque.slot_lease", pid1)
	if c := claim(t, d.pool, "q", "c", 0, "other", "1 hour"); c != nil {
		t.Fatalf("the end of a session the lease is no longer bound to freed it (epoch %d)", *c)
	}
	// Unbind, then end the second session too.
	if r := claimBound(t, d.pool, "q", "c", 0, "holder", "1 hour", nil); r == nil || *r != *e {
		t.Fatalf("the unbinding renewal = %v, want epoch %d", r, *e)
	}
	close2()
	waitGone(t, d, pid2)
	for range 2 {
		if c := claim(t, d.pool, "q", "c", 0, "other", "1 hour"); c != nil {
			t.Fatalf("an unbound live lease was taken over (epoch %d)", *c)
		}
	}
	if n := one[int64](t, d.pool, "select count(*) from pgque.lease_orphan where lo_session = $1", pid2); n != 0 {
		t.Errorf("an unbound lease's refusals recorded %d orphans", n)
	}
	var epoch *int64
	err := d.pool.QueryRow(context.Background(),
		"select epoch from pgque.claim_slot('q', 'c', 0, 'holder', '1 hour', null, $1)", pid2).Scan(&epoch)
	wantState(t, err, "PQ011", "binding a session that is gone")
}

// TestDeadHolderOpenClaimBlocksNobody: a claim that recorded a dead
// session and was left open in its transaction holds up neither another
// claimer nor its takeover, which never waits for that record.
func TestDeadHolderOpenClaimBlocksNobody(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := setup(t)
	d.createQueue("q")
	d.subscribeSlots("q", "c", 1)
	closeHolder, pid := session(t, d)
	e := claimBound(t, d.pool, "q", "c", 0, "holder", "1 hour", &pid)
	closeHolder()
	waitGone(t, d, pid)

	open := pgtest.Conn(t, d.dsn)
	tx, err := open.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if c := claim(t, tx, "q", "c", 0, "intruder", "1 hour"); c != nil {
		t.Fatalf("the first claim after the session died took the lease (epoch %d)", *c)
	}
	// The open transaction's record is its own: another claim records one
	// too, and, once that one is past the grace, takes the lease without
	// waiting for the open transaction.
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var got *int64
	if err := d.pool.QueryRow(cctx, "select epoch from pgque.claim_slot('q', 'c', 0, 'other', '1 hour')").Scan(&got); err != nil || got != nil {
		t.Fatalf("the second claimer's first claim = %v, %v; want refused, at once", got, err)
	}
	d.exec("update pgque.lease_orphan set lo_seen = clock_timestamp() - interval '11 minutes'")
	if err := d.pool.QueryRow(cctx, "select epoch from pgque.claim_slot('q', 'c', 0, 'other', '1 hour')").Scan(&got); err != nil || got == nil || *got != *e+1 {
		t.Fatalf("the takeover beside an open claim = %v, %v; want epoch %d at once", got, err, *e+1)
	}
}

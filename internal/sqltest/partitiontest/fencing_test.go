package partitiontest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgque/pgque/internal/testing/pgtest"
)

// fencedAck calls the fenced ack_partitioned with the delivery's proof.
func fencedAck(ctx context.Context, q querier, s slotRef, epoch, batch, msgID int64) (int32, error) {
	token, err := holderToken(ctx, q, s)
	if err != nil {
		return 0, err
	}
	var n int32
	err = q.QueryRow(ctx, "select pgque.ack_partitioned($1, $2, $3, $4, $5, $6::uuid, $7, $8, $9)",
		s.q, s.c, s.slot, s.n, s.worker, token, epoch, batch, msgID).Scan(&n)
	return n, err
}

// keysOfSlot returns count keys that route to slot of n.
func keysOfSlot(t *testing.T, q querier, slot, n, count int) []*string {
	t.Helper()
	var out []*string
	for i := 0; len(out) < count; i++ {
		k := ptr(fmt.Sprintf("key-%d", i))
		if expectedSlot(t, q, k, n) == slot {
			out = append(out, k)
		}
	}
	return out
}

// T-fenced-ack: a worker that received a chunk, lost the lease and got it
// back later cannot acknowledge with its old proof: the epoch changed
// (PQ032), and an event of a chunk that was acknowledged since is not the
// current delivery (PQ035). The chunk it names is not acknowledged, and
// the next owner's chunk is untouched.
func TestFencedAckAfterReclaim(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := setup(t)
	d.createQueue("q")
	d.subscribeSlots("q", "c", 2)
	keys := keysOfSlot(t, d.pool, 0, 2, 4)
	d.sendBatch("q", keys)
	d.tick("q")

	w1 := slotRef{q: "q", c: "c", slot: 0, n: 2, worker: "w1", max: 2}
	w2 := w1
	w2.worker = "w2"
	e1 := mustClaim(t, d.pool, "q", "c", 0, "w1", "1 hour")
	c1 := mustReceive(t, d.pool, w1)
	if len(c1) != 2 {
		t.Fatalf("w1 received %v, want 2 events", c1)
	}
	// w1 loses the lease; w2 takes over, receives the same chunk, acks it
	// and receives the next one.
	if !release(t, d.pool, "q", "c", 0, "w1") {
		t.Fatal("release_slot refused")
	}
	e2 := mustClaim(t, d.pool, "q", "c", 0, "w2", "1 hour")
	if got := mustReceive(t, d.pool, w2); len(got) != 2 || got[0].ID != c1[0].ID {
		t.Fatalf("w2 received %v, want the unacknowledged chunk %v again", got, c1)
	}
	if n, err := fencedAck(ctx, d.pool, w2, e2, c1[0].Batch, c1[0].ID); err != nil || n != 0 {
		t.Fatalf("w2's fenced ack = %d, %v", n, err)
	}
	c2 := mustReceive(t, d.pool, w2)
	if len(c2) != 2 || c2[0].ID == c1[0].ID {
		t.Fatalf("w2's second chunk %v", c2)
	}
	// w2 goes away; the stale w1 comes back with a new lease.
	release(t, d.pool, "q", "c", 0, "w2")
	e3 := mustClaim(t, d.pool, "q", "c", 0, "w1", "1 hour")

	_, err := fencedAck(ctx, d.pool, w1, e1, c1[0].Batch, c1[0].ID)
	wantState(t, err, "PQ032", "stale w1 acking with the epoch it received under")
	_, err = fencedAck(ctx, d.pool, w1, e3, c1[0].Batch, c1[0].ID)
	wantState(t, err, "PQ035", "w1 acking a chunk acknowledged since, with the current epoch")
	_, err = fencedAck(ctx, d.pool, w1, e3, c1[0].Batch+1048576, c2[0].ID)
	wantState(t, err, "PQ035", "w1 acking with a wrong batch id")

	// Nothing was acknowledged by the refused calls: the next receive hands
	// out w2's chunk again.
	if got := mustReceive(t, d.pool, w1); len(got) != 2 || got[0].ID != c2[0].ID {
		t.Fatalf("after the refused acks w1 received %v, want %v again", got, c2)
	}
	if n, err := fencedAck(ctx, d.pool, w1, e3, c2[0].Batch, c2[1].ID); err != nil || n != 1 {
		t.Fatalf("w1's fenced ack of the chunk it holds = %d, %v; want 1 (batch finished)", n, err)
	}
}

// T-nack-own-chunk: nack_partitioned (both forms) refuses an event that is
// not in the caller's delivered chunk: another slot's event, an event of
// the batch not handed out yet, and one acknowledged already.
func TestNackOnlyOwnDeliveredChunk(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := setup(t)
	d.createQueue("q")
	d.subscribeSlots("q", "c", 2)
	mine := keysOfSlot(t, d.pool, 0, 2, 5)
	other := keysOfSlot(t, d.pool, 1, 2, 1)
	ids := d.sendBatch("q", append(append([]*string{}, mine...), other...))
	d.tick("q")
	s0 := slotRef{q: "q", c: "c", slot: 0, n: 2, worker: "w", max: 2}
	e := mustClaim(t, d.pool, "q", "c", 0, "w", "1 hour")
	c1 := mustReceive(t, d.pool, s0)
	if n, err := fencedAck(ctx, d.pool, s0, e, c1[0].Batch, c1[0].ID); err != nil || n != 0 {
		t.Fatalf("ack = %d, %v", n, err)
	}
	// Chunks of 2: c1 = ids[0..1] (acknowledged), c2 = ids[2..3], ids[4]
	// not handed out yet, ids[5] is slot 1's.
	c2 := mustReceive(t, d.pool, s0)
	if len(c2) != 2 || c2[0].ID != ids[2] || c2[1].ID != ids[3] {
		t.Fatalf("second chunk %v, want events %v", c2, ids[2:4])
	}
	cases := []struct {
		what string
		id   int64
	}{
		{"another slot's event", ids[5]},
		{"an event acknowledged already", c1[0].ID},
		{"an event not handed out yet", ids[4]},
		{"an event id that does not exist", ids[5] + 1000},
	}
	for _, c := range cases {
		_, err := nack(ctx, d.pool, s0, c.id, "1 s")
		wantState(t, err, "PQ022", "nack_partitioned of "+c.what)
		var n int32
		err = d.pool.QueryRow(ctx, "select pgque.nack_partitioned('q', 'c', 0, 2, 'w', $1::uuid, $2, $3, $4, '1 s', 'r')",
			tokenFor(t, d.pool, "q", "c", 0, "w"), e, c2[0].Batch, c.id).Scan(&n)
		if st := sqlState(err); st != "PQ022" && st != "PQ035" {
			t.Errorf("fenced nack_partitioned of %s: SQLSTATE %q (%v), want PQ035 or PQ022", c.what, st, err)
		}
	}
	if n := one[int64](t, d.pool, "select count(*) from pgque.retry_queue"); n != 0 {
		t.Errorf("refused nacks left %d retry rows", n)
	}
	// The event in the chunk can be nacked.
	if n, err := nack(ctx, d.pool, s0, c2[0].ID, "1 s"); err != nil || n != 1 {
		t.Errorf("nack of the delivered event = %d, %v", n, err)
	}
}

// T-claim-no-lock: a refused claim_slot left open in a transaction holds no
// lock on the lease row, so the owner's receive and ack go on at once.
// A lock on the row held by an open transaction of the owner itself makes
// other calls fail after a bounded wait (55P03), not hang.
func TestRefusedClaimDoesNotBlockOwner(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := setup(t)
	d.createQueue("q")
	d.subscribeSlots("q", "c", 1)
	d.send("q", ptr("k"))
	d.tick("q")
	mustClaim(t, d.pool, "q", "c", 0, "owner", "1 hour")

	intruder := pgtest.Conn(t, d.dsn)
	tx, err := intruder.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if e := claim(t, tx, "q", "c", 0, "intruder", "30 seconds"); e != nil {
		t.Fatalf("claim of a live lease by another worker = %d, want NULL", *e)
	}
	s := slotRef{q: "q", c: "c", slot: 0, n: 1, worker: "owner", max: 10}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	ms, err := receive(cctx, d.pool, s)
	if err != nil || len(ms) != 1 {
		t.Fatalf("owner's receive while a refused claim is open: %v %v", ms, err)
	}
	if _, err := ack(cctx, d.pool, s); err != nil {
		t.Fatalf("owner's ack while a refused claim is open: %v", err)
	}
	tx.Rollback(ctx)

	// The owner's own open transaction holding the row: another call waits
	// for a bounded time only.
	otx, err := intruder.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer otx.Rollback(ctx)
	if _, err := receive(ctx, otx, s); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = receive(cctx, d.pool, s)
	wantState(t, err, "55P03", "receive while the lease row is locked by an open transaction")
	if el := time.Since(start); el > 4*time.Second {
		t.Errorf("the blocked receive failed after %v, want about 2 s", el)
	}
}

// T-ttl-cap: the lease TTL is checked as the real duration it has, not by
// interval comparison (which counts a month as 30 days).
func TestLeaseTTLRealDuration(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := setup(t)
	d.createQueue("q")
	d.subscribeSlots("q", "c", 1)
	for _, c := range []struct {
		ttl  string
		want string // "" accepted
	}{
		{"30 seconds", ""},
		{"1 day", ""},
		{"2 days -24 hours", ""},
		{"1000 months -29999 days", "PQ011"},
		{"1 day 1 second", "PQ011"},
		{"25 hours", "PQ011"},
		{"10000 years -3599999 days", "PQ011"},
		{"1 month -26 days", "PQ011"}, // 2 to 5 days, whatever the month
		{"1 year -363 days", "PQ011"},
		{"-1 month 33 days", "PQ011"}, // 2 to 5 days
		{"1 month -31 days", "PQ011"}, // -3 to 0 days
		{"0", "PQ011"},
		{"-1 second", "PQ011"},
	} {
		var e *int64
		err := d.pool.QueryRow(ctx, "select epoch from pgque.claim_slot('q', 'c', 0, 'w', $1::interval)", c.ttl).Scan(&e)
		if c.want == "" {
			if err != nil {
				t.Errorf("ttl %q: %v, want accepted", c.ttl, err)
			}
			continue
		}
		if st := sqlState(err); st != c.want {
			// "1 month -29 days" is 1 to 3 days: accepted only when it is
			// exactly one day, which no month gives.
			t.Errorf("ttl %q: SQLSTATE %q (%v), want %s", c.ttl, st, err, c.want)
		}
		if until := one[*time.Time](t, d.pool, "select sl_until from pgque.slot_lease"); until != nil && time.Until(*until) > 25*time.Hour {
			t.Fatalf("ttl %q left a lease until %v", c.ttl, *until)
		}
	}
}

var _ = pgx.ReadCommitted

// T-lease-renewal-appends: renewing a lease (claim_slot by its owner with
// the same ttl) makes no row version of slot_lease, yet moves the expiry
// the views report and keeps other workers out.
func TestLeaseRenewalWritesNoVersion(t *testing.T) {
	t.Parallel()
	d := setup(t)
	conn := pgtest.Conn(t, d.dsn)
	one[int32](t, conn, "select pgque.create_queue('q')")
	one[int32](t, conn, "select pgque.subscribe_slot('q', 'c', 0, 1)")
	e := mustClaim(t, conn, "q", "c", 0, "w", "1 hour")
	first := one[time.Time](t, conn, "select lease_until from pgque.partition_slot_leases where slot = 0")
	before := writeStats(t, conn)
	for range 50 {
		if got := mustClaim(t, conn, "q", "c", 0, "w", "1 hour"); got != e {
			t.Fatalf("renewal changed the epoch: %d, want %d", got, e)
		}
	}
	after := writeStats(t, conn)
	if dl := after["slot_lease"].minus(before["slot_lease"]); dl.upd != 0 || dl.del != 0 {
		t.Errorf("50 renewals made %d updates of slot_lease, want 0", dl.upd)
	}
	if dl := after["sub_state"].minus(before["sub_state"]); dl.ins != 50 || dl.upd != 0 {
		t.Errorf("50 renewals: sub_state %+v, want 50 appends", dl)
	}
	last := one[time.Time](t, conn, "select lease_until from pgque.partition_slot_leases where slot = 0")
	if !last.After(first) {
		t.Errorf("lease_until did not move with the renewals: %v then %v", first, last)
	}
	if c := claim(t, conn, "q", "c", 0, "other", "1 hour"); c != nil {
		t.Errorf("another worker claimed a renewed, live lease (epoch %d)", *c)
	}
	// A release frees it at once.
	release(t, conn, "q", "c", 0, "w")
	if c := claim(t, conn, "q", "c", 0, "other", "1 hour"); c == nil || *c != e+1 {
		t.Errorf("claim after release = %v, want epoch %d", c, e+1)
	}
}

// TestCompletionHoldsTakeoverNotOwner: a handler's transaction that
// completed an event (complete_partitioned_in_tx) and is still open holds
// up a change of the slot's owner, which must not happen before it
// commits, but none of the owner's own calls: a receive, a renewing claim
// and a release go on at once. They waited for it (up to 2 s, then
// 55P03), and the slot's next completions queued behind them. The
// takeover's own wait is bounded the same way (55P03 after 2 s), and the
// claimer tries again.
func TestCompletionHoldsTakeoverNotOwner(t *testing.T) {
	t.Parallel()
	d := setup(t)
	ctx := context.Background()
	s, m, token := twoOfOneKey(t, d, 1)
	handler, err := d.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer handler.Rollback(ctx)
	if _, err := handler.Exec(ctx, "select pgque.complete_partitioned_in_tx('q', 'c', 0, 1, 'w', $1::uuid, $2, $3, $4)",
		token, m[0].Epoch, m[0].Batch, m[0].ID); err != nil {
		t.Fatal(err)
	}
	handlerPID := one[int32](t, handler, "select pg_backend_pid()")

	octx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := receive(octx, d.pool, s); err != nil {
		t.Fatalf("the owner's receive beside its handler's open completion: %v", err)
	}
	if _, err := d.pool.Exec(octx, "select pgque.claim_slot('q', 'c', 0, 'w', '1 hour', $1::uuid)", token); err != nil {
		t.Fatalf("the owner's renewal beside its handler's open completion: %v", err)
	}
	if !release(t, d.pool, "q", "c", 0, "w") {
		t.Fatal("the owner's release was refused")
	}

	// Another worker's claim gives up after 2 s (55P03) while the
	// completion stays open: a handler's transaction left open does not
	// hold the claimer.
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	_, err = d.pool.Exec(cctx, "select pgque.claim_slot('q', 'c', 0, 'v', '1 hour')")
	cancel()
	wantState(t, err, "55P03", "a takeover beside an open completion")

	// Another worker's claim takes the slot only once the completion
	// committed.
	claimed := pgtest.Async(func() (epoch *int64, err error) {
		// A claim waits 2 s at most (55P03) and the claimer tries again,
		// as a pool's next claim pass does.
		for range 10 {
			err = d.pool.QueryRow(ctx, "select epoch from pgque.claim_slot('q', 'c', 0, 'v', '1 hour')").Scan(&epoch)
			if sqlState(err) != "55P03" {
				break
			}
		}
		return epoch, err
	})
	pgtest.WaitFor(t, 10*time.Second, "the takeover to wait for the handler's transaction", func() bool {
		return one[bool](t, d.pool, "select exists (select from pg_stat_activity where $1::int = any(pg_blocking_pids(pid)))", handlerPID)
	})
	if err := handler.Commit(ctx); err != nil {
		t.Fatal("the completion's commit, with the lease released by its owner since:", err)
	}
	select {
	case r := <-claimed:
		if r.Err != nil || r.Value == nil || *r.Value != m[0].Epoch+1 {
			t.Fatalf("the takeover: epoch %v, %v; want %d", r.Value, r.Err, m[0].Epoch+1)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the takeover still waits after the completion committed")
	}
}

// TestHeldCompletionRacingTheSettle: a key lane's handler completes its
// event (complete_partitioned_in_tx) while the slot's settle holds that key
// and acknowledges the chunk in one transaction. Whichever it sees, the
// chunk still out or the hold, the completion is proved. The two were read
// under two snapshots, the hold first: a settle that committed between the
// two looks refused the event with PQ035 (a spurious failure, seen about
// once in 6 000 transactional handler calls). The test makes the
// completion's read of the slot's state wait until the settle committed,
// through a stand-in for pgque._sub_state that, in sessions that ask it
// to, first waits on a lock the test holds until then (with no
// lock_timeout: the completion's own, 2 s, would otherwise end the wait).
func TestHeldCompletionRacingTheSettle(t *testing.T) {
	t.Parallel()
	d := setup(t)
	ctx := context.Background()
	s, m, token := twoOfOneKey(t, d, 2)
	// The stand-in: the same read, after a wait the session asks for.
	d.exec(`alter function pgque._sub_state(integer) rename to _sub_state_real`)
	d.exec(`create function pgque._sub_state(i_sub integer) returns pgque.sub_state language plpgsql volatile
		set search_path = pg_catalog, pg_temp set lock_timeout = 0 as $$
		begin
		    if current_setting('pgque_test.wait_state', true) = 'on' then
		        perform pg_catalog.pg_advisory_xact_lock(4243);
		    end if;
		    return pgque._sub_state_real(i_sub);
		end $$`)

	gate := pgtest.Conn(t, d.dsn)
	if _, err := gate.Exec(ctx, "select pg_advisory_lock(4243)"); err != nil {
		t.Fatal(err)
	}
	handler := pgtest.Conn(t, d.dsn)
	if _, err := handler.Exec(ctx, "set pgque_test.wait_state = on"); err != nil {
		t.Fatal(err)
	}
	handlerPID := one[int32](t, handler, "select pg_backend_pid()")
	completed := pgtest.Async(func() (struct{}, error) {
		_, err := handler.Exec(ctx, "select pgque.complete_partitioned_in_tx('q', 'c', 0, 1, 'w', $1::uuid, $2, $3, $4)",
			token, m[0].Epoch, m[0].Batch, m[0].ID)
		return struct{}{}, err
	})
	waitForLockWait(t, d, handlerPID, "the completion, in its read of the state")
	// The settle: hold the key from its running event on, and acknowledge
	// the chunk, in one transaction.
	holdAndAck(t, d, s, m[0], token)
	if _, err := gate.Exec(ctx, "select pg_advisory_unlock(4243)"); err != nil {
		t.Fatal(err)
	}
	if r := <-completed; r.Err != nil {
		t.Fatalf("the held key's completion beside the settle: %v", r.Err)
	}
}

// holdAndAck holds key k of queue q's one slot from event head on and
// acknowledges the chunk head came in, in one transaction, as a worker's
// settle does.
func holdAndAck(t *testing.T, d *db, s slotRef, head msg, token *string) {
	t.Helper()
	ctx := context.Background()
	tx, err := d.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, "select pgque.hold_key_partitioned('q', 'c', 0, 1, 'w', $1::uuid, $2, $3, 'k', $4)",
		token, head.Epoch, head.Batch, head.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := fencedAck(ctx, tx, s, head.Epoch, head.Batch, head.ID); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}

// twoOfOneKey sends two events of key k to queue q of a one-slot consumer
// c, claims the slot for worker w and receives a chunk of max events
// (1 or 2): the slot, the chunk and w's token.
func twoOfOneKey(t *testing.T, d *db, max int) (slotRef, []msg, *string) {
	t.Helper()
	d.createQueue("q")
	d.subscribeSlots("q", "c", 1)
	k := "k"
	d.send("q", &k)
	d.send("q", &k)
	d.tick("q")
	s := d.claimAll("q", "c", 1, "w", max)[0]
	m := mustReceive(t, d.pool, s)
	if len(m) != max {
		t.Fatalf("received %v, want %d events", m, max)
	}
	return s, m, tokenFor(t, d.pool, "q", "c", 0, "w")
}

// TestHoldKeys: hold_keys_partitioned holds several keys of the chunk out in
// one call, each from its head on, as hold_key_partitioned does one; a head
// that is not its key's event in the chunk, or a key given twice, fails the
// whole call; and the next owner's release_stale_holds_partitioned puts every
// held event back, in order.
func TestHoldKeys(t *testing.T) {
	t.Parallel()
	d := setup(t)
	ctx := context.Background()
	d.createQueue("hk")
	d.subscribeSlots("hk", "c", 1)
	//                          0    1    2    3    4    5    6
	sent := d.sendBatch("hk", []*string{ptr("a"), ptr("b"), ptr("a"), nil, ptr("b"), nil, ptr("c")})
	d.tick("hk")
	s := d.claimAll("hk", "c", 1, "w", 100)[0]
	m := mustReceive(t, d.pool, s)
	if len(m) != len(sent) {
		t.Fatalf("received %v, want %d events", ids(m), len(sent))
	}
	token := tokenFor(t, d.pool, "hk", "c", 0, "w")
	hold := func(q querier, keys []*string, heads []int64) (int32, error) {
		var n int32
		err := q.QueryRow(ctx, "select pgque.hold_keys_partitioned('hk', 'c', 0, 1, 'w', $1::uuid, $2, $3, $4, $5)",
			token, m[0].Epoch, m[0].Batch, keys, heads).Scan(&n)
		return n, err
	}
	// Failing calls change nothing.
	_, err := hold(d.pool, []*string{ptr("a"), ptr("b")}, []int64{sent[2], sent[2]})
	wantState(t, err, "PQ022", "a head that is another key's event")
	_, err = hold(d.pool, []*string{ptr("a"), ptr("a")}, []int64{sent[0], sent[2]})
	wantState(t, err, "PQ011", "a key given twice")
	_, err = hold(d.pool, []*string{nil, ptr("a"), nil}, []int64{sent[3], sent[0], sent[5]})
	wantState(t, err, "PQ011", "the NULL key given twice")
	if n := one[int64](t, d.pool, "select count(*) from pgque.deferred"); n != 0 {
		t.Fatalf("failed holds deferred %d events", n)
	}

	tx, err := d.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	// a from its second event, b from its first, the NULL key from its first.
	n, err := hold(tx, []*string{ptr("a"), ptr("b"), nil}, []int64{sent[2], sent[1], sent[3]})
	if err != nil || n != 5 {
		t.Fatalf("hold_keys_partitioned = %d, %v; want 5 events deferred", n, err)
	}
	if _, err := fencedAck(ctx, tx, s, m[0].Epoch, m[0].Batch, m[0].ID); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if got := one[[]string](t, d.pool, `select array_agg(coalesce(kb_key, 'NULL') || ':' || kb_state || ':' || kb_head order by kb_head)
		from pgque.key_block`); fmt.Sprint(got) != fmt.Sprint([]string{
		fmt.Sprintf("b:inflight:%d", sent[1]), fmt.Sprintf("a:inflight:%d", sent[2]), fmt.Sprintf("NULL:inflight:%d", sent[3])}) {
		t.Errorf("key_block %v, want a, b and NULL held inflight from their heads", got)
	}

	// The next owner releases the holds and receives the held events, each
	// key in order.
	release(t, d.pool, "hk", "c", 0, "w")
	mustClaim(t, d.pool, "hk", "c", 0, "w2", "1 hour")
	s2 := slotRef{q: "hk", c: "c", slot: 0, n: 1, worker: "w2", max: 100}
	if _, err := d.pool.Exec(ctx, "select pgque.release_stale_holds_partitioned('hk', 'c', 0, 1, 'w2', $1::uuid)",
		tokenFor(t, d.pool, "hk", "c", 0, "w2")); err != nil {
		t.Fatal(err)
	}
	d.tick("hk")
	got, _ := drain(t, d.pool, s2)
	want := []int64{sent[1], sent[2], sent[3], sent[4], sent[5]}
	if fmt.Sprint(ids(got)) != fmt.Sprint(want) {
		t.Errorf("the next owner received %v, want the held events %v", ids(got), want)
	}
}

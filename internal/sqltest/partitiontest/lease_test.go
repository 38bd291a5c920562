package partitiontest

import (
	"context"
	"slices"
	"strconv"
	"testing"
	"time"
)

// T-N-invariant: N is persisted per (queue, consumer). Subscribing the same
// (slot, N) twice is fine (0 the second time); another N raises PQ030, on
// subscribe and on every per-slot call; once every slot is unsubscribed a
// new N is accepted.
func TestNInvariant(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := setup(t)
	d.createQueue("ni")
	d.subscribeSlots("ni", "c", 4)
	if got := one[int32](t, d.pool, "select pgque.subscribe_slot('ni', 'c', 2, 4)"); got != 0 {
		t.Errorf("subscribe_slot of an existing (slot 2, N 4) = %d, want 0", got)
	}

	_, err := d.pool.Exec(ctx, "select pgque.subscribe_slot('ni', 'c', 0, 8)")
	wantState(t, err, "PQ030", "subscribe_slot with N 8 where N 4 is persisted")
	_, err = d.pool.Exec(ctx, "select pgque.subscribe_slot('ni', 'c', 5, 8)")
	wantState(t, err, "PQ030", "subscribe_slot of a new slot with N 8 where N 4 is persisted")
	mustClaim(t, d.pool, "ni", "c", 0, "w", "1 hour")
	wrongN := slotRef{q: "ni", c: "c", slot: 0, n: 8, worker: "w", max: 10}
	_, err = receive(ctx, d.pool, wrongN)
	wantState(t, err, "PQ030", "receive_partitioned with N 8 where N 4 is persisted")
	_, err = ack(ctx, d.pool, wrongN)
	wantState(t, err, "PQ030", "ack_partitioned with N 8 where N 4 is persisted")
	_, err = nack(ctx, d.pool, wrongN, 1, "0 seconds")
	wantState(t, err, "PQ030", "nack_partitioned with N 8 where N 4 is persisted")
	_, err = d.pool.Exec(ctx, "select pgque.unsubscribe_slot('ni', 'c', 0, 8)")
	wantState(t, err, "PQ030", "unsubscribe_slot with N 8 where N 4 is persisted")

	// Removing some slots keeps N.
	for k := range 3 {
		if got := one[int32](t, d.pool, "select pgque.unsubscribe_slot('ni', 'c', $1, 4)", k); got != 1 {
			t.Errorf("unsubscribe_slot(slot %d of 4) = %d, want 1", k, got)
		}
	}
	if got := one[int32](t, d.pool, "select pgque.unsubscribe_slot('ni', 'c', 0, 4)"); got != 0 {
		t.Errorf("unsubscribe_slot of a removed slot = %d, want 0", got)
	}
	_, err = d.pool.Exec(ctx, "select pgque.subscribe_slot('ni', 'c', 0, 8)")
	wantState(t, err, "PQ030", "subscribe_slot with N 8 while slot 3 of 4 remains")

	// Removing the last slot releases N.
	if got := one[int32](t, d.pool, "select pgque.unsubscribe_slot('ni', 'c', 3, 4)"); got != 1 {
		t.Errorf("unsubscribe_slot(slot 3 of 4) = %d, want 1", got)
	}
	if n := one[int64](t, d.pool, "select count(*) from pgque.get_consumer_info('ni') where consumer_name like 'c#%'"); n != 0 {
		t.Errorf("%d slot subscriptions remain after every slot was unsubscribed", n)
	}
	d.subscribeSlots("ni", "c", 8)
	if got := one[[]int32](t, d.pool, `select array_agg(distinct nslots order by nslots) from pgque.partition_slot_status
		where queue = 'ni' and consumer = 'c'`); !slices.Equal(got, []int32{8}) {
		t.Errorf("partition_slot_status nslots = %v after resubscribing with 8, want [8]", got)
	}
	if got := one[int64](t, d.pool, "select count(*) from pgque.partition_slot_status where queue = 'ni' and consumer = 'c'"); got != 8 {
		t.Errorf("partition_slot_status has %d slots, want 8", got)
	}
}

// leaseRow reads a slot's lease from partition_slot_status.
func leaseRow(t *testing.T, d *db, q, c string, slot int) (owner *string, epoch int64, until *time.Time) {
	t.Helper()
	err := d.pool.QueryRow(context.Background(), `select owner, epoch, lease_until from pgque.partition_slot_status
		where queue = $1 and consumer = $2 and slot = $3`, q, c, slot).Scan(&owner, &epoch, &until)
	if err != nil {
		t.Fatal(err)
	}
	return owner, epoch, until
}

// T-lease: claim (epoch 1), steer (another worker gets NULL), renew with the
// same epoch, owner-only release, takeover after expiry with an epoch bump,
// and the grace rule: an expired lease that nobody took over can still be
// used by its owner.
func TestLease(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := setup(t)
	d.createQueue("ls")
	d.subscribeSlots("ls", "c", 2)
	const ttl = "200 milliseconds"

	if e := mustClaim(t, d.pool, "ls", "c", 0, "w1", "1 hour"); e != 1 {
		t.Errorf("first claim epoch = %d, want 1", e)
	}
	if e := claim(t, d.pool, "ls", "c", 0, "w2", "1 hour"); e != nil {
		t.Errorf("claim by w2 of w1's live lease = %d, want NULL", *e)
	}
	_, _, until1 := leaseRow(t, d, "ls", "c", 0)
	if e := mustClaim(t, d.pool, "ls", "c", 0, "w1", "2 hours"); e != 1 {
		t.Errorf("renewal by the owner: epoch %d, want 1 (same epoch)", e)
	}
	if owner, epoch, until2 := leaseRow(t, d, "ls", "c", 0); owner == nil || *owner != "w1" || epoch != 1 ||
		until1 == nil || until2 == nil || !until2.After(until1.Add(30*time.Minute)) {
		t.Errorf("after renewal with ttl 2 hours: owner %s epoch %d until %v (was %v); want w1, 1, about an hour later",
			keyString(owner), epoch, until2, until1)
	}

	// Only the owner releases.
	if ok := release(t, d.pool, "ls", "c", 0, "w2"); ok {
		t.Error("release_slot by a non-owner returned true")
	}
	if owner, _, _ := leaseRow(t, d, "ls", "c", 0); owner == nil || *owner != "w1" {
		t.Errorf("after a non-owner's release the owner is %s, want w1", keyString(owner))
	}
	if ok := release(t, d.pool, "ls", "c", 0, "w1"); !ok {
		t.Error("release_slot by the owner returned false")
	}
	if owner, _, _ := leaseRow(t, d, "ls", "c", 0); owner != nil {
		t.Errorf("after release the owner is %s, want NULL", *owner)
	}
	if ok := release(t, d.pool, "ls", "c", 0, "w1"); ok {
		t.Error("a second release_slot returned true")
	}
	if e := mustClaim(t, d.pool, "ls", "c", 0, "w2", ttl); e != 2 {
		t.Errorf("claim of a released lease: epoch %d, want 2", e)
	}

	// Takeover after expiry bumps the epoch and fences the old owner.
	waitLeaseExpired(t, d, "ls", "c", 0)
	if e := mustClaim(t, d.pool, "ls", "c", 0, "w3", "1 hour"); e != 3 {
		t.Errorf("takeover of an expired lease: epoch %d, want 3", e)
	}
	_, err := receive(ctx, d.pool, slotRef{q: "ls", c: "c", slot: 0, n: 2, worker: "w2", max: 10})
	wantState(t, err, "PQ085", "receive_partitioned by the owner whose expired lease was taken over")
	if e := claim(t, d.pool, "ls", "c", 0, "w2", ttl); e != nil {
		t.Errorf("the fenced worker re-claimed a live lease: epoch %d", *e)
	}

	// Grace: an expired lease nobody took over still works for its owner,
	// and using it renews it.
	d.send("ls", ptr("tenant-3")) // pinned: slot 0 of 2
	d.tick("ls")
	if e := mustClaim(t, d.pool, "ls", "c", 1, "w1", ttl); e != 1 {
		t.Errorf("first claim of slot 1: epoch %d, want 1", e)
	}
	mustClaim(t, d.pool, "ls", "c", 0, "w3", ttl) // renew w3 with a short ttl
	waitLeaseExpired(t, d, "ls", "c", 0)
	if owner, _, _ := leaseRow(t, d, "ls", "c", 0); owner != nil {
		t.Errorf("partition_slot_status owner of an expired lease = %s, want NULL", *owner)
	}
	s := slotRef{q: "ls", c: "c", slot: 0, n: 2, worker: "w3", max: 10}
	before := one[time.Time](t, d.pool, "select clock_timestamp()")
	ms, err := receive(ctx, d.pool, s)
	if err != nil {
		t.Fatalf("grace rule: the owner of an expired, untaken lease cannot receive: %v", err)
	}
	if len(ms) != 1 || ms[0].Epoch != 3 {
		t.Errorf("grace receive = %+v, want the one event with epoch 3", ms)
	}
	if owner, epoch, until := leaseRow(t, d, "ls", "c", 0); owner == nil || *owner != "w3" || epoch != 3 ||
		until == nil || !until.After(before) {
		t.Errorf("after the grace receive: owner %s epoch %d until %v; want a renewed lease of w3, epoch 3", keyString(owner), epoch, until)
	}
	if n, err := ack(ctx, d.pool, s); err != nil || n != 1 {
		t.Errorf("grace ack = %d, %v; want 1", n, err)
	}
}

// T-fencing: a zombie opens a batch, stalls past its TTL; the heir claims
// (epoch + 1) and receive_partitioned hands it the same open batch with the
// same rows; the zombie's ack_partitioned and nack_partitioned raise PQ032;
// the heir acks and the cursor moves.
func TestFencing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := setup(t)
	d.createQueue("fe")
	d.subscribeSlots("fe", "c", 2)
	key := ptr("tenant-1") // pinned: slot 1 of 2
	slot := pinnedSlot(t, key, 2)
	for range 3 {
		d.send("fe", key)
	}
	tickID := d.tick("fe")

	ze := mustClaim(t, d.pool, "fe", "c", slot, "zombie", "200 milliseconds")
	zombie := slotRef{q: "fe", c: "c", slot: slot, n: 2, worker: "zombie", max: 100}
	zrows := mustReceive(t, d.pool, zombie)
	if len(zrows) != 3 {
		t.Fatalf("zombie received %v, want 3 events", ids(zrows))
	}
	waitLeaseExpired(t, d, "fe", "c", slot) // the zombie stalls past its TTL

	he := mustClaim(t, d.pool, "fe", "c", slot, "heir", "1 hour")
	if he != ze+1 {
		t.Errorf("heir's epoch = %d, want zombie's %d + 1", he, ze)
	}
	heir := zombie
	heir.worker = "heir"
	hrows := mustReceive(t, d.pool, heir)
	if !slices.Equal(ids(hrows), ids(zrows)) || len(hrows) == 0 || hrows[0].Batch != zrows[0].Batch {
		t.Errorf("heir received %v of batch %d, want the zombie's open batch %d with %v",
			ids(hrows), batchOf(hrows), zrows[0].Batch, ids(zrows))
	}
	for _, m := range hrows {
		if m.Epoch != he {
			t.Errorf("heir's row %d carries epoch %d, want %d", m.ID, m.Epoch, he)
		}
	}

	_, err := ack(ctx, d.pool, zombie)
	wantState(t, err, "PQ085", "zombie's ack_partitioned after takeover")
	_, err = nack(ctx, d.pool, zombie, zrows[0].ID, "0 seconds")
	wantState(t, err, "PQ085", "zombie's nack_partitioned after takeover")
	_, err = receive(ctx, d.pool, zombie)
	wantState(t, err, "PQ085", "zombie's receive_partitioned after takeover")
	if n := one[int64](t, d.pool, "select count(*) from pgque.retry_queue"); n != 0 {
		t.Errorf("the zombie's refused nack left %d retry rows", n)
	}

	if n := mustAck(t, d.pool, heir); n != 1 {
		t.Errorf("heir's ack = %d, want 1 (batch finished)", n)
	}
	var last int64
	var open *int64
	if err := d.pool.QueryRow(ctx, "select last_tick, current_batch from pgque.get_consumer_info('fe', $1)",
		"c#"+strconv.Itoa(slot)+"/2").Scan(&last, &open); err != nil {
		t.Fatal(err)
	}
	if last != tickID || open != nil {
		t.Errorf("after the heir's ack: cursor at tick %d, open batch %s; want tick %d and none", last, int64String(open), tickID)
	}
}

func batchOf(ms []msg) int64 {
	if len(ms) == 0 {
		return 0
	}
	return ms[0].Batch
}

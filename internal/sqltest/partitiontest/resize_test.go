package partitiontest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgque/pgque/internal/testing/pgtest"
)

// resizeKeys are the keys the resize tests send, enough to hit every slot
// of 8.
func resizeKeys(n int) []*string {
	keys := make([]*string, n)
	for i := range keys {
		keys[i] = ptr(fmt.Sprintf("tenant-%d", i))
	}
	return keys
}

// resizeStatus reads the phase and target of a consumer's resize.
func resizeStatus(t testing.TB, q querier, queue, c string) (phase string, nslots int32, to *int32) {
	t.Helper()
	err := q.QueryRow(context.Background(),
		"select phase, nslots, resize_to from pgque.resize_status($1) where consumer = $2", queue, c).Scan(&phase, &nslots, &to)
	if err != nil {
		t.Fatalf("resize_status(%s) of %s: %v", queue, c, err)
	}
	return phase, nslots, to
}

// TestResizeSQL drives a resize 4 -> 8 by hand through the SQL API: the
// old slots deliver exactly the events committed before the seal, the new
// slots exactly those after it, each on the slot its key maps to under
// its N, with no new slot workable before the cutover and the cutover done
// by the old slots' own receives.
func TestResizeSQL(t *testing.T) {
	t.Parallel()
	d := setup(t)
	ctx := context.Background()
	d.createQueue("q")
	d.subscribeSlots("q", "c", 4)
	keys := resizeKeys(40)
	before := d.sendBatch("q", keys)
	d.tick("q")
	old := d.claimAll("q", "c", 4, "w1", 7)
	// Slot 0 has a batch open when the resize starts.
	open := mustReceive(t, d.pool, old[0])
	if len(open) == 0 {
		t.Fatal("slot 0 got nothing before the resize")
	}

	_, err := d.pool.Exec(ctx, "select pgque.resize_slots('q', 'nobody', 8)")
	wantState(t, err, "PQ071", "resize of an unknown consumer")
	_, err = d.pool.Exec(ctx, "select pgque.resize_slots('q', 'c', 4)")
	wantState(t, err, "PQ072", "resize to the same N")
	_, err = d.pool.Exec(ctx, "select pgque.resize_slots('q', 'c', 0)")
	wantState(t, err, "PQ011", "resize to 0 slots")
	seal := one[int64](t, d.pool, "select pgque.resize_slots('q', 'c', 8)")
	_, err = d.pool.Exec(ctx, "select pgque.resize_slots('q', 'c', 16)")
	wantState(t, err, "PQ070", "a second resize while one is in progress")
	_, err = d.pool.Exec(ctx, "select pgque.unsubscribe_slot('q', 'c', 0, 4)")
	wantState(t, err, "PQ073", "unsubscribing during a resize")
	if phase, n, to := resizeStatus(t, d.pool, "q", "c"); phase != "draining" || n != 4 || to == nil || *to != 8 {
		t.Fatalf("resize_status = %s %d -> %v, want draining 4 -> 8", phase, n, to)
	}

	after := d.sendBatch("q", keys)
	d.tick("q")
	// A new slot has no lease before the cutover.
	_, err = d.pool.Exec(ctx, "select pgque.claim_slot('q', 'c', 6, 'w2')")
	wantState(t, err, "PQ011", "claiming a new slot before the cutover")

	got := map[int64]int{} // ev_id -> slot it came on
	record := func(ms []msg, n int) {
		for _, m := range ms {
			if want := expectedSlot(t, d.pool, m.Key, n); want != m.Slot {
				t.Errorf("event %d of key %s on slot %d of %d, want slot %d", m.ID, keyString(m.Key), m.Slot, n, want)
			}
			if _, dup := got[m.ID]; dup {
				t.Errorf("event %d delivered twice", m.ID)
			}
			got[m.ID] = m.Slot
		}
	}
	record(open, 4)
	mustAck(t, d.pool, old[0])
	// Drain the old slots until the cutover happened (their receives do it).
	for round := 0; ; round++ {
		if round > 1000 {
			t.Fatal("the old slots never completed the resize")
		}
		if _, n, _ := resizeStatus(t, d.pool, "q", "c"); n == 8 {
			break
		}
		for _, s := range old {
			ms, err := receive(ctx, d.pool, s)
			if err != nil {
				wantState(t, err, "PQ030", "receiving an old slot after the cutover")
				continue
			}
			for _, m := range ms {
				if m.ID > before[len(before)-1] {
					t.Errorf("old slot %d got event %d, sent after the seal", s.slot, m.ID)
				}
			}
			record(ms, 4)
			if len(ms) > 0 {
				mustAck(t, d.pool, s)
			}
		}
	}
	if phase, _, to := resizeStatus(t, d.pool, "q", "c"); phase != "done" || to != nil {
		t.Fatalf("after the cutover resize_status = %s -> %v, want done", phase, to)
	}
	if _, err := receive(ctx, d.pool, old[1]); sqlState(err) != "PQ030" {
		t.Fatalf("receive on an old slot after the cutover: %v, want PQ030", err)
	}
	for _, id := range before {
		if _, ok := got[id]; !ok {
			t.Errorf("event %d, sent before the seal %d, was not delivered by the old slots", id, seal)
		}
	}
	// The new slots: claimable now, with an epoch above the old ones.
	newSlots := d.claimAll("q", "c", 8, "w2", 5)
	record(drainRoundRobin(t, d.pool, newSlots), 8)
	for _, id := range append(slices.Clone(before), after...) {
		if _, ok := got[id]; !ok {
			t.Errorf("event %d was never delivered", id)
		}
	}
	if n := one[int64](t, d.pool, "select count(*) from pgque.subscription where sub_name like 'c#%/4'"); n != 0 {
		t.Errorf("%d subscriptions of the old N are left", n)
	}
	if past := one[[]int32](t, d.pool, "select past_nslots from pgque.slot_group_info('q', 'c')"); !slices.Equal(past, []int32{4}) {
		t.Errorf("past_nslots = %v, want [4]", past)
	}
}

// TestResizeCarriesRetriesAndBlocks: under pause, a key blocked on an old
// slot (its head waiting for a retry, later events deferred behind it)
// stays blocked on its new slot after the cutover, and then delivers its
// head, its deferred events and the events sent after the seal in ev_id
// order; a retry of another key and a dead letter move to the key's new
// slot.
func TestResizeCarriesRetriesAndBlocks(t *testing.T) {
	t.Parallel()
	d := setup(t)
	ctx := context.Background()
	d.createQueue("q")
	d.subscribeSlots("q", "c", 2)
	d.exec("select pgque.set_failure_policy('q', 'c', 'pause')")
	d.exec("select pgque.set_queue_config('q', 'max_retries', '1')")
	k := ptr("blocked-key")
	r := ptr("retried-key")
	dl := ptr("dead-key")
	sk := expectedSlot(t, d.pool, k, 2)
	head := d.send("q", k)
	retried := d.send("q", r)
	dead := d.send("q", dl)
	d.tick("q")
	old := d.claimAll("q", "c", 2, "w1", 100)
	for _, s := range old {
		ms := mustReceive(t, d.pool, s)
		for _, m := range ms {
			switch m.ID {
			case head, retried:
				if _, err := nack(ctx, d.pool, s, m.ID, "1 hour"); err != nil {
					t.Fatal(err)
				}
			case dead:
				if _, err := d.pool.Exec(ctx, "select pgque.nack_partitioned($1, $2, $3, $4, $5, $6::uuid, $7, null, 'bad')",
					s.q, s.c, s.slot, s.n, s.worker, tokenFor(t, d.pool, s.q, s.c, s.slot, s.worker), m.ID); err != nil {
					t.Fatal(err)
				}
			}
		}
		if len(ms) > 0 {
			mustAck(t, d.pool, s)
		}
	}
	// Later events of the blocked key are deferred on its old slot.
	var deferred []int64
	for range 3 {
		deferred = append(deferred, d.send("q", k))
	}
	d.tick("q")
	if ms := mustReceive(t, d.pool, old[sk]); len(ms) != 0 {
		t.Fatalf("blocked key delivered %v", ids(ms))
	}

	d.exec("select pgque.resize_slots('q', 'c', 5)")
	var afterSeal []int64
	for range 2 {
		afterSeal = append(afterSeal, d.send("q", k))
	}
	d.tick("q")
	for round := 0; ; round++ {
		if round > 100 {
			t.Fatal("the cutover did not happen")
		}
		if _, n, _ := resizeStatus(t, d.pool, "q", "c"); n == 5 {
			break
		}
		for _, s := range old {
			if ms, err := receive(ctx, d.pool, s); err == nil && len(ms) > 0 {
				t.Fatalf("old slot %d delivered %v after the failures", s.slot, ids(ms))
			}
		}
	}
	nk := expectedSlot(t, d.pool, k, 5)
	var bslot int32
	var bstate string
	var bdeferred int64
	if err := d.pool.QueryRow(ctx, "select slot, state, deferred from pgque.blocked_keys('q', 'c') where key = $1", *k).
		Scan(&bslot, &bstate, &bdeferred); err != nil {
		t.Fatalf("blocked key after the cutover: %v", err)
	}
	if int(bslot) != nk || bstate != "blocked" || bdeferred != 3 {
		t.Fatalf("blocked key on slot %d (%s, %d deferred), want slot %d blocked with 3 deferred", bslot, bstate, bdeferred, nk)
	}
	owner := one[string](t, d.pool, `select s.sub_name from pgque.retry_queue r join pgque.subscription s on s.sub_id = r.ev_owner
		where r.ev_id = $1`, retried)
	if want := fmt.Sprintf("c#%d/5", expectedSlot(t, d.pool, r, 5)); owner != want {
		t.Errorf("retry of %d owned by %s, want %s", retried, owner, want)
	}
	dlc := one[string](t, d.pool, "select dl_consumer from pgque.dead_letter where ev_id = $1", dead)
	if want := fmt.Sprintf("c#%d/5", expectedSlot(t, d.pool, dl, 5)); dlc != want {
		t.Errorf("dead letter of %d names %s, want %s", dead, dlc, want)
	}
	if n := one[int64](t, d.pool, "select pgque.dlq_replay('q', (select dl_id from pgque.dead_letter where ev_id = $1))", dead); n != dead {
		t.Errorf("dlq_replay = %d, want %d", n, dead)
	}

	// The new slot of the blocked key: nothing until the head is retried,
	// then head, deferred, after-seal events in order.
	ns := slotRef{q: "q", c: "c", slot: nk, n: 5, worker: "w2", max: 100}
	mustClaim(t, d.pool, "q", "c", nk, "w2", "1 hour")
	if ms := mustReceive(t, d.pool, ns); len(ms) != 0 {
		t.Fatalf("new slot delivered %v while the key is blocked", ids(ms))
	}
	d.exec("select pgque.retry_key_now('q', 'c', $1)", *k)
	d.tick("q")
	var seen []int64
	for range 20 {
		ms := mustReceive(t, d.pool, ns)
		for _, m := range ms {
			if m.Key != nil && *m.Key == *k {
				seen = append(seen, m.ID)
			}
		}
		if len(ms) > 0 {
			mustAck(t, d.pool, ns)
		}
		d.tick("q")
	}
	want := append(append([]int64{head}, deferred...), afterSeal...)
	if !slices.Equal(seen, want) {
		t.Fatalf("blocked key delivered %v after the resize, want %v", seen, want)
	}
}

// routeIndexes counts the routing indexes of N on the queue's tables.
func routeIndexes(t testing.TB, q querier, n int) int64 {
	t.Helper()
	return one[int64](t, q, `select count(*) from pg_class c join pg_namespace ns on ns.oid = c.relnamespace
		where ns.nspname = 'pgque' and c.relkind = 'i' and c.relname ~ ('^event_[0-9]+_[0-9]+_route' || $1::int || '$')`, n)
}

// TestResizeFreesItsN: a resize counts both N towards the queue's limit of
// 4 distinct N (PQ051) until the cutover, which frees the old one;
// maint_route_indexes then drops the old N's routing indexes.
func TestResizeFreesItsN(t *testing.T) {
	t.Parallel()
	d := setup(t)
	ctx := context.Background()
	d.createQueue("q")
	for i, n := range []int{2, 3, 4, 5} {
		d.subscribeSlots("q", fmt.Sprintf("c%d", i), n)
	}
	_, err := d.pool.Exec(ctx, "select pgque.resize_slots('q', 'c0', 6)")
	wantState(t, err, "PQ051", "a fifth distinct N")
	d.exec("select pgque.resize_slots('q', 'c0', 3)") // 3 is in use: still four
	d.exec("select pgque.maint_route_indexes()")
	if n := routeIndexes(t, d.pool, 2); n != 3 {
		t.Fatalf("%d routing indexes for N=2 before the cutover, want 3", n)
	}
	_, err = d.pool.Exec(ctx, "select pgque.resize_slots('q', 'c1', 6)")
	wantState(t, err, "PQ051", "a fifth N while the resize still counts N=2")
	for _, s := range d.claimAll("q", "c0", 2, "w", 10) {
		mustReceive(t, d.pool, s) // empty: the cutover happens on the last one
	}
	if _, n, _ := resizeStatus(t, d.pool, "q", "c0"); n != 3 {
		t.Fatalf("c0 has %d slots after its old ones drained, want 3", n)
	}
	d.exec("select pgque.resize_slots('q', 'c1', 6)") // N=2 is free now
	if got := one[int32](t, d.pool, "select pgque.maint_route_indexes()"); got < 3 {
		t.Errorf("maint_route_indexes() = %d, want at least the 3 indexes of N=2 dropped", got)
	}
	if n := routeIndexes(t, d.pool, 2); n != 0 {
		t.Errorf("%d routing indexes for N=2 left after maint_route_indexes", n)
	}
	if n := routeIndexes(t, d.pool, 3); n != 3 {
		t.Errorf("%d routing indexes for N=3, want 3", n)
	}
}

// The cutover wakes the consumer's pools with a NOTIFY on channel pgque
// carrying the queue's tick tag, the payload pools match (any role may
// LISTEN, so it is never the queue name).
func TestResizeCutoverNotifiesTheTickTag(t *testing.T) {
	t.Parallel()
	d := setup(t)
	ctx := context.Background()
	d.createQueue("files-acme")
	d.subscribeSlots("files-acme", "c", 2)
	listener := pgtest.Conn(t, d.dsn)
	if _, err := listener.Exec(ctx, "listen pgque"); err != nil {
		t.Fatal(err)
	}
	tag := one[string](t, d.pool, "select pgque._tick_tag('files-acme')")
	old := d.claimAll("files-acme", "c", 2, "w", 100)
	one[int64](t, d.pool, "select pgque.resize_slots('files-acme', 'c', 4)")
	// The old slots' receives take them to the seal, and an empty one
	// completes the resize.
	receivesCutOver(t, d, "files-acme", "c", 4, func(round int) {
		for _, s := range old {
			if _, err := receive(ctx, d.pool, s); err != nil && round == 0 {
				t.Fatal(err)
			}
		}
	})
	// The resize's own forced seal tick notifies too: read until the
	// cutover's notification, or fail on a payload that is not the tag.
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for seen := 0; seen < 2; seen++ {
		n, err := listener.WaitForNotification(wctx)
		if err != nil {
			if seen > 0 {
				return // the seal tick did not notify: the one seen was the cutover's
			}
			t.Fatalf("no notification after the cutover: %v", err)
		}
		if n.Payload != tag {
			t.Fatalf("notification on %s carries %q, want the tick tag %q", n.Channel, n.Payload, tag)
		}
	}
}

// T-resize-raw-cutover: receive_partitioned_raw, what the Go client calls,
// completes a resize as receive_partitioned does: once the old slots are
// drained to the seal, an empty receive on one of them makes the cutover,
// with no maint() in between.
func TestResizeCutoverByRawReceive(t *testing.T) {
	t.Parallel()
	d := setup(t)
	ctx := context.Background()
	d.createQueue("q")
	d.subscribeSlots("q", "c", 2)
	d.sendBatch("q", resizeKeys(10))
	d.tick("q")
	old := d.claimAll("q", "c", 2, "w", 100)
	one[int64](t, d.pool, "select pgque.resize_slots('q', 'c', 4)")
	receivesCutOver(t, d, "q", "c", 4, func(int) {
		for _, s := range old {
			token, err := holderToken(ctx, d.pool, s)
			if err != nil {
				t.Fatal(err)
			}
			var epoch, batch, id int64
			err = d.pool.QueryRow(ctx, `select epoch, batch_id, msg_id from pgque.receive_partitioned_raw($1, $2, $3, $4, $5, $6::uuid, $7) limit 1`,
				s.q, s.c, s.slot, s.n, s.worker, token, s.max).Scan(&epoch, &batch, &id)
			switch {
			case errors.Is(err, pgx.ErrNoRows):
			case err != nil:
				wantState(t, err, "PQ030", "a raw receive on an old slot after the cutover")
			default:
				if _, err := d.pool.Exec(ctx, "select pgque.ack_partitioned($1, $2, $3, $4, $5, $6::uuid, $7, $8, $9)",
					s.q, s.c, s.slot, s.n, s.worker, token, epoch, batch, id); err != nil {
					t.Fatal(err)
				}
			}
		}
	})
}

// receivesCutOver runs round (receives on the old slots) until the resize
// of consumer on queue is done at n slots, and fails the test after 10
// rounds: an empty receive on a drained old slot makes the cutover.
func receivesCutOver(t *testing.T, d *db, queue, consumer string, n int, round func(int)) {
	t.Helper()
	for i := 0; ; i++ {
		if phase, got, _ := resizeStatus(t, d.pool, queue, consumer); phase == "done" && int(got) == n {
			return
		} else if i == 10 {
			t.Fatalf("after %d rounds of receives the resize is %s with %d slots, want done with %d", i, phase, got, n)
		}
		round(i)
	}
}

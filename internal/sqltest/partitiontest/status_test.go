package partitiontest

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// Plain receive, ack and nack refuse slot subscriptions and their batches
// with PQ033, so nobody can consume a slot around its lease through the api
// layer; subscribe refuses the reserved slot name syntax.
func TestPlainAPIRefusesSlots(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := setup(t)
	d.createQueue("pl")
	d.subscribeSlots("pl", "c", 2)
	id := d.send("pl", ptr("tenant-3")) // pinned: slot 0 of 2
	d.tick("pl")
	mustClaim(t, d.pool, "pl", "c", 0, "w", "1 hour")
	s := slotRef{q: "pl", c: "c", slot: 0, n: 2, worker: "w", max: 10}
	ms := mustReceive(t, d.pool, s)
	if len(ms) != 1 || ms[0].ID != id {
		t.Fatalf("slot 0 received %v, want [%d]", ids(ms), id)
	}
	batch := ms[0].Batch

	_, err := d.pool.Exec(ctx, "select * from pgque.receive('pl', 'c#0/2', 10)")
	wantState(t, err, "PQ033", "receive on a slot subscription")
	_, err = d.pool.Exec(ctx, "select * from pgque.receive('pl', 'c#1/2', 10)")
	wantState(t, err, "PQ033", "receive on an unclaimed slot subscription")
	_, err = d.pool.Exec(ctx, "select pgque.ack($1)", batch)
	wantState(t, err, "PQ033", "ack of a slot's batch")
	_, err = d.pool.Exec(ctx, "select pgque.nack($1, $2, '0 seconds', 'x')", batch, id)
	wantState(t, err, "PQ033", "nack of a slot's batch")
	_, err = d.pool.Exec(ctx, "select pgque.subscribe('pl', 'x#0/2')")
	wantState(t, err, "PQ010", "subscribe with a slot name")

	// Nothing moved: the lease holder gets the same row and acks it.
	again := mustReceive(t, d.pool, s)
	if len(again) != 1 || again[0].ID != id || again[0].Batch != batch {
		t.Errorf("after the refused calls slot 0 redelivered %+v, want event %d of batch %d", again, id, batch)
	}
	if n := one[int64](t, d.pool, "select count(*) from pgque.retry_queue"); n != 0 {
		t.Errorf("the refused nack left %d retry rows", n)
	}
	if n := mustAck(t, d.pool, s); n != 1 {
		t.Errorf("ack_partitioned = %d, want 1", n)
	}
}

// A batch with nothing for a slot is finished at once: receive_partitioned
// returns no rows, and the slot's cursor moves to the batch's tick, so an
// idle slot does not pin rotation.
func TestEmptySlotBatchMovesCursor(t *testing.T) {
	t.Parallel()
	d := setup(t)
	d.createQueue("em")
	d.subscribeSlots("em", "c", 8)
	idle := 4 // no pinned key maps to slot 4 of 8
	for _, p := range pinnedKeys {
		if p.slot8 == idle {
			t.Fatalf("pinned key %s maps to slot %d, which this test needs idle", keyString(p.key), idle)
		}
	}
	mustClaim(t, d.pool, "em", "c", idle, "w", "1 hour")
	s := slotRef{q: "em", c: "c", slot: idle, n: 8, worker: "w", max: 100}
	name := fmt.Sprintf("c#%d/8", idle)
	for round := range 3 {
		before := one[int64](t, d.pool, "select last_tick from pgque.get_consumer_info('em', $1)", name)
		for _, p := range pinnedKeys {
			d.send("em", p.key)
		}
		tk := d.tick("em")
		if ms := mustReceive(t, d.pool, s); len(ms) != 0 {
			t.Fatalf("round %d: idle slot %d received %v", round, idle, ids(ms))
		}
		var last int64
		var open *int64
		if err := d.pool.QueryRow(context.Background(),
			"select last_tick, current_batch from pgque.get_consumer_info('em', $1)", name).Scan(&last, &open); err != nil {
			t.Fatal(err)
		}
		if last != tk || last == before || open != nil {
			t.Errorf("round %d: idle slot's cursor at tick %d (was %d), open batch %s; want tick %d and no open batch",
				round, last, before, int64String(open), tk)
		}
	}
}

// partition_slot_status shows per slot the pending events of that slot
// only (not of the whole stream) and the age of the oldest, and shows no
// owner once a lease has expired.
func TestSlotStatus(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := setup(t)
	d.createQueue("st")
	d.subscribeSlots("st", "c", 8)

	// Pinned slots of 8: NULL 0, tenant-1 1, tenant-3 2, acme 6, "" 5,
	// Zürich 1.
	sends := []struct {
		key   *string
		count int
	}{{nil, 1}, {ptr("tenant-1"), 2}, {ptr("Zürich-日本-ü"), 1}, {ptr("tenant-3"), 3}, {ptr("acme"), 2}}
	want := make([]int64, 8)
	total := 0
	for _, s := range sends {
		for range s.count {
			d.send("st", s.key)
		}
		want[pinnedSlot(t, s.key, 8)] += int64(s.count)
		total += s.count
	}
	waitServerClock(t, d, 50*time.Millisecond) // so the oldest pending event has an age
	check := func(stage string) {
		t.Helper()
		rows, err := d.pool.Query(ctx, `select slot, lag, extract(epoch from oldest_pending_age)
			from pgque.partition_slot_status where queue = 'st' and consumer = 'c' order by slot`)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		n := 0
		for rows.Next() {
			var slot int32
			var lag int64
			var age *float64
			if err := rows.Scan(&slot, &lag, &age); err != nil {
				t.Fatal(err)
			}
			n++
			if lag != want[slot] {
				t.Errorf("%s: slot %d lag = %d, want %d (its own events; the stream has %d)", stage, slot, lag, want[slot], total)
			}
			switch {
			case want[slot] == 0 && age != nil:
				t.Errorf("%s: slot %d has nothing pending but oldest_pending_age %v s", stage, slot, *age)
			case want[slot] > 0 && (age == nil || *age < 0.04):
				t.Errorf("%s: slot %d has %d pending, oldest_pending_age %v s, want at least 0.04 s", stage, slot, want[slot], age)
			}
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		if n != 8 {
			t.Errorf("%s: partition_slot_status has %d rows, want 8", stage, n)
		}
	}
	check("before any tick")
	d.tick("st")
	check("after a tick")

	// Draining slot 2 empties its lag only.
	mustClaim(t, d.pool, "st", "c", 2, "w", "1 hour")
	if ms, _ := drain(t, d.pool, slotRef{q: "st", c: "c", slot: 2, n: 8, worker: "w", max: 100}); len(ms) != 3 {
		t.Fatalf("slot 2 drained %v, want 3 events", ids(ms))
	}
	want[2] = 0
	check("after slot 2 was drained")

	// Renew with a short TTL and let it run out.
	mustClaim(t, d.pool, "st", "c", 2, "w", "2 seconds")
	owner, epoch, _ := leaseRow(t, d, "st", "c", 2)
	if owner == nil || *owner != "w" || epoch != 1 {
		t.Errorf("live lease: owner %s epoch %d, want w and 1", keyString(owner), epoch)
	}
	waitLeaseExpired(t, d, "st", "c", 2)
	owner, epoch, until := leaseRow(t, d, "st", "c", 2)
	if owner != nil || epoch != 1 || until == nil {
		t.Errorf("expired lease: owner %s epoch %d lease_until %v; want NULL owner, epoch 1, the past expiry", keyString(owner), epoch, until)
	}
}

func int64String(p *int64) string {
	if p == nil {
		return "NULL"
	}
	return fmt.Sprint(*p)
}

// TestSlotStatusCountsBlockedKeys: a key blocked under pause holds its
// failed head (waiting for its retry) and every later event of the key;
// the slot's lag and oldest pending age count them, and blocked_keys and
// held show why, though the slot's cursor has moved past them all.
func TestSlotStatusCountsBlockedKeys(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := setup(t)
	d.createQueue("sb")
	d.exec("select pgque.subscribe_slot('sb', 'p', 0, 1, 'pause')")
	mustClaim(t, d.pool, "sb", "p", 0, "w", "1 hour")
	p := slotRef{q: "sb", c: "p", slot: 0, n: 1, worker: "w", max: 100}
	k := ptr("tenant-9")
	a1 := d.send("sb", k)
	d.send("sb", k)
	d.send("sb", ptr("tenant-2"))
	waitServerClock(t, d, 50*time.Millisecond) // so the held events have an age
	d.tick("sb")
	if ms := mustReceive(t, d.pool, p); len(ms) != 3 {
		t.Fatalf("received %v, want 3 events", ids(ms))
	}
	if n, err := nack(ctx, d.pool, p, a1, "1 hour"); err != nil || n != 1 {
		t.Fatalf("nack: %d %v", n, err)
	}
	mustAck(t, d.pool, p)
	var lag, held int64
	var blocked int32
	var age *float64
	if err := d.pool.QueryRow(ctx, `select lag, extract(epoch from oldest_pending_age)::float8, held, blocked_keys
		from pgque.partition_slot_status where queue = 'sb' and consumer = 'p'`).Scan(&lag, &age, &held, &blocked); err != nil {
		t.Fatal(err)
	}
	if lag != 2 || held != 1 || blocked != 1 || age == nil || *age < 0.04 {
		t.Errorf("slot of a blocked key: lag %d, oldest age %v s, held %d, blocked keys %d; want 2, at least 0.04, 1, 1",
			lag, age, held, blocked)
	}
}

// TestSlotStatusCountsOpenBatchProgress: a slot's cursor stays at its open
// batch's first tick until the batch's last chunk is acknowledged, and a
// catch-up batch holds the slot's whole backlog; the lag, key_heads and
// key_shares count what is still to be handled of it, not the chunks
// already acknowledged. An event whose transaction began first (the lowest
// ev_id) but committed after the batch's last tick belongs to a later
// batch and stays pending.
func TestSlotStatusCountsOpenBatchProgress(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := setup(t)
	d.createQueue("sp")
	d.subscribeSlots("sp", "c", 1)
	mustClaim(t, d.pool, "sp", "c", 0, "w", "1 hour")
	p := slotRef{q: "sp", c: "c", slot: 0, n: 1, worker: "w", max: 100}

	tx, err := d.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	late := send(t, tx, "sp", ptr("late"))
	// 25 keys of 10 consecutive events each: chunks of 100 hold 10 keys.
	keys := make([]*string, 250)
	for i := range keys {
		keys[i] = ptr(fmt.Sprintf("k-%02d", i/10))
	}
	sent := d.sendBatch("sp", keys)
	if late >= sent[0] {
		t.Fatalf("late event %d was meant to have the lowest ev_id (first sent %d)", late, sent[0])
	}
	d.tick("sp")

	type status struct{ lag, retrying, keys, heads, shares int64 }
	read := func() status {
		t.Helper()
		var s status
		if err := d.pool.QueryRow(ctx, `select lag, retrying from pgque.partition_slot_status
			where queue = 'sp' and consumer = 'c'`).Scan(&s.lag, &s.retrying); err != nil {
			t.Fatal(err)
		}
		if err := d.pool.QueryRow(ctx, `select count(*), coalesce(sum(pending), 0)::bigint
			from pgque.key_heads('sp', 'c', null, 10000)`).Scan(&s.keys, &s.heads); err != nil {
			t.Fatal(err)
		}
		s.shares = one[int64](t, d.pool, "select pending from pgque.key_shares('sp', 'c')")
		return s
	}
	check := func(stage string, want status) {
		t.Helper()
		if got := read(); got != want {
			t.Errorf("%s: lag %d (retrying %d), key_heads %d keys with %d pending, key_shares %d pending; want %d (%d), %d, %d, %d",
				stage, got.lag, got.retrying, got.keys, got.heads, got.shares, want.lag, want.retrying, want.keys, want.heads, want.shares)
		}
	}
	check("before the batch opens", status{250, 0, 25, 250, 250})

	if ms := mustReceive(t, d.pool, p); len(ms) != 100 || ms[0].ID != sent[0] {
		t.Fatalf("first chunk %v, want the first 100 sent", ids(ms))
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	d.tick("sp")
	// The chunk in hand is still to be handled; the late event waits for
	// the next batch.
	check("first chunk in hand", status{251, 0, 26, 251, 251})

	mustAck(t, d.pool, p)
	check("first chunk acknowledged", status{151, 0, 16, 151, 151})

	ms := mustReceive(t, d.pool, p)
	if len(ms) != 100 || ms[0].ID != sent[100] {
		t.Fatalf("second chunk %v, want sent[100:200]", ids(ms))
	}
	// k-19's last event fails and waits an hour for its retry.
	if n, err := nack(ctx, d.pool, p, sent[199], "1 hour"); err != nil || n != 1 {
		t.Fatalf("nack: %d %v", n, err)
	}
	mustAck(t, d.pool, p)
	// 50 of the batch (k-20..k-24), the late event, and k-19's retry.
	check("second chunk acknowledged with a retry", status{52, 1, 7, 52, 51})

	ms = mustReceive(t, d.pool, p)
	if len(ms) != 50 || ms[0].ID != sent[200] {
		t.Fatalf("last chunk of the batch %v, want sent[200:]", ids(ms))
	}
	mustAck(t, d.pool, p)
	check("batch finished", status{2, 1, 2, 2, 1})
}

// TestSlotStatusLeavesOutHeldEventsDone: a held key's events stay in
// deferred until its lane settles them; the lag, held and key_heads leave
// out those a transactional handler has completed meanwhile.
func TestSlotStatusLeavesOutHeldEventsDone(t *testing.T) {
	t.Parallel()
	d := setup(t)
	ctx := context.Background()
	s, m, token := twoOfOneKey(t, d, 2)
	s.max = 10
	holdAndAck(t, d, s, m[0], token)
	check := func(stage string, want int64) {
		t.Helper()
		var lag, held, pending, deferred int64
		if err := d.pool.QueryRow(ctx, `select lag, held from pgque.partition_slot_status where queue = 'q'`).Scan(&lag, &held); err != nil {
			t.Fatal(err)
		}
		if err := d.pool.QueryRow(ctx, `select pending, deferred from pgque.key_heads('q', 'c') where key = 'k'`).Scan(&pending, &deferred); err != nil {
			t.Fatal(err)
		}
		if lag != want || held != want || pending != want || deferred != want {
			t.Errorf("%s: lag %d, held %d, key_heads pending %d and deferred %d; want %d each", stage, lag, held, pending, deferred, want)
		}
	}
	check("held, nothing done", 2)
	if _, err := d.pool.Exec(ctx, "select pgque.complete_partitioned_in_tx('q', 'c', 0, 1, 'w', $1::uuid, $2, $3, $4)",
		token, m[0].Epoch, m[0].Batch, m[0].ID); err != nil {
		t.Fatal(err)
	}
	check("held, the head done in a transaction", 1)

	// The key's later events are deferred by the receive that reads them;
	// while that chunk is out they are counted once, as held.
	k, j := "k", "j"
	d.send("q", &k)
	d.send("q", &k)
	d.send("q", &j)
	d.tick("q")
	if ms := mustReceive(t, d.pool, s); len(ms) != 1 || *ms[0].Key != j {
		t.Fatalf("received %v, want j's event alone (k's deferred behind its hold)", ms)
	}
	var lag, held int64
	if err := d.pool.QueryRow(ctx, `select lag, held from pgque.partition_slot_status where queue = 'q'`).Scan(&lag, &held); err != nil {
		t.Fatal(err)
	}
	var keys, pending int64
	if err := d.pool.QueryRow(ctx, `select count(*), sum(pending) from pgque.key_heads('q', 'c')`).Scan(&keys, &pending); err != nil {
		t.Fatal(err)
	}
	if lag != 4 || held != 3 || keys != 2 || pending != 4 {
		t.Errorf("chunk out with k's later events deferred: lag %d, held %d, key_heads %d keys with %d pending; want 4, 3, 2, 4",
			lag, held, keys, pending)
	}
}

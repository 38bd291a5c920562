package partitiontest

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// keyHead is one row of key_heads.
type keyHead struct {
	Slot      int
	Key       *string
	State     string
	Head      int64
	Age       time.Duration
	Pending   int64
	Failures  *int32
	Reason    *string
	RetryAt   *time.Time
	Deferred  int64
	Estimated bool
}

func keyHeads(t *testing.T, d *db, q, c string, slot *int, limit, scan int) []keyHead {
	t.Helper()
	rows, err := d.pool.Query(context.Background(), `select slot, key, state, head_ev_id, head_age, pending, failures,
		reason, retry_at, deferred, estimated from pgque.key_heads($1, $2, $3, $4, $5)`, q, c, slot, limit, scan)
	if err != nil {
		t.Fatalf("key_heads(%s, %s): %v", q, c, err)
	}
	hs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (keyHead, error) {
		var h keyHead
		err := r.Scan(&h.Slot, &h.Key, &h.State, &h.Head, &h.Age, &h.Pending, &h.Failures, &h.Reason, &h.RetryAt,
			&h.Deferred, &h.Estimated)
		return h, err
	})
	if err != nil {
		t.Fatalf("key_heads(%s, %s): %v", q, c, err)
	}
	return hs
}

func findHead(hs []keyHead, key *string) *keyHead {
	for i := range hs {
		if (hs[i].Key == nil) == (key == nil) && (key == nil || *hs[i].Key == *key) {
			return &hs[i]
		}
	}
	return nil
}

// The key view on a crafted stream: a key blocked under the pause policy
// (its failing head waits for a retry and a later event is deferred), a
// stalled key whose slot is not consumed, a hot key, the NULL key and the
// empty key (two different keys), and a key in the open batch. Rows come
// oldest head first, each on its key's slot, with the right state, head,
// pending count and failure details; the scan budget marks estimates; the
// hot-key views find the hot key.
func TestKeyHeadsCraftedStream(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := setup(t)
	d.createQueue("kh")
	for k := range 2 {
		d.exec("select pgque.subscribe_slot('kh', 'c', $1, 2, 'pause')", k)
	}
	// tenant-3 and acme map to slot 0 of 2, tenant-1 and '' to slot 1
	// (pinned in g1_test.go), the NULL key to slot 0.
	blocked, stalled, hot, flying := ptr("tenant-3"), ptr("tenant-1"), ptr("acme"), ptr("Zürich-日本-ü")
	empty := ptr("")
	mustClaim(t, d.pool, "kh", "c", 0, "w", "1 hour")
	mustClaim(t, d.pool, "kh", "c", 1, "w", "1 hour")
	s0 := slotRef{q: "kh", c: "c", slot: 0, n: 2, worker: "w", max: 100}
	s1 := slotRef{q: "kh", c: "c", slot: 1, n: 2, worker: "w", max: 100}

	// Block tenant-3: its head fails, its second event is deferred.
	b1 := d.send("kh", blocked)
	b2 := d.send("kh", blocked)
	d.tick("kh")
	ms := mustReceive(t, d.pool, s0)
	if len(ms) != 2 || ms[0].ID != b1 {
		t.Fatalf("slot 0 received %v, want [%d %d]", ids(ms), b1, b2)
	}
	if n, err := nack(ctx, d.pool, s0, b1, "1 hour"); err != nil || n != 1 {
		t.Fatalf("nack head: %d, %v", n, err)
	}
	mustAck(t, d.pool, s0)

	s := d.send("kh", stalled)
	d.send("kh", stalled)
	d.send("kh", stalled)
	nul := d.send("kh", nil)
	emp := d.send("kh", empty)
	var hotIDs []int64
	for range 20 {
		hotIDs = append(hotIDs, d.send("kh", hot))
	}
	d.tick("kh")
	fly := d.send("kh", flying)
	d.tick("kh")
	// Slot 1 takes its first batch (tenant-1, '') and holds it open.
	// (Its cursor first skips the batch that held only slot 0's events.)
	ms = mustReceive(t, d.pool, s1)
	if len(ms) == 0 {
		ms = mustReceive(t, d.pool, s1)
	}
	if len(ms) != 4 {
		t.Fatalf("slot 1 received %v, want the 3 events of tenant-1 and the one of ''", ids(ms))
	}

	hs := keyHeads(t, d, "kh", "c", nil, 100, 100000)
	if len(hs) != 6 {
		t.Fatalf("key_heads returned %d rows, want 6: %+v", len(hs), hs)
	}
	want := []struct {
		key     *string
		slot    int
		state   string
		head    int64
		pending int64
	}{
		{blocked, 0, "blocked", b1, 2},
		{stalled, 1, "in flight", s, 3},
		{nil, 0, "flowing", nul, 1},
		{empty, 1, "in flight", emp, 1},
		{hot, 0, "flowing", hotIDs[0], 20},
		{flying, 1, "flowing", fly, 1},
	}
	for i, w := range want {
		h := hs[i]
		if (h.Key == nil) != (w.key == nil) || (w.key != nil && *h.Key != *w.key) {
			t.Fatalf("row %d is key %s, want %s (oldest head first): %+v", i, keyString(h.Key), keyString(w.key), hs)
		}
		if h.Slot != w.slot || h.State != w.state || h.Head != w.head || h.Pending != w.pending || h.Estimated {
			t.Errorf("key %s: slot %d state %q head %d pending %d estimated %v, want slot %d state %q head %d pending %d",
				keyString(w.key), h.Slot, h.State, h.Head, h.Pending, h.Estimated, w.slot, w.state, w.head, w.pending)
		}
		if h.Age <= 0 || h.Age > time.Hour {
			t.Errorf("key %s: head age %v", keyString(w.key), h.Age)
		}
		if i > 0 && h.Age > hs[i-1].Age {
			t.Errorf("key %s: head age %v is older than the previous row's %v", keyString(w.key), h.Age, hs[i-1].Age)
		}
	}
	b := hs[0]
	if b.Failures == nil || *b.Failures != 1 || b.Reason == nil || *b.Reason != "test" || b.Deferred != 1 ||
		b.RetryAt == nil || time.Until(*b.RetryAt) < 50*time.Minute {
		t.Errorf("blocked key details: failures %v reason %v deferred %d retry_at %v, want 1, test, 1, in an hour",
			b.Failures, b.Reason, b.Deferred, b.RetryAt)
	}
	for _, h := range hs[1:] {
		if h.Failures != nil || h.Reason != nil || h.RetryAt != nil || h.Deferred != 0 {
			t.Errorf("healthy key %s has failure details %+v", keyString(h.Key), h)
		}
	}

	// One slot, a row limit, and a scan budget that cuts the scan short.
	one1 := 1
	if hs := keyHeads(t, d, "kh", "c", &one1, 100, 100000); len(hs) != 3 {
		t.Errorf("slot 1 alone: %d rows, want 3: %+v", len(hs), hs)
	} else {
		for _, h := range hs {
			if h.Slot != 1 {
				t.Errorf("slot 1 alone returned a row of slot %d", h.Slot)
			}
		}
	}
	if hs := keyHeads(t, d, "kh", "c", nil, 2, 100000); len(hs) != 2 || hs[0].Head != b1 {
		t.Errorf("limit 2: %+v", hs)
	}
	hs = keyHeads(t, d, "kh", "c", nil, 100, 2) // 1 row per slot
	if h := findHead(hs, hot); h != nil {
		t.Errorf("with a budget of 1 row per slot the hot key's events (the newest) were read: %+v", h)
	}
	if h := findHead(hs, nil); h == nil || !h.Estimated {
		t.Errorf("NULL key under a cut scan: %+v, want estimated", h)
	}

	// key_shares: acme holds 20 of slot 0's 21 pending log events.
	var top *string
	var pending, topPending int64
	var share float64
	var est bool
	if err := d.pool.QueryRow(ctx, `select pending, top_key, top_pending, share, estimated
		from pgque.key_shares('kh', 'c') where slot = 0`).Scan(&pending, &top, &topPending, &share, &est); err != nil {
		t.Fatal(err)
	}
	if top == nil || *top != *hot || pending != 21 || topPending != 20 || share < 0.95 || share > 0.96 || est {
		t.Errorf("key_shares slot 0: top %s %d of %d (share %v, estimated %v), want acme 20 of 21",
			keyString(top), topPending, pending, share, est)
	}

	// hot_keys: acme made 20 of the 28 new events (retried copies are not
	// counted); a sample of 10 events is an estimate over a shorter span.
	var hk *string
	var events int64
	var rate float64
	if err := d.pool.QueryRow(ctx, `select key, events, rate, share, estimated
		from pgque.hot_keys('kh', '1 minute', 1)`).Scan(&hk, &events, &rate, &share, &est); err != nil {
		t.Fatal(err)
	}
	if hk == nil || *hk != *hot || events != 20 || share < 20.0/28-0.001 || share > 20.0/28+0.001 || est || rate < 20.0/60-0.01 {
		t.Errorf("hot_keys top: %s %d events, rate %v, share %v, estimated %v; want acme, 20, 20/28", keyString(hk), events, rate, share, est)
	}
	if err := d.pool.QueryRow(ctx, `select key, events, estimated from pgque.hot_keys('kh', '1 hour', 1, 10)`).
		Scan(&hk, &events, &est); err != nil {
		t.Fatal(err)
	}
	if hk == nil || *hk != *hot || events != 9 || !est {
		t.Errorf("hot_keys over a sample of 10: %s %d events, estimated %v; want acme, 9, true", keyString(hk), events, est)
	}
}

// Bad arguments to the key views are refused with a stable SQLSTATE.
func TestKeyViewsBadInput(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := setup(t)
	d.createQueue("kb")
	d.subscribeSlots("kb", "c", 2)
	for _, c := range []struct{ sql, code, what string }{
		{"select * from pgque.key_heads('nope', 'c')", "PQ001", "missing queue"},
		{"select * from pgque.key_heads(null, 'c')", "22004", "NULL queue"},
		{"select * from pgque.key_heads('kb', 'other')", "PQ034", "consumer without slots"},
		{"select * from pgque.key_heads('kb', 'c', 2)", "PQ011", "slot out of range"},
		{"select * from pgque.key_heads('kb', 'c', null, 0)", "PQ011", "limit 0"},
		{"select * from pgque.key_heads('kb', 'c', null, 10, -1)", "PQ011", "negative scan"},
		{"select * from pgque.key_heads('kb', 'c', null, null)", "22004", "NULL limit"},
		{"select * from pgque.key_shares('kb', 'other')", "PQ034", "key_shares of a consumer without slots"},
		{"select * from pgque.key_shares('kb', 'c', 0)", "PQ011", "key_shares scan 0"},
		{"select * from pgque.hot_keys('kb', '0 seconds')", "PQ011", "empty window"},
		{"select * from pgque.hot_keys('kb', null)", "22004", "NULL window"},
		{"select * from pgque.hot_keys('kb', '2 days')", "PQ011", "window over a day"},
		{"select * from pgque.hot_keys('kb', '1 minute', 100000)", "PQ011", "limit too large"},
		{"select * from pgque.hot_keys('nope')", "PQ001", "hot_keys of a missing queue"},
	} {
		_, err := d.pool.Exec(ctx, c.sql)
		wantState(t, err, c.code, c.what)
	}
	// An idle consumer has no keys, and every slot shows zero pending.
	if n := one[int64](t, d.pool, "select count(*) from pgque.key_heads('kb', 'c')"); n != 0 {
		t.Errorf("idle consumer: %d key rows", n)
	}
	if n := one[int64](t, d.pool, "select count(*) from pgque.key_shares('kb', 'c') where pending = 0 and top_key is null"); n != 2 {
		t.Errorf("idle consumer: %d empty key_shares rows, want 2", n)
	}
}

// slotHeads reads slot_heads as slot → head ev_id (0: nothing pending).
func slotHeads(t *testing.T, d *db, q, c string) map[int]int64 {
	t.Helper()
	rows, err := d.pool.Query(context.Background(), "select slot, coalesce(head_ev_id, 0), head_age from pgque.slot_heads($1, $2)", q, c)
	if err != nil {
		t.Fatal(err)
	}
	out := make(map[int]int64)
	for rows.Next() {
		var slot int
		var id int64
		var age *time.Duration
		if err := rows.Scan(&slot, &id, &age); err != nil {
			t.Fatal(err)
		}
		if (id == 0) != (age == nil) || (age != nil && *age < 0) {
			t.Errorf("slot %d: head %d with age %v", slot, id, age)
		}
		out[slot] = id
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// slot_heads finds each slot's first pending event with two index probes:
// past the cursor snapshot's xmax, and among the transactions that were in
// progress at the cursor's tick. An event whose transaction was open at
// that tick and committed later is pending and older than the events sent
// after it, so it is the head; a caught-up slot has none.
func TestSlotHeads(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := setup(t)
	d.createQueue("sh")
	d.subscribeSlots("sh", "c", 2)
	mustClaim(t, d.pool, "sh", "c", 0, "w", "1 hour")
	s0 := slotRef{q: "sh", c: "c", slot: 0, n: 2, worker: "w", max: 100}

	// tenant-3 maps to slot 0, tenant-1 to slot 1.
	tx, err := d.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	var late int64
	if err := tx.QueryRow(ctx, "select pgque.send('sh', 'test', '{}'::jsonb, 'tenant-3')").Scan(&late); err != nil {
		t.Fatal(err)
	}
	d.send("sh", ptr("tenant-3"))
	d.tick("sh") // the open transaction is in this tick's xip list
	if ms, _ := drain(t, d.pool, s0); len(ms) != 1 {
		t.Fatalf("slot 0 drained %v, want the one committed event", ids(ms))
	}
	if h := slotHeads(t, d, "sh", "c"); h[0] != 0 || h[1] != 0 {
		t.Fatalf("caught up: slot_heads = %v, want nothing pending", h)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	after := d.send("sh", ptr("tenant-3"))
	other := d.send("sh", ptr("tenant-1"))
	if h := slotHeads(t, d, "sh", "c"); h[0] != late || h[1] != other {
		t.Fatalf("slot_heads = %v, want slot 0 at %d (committed after its tick), not %d; slot 1 at %d", h, late, after, other)
	}
	if n := one[int64](t, d.pool, "select lag from pgque.partition_slot_status where queue = 'sh' and slot = 0"); n != 2 {
		t.Errorf("partition_slot_status lag of slot 0 = %d, want 2 (the same pending set)", n)
	}
}

// A key whose failed head succeeded on its retry is "releasing" while the events
// deferred behind it are put back and delivered, and "flowing" once they
// are acknowledged; a key with a retry pending under skip is "retrying".
func TestKeyHeadsHeldAndRetrying(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := setup(t)
	d.createQueue("kr")
	d.exec("select pgque.subscribe_slot('kr', 'p', 0, 1, 'pause')")
	d.exec("select pgque.subscribe_slot('kr', 's', 0, 1, 'skip')")
	mustClaim(t, d.pool, "kr", "p", 0, "w", "1 hour")
	mustClaim(t, d.pool, "kr", "s", 0, "w", "1 hour")
	p := slotRef{q: "kr", c: "p", slot: 0, n: 1, worker: "w", max: 100}
	s := slotRef{q: "kr", c: "s", slot: 0, n: 1, worker: "w", max: 100}
	k := ptr("tenant-9")
	a1 := d.send("kr", k)
	a2 := d.send("kr", k)
	d.tick("kr")
	for _, sl := range []slotRef{p, s} {
		if ms := mustReceive(t, d.pool, sl); len(ms) != 2 {
			t.Fatalf("%s received %v", sl, ids(ms))
		}
		if n, err := nack(ctx, d.pool, sl, a1, "0 seconds"); err != nil || n != 1 {
			t.Fatalf("nack on %s: %d %v", sl, n, err)
		}
		mustAck(t, d.pool, sl)
	}
	state := func(c string) keyHead {
		t.Helper()
		hs := keyHeads(t, d, "kr", c, nil, 10, 1000)
		if len(hs) != 1 {
			t.Fatalf("consumer %s: key_heads = %+v, want one key", c, hs)
		}
		return hs[0]
	}
	if h := state("s"); h.State != "retrying" || h.Head != a1 || h.Pending != 1 || h.RetryAt == nil {
		t.Errorf("skip consumer: %+v, want tenant-9 retrying at head %d with 1 pending", h, a1)
	}
	if h := state("p"); h.State != "blocked" || h.Head != a1 || h.Pending != 2 || h.Deferred != 1 {
		t.Errorf("pause consumer: %+v, want blocked at %d, 2 pending, 1 deferred", h, a1)
	}
	// The retry comes back and succeeds: the deferred event is put back.
	d.exec("select pgque.maint_retry_events()")
	d.tick("kr")
	ms := mustReceive(t, d.pool, p)
	if len(ms) != 1 || ms[0].ID != a1 {
		t.Fatalf("pause consumer redelivered %v, want [%d]", ids(ms), a1)
	}
	mustAck(t, d.pool, p)
	if h := state("p"); h.State != "releasing" || h.Head != a2 || h.Pending != 1 || h.Deferred != 0 || h.Failures == nil {
		t.Errorf("after the head succeeded: %+v, want releasing at %d with 1 pending", h, a2)
	}
	d.tick("kr")
	if ms := mustReceive(t, d.pool, p); len(ms) != 1 || ms[0].ID != a2 {
		t.Fatalf("pause consumer delivered %v, want [%d]", ids(ms), a2)
	}
	mustAck(t, d.pool, p)
	if hs := keyHeads(t, d, "kr", "p", nil, 10, 1000); len(hs) != 0 {
		t.Errorf("after the held event was acknowledged: %+v, want no pending key", hs)
	}
}

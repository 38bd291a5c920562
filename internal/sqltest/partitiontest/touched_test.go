package partitiontest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pgque/pgque/internal/testing/pgtest"
)

// touchedHex spells a set of slots of n the way pgque._tick_slots does: n
// bits in ceil(n/4) hex digits, slot 4j+b being bit 8>>b of digit j.
func touchedHex(slots map[int]bool, n int) string {
	var b strings.Builder
	for j := 0; j < (n+3)/4; j++ {
		v := 0
		for bit := range 4 {
			if slots[4*j+bit] {
				v |= 8 >> bit
			}
		}
		fmt.Fprintf(&b, "%x", v)
	}
	return b.String()
}

// nextTouched waits for the next notification on pgque_slots.
func nextTouched(t *testing.T, conn *pgx.Conn) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	n, err := conn.WaitForNotification(ctx)
	if err != nil {
		t.Fatalf("no notification on pgque_slots: %v", err)
	}
	if n.Channel != "pgque_slots" {
		t.Fatalf("notification on %q, want pgque_slots", n.Channel)
	}
	return n.Payload
}

// A tick notifies channel pgque_slots with the slots its batch touches,
// for every N in use on the queue: random keys (NULL among them), a
// transaction that commits after the tick that saw it running (its events
// are the next batch's, and so is its slot), a tick with no event (no
// notification) and a tick too full to be worth reading (every slot).
func TestTickNotifiesTouchedSlots(t *testing.T) {
	t.Parallel()
	d := setup(t)
	ctx := context.Background()
	d.createQueue("q")
	d.subscribeSlots("q", "c16", 16)
	d.subscribeSlots("q", "c4", 4)
	tag := one[string](t, d.pool, "select pgque._tick_tag('q')")
	d.tick("q") // the batches below all have a previous tick
	listener := pgtest.Conn(t, d.dsn)
	if _, err := listener.Exec(ctx, "listen pgque_slots"); err != nil {
		t.Fatal(err)
	}
	want := func(keys []*string) string {
		t.Helper()
		var parts []string
		for _, n := range []int{4, 16} {
			slots := map[int]bool{}
			for _, k := range keys {
				slots[expectedSlot(t, d.pool, k, n)] = true
			}
			parts = append(parts, fmt.Sprintf("%d=%s", n, touchedHex(slots, n)))
		}
		return tag + ":" + strings.Join(parts, ",")
	}

	rng := rand.New(rand.NewPCG(36, 1))
	for round := range 40 {
		keys := make([]*string, 1+rng.IntN(5))
		for i := range keys {
			if rng.IntN(8) > 0 {
				keys[i] = ptr(fmt.Sprintf("k%d", rng.IntN(1000)))
			}
		}
		d.sendBatch("q", keys)
		d.tick("q")
		if got, w := nextTouched(t, listener), want(keys); got != w {
			t.Fatalf("round %d, keys %v: notified %q, want %q", round, keys, got, w)
		}
	}

	// A producer still running at tick A: its event is the batch A→B's.
	tx, err := d.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	straggler := ptr("straggler")
	send(t, tx, "q", straggler)
	early := ptr("early")
	d.send("q", early)
	d.tick("q")
	if got, w := nextTouched(t, listener), want([]*string{early}); got != w {
		t.Fatalf("tick with a producer running: notified %q, want %q", got, w)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	d.tick("q")
	if got, w := nextTouched(t, listener), want([]*string{straggler}); got != w {
		t.Fatalf("tick after the straggler committed: notified %q, want %q", got, w)
	}

	// A tick with nothing sends nothing: the next notification is the
	// following tick's.
	d.tick("q")
	late := ptr("late")
	d.send("q", late)
	d.tick("q")
	if got, w := nextTouched(t, listener), want([]*string{late}); got != w {
		t.Fatalf("after an empty tick: notified %q, want %q (the empty tick must not notify)", got, w)
	}

	// More than 4·N events: every slot.
	many := make([]*string, 4*16+1)
	for i := range many {
		many[i] = ptr(fmt.Sprintf("m%d", i))
	}
	d.sendBatch("q", many)
	d.tick("q")
	if got := nextTouched(t, listener); got != tag+":*" {
		t.Fatalf("tick of %d events: notified %q, want %q", len(many), got, tag+":*")
	}
}

// A receive_partitioned_raw whose chunk is short of max and reaches the end
// of its batch while later ticks wait (a slot behind, catching up) says so
// on pgque_slots for that slot alone: a client that folds the chunk's
// acknowledgement into its next wake-up is woken by the call's commit, not
// after its bound. A chunk of max rows, and a short last chunk with no
// later tick, say nothing.
func TestBehindSlotWakesItself(t *testing.T) {
	t.Parallel()
	d := setup(t)
	ctx := context.Background()
	d.createQueue("q")
	d.subscribeSlots("q", "c", 4)
	tag := one[string](t, d.pool, "select pgque._tick_tag('q')")
	d.tick("q")
	mine := ptr("k1")
	slot := expectedSlot(t, d.pool, mine, 4)
	var others []*string
	for i := 0; len(others) < 4; i++ {
		if k := ptr(fmt.Sprintf("o%d", i)); expectedSlot(t, d.pool, k, 4) != slot {
			others = append(others, k)
		}
	}
	// Six ticks of five events, one of them the slot's. The test's ticks
	// are forced, which moves the event sequence past max × N, so a
	// catch-up batch is one tick: one of the slot's events, a chunk short
	// of max 3 that ends its batch.
	for range 6 {
		d.sendBatch("q", append([]*string{mine}, others...))
		d.tick("q")
	}
	s := d.claimAll("q", "c", 4, "w", 3)[slot]
	token, err := holderToken(ctx, d.pool, s)
	if err != nil {
		t.Fatal(err)
	}
	listener := pgtest.Conn(t, d.dsn)
	if _, err := listener.Exec(ctx, "listen pgque_slots"); err != nil {
		t.Fatal(err)
	}
	self := fmt.Sprintf("%s:4=%s", tag, touchedHex(map[int]bool{slot: true}, 4))
	var ack [3]*int64
	recv := func() int {
		t.Helper()
		rows, err := d.pool.Query(ctx, `select msg_id, batch_id, epoch from pgque.receive_partitioned_raw('q', 'c', $1, 4, 'w', $2::uuid, 3, $3, $4, $5)`,
			slot, *token, ack[2], ack[1], ack[0])
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for rows.Next() {
			var id, batch, epoch int64
			if err := rows.Scan(&id, &batch, &epoch); err != nil {
				t.Fatal(err)
			}
			if n == 0 {
				ack = [3]*int64{&id, &batch, &epoch}
			}
			n++
		}
		if rows.Err() != nil {
			t.Fatal(rows.Err())
		}
		return n
	}
	// Six batches: the first five leave later ticks behind them, the sixth
	// is the last.
	for b := range 6 {
		if n := recv(); n != 1 {
			t.Fatalf("batch %d: %d rows, want the slot's 1", b, n)
		}
		if b < 5 {
			if got := nextTouched(t, listener); got != self {
				t.Fatalf("batch %d, later ticks waiting: notified %q, want %q", b, got, self)
			}
		}
	}
	// Caught up: the next notification is the following tick's set (of
	// another slot), not this slot's own.
	other := func() string {
		return fmt.Sprintf("%s:4=%s", tag, touchedHex(map[int]bool{expectedSlot(t, d.pool, others[0], 4): true}, 4))
	}
	d.send("q", others[0])
	d.tick("q")
	if got, want := nextTouched(t, listener), other(); got != want {
		t.Fatalf("after the last batch: notified %q, want the next tick's %q", got, want)
	}
	// A full chunk (max rows) says nothing: the client receives again at once.
	for range 2 {
		d.sendBatch("q", []*string{mine, mine, mine, mine})
		d.tick("q")
	}
	for range 2 {
		if got := nextTouched(t, listener); got != self {
			t.Fatalf("a tick of the slot's events: notified %q, want %q", got, self)
		}
	}
	if n := recv(); n != 3 {
		t.Fatalf("a full chunk: %d rows, want 3", n)
	}
	d.send("q", others[0])
	d.tick("q")
	if got, want := nextTouched(t, listener), other(); got != want {
		t.Fatalf("after a full chunk: notified %q, want the next tick's %q", got, want)
	}
}

// A tick of a queue with slot consumers reads its batch's keys with the
// queue's key reader, whose plan holds the queue's own event tables: it
// locks no other queue's tables or indexes (a generic plan on pgque.event
// locked them all, 8 133 locks a tick with 900 queues). Without the
// reader (dropped here) the tick plans the statement for itself, with the
// same notification and the same locks, and maint() makes the reader
// again; it drops the reader of a dropped queue.
func TestTickReadsTheKeysOfItsQueueAlone(t *testing.T) {
	t.Parallel()
	d := setup(t)
	ctx := context.Background()
	for i := range 20 {
		d.createQueue(fmt.Sprintf("o%d", i))
	}
	d.createQueue("q")
	d.subscribeSlots("q", "c", 4)
	d.subscribeSlots("o1", "c", 2)
	id := one[int32](t, d.pool, "select queue_id from pgque.queue where queue_name = 'q'")
	reader := fmt.Sprintf("pgque._slot_keys_%d", id)
	hasReader := func(name string) bool {
		return one[*string](t, d.pool, "select pg_catalog.to_regproc($1)::text", name) != nil
	}
	if !hasReader(reader) {
		t.Fatalf("subscribe_slot made no %s", reader)
	}
	tag := one[string](t, d.pool, "select pgque._tick_tag('q')")
	d.tick("q")
	listener := pgtest.Conn(t, d.dsn)
	if _, err := listener.Exec(ctx, "listen pgque_slots"); err != nil {
		t.Fatal(err)
	}

	// tickLocks sends key, ticks q in a transaction and returns the event
	// tables and indexes of other queues that the transaction locked.
	tickLocks := func(key string) []string {
		t.Helper()
		d.send("q", ptr(key))
		tx, err := d.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		tick(t, tx, "q")
		others := one[[]string](t, tx, `select coalesce(array_agg(c.relname::text order by c.relname), '{}')
			  from pg_catalog.pg_locks l join pg_catalog.pg_class c on c.oid = l.relation
			 where l.pid = pg_catalog.pg_backend_pid() and c.relkind in ('r', 'i')
			   and c.relname like 'event\_%' and c.relname not like $1`, fmt.Sprintf("event\\_%d\\_%%", id))
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		want := fmt.Sprintf("%s:4=%s", tag, touchedHex(map[int]bool{expectedSlot(t, d.pool, ptr(key), 4): true}, 4))
		if got := nextTouched(t, listener); got != want {
			t.Errorf("tick of key %s: notified %q, want %q", key, got, want)
		}
		return others
	}
	if others := tickLocks("a"); len(others) != 0 {
		t.Errorf("a tick of q locked %d event tables and indexes of other queues: %v", len(others), others)
	}
	d.exec("drop function " + reader)
	if others := tickLocks("b"); len(others) != 0 {
		t.Errorf("without its key reader, a tick of q locked %d event tables and indexes of other queues: %v", len(others), others)
	}
	d.exec("select pgque.maint()")
	if !hasReader(reader) {
		t.Errorf("maint() did not make %s again", reader)
	}
	if others := tickLocks("c"); len(others) != 0 {
		t.Errorf("with the remade key reader, a tick of q locked %d event tables and indexes of other queues: %v", len(others), others)
	}

	gone := fmt.Sprintf("pgque._slot_keys_%d", one[int32](t, d.pool, "select queue_id from pgque.queue where queue_name = 'o1'"))
	if !hasReader(gone) {
		t.Fatalf("subscribe_slot made no %s", gone)
	}
	d.exec("select pgque.drop_queue('o1', true)")
	d.exec("select pgque.maint()")
	if hasReader(gone) {
		t.Errorf("maint() left %s of the dropped queue o1", gone)
	}
}

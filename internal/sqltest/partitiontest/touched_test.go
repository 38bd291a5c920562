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

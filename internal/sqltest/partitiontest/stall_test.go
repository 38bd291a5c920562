package partitiontest

import (
	"context"
	"testing"
	"time"

	"github.com/pgque/pgque/internal/testing/pgtest"
)

// stallRow is one row of partition_slot_stalls.
type stallRow struct {
	owner   *string
	behind  bool
	stalled bool
	reason  *string
}

// stalls reads partition_slot_stalls for one consumer, by slot.
func stalls(t *testing.T, d *db, q, c string) map[int]stallRow {
	t.Helper()
	rows, err := d.pool.Query(context.Background(), `select slot, owner, behind_since is not null, stalled, reason
		from pgque.partition_slot_stalls where queue = $1 and consumer = $2`, q, c)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := make(map[int]stallRow)
	for rows.Next() {
		var slot int
		var r stallRow
		if err := rows.Scan(&slot, &r.owner, &r.behind, &r.stalled, &r.reason); err != nil {
			t.Fatal(err)
		}
		out[slot] = r
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// The stalled-slot view tells the three ways a slot stops being worked
// apart from a slot that consumes: slot 0's owner renews its lease but never
// receives, slot 1 was released and nobody claimed it again, slot 2's owner
// vanished, and slot 3 consumes. With a 1-second lease TTL the stall bound
// is 2 seconds; the test waits for the view to say so (state, not a fixed
// sleep) and checks that the consuming slot never shows up and that a
// stalled slot stops being stalled once it consumes.
func TestStalledSlotView(t *testing.T) {
	t.Parallel()
	d := setup(t)
	d.createQueue("st")
	d.subscribeSlots("st", "c", 4)
	for s := range 4 {
		mustClaim(t, d.pool, "st", "c", s, "w", "1 second")
	}
	d.exec("select pgque.release_slot('st', 'c', 1, 'w', $1::uuid)", tokenFor(t, d.pool, "st", "c", 1, "w"))
	// Nothing is pending anywhere yet: nobody is behind, so nothing pins
	// rotation and nothing is stalled, whoever holds what.
	for s, r := range stalls(t, d, "st", "c") {
		if r.behind || r.stalled {
			t.Fatalf("slot %d before any tick: %+v, want neither behind nor stalled", s, r)
		}
	}
	d.send("st", ptr("tenant-3"))
	d.tick("st")

	live := slotRef{q: "st", c: "c", slot: 3, n: 4, worker: "w", max: 100}
	want := map[int]string{0: "not progressing", 1: "unclaimed", 2: "lease expired"}
	var got map[int]stallRow
	pgtest.WaitFor(t, 30*time.Second, "slots 0, 1 and 2 to be reported stalled with a 2 s stall bound", func() bool {
		// Slot 0's owner only renews; slot 3's consumes.
		mustClaim(t, d.pool, "st", "c", 0, "w", "1 second")
		if len(mustReceive(t, d.pool, live)) > 0 {
			mustAck(t, d.pool, live)
		}
		got = stalls(t, d, "st", "c")
		if got[3].stalled || got[3].behind {
			t.Fatalf("the consuming slot 3 is reported %+v", got[3])
		}
		done := true
		for s, reason := range want {
			if !got[s].stalled {
				done = false
				continue
			}
			if got[s].reason == nil || *got[s].reason != reason {
				t.Fatalf("slot %d stalled with reason %v, want %q", s, got[s].reason, reason)
			}
		}
		return done
	})
	if got[0].owner == nil || *got[0].owner != "w" {
		t.Errorf("slot 0 owner = %v, want the renewing worker", got[0].owner)
	}

	// A heartbeat is not progress; consuming is: slot 0 receives and acks
	// its batch and is no longer behind.
	s0 := slotRef{q: "st", c: "c", slot: 0, n: 4, worker: "w", max: 100}
	for range 3 {
		if len(mustReceive(t, d.pool, s0)) > 0 {
			mustAck(t, d.pool, s0)
		}
	}
	if r := stalls(t, d, "st", "c")[0]; r.stalled || r.behind {
		t.Errorf("slot 0 after consuming: %+v, want neither behind nor stalled", r)
	}

	// A caught-up slot is idle, not stalled, however long ago it last
	// moved: wait until slot 3's last progress is past its stall bound.
	pgtest.WaitFor(t, 30*time.Second, "slot 3's last progress to get older than its stall bound", func() bool {
		return !one[bool](t, d.pool, `select last_progress >= clock_timestamp() - stall_after
			from pgque.partition_slot_stalls where queue = 'st' and consumer = 'c' and slot = 3`)
	})
	if r := stalls(t, d, "st", "c")[3]; r.stalled || r.behind {
		t.Errorf("caught-up slot 3 with old progress: %+v, want neither behind nor stalled", r)
	}
}

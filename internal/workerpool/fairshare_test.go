package workerpool

import (
	"testing"
	"time"

	"github.com/pgque/pgque/internal/dbq"
)

// slots builds a status where owners[i] owns slot i ("" = free).
func slots(owners ...string) []dbq.SlotStatus {
	out := make([]dbq.SlotStatus, len(owners))
	for i, o := range owners {
		out[i] = dbq.SlotStatus{Slot: i, NSlots: len(owners)}
		if o != "" {
			owner := o
			out[i].Owner, out[i].Live = &owner, true
		}
	}
	return out
}

func running(s ...int) map[int]bool {
	m := make(map[int]bool)
	for _, x := range s {
		m[x] = false
	}
	return m
}

func TestPlanAloneClaimsEverything(t *testing.T) {
	t.Parallel()
	pl := makePlan(planInput{self: "a", slots: 4, maxActive: 4, status: slots("", "", "", ""), running: running()})
	if pl.target != 4 || len(pl.claim) != 4 || len(pl.release) != 0 {
		t.Fatalf("plan = %+v", pl)
	}
}

func TestPlanClaimsUpToFairShare(t *testing.T) {
	t.Parallel()
	// b holds 2 of 8; a runs nothing: fair share ceil(8/2) = 4.
	pl := makePlan(planInput{self: "a", slots: 8, maxActive: 8, status: slots("b", "b", "", "", "", "", "", ""), running: running()})
	if pl.target != 4 || len(pl.claim) != 4 {
		t.Fatalf("plan = %+v, want 4 claims", pl)
	}
}

func TestPlanClaimsBeyondFairShareOnlyLongFreeSlots(t *testing.T) {
	t.Parallel()
	in := planInput{self: "a", slots: 4, maxActive: 4, status: slots("a", "a", "b", ""), running: running(0, 1)}
	if pl := makePlan(in); len(pl.claim) != 0 {
		t.Fatalf("claimed %v beyond the fair share of a slot free for one pass", pl.claim)
	}
	in.prevFree = map[int]bool{3: true}
	if pl := makePlan(in); len(pl.claim) != 1 || pl.claim[0] != 3 {
		t.Fatalf("plan = %+v, want slot 3 claimed", pl)
	}
	in.peers = map[string]bool{"c": true} // a hungry peer gets it first
	if pl := makePlan(in); len(pl.claim) != 0 {
		t.Fatalf("claimed %v while a peer is hungry", pl.claim)
	}
}

func TestPlanReleasesExcessOnlyForHungryPeers(t *testing.T) {
	t.Parallel()
	in := planInput{self: "a", slots: 4, maxActive: 4, status: slots("a", "a", "a", "a"), running: running(0, 1, 2, 3),
		peers: map[string]bool{"b": false}}
	if pl := makePlan(in); len(pl.release) != 0 {
		t.Fatalf("released %v with no hungry peer", pl.release)
	}
	in.peers["b"] = true
	pl := makePlan(in)
	if pl.target != 2 || len(pl.release) != 2 {
		t.Fatalf("plan = %+v, want 2 releases", pl)
	}
	in.running[3] = true // already releasing one
	if pl := makePlan(in); len(pl.release) != 1 {
		t.Fatalf("plan = %+v, want 1 more release", pl)
	}
}

func TestPlanRespectsMaxActiveAndHoldoff(t *testing.T) {
	t.Parallel()
	pl := makePlan(planInput{self: "a", slots: 4, maxActive: 1, status: slots("", "", "", ""), running: running()})
	if pl.target != 1 || len(pl.claim) != 1 {
		t.Fatalf("plan = %+v, want 1 claim", pl)
	}
	pl = makePlan(planInput{self: "a", slots: 2, maxActive: 2, status: slots("", ""), running: running(),
		holdoff: map[int]bool{0: true}})
	if len(pl.claim) != 1 || pl.claim[0] != 1 {
		t.Fatalf("plan = %+v, want only slot 1", pl)
	}
}

func TestPlanAdoptsOwnUnrunSlots(t *testing.T) {
	t.Parallel()
	pl := makePlan(planInput{self: "a", slots: 2, maxActive: 2, status: slots("a", "b"), running: running()})
	if len(pl.claim) != 1 || pl.claim[0] != 0 {
		t.Fatalf("plan = %+v, want slot 0 adopted", pl)
	}
}

func TestPlanExpiredLeaseIsFree(t *testing.T) {
	t.Parallel()
	st := slots("b", "")
	st[0].Live = false
	pl := makePlan(planInput{self: "a", slots: 2, maxActive: 2, status: st, running: running()})
	if pl.live != 1 || len(pl.claim) != 2 {
		t.Fatalf("plan = %+v, want both slots claimed", pl)
	}
}

func TestPresence(t *testing.T) {
	t.Parallel()
	a := newPresence("q", "c", "a", 0)
	b := newPresence("q", "c", "b", 0)
	now := timeZero.Add(1)
	if !a.record(b.payload(true, []int{1}), now) {
		t.Fatal("a new peer is not news")
	}
	if a.record(b.payload(true, []int{1}), now) {
		t.Fatal("the same announcement twice is news")
	}
	if a.record(a.payload(true, nil), now) {
		t.Fatal("own announcement recorded")
	}
	if a.record(newPresence("q", "other", "x", 0).payload(true, nil), now) || a.record("garbage", now) {
		t.Fatal("foreign or garbled announcement recorded")
	}
	if live := a.live(now); len(live) != 1 || !live["b"] {
		t.Fatalf("live = %v", live)
	}
	if !a.record(b.payload(true, []int{1, 2}), now) {
		t.Fatal("a change of slots is not news")
	}
	st := a.status(3, now)
	if st[0].Owner != nil || st[1].Owner == nil || *st[1].Owner != "b" || !st[2].Live {
		t.Fatalf("status = %+v", st)
	}
	if a.previousOwner(2) != "b" {
		t.Fatalf("previous owner of slot 2 = %q", a.previousOwner(2))
	}
	if live := a.live(now.Add(1)); len(live) != 0 {
		t.Fatalf("live after the ttl = %v", live)
	}
}

var timeZero = time.Unix(0, 0)

// Free slots are claimed oldest pending event first, whatever their order.
func TestPlanClaimsOldestHeadFirst(t *testing.T) {
	t.Parallel()
	st := slots("", "", "", "")
	for i, age := range []time.Duration{time.Second, time.Hour, 0, time.Minute} {
		st[i].OldestPendingAge = age
	}
	for range 20 { // the shuffle before the sort must not matter
		pl := makePlan(planInput{self: "a", slots: 4, maxActive: 4, status: st, running: running()})
		if len(pl.claim) != 4 || pl.claim[0] != 1 || pl.claim[1] != 3 || pl.claim[2] != 0 || pl.claim[3] != 2 {
			t.Fatalf("claims %v, want [1 3 0 2] (oldest head first)", pl.claim)
		}
	}
}

package workerpool

import (
	"strings"
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
	now := timeZero.Add(1)
	b := func(hungry bool, slots ...int32) []dbq.Peer {
		return []dbq.Peer{{Worker: "b", Hungry: hungry, Slots: slots}}
	}
	if !a.update(b(true, 1), now) {
		t.Fatal("a new peer is not news")
	}
	if a.update(b(true, 1), now) {
		t.Fatal("the same announcement twice is news")
	}
	if a.update(append(b(true, 1), dbq.Peer{Worker: "a", Hungry: true}, dbq.Peer{Worker: ""}), now) {
		t.Fatal("own or nameless announcement recorded")
	}
	if live := a.live(now); len(live) != 1 || !live["b"] {
		t.Fatalf("live = %v", live)
	}
	if !a.update(b(true, 2, 1), now) {
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
	if a.update(nil, now); len(a.live(now)) != 0 {
		t.Fatal("a peer the server no longer returns is still live")
	}
	// A pool that stopped gracefully announces no slots and no hunger:
	// it is no peer from then on, its slots are free, and that is news.
	a.update(b(false, 0, 2), now)
	if !a.update(b(false), now) || !a.takeLeft() || a.takeLeft() {
		t.Fatal("a peer that left is not news, or not taken once as a leave")
	}
	if live := a.live(now); len(live) != 0 {
		t.Fatalf("live after the peer left = %v", live)
	}
	if st := a.status(3, now); st[0].Owner != nil || st[2].Owner != nil {
		t.Fatalf("status after the peer left = %+v", st)
	}
	if a.update(b(false), now) {
		t.Fatal("a peer that left is news again")
	}
	// One with no slots that wants some is a peer.
	if !a.update(b(true), now) || len(a.live(now)) != 1 {
		t.Fatal("a hungry peer with no slots is not live")
	}
}

// TestPresenceHint: only this consumer's tag wakes the pool, at most once
// per gap however many hints arrive, and the tag names nothing.
func TestPresenceHint(t *testing.T) {
	t.Parallel()
	a := newPresence("files", "thumbs", "a", time.Second)
	tag := hintTag("files", "thumbs")
	if strings.Contains(tag, "files") || strings.Contains(tag, "thumbs") || tag == hintTag("files", "other") || tag == hintTag("file", "sthumbs") {
		t.Fatalf("hint tag %q leaks or collides", tag)
	}
	now := timeZero.Add(time.Hour)
	for _, c := range []struct {
		payload string
		at      time.Duration
		want    bool
	}{
		{tag, 0, true}, {tag, time.Millisecond, false}, {`{"q":"files","c":"thumbs","w":"fake","h":true}`, time.Second, false},
		{"", time.Second, false}, {hintTag("files", "other"), time.Second, false}, {tag, 300 * time.Millisecond, true},
	} {
		if got, _ := a.hint(c.payload, now.Add(c.at), 250*time.Millisecond); got != c.want {
			t.Errorf("hint(%q) at +%v = %v, want %v", c.payload, c.at, got, c.want)
		}
	}
	// One within the gap is due when the gap ends, not dropped; others
	// are not due at all.
	if ok, wait := a.hint(tag, now.Add(400*time.Millisecond), 250*time.Millisecond); ok || wait != 150*time.Millisecond {
		t.Fatalf("hint within the gap = %v, wait %v; want false, due in 150ms", ok, wait)
	}
	if ok, wait := a.hint("", now.Add(400*time.Millisecond), 250*time.Millisecond); ok || wait != 0 {
		t.Fatalf("a foreign hint = %v, wait %v; want nothing due", ok, wait)
	}
	// A leave is gated apart: the hint just taken does not swallow it.
	leave := leaveTag("files", "thumbs")
	// The TypeScript worker checks the same value (test/worker_fairshare.test.ts).
	if leave == tag || leave == leaveTag("files", "other") || leave != "ce3fd733220ff6c1" {
		t.Fatalf("leave tag %q collides", leave)
	}
	if ok, _ := a.hint(leave, now.Add(310*time.Millisecond), 250*time.Millisecond); !ok {
		t.Fatal("a leave right after a hint is not taken")
	}
	if ok, _ := a.hint(leave, now.Add(320*time.Millisecond), 250*time.Millisecond); ok {
		t.Fatal("a second leave within the gap is taken")
	}
	if len(a.live(now)) != 0 {
		t.Fatal("a hint created a peer")
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

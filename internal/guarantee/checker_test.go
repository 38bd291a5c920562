package guarantee

import (
	"slices"
	"strings"
	"testing"
	"time"
)

// t0 is the start of every planted history.
var t0 = time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)

func ms(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }

// hb builds histories: keys "a" (slot 0) and "b" (slot 1), events
// a:1,2,3 = ev 10,12,14 and b:1,2 = ev 11,13.
type hb struct{ h History }

func newHB(policy string) *hb {
	b := &hb{h: History{Policy: policy, LeaseTTL: time.Second, End: ms(100000)}}
	b.h.Committed = []Committed{
		{Key: "a", Seq: 1, EvID: 10}, {Key: "b", Seq: 1, EvID: 11},
		{Key: "a", Seq: 2, EvID: 12}, {Key: "b", Seq: 2, EvID: 13},
		{Key: "a", Seq: 3, EvID: 14},
	}
	return b
}

func (b *hb) try(proc string, epoch int64, key string, ev int64, retry int, outcome string, start, end int) *hb {
	slot := 0
	if key == "b" {
		slot = 1
	}
	a := Attempt{Proc: proc, Slot: slot, Epoch: epoch, Key: key, EvID: ev, Retry: retry, Outcome: outcome, Start: ms(start)}
	if end >= 0 {
		a.End = ms(end)
	}
	b.h.Attempts = append(b.h.Attempts, a)
	return b
}

func (b *hb) fault(kind, target string, start, end int) *hb {
	b.h.Faults = append(b.h.Faults, Fault{Kind: kind, Target: target, Start: ms(start), End: ms(end)})
	return b
}

// clean: both keys handled in order by two workers; a worker is killed
// mid-chunk and its slot taken over with redelivery; a head fails and is
// retried under pause; a poison event is dead-lettered.
func cleanHistory(policy string) *hb {
	b := newHB(policy)
	b.try("w1", 1, "a", 10, 0, OutcomeOK, 0, 10).
		try("w2", 1, "b", 11, 0, OutcomeOK, 1, 5).
		try("w1", 1, "a", 12, 0, OutcomeOK, 11, 20).
		try("w1", 1, "a", 14, 0, "", 21, -1). // killed in the handler
		fault(FaultWorkerKill, "w1", 25, 25).
		// w3 takes slot 0 over: the unacked chunk comes again.
		try("w3", 2, "a", 10, 0, OutcomeOK, 2000, 2005).
		try("w3", 2, "a", 12, 0, OutcomeOK, 2006, 2010).
		try("w3", 2, "a", 14, 0, OutcomeOK, 2011, 2015).
		// b's second event fails, is retried and then dead-lettered.
		try("w2", 1, "b", 13, 0, OutcomeError, 6, 8).
		try("w2", 1, "b", 13, 1, OutcomePanic, 500, 501).
		try("w2", 1, "b", 13, 2, OutcomeError, 900, 901)
	b.h.DeadLetters = []DeadLetter{{EvID: 13, Key: "b"}}
	return b
}

func mustPass(t *testing.T, h *History) *Report {
	t.Helper()
	r := Check(h)
	if !r.OK() {
		t.Fatalf("clean history flagged: %v", r.Violations)
	}
	return r
}

func mustFlag(t *testing.T, h *History, guarantee string, detail string) *Report {
	t.Helper()
	r := Check(h)
	for _, v := range r.Violations {
		if v.Guarantee == guarantee && strings.Contains(v.Detail, detail) {
			return r
		}
	}
	t.Fatalf("want a %s violation mentioning %q, got %v", guarantee, detail, r.Violations)
	return r
}

func TestCheckCleanHistory(t *testing.T) {
	for _, policy := range []string{"pause", "skip"} {
		t.Run(policy, func(t *testing.T) {
			r := mustPass(t, &cleanHistory(policy).h)
			if r.Committed != 5 || r.DeadLettered != 1 || r.Keys != 2 {
				t.Errorf("counts: %+v", r)
			}
			if r.Takeovers != 1 || r.Redeliveries != 3 || r.DuplicateSuccesses != 2 || r.ExplainedDuplicates != 2 {
				t.Errorf("takeovers %d redeliveries %d duplicates %d/%d explained", r.Takeovers, r.Redeliveries,
					r.DuplicateSuccesses, r.ExplainedDuplicates)
			}
			if r.Errors != 2 || r.Panics != 1 || r.Unfinished != 1 || r.Retries != 2 {
				t.Errorf("outcomes: %+v", r)
			}
		})
	}
}

func TestCheckFlagsLoss(t *testing.T) {
	b := cleanHistory("pause")
	b.h.Committed = append(b.h.Committed, Committed{Key: "b", Seq: 3, EvID: 15}) // never handled
	mustFlag(t, &b.h, GNoLoss, "never handled")

	// A dead letter is not an excuse for another event.
	b = cleanHistory("skip")
	b.h.DeadLetters = nil
	mustFlag(t, &b.h, GNoLoss, "never handled")
}

func TestCheckFlagsReordering(t *testing.T) {
	b := newHB("skip")
	b.try("w1", 1, "a", 12, 0, OutcomeOK, 0, 1). // ev 12 first delivered before ev 10
							try("w1", 1, "a", 10, 0, OutcomeOK, 2, 3).
							try("w1", 1, "a", 14, 0, OutcomeOK, 4, 5).
							try("w2", 1, "b", 11, 0, OutcomeOK, 0, 1).
							try("w2", 1, "b", 13, 0, OutcomeOK, 2, 3)
	mustFlag(t, &b.h, GG1, "out of ev_id order")

	// A key seen on two slots breaks affinity.
	b = cleanHistory("skip")
	b.h.Attempts[len(b.h.Attempts)-1].Slot = 7
	mustFlag(t, &b.h, GG1, "slot 7")

	// A key delivered consistently, but by the wrong slot.
	b = cleanHistory("skip")
	b.h.KeySlots = map[string]int{"a": 0, "b": 3}
	mustFlag(t, &b.h, GG1, "maps to slot 3")
	b.h.KeySlots = map[string]int{"a": 0, "b": 1}
	mustPass(t, &b.h)

	// Stored out of the producer's order.
	b = cleanHistory("skip")
	b.h.Committed[4].Seq = 0
	mustFlag(t, &b.h, GG1, "send order")
}

func TestCheckFlagsOverlap(t *testing.T) {
	// Two workers on one key under the same epoch.
	b := cleanHistory("skip")
	b.try("w9", 1, "a", 12, 0, OutcomeOK, 15, 16)
	mustFlag(t, &b.h, GG2, "same epoch")

	// A zombie (older epoch) overlapping the owner for longer than the TTL.
	b = cleanHistory("skip")
	b.try("w0", 0, "a", 14, 0, OutcomeCancelled, 1500, 4000)
	mustFlag(t, &b.h, GG2, "more than the lease TTL")

	// The same zombie, frozen by SIGSTOP for most of that time, is fine.
	b = cleanHistory("skip")
	b.try("w0", 0, "a", 14, 0, OutcomeCancelled, 1500, 4000).fault(FaultWorkerStop, "w0", 1600, 3950)
	r := mustPass(t, &b.h)
	if r.ZombieOverlaps == 0 || r.MaxZombieOverlap > time.Second {
		t.Errorf("zombie overlaps %d, max %v", r.ZombieOverlaps, r.MaxZombieOverlap)
	}
}

func TestCheckFlagsG3Skip(t *testing.T) {
	// Under pause, a later event of the key overtakes a failed head.
	b := newHB("pause")
	b.try("w1", 1, "a", 10, 0, OutcomeError, 0, 1).
		try("w1", 1, "a", 12, 0, OutcomeOK, 2, 3). // must have waited for ev 10
		try("w1", 1, "a", 10, 1, OutcomeOK, 1000, 1001).
		try("w1", 1, "a", 14, 0, OutcomeOK, 1002, 1003).
		try("w2", 1, "b", 11, 0, OutcomeOK, 0, 1).
		try("w2", 1, "b", 13, 0, OutcomeOK, 2, 3)
	mustFlag(t, &b.h, GG3, "before ev 10")
	// The same history is fine under skip.
	b.h.Policy = "skip"
	mustPass(t, &b.h)

	// A head dead-lettered by the new owner while a frozen zombie still
	// held it: the zombie's late success does not hold the key back.
	b = newHB("pause")
	b.try("w1", 1, "a", 10, 0, OutcomeError, 0, 1).
		try("w2", 2, "a", 10, 1, OutcomeError, 3000, 3001). // last retry: dead-lettered
		try("w2", 2, "a", 12, 0, OutcomeOK, 3100, 3101).
		try("w1", 1, "a", 10, 1, OutcomeOK, 4000, 4001). // the zombie wakes up
		try("w2", 2, "a", 14, 0, OutcomeOK, 4100, 4101).
		try("w3", 1, "b", 11, 0, OutcomeOK, 0, 1).
		try("w3", 1, "b", 13, 0, OutcomeOK, 2, 3).
		fault(FaultWorkerStop, "w1", 100, 3995)
	b.h.DeadLetters = []DeadLetter{{EvID: 10, Key: "a"}}
	mustPass(t, &b.h)

	// The same, but the zombie's late run is cancelled (its lease is gone):
	// an attempt after the dead letter is not the last one that counts.
	b = newHB("pause")
	b.try("w1", 1, "a", 10, 0, OutcomeError, 0, 1).
		try("w2", 2, "a", 10, 1, OutcomeError, 3000, 3001). // last retry: dead-lettered
		try("w2", 2, "a", 12, 0, OutcomeOK, 3100, 3101).
		try("w1", 1, "a", 10, 0, OutcomeCancelled, 4000, 4001). // the zombie wakes up
		try("w2", 2, "a", 14, 0, OutcomeOK, 4100, 4101).
		try("w3", 1, "b", 11, 0, OutcomeOK, 0, 1).
		try("w3", 1, "b", 13, 0, OutcomeOK, 2, 3).
		fault(FaultWorkerStop, "w1", 100, 3995)
	b.h.DeadLetters = []DeadLetter{{EvID: 10, Key: "a", Time: ms(3002)}}
	mustPass(t, &b.h)
	// ... while a later event handled before the head's last attempt is
	// flagged.
	b = newHB("pause")
	b.try("w1", 1, "a", 10, 0, OutcomeError, 0, 1).
		try("w2", 2, "a", 12, 0, OutcomeOK, 2500, 2501).
		try("w2", 2, "a", 10, 1, OutcomeError, 3000, 3001).
		try("w1", 1, "a", 10, 0, OutcomeCancelled, 4000, 4001).
		fault(FaultWorkerStop, "w1", 100, 3995)
	b.h.DeadLetters = []DeadLetter{{EvID: 10, Key: "a", Time: ms(3002)}}
	mustFlag(t, &b.h, GG3, "before ev 10")

	// A success repeated without any cause breaks exactly-once.
	b = cleanHistory("pause")
	b.try("w2", 1, "b", 11, 0, OutcomeOK, 30, 31)
	mustFlag(t, &b.h, GG3, "no takeover")
	// ... unless Postgres restarted in between,
	b2 := *b
	b2.h.Faults = slices.Clone(b.h.Faults)
	b.fault(FaultPGRestart, "", 20, 22)
	mustPass(t, &b.h)
	// ... or the worker fenced the slot itself (same epoch afterwards: the
	// server still had its lease).
	slot := 1
	b2.h.Faults = append(b2.h.Faults, Fault{Kind: FaultFence, Target: "w2", Slot: &slot, Start: ms(25), End: ms(25)})
	mustPass(t, &b2.h)
	other := 0
	b2.h.Faults[len(b2.h.Faults)-1].Slot = &other // a fence of another slot explains nothing
	mustFlag(t, &b2.h, GG3, "no takeover")
}

func TestCheckFlagsPhantom(t *testing.T) {
	b := cleanHistory("skip")
	b.try("w2", 1, "b", 99, 0, OutcomeOK, 40, 41)
	mustFlag(t, &b.h, GPhantom, "never committed")
}

func TestCheckSkippedRecordsAreNotHandlings(t *testing.T) {
	// Under pause the worker records skipped events behind a failed head;
	// they neither count as deliveries nor as successes.
	b := newHB("pause")
	b.try("w1", 1, "a", 10, 0, OutcomeError, 0, 1).
		try("w1", 1, "a", 12, 0, OutcomeSkipped, 1, 1).
		try("w1", 1, "a", 10, 1, OutcomeOK, 1000, 1001).
		try("w1", 1, "a", 12, 0, OutcomeOK, 1002, 1003).
		try("w1", 1, "a", 14, 0, OutcomeOK, 1004, 1005).
		try("w2", 1, "b", 11, 0, OutcomeOK, 0, 1).
		try("w2", 1, "b", 13, 0, OutcomeOK, 2, 3)
	r := mustPass(t, &b.h)
	if r.Skipped != 1 || r.Redeliveries != 0 {
		t.Errorf("skipped %d redeliveries %d", r.Skipped, r.Redeliveries)
	}
}

// TestCheckAcrossResize: a key moving from slot 0 of N=2 to slot 3 of N=4
// in order, one handler at a time, passes; the same key handled by the
// old and the new slot at once, or by a slot that is not its slot under
// the attempt's N, is flagged.
func TestCheckAcrossResize(t *testing.T) {
	resized := func() *hb {
		b := newHB("skip")
		b.h.KeySlotsByN = map[int]map[string]int{2: {"a": 0, "b": 1}, 4: {"a": 3, "b": 1}}
		at := func(proc string, slot, n int, epoch int64, key string, ev int64, start, end int) {
			b.h.Attempts = append(b.h.Attempts, Attempt{Proc: proc, Slot: slot, NSlots: n, Epoch: epoch, Key: key,
				EvID: ev, Outcome: OutcomeOK, Start: ms(start), End: ms(end)})
		}
		at("w1", 0, 2, 1, "a", 10, 0, 10)
		at("w2", 1, 2, 1, "b", 11, 0, 10)
		at("w1", 0, 2, 1, "a", 12, 11, 20)
		at("w2", 3, 4, 2, "a", 14, 30, 40) // after the cutover
		at("w2", 1, 4, 2, "b", 13, 30, 40)
		return b
	}
	mustPass(t, &resized().h)

	b := resized()
	b.h.Attempts[3].Start = ms(15) // the new slot starts while the old one runs
	mustFlag(t, &b.h, GG2, "across a resize")

	// A frozen worker's handler of the old N outlives the resize: another
	// worker took its slot over (a claim, and no handler run, since the
	// old slot had nothing left but the released key) and the cutover gave
	// the key to a new slot. A zombie, allowed for a lease TTL of running.
	zombie := func(claim bool, end int) *hb {
		b := resized()
		b.h.Attempts[2].End = ms(end)
		b.h.Attempts[3].Start, b.h.Attempts[3].End = ms(1500), ms(1510)
		b.fault(FaultWorkerStop, "w1", 15, 1600)
		if claim {
			b.h.Claims = []Claim{{Proc: "w3", Slot: 0, NSlots: 2, Epoch: 2, At: ms(1100)}}
		}
		return b
	}
	mustPass(t, &zombie(true, 1650).h)
	mustFlag(t, &zombie(false, 1650).h, GG2, "across a resize")
	mustFlag(t, &zombie(true, 2700).h, GG2, "more than the lease TTL") // 1.1 s of running after the claim

	b = resized()
	b.h.Attempts[3].Slot = 2 // not a's slot under N=4
	mustFlag(t, &b.h, GG1, "maps to slot 3")

	b = resized()
	b.h.Attempts[3].EvID, b.h.Attempts[2].EvID = 12, 14 // a's order broken across the change
	mustFlag(t, &b.h, GG1, "out of ev_id order")
}

// A Tx run's effects: exactly one per committed event, none for a dead
// letter; a duplicate, a missing effect and a dead letter's effect are
// each a violation of GuaranteeEffects.
func TestCheckEffects(t *testing.T) {
	h := cleanHistory("pause").h
	h.Tx = true
	h.Effects = map[int64]int{}
	dead := map[int64]bool{}
	for _, d := range h.DeadLetters {
		dead[d.EvID] = true
	}
	for _, c := range h.Committed {
		if !dead[c.EvID] {
			h.Effects[c.EvID] = 1
		}
	}
	if r := Check(&h); r.ByGuarantee[GuaranteeEffects] != 0 {
		t.Fatalf("clean effects: %v", r.Violations)
	}
	h.Effects[10] = 2
	h.Effects[11] = 0
	for ev := range dead {
		h.Effects[ev] = 1
	}
	r := Check(&h)
	want := 2 + len(dead)
	if got := r.ByGuarantee[GuaranteeEffects]; got != want || r.EffectDuplicates != 1 || r.EffectsMissing != 1 {
		t.Fatalf("%d effect violations (%d duplicates, %d missing), want %d (1, 1): %v",
			got, r.EffectDuplicates, r.EffectsMissing, want, r.Violations)
	}
}

// In a Tx run an event's first delivery can fail before the handler body
// records it; its first recorded run then has a retry count and comes after
// later events of the key. That is not a G1 violation there, and still is
// in a run without Tx.
func TestCheckG1TxUnrecordedFirstDelivery(t *testing.T) {
	b := newHB("skip")
	b.try("w1", 1, "a", 10, 0, OutcomeOK, 0, 1).
		try("w1", 1, "a", 14, 0, OutcomeOK, 10, 11).
		try("w1", 1, "a", 12, 1, OutcomeOK, 20, 21).
		try("w2", 1, "b", 11, 0, OutcomeOK, 0, 1).
		try("w2", 1, "b", 13, 0, OutcomeOK, 2, 3)
	if r := Check(&b.h); r.ByGuarantee[GG1] != 1 {
		t.Fatalf("without Tx: %d G1 violations, want 1: %v", r.ByGuarantee[GG1], r.Violations)
	}
	b.h.Tx = true
	b.h.Effects = map[int64]int{10: 1, 11: 1, 12: 1, 13: 1, 14: 1}
	mustPass(t, &b.h)
}

package guarantee

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"
)

// Guarantee labels of violations.
const (
	GNoLoss  = "no-loss"
	GG1      = "G1"
	GG2      = "G2"
	GG3      = "G3"
	GPhantom = "phantom" // a handled or dead-lettered event nobody committed
)

// Violation is one breach of a guarantee found in a history.
type Violation struct {
	Guarantee string `json:"guarantee"`
	Key       string `json:"key"`
	EvID      int64  `json:"ev_id"`
	Detail    string `json:"detail"`
}

func (v Violation) String() string {
	return fmt.Sprintf("%s: key %q ev %d: %s", v.Guarantee, v.Key, v.EvID, v.Detail)
}

// Report is the checker's verdict with the figures of the run.
type Report struct {
	Committed int `json:"committed"`
	// Effects, EffectDuplicates and EffectsMissing: Tx runs only (see
	// GuaranteeEffects).
	Effects          int `json:"effects,omitempty"`
	EffectDuplicates int `json:"effect_duplicates,omitempty"`
	EffectsMissing   int `json:"effects_missing,omitempty"`
	DeadLettered     int `json:"dead_lettered"`
	Keys             int `json:"keys"`
	Attempts         int `json:"attempts"`  // handler bodies run (skipped records excluded)
	Successes        int `json:"successes"` // attempts with outcome ok
	Skipped          int `json:"skipped"`   // pause: bodies not run behind a failed head in the chunk
	Errors           int `json:"errors"`    // injected handler errors
	Panics           int `json:"panics"`    // injected handler panics
	Cancelled        int `json:"cancelled"` // handlers whose context ended (lease lost, shutdown)
	Unfinished       int `json:"unfinished"`
	Retries          int `json:"retries"` // attempts with retry_count > 0
	// Redeliveries are attempts that repeat an (ev_id, retry_count) already
	// attempted: the earlier chunk was never acknowledged (crash, fencing,
	// connection lost before the ack committed).
	Redeliveries int `json:"redeliveries"`
	// DuplicateSuccesses are successes of an event that had succeeded
	// before; Explained ones have a cause in the history (another epoch, a
	// Postgres or PgBouncer fault in between).
	DuplicateSuccesses  int `json:"duplicate_successes"`
	ExplainedDuplicates int `json:"explained_duplicates"`
	// Takeovers counts lease epoch changes seen per slot.
	Takeovers int `json:"takeovers"`
	// ZombieOverlaps counts overlaps of a fenced worker's handler (older
	// epoch) with the live owner's on one key; MaxZombieOverlap is the
	// longest, not counting the time the zombie was frozen (SIGSTOP).
	ZombieOverlaps int `json:"zombie_overlaps"`
	// LiveTakeovers counts epochs of a slot superseded while their holder
	// was still alive: fencings (frozen, slow or cut-off holders) and
	// rebalancing releases, as opposed to takeovers after a crash.
	LiveTakeovers int `json:"live_takeovers"`
	// ZombieRuns counts handler runs still going when a newer epoch of
	// their slot started work.
	ZombieRuns       int            `json:"zombie_runs"`
	MaxZombieOverlap time.Duration  `json:"max_zombie_overlap"`
	Violations       []Violation    `json:"violations"`
	ByGuarantee      map[string]int `json:"by_guarantee"`
	// ByCheck counts violations by the check that found them.
	ByCheck map[string]int `json:"by_check"`
}

// OK reports whether no guarantee was violated.
func (r *Report) OK() bool { return len(r.Violations) == 0 }

// maxViolationsPerKind bounds the violations kept in detail; all are counted.
const maxViolationsPerKind = 20

func (r *Report) flag(g, key string, ev int64, format string, args ...any) {
	if r.ByGuarantee == nil {
		r.ByGuarantee = map[string]int{}
	}
	if r.ByCheck == nil {
		r.ByCheck = map[string]int{}
	}
	r.ByGuarantee[g]++
	// The check is named by the guarantee and the first words of the
	// message; details are kept for the first few of each check.
	words := strings.Fields(format)
	check := g + ": " + strings.Join(words[:min(3, len(words))], " ")
	r.ByCheck[check]++
	if r.ByCheck[check] <= maxViolationsPerKind {
		r.Violations = append(r.Violations, Violation{Guarantee: g, Key: key, EvID: ev, Detail: fmt.Sprintf(format, args...)})
	}
}

// ViolationCount is the number of violations, including those not kept in
// detail.
func (r *Report) ViolationCount() int {
	n := 0
	for _, c := range r.ByGuarantee {
		n += c
	}
	return n
}

// interval is an attempt with its effective end.
type interval struct {
	*Attempt
	end time.Time
}

// Check verifies h against the guarantees and returns the report.
func Check(h *History) *Report {
	r := &Report{ByGuarantee: map[string]int{}}
	c := newCheck(h)
	r.Committed = len(h.Committed)
	r.DeadLettered = len(c.dead)
	r.Keys = len(c.keyEvents)

	c.counts(r)
	c.checkCommitted(r)
	c.checkNoLoss(r)
	c.checkG1(r)
	c.checkG2(r)
	c.checkDuplicates(r)
	if h.Policy == "pause" {
		c.checkG3(r)
	}
	if h.Tx {
		c.checkEffects(r)
	}
	slices.SortStableFunc(r.Violations, func(a, b Violation) int {
		return cmp.Or(cmp.Compare(a.Guarantee, b.Guarantee), cmp.Compare(a.Key, b.Key), cmp.Compare(a.EvID, b.EvID))
	})
	return r
}

// GuaranteeEffects is the transactional handlers' guarantee: every
// committed event's effect exists exactly once per consumer (none for a
// dead-lettered event, whose every attempt failed and rolled back).
const GuaranteeEffects = "exactly-once effects"

// checkEffects checks GuaranteeEffects against the effect rows counted at
// the end of a Tx run.
func (c *check) checkEffects(r *Report) {
	for _, e := range c.h.Committed {
		n := c.h.Effects[e.EvID]
		r.Effects += n
		_, dead := c.dead[e.EvID]
		switch {
		case dead && n != 0:
			r.flag(GuaranteeEffects, e.Key, e.EvID, "effect of a dead letter: %d", n)
		case !dead && n == 0:
			r.EffectsMissing++
			r.flag(GuaranteeEffects, e.Key, e.EvID, "no effect committed")
		case n > 1:
			r.EffectDuplicates++
			r.flag(GuaranteeEffects, e.Key, e.EvID, "effect applied more than once: %d", n)
		}
	}
}

type check struct {
	h         *History
	committed map[int64]Committed
	keyEvents map[string][]int64 // committed ev_ids per key, ascending
	dead      map[int64]DeadLetter
	// byKey: the key's handlings (skipped records excluded), by start.
	byKey map[string][]interval
	// byEv: every handling of an event, by start.
	byEv    map[int64][]interval
	freezes map[string][]Fault // worker-stop windows per process
	deaths  map[string][]time.Time
	cluster []Fault // Postgres and PgBouncer faults
	// lost: per process, the fences and failed slot calls seen in its log.
	lost map[string][]Fault
}

func newCheck(h *History) *check {
	c := &check{
		h:         h,
		committed: make(map[int64]Committed, len(h.Committed)),
		keyEvents: map[string][]int64{},
		dead:      map[int64]DeadLetter{},
		byKey:     map[string][]interval{},
		byEv:      map[int64][]interval{},
		freezes:   map[string][]Fault{},
		deaths:    map[string][]time.Time{},
		lost:      map[string][]Fault{},
	}
	for _, e := range h.Committed {
		c.committed[e.EvID] = e
		c.keyEvents[e.Key] = append(c.keyEvents[e.Key], e.EvID)
	}
	for k := range c.keyEvents {
		slices.Sort(c.keyEvents[k])
	}
	for _, d := range h.DeadLetters {
		c.dead[d.EvID] = d
	}
	for _, f := range h.Faults {
		switch f.Kind {
		case FaultWorkerStop:
			c.freezes[f.Target] = append(c.freezes[f.Target], f)
		case FaultWorkerKill, FaultShutdown, FaultProcessExit:
			c.deaths[f.Target] = append(c.deaths[f.Target], f.Start)
		case FaultPGRestart, FaultPgBouncerKill:
			c.cluster = append(c.cluster, f)
		case FaultFence, FaultWorkError:
			c.lost[f.Target] = append(c.lost[f.Target], f)
		}
	}
	for p := range c.deaths {
		slices.SortFunc(c.deaths[p], func(a, b time.Time) int { return a.Compare(b) })
	}
	for i := range h.Attempts {
		a := &h.Attempts[i]
		if a.Outcome == OutcomeSkipped {
			continue
		}
		iv := interval{Attempt: a, end: c.endOf(a)}
		c.byKey[a.Key] = append(c.byKey[a.Key], iv)
		c.byEv[a.EvID] = append(c.byEv[a.EvID], iv)
	}
	byStart := func(a, b interval) int {
		return cmp.Or(a.Start.Compare(b.Start), cmp.Compare(a.EvID, b.EvID))
	}
	for k := range c.byKey {
		slices.SortStableFunc(c.byKey[k], byStart)
	}
	for k := range c.byEv {
		slices.SortStableFunc(c.byEv[k], byStart)
	}
	return c
}

// endOf is when an attempt's handler stopped running: its end record, else
// the first death of its process after it started, else the end of the run.
func (c *check) endOf(a *Attempt) time.Time {
	if !a.End.IsZero() {
		return a.End
	}
	for _, d := range c.deaths[a.Proc] {
		if !d.Before(a.Start) {
			return d
		}
	}
	if !c.h.End.IsZero() && c.h.End.After(a.Start) {
		return c.h.End
	}
	return a.Start
}

func (c *check) counts(r *Report) {
	type try struct {
		ev    int64
		retry int
	}
	seen := map[try]bool{}
	epochs := map[int]map[int64]bool{}
	for i := range c.h.Attempts {
		a := &c.h.Attempts[i]
		switch a.Outcome {
		case OutcomeSkipped:
			r.Skipped++
			continue
		case OutcomeOK:
			r.Successes++
		case OutcomeError:
			r.Errors++
		case OutcomePanic:
			r.Panics++
		case OutcomeCancelled:
			r.Cancelled++
		case "":
			r.Unfinished++
		}
		r.Attempts++
		if a.Retry > 0 {
			r.Retries++
		}
		t := try{a.EvID, a.Retry}
		if seen[t] {
			r.Redeliveries++
		}
		seen[t] = true
		if epochs[a.Slot] == nil {
			epochs[a.Slot] = map[int64]bool{}
		}
		epochs[a.Slot][a.Epoch] = true
	}
	for _, es := range epochs {
		r.Takeovers += len(es) - 1
	}
}

// checkCommitted: handled and dead-lettered events were committed, and a
// key's events were stored in the order its producer sent them.
func (c *check) checkCommitted(r *Report) {
	for ev, ivs := range c.byEv {
		e, ok := c.committed[ev]
		if !ok {
			r.flag(GPhantom, ivs[0].Key, ev, "handled %d times but never committed", len(ivs))
			continue
		}
		for _, iv := range ivs {
			if iv.Key != e.Key {
				r.flag(GG1, iv.Key, ev, "handled with key %q, committed with key %q", iv.Key, e.Key)
				break
			}
		}
	}
	for ev, d := range c.dead {
		if _, ok := c.committed[ev]; !ok {
			r.flag(GPhantom, d.Key, ev, "dead-lettered but never committed")
		}
	}
	for key, evs := range c.keyEvents {
		for i := 1; i < len(evs); i++ {
			prev, cur := c.committed[evs[i-1]], c.committed[evs[i]]
			if cur.Seq <= prev.Seq {
				r.flag(GG1, key, cur.EvID, "stored out of send order: seq %d (ev %d) after seq %d (ev %d)",
					cur.Seq, cur.EvID, prev.Seq, prev.EvID)
			}
		}
	}
}

// checkNoLoss: every committed event succeeded or was dead-lettered.
func (c *check) checkNoLoss(r *Report) {
	for _, e := range c.h.Committed {
		if _, ok := c.dead[e.EvID]; ok {
			continue
		}
		ok := false
		for _, iv := range c.byEv[e.EvID] {
			if iv.Outcome == OutcomeOK {
				ok = true
				break
			}
		}
		if !ok {
			r.flag(GNoLoss, e.Key, e.EvID, "committed (seq %d) but never handled successfully nor dead-lettered (%d attempts)",
				e.Seq, len(c.byEv[e.EvID]))
		}
	}
}

// checkG1: a key's events are all delivered by one slot, and their first
// deliveries come in ev_id order.
func (c *check) checkG1(r *Report) {
	for key, ivs := range c.byKey {
		slot, pinned := c.h.KeySlots[key]
		if !pinned {
			slot = ivs[0].Slot
		}
		first := map[int64]bool{}
		var last int64 = -1
		for _, iv := range ivs {
			slot, pinned := slot, pinned
			if m, ok := c.h.KeySlotsByN[iv.NSlots]; ok && iv.NSlots != 0 {
				// Across a resize the key's slot is its slot under the
				// attempt's N; its first deliveries stay in ev_id order.
				slot, pinned = m[key]
			}
			if iv.Slot != slot {
				if pinned {
					r.flag(GG1, key, iv.EvID, "delivered by slot %d, but the key maps to slot %d", iv.Slot, slot)
				} else {
					r.flag(GG1, key, iv.EvID, "delivered by slot %d, but earlier events of the key by slot %d", iv.Slot, slot)
				}
			}
			if first[iv.EvID] {
				continue
			}
			first[iv.EvID] = true
			// In a Tx run a delivery can fail before the handler body runs
			// and records it (BEGIN or the effect's insert lost its
			// connection): a first recorded run with a retry count is not
			// the first delivery, which was in order, and is not checked.
			if c.h.Tx && iv.Retry > 0 {
				continue
			}
			if iv.EvID < last {
				r.flag(GG1, key, iv.EvID, "first delivered at %s after ev %d was first delivered (out of ev_id order)",
					iv.Start.Format(time.RFC3339Nano), last)
			}
			last = max(last, iv.EvID)
		}
	}
}

// checkG2: no two handlers of one key overlap under one epoch; a handler
// of an older epoch (a fenced zombie) may still run after a newer epoch of
// its slot started work, but only for at most a lease TTL of running (not
// frozen) time.
func (c *check) checkG2(r *Report) {
	// takeover[slot]: epochs seen and the first start under each.
	type epochStart struct {
		epoch int64
		start time.Time
	}
	// An epoch starts when its lease is claimed or, for a worker that logs
	// no claims, at its first handler run.
	firsts := map[int]map[int64]time.Time{}
	started := func(slot int, epoch int64, at time.Time) {
		m := firsts[slot]
		if m == nil {
			m = map[int64]time.Time{}
			firsts[slot] = m
		}
		if s, ok := m[epoch]; !ok || at.Before(s) {
			m[epoch] = at
		}
	}
	for _, ivs := range c.byKey {
		for _, iv := range ivs {
			started(slotID(iv.Slot, iv.NSlots), iv.Epoch, iv.Start)
		}
	}
	for _, cl := range c.h.Claims {
		if cl.NSlots > 0 {
			started(slotID(cl.Slot, cl.NSlots), cl.Epoch, cl.At)
		}
	}
	// superseded(slot, epoch): when a newer epoch of the slot started.
	suffix := map[int][]epochStart{}
	for slot, m := range firsts {
		var es []epochStart
		for e, s := range m {
			es = append(es, epochStart{e, s})
		}
		slices.SortFunc(es, func(a, b epochStart) int { return cmp.Compare(a.epoch, b.epoch) })
		for i := len(es) - 2; i >= 0; i-- {
			if es[i+1].start.Before(es[i].start) {
				es[i].start = es[i+1].start // earliest start of any newer epoch
			}
		}
		suffix[slot] = es
	}
	superseded := func(slot int, epoch int64) (time.Time, bool) {
		es := suffix[slot]
		i, _ := slices.BinarySearchFunc(es, epoch+1, func(e epochStart, t int64) int { return cmp.Compare(e.epoch, t) })
		if i < len(es) {
			return es[i].start, true
		}
		return time.Time{}, false
	}
	type holder struct {
		slot  int
		epoch int64
	}
	holders := map[holder]string{}
	for _, ivs := range c.byKey {
		for _, iv := range ivs {
			holders[holder{slotID(iv.Slot, iv.NSlots), iv.Epoch}] = iv.Proc
		}
	}
	for h, proc := range holders {
		t, ok := superseded(h.slot, h.epoch)
		if !ok {
			continue
		}
		alive := true
		for _, d := range c.deaths[proc] {
			if d.Before(t) {
				alive = false
				break
			}
		}
		if alive {
			r.LiveTakeovers++
		}
	}
	for key, ivs := range c.byKey {
		for i := range ivs {
			a := ivs[i]
			if t, ok := superseded(slotID(a.Slot, a.NSlots), a.Epoch); ok && t.Before(a.end) {
				from := laterOf(t, a.Start)
				active := a.end.Sub(from) - c.frozen(a.Proc, from, a.end)
				r.ZombieRuns++
				r.MaxZombieOverlap = max(r.MaxZombieOverlap, active)
				if active > c.h.LeaseTTL {
					r.flag(GG2, key, a.EvID, "fenced %s (epoch %d) ran its handler %v after a newer epoch of slot %d started at %s: more than the lease TTL %v",
						a.Proc, a.Epoch, active, a.Slot, t.Format(time.RFC3339Nano), c.h.LeaseTTL)
				}
			}
			for j := i + 1; j < len(ivs) && ivs[j].Start.Before(a.end); j++ {
				b := ivs[j]
				if !b.Start.Before(a.end) || !a.Start.Before(b.end) {
					continue
				}
				if a.NSlots != b.NSlots && a.NSlots != 0 && b.NSlots != 0 {
					// Slots of two N overlapping on a key: allowed only
					// for a fenced zombie of the old one (bounded above).
					if t, ok := superseded(slotID(a.Slot, a.NSlots), a.Epoch); !ok || b.Start.Before(t) {
						from, to := laterOf(a.Start, b.Start), earlierOf(a.end, b.end)
						r.flag(GG2, key, b.EvID, "handled by slot %d/%d while slot %d/%d handled ev %d, for %v (across a resize)",
							b.Slot, b.NSlots, a.Slot, a.NSlots, a.EvID, to.Sub(from))
						continue
					}
				}
				if a.Epoch == b.Epoch {
					from, to := laterOf(a.Start, b.Start), earlierOf(a.end, b.end)
					r.flag(GG2, key, b.EvID, "handled by %s (epoch %d) while %s handled ev %d under the same epoch, for %v",
						b.Proc, b.Epoch, a.Proc, a.EvID, to.Sub(from))
					continue
				}
				r.ZombieOverlaps++
			}
		}
	}
}

// frozen is how long proc was stopped (SIGSTOP) within [from, to].
func (c *check) frozen(proc string, from, to time.Time) time.Duration {
	var d time.Duration
	for _, f := range c.freezes[proc] {
		end := f.End
		if end.IsZero() {
			end = to
		}
		s, e := laterOf(f.Start, from), earlierOf(end, to)
		if e.After(s) {
			d += e.Sub(s)
		}
	}
	return d
}

// checkDuplicates counts successes of already-succeeded events and
// explains them; under pause an unexplained one breaks "exactly once".
func (c *check) checkDuplicates(r *Report) {
	for ev, ivs := range c.byEv {
		var prev *interval
		for i := range ivs {
			iv := &ivs[i]
			if iv.Outcome != OutcomeOK {
				continue
			}
			if prev != nil {
				r.DuplicateSuccesses++
				if c.explained(*prev, *iv) {
					r.ExplainedDuplicates++
				} else if c.h.Policy == "pause" {
					r.flag(GG3, iv.Key, ev, "succeeded again at %s (%s epoch %d) after succeeding at %s (%s epoch %d) with no takeover or connection fault in between",
						iv.Start.Format(time.RFC3339Nano), iv.Proc, iv.Epoch, prev.Start.Format(time.RFC3339Nano), prev.Proc, prev.Epoch)
				}
			}
			prev = iv
		}
	}
}

// explained reports whether a second success d of an event has a cause: a
// change of lease epoch (crash, freeze, expiry: the chunk was never acked
// by the first owner), the first owner fencing the slot itself or failing
// a call on it in between, or a Postgres/PgBouncer fault between the two
// (the ack was lost with the connection).
func (c *check) explained(p, d interval) bool {
	if p.Epoch != d.Epoch || p.Proc != d.Proc {
		return true
	}
	for _, f := range c.lost[p.Proc] {
		if (f.Slot == nil || *f.Slot == p.Slot) && !f.Start.Before(p.Start) && !f.Start.After(d.Start) {
			return true
		}
	}
	for _, f := range c.cluster {
		end := f.End
		if end.IsZero() {
			end = f.Start
		}
		if !f.Start.After(d.Start) && !end.Before(p.Start) {
			return true
		}
	}
	return false
}

// checkG3 (pause): per key, no event is handled before its predecessor was
// resolved (succeeded, or dead-lettered after its last attempt), and the
// first successes are exactly the key's ev_ids minus dead letters, in order.
func (c *check) checkG3(r *Report) {
	for key, evs := range c.keyEvents {
		// resolution of each event: its first success, or its last attempt's
		// start when it was dead-lettered.
		var prevEv int64 = -1
		var prevRes time.Time
		for _, ev := range evs {
			ivs := c.byEv[ev]
			if prevEv >= 0 && !prevRes.IsZero() {
				for _, iv := range ivs {
					if iv.Start.Before(prevRes) {
						r.flag(GG3, key, ev, "handled at %s by %s before ev %d, ahead of it in the key, was resolved at %s",
							iv.Start.Format(time.RFC3339Nano), iv.Proc, prevEv, prevRes.Format(time.RFC3339Nano))
						break
					}
				}
			}
			var res time.Time
			for _, iv := range ivs {
				if iv.Outcome == OutcomeOK {
					res = iv.Start
					break
				}
			}
			if d, dead := c.dead[ev]; dead {
				// Dead-lettered after its last failed attempt. A fenced
				// zombie may still run it after the dead letter (to a
				// success, an error or a cancellation), which does not
				// hold the key back: the attempts that count started by
				// the dead letter's time, when it is known.
				var last time.Time
				for i := len(ivs) - 1; i >= 0; i-- {
					if ivs[i].Outcome != OutcomeOK && (d.Time.IsZero() || !ivs[i].Start.After(d.Time)) {
						last = ivs[i].Start
						break
					}
				}
				if !last.IsZero() && (res.IsZero() || last.Before(res)) {
					res = last
				}
			}
			prevEv, prevRes = ev, res
		}
		// First successes in ev_id order, none missing but dead letters.
		var order []int64
		seen := map[int64]bool{}
		for _, iv := range c.byKey[key] {
			if _, dead := c.dead[iv.EvID]; dead {
				continue // its order is held by the dead letter, not a late zombie success
			}
			if iv.Outcome == OutcomeOK && !seen[iv.EvID] {
				seen[iv.EvID] = true
				order = append(order, iv.EvID)
			}
		}
		var want []int64
		for _, ev := range evs {
			if _, dead := c.dead[ev]; !dead {
				want = append(want, ev)
			}
		}
		if !slices.IsSorted(order) {
			for i := 1; i < len(order); i++ {
				if order[i] < order[i-1] {
					r.flag(GG3, key, order[i], "first succeeded after ev %d: successes are not the key's ev_id sequence", order[i-1])
					break
				}
			}
		}
	}
}

func laterOf(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func earlierOf(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// slotID names the slot of an attempt across resizes: slot k of N is
// another slot than slot k of M.
func slotID(slot, nslots int) int { return nslots*4096 + slot }

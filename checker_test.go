package pgque_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/pgque/pgque"
	"github.com/pgque/pgque/internal/guarantee"
)

// delivery is one handler call as the checker records it.
type delivery struct {
	worker     string
	key        string
	id         int64
	slot       int
	epoch      int64
	retry      int
	start, end time.Time
}

// checker records every handler call of a run; verify hands them to the
// guarantee checker the chaos harness uses too (package guarantee): no
// loss, G1 (per-key order, one slot per key) and G2 (no two calls on one
// key overlap).
type checker struct {
	mu         sync.Mutex
	deliveries []delivery
}

// begin records the start of a call; the returned func records its end.
func (c *checker) begin(worker string, m *pgque.Message) func() {
	d := delivery{worker: worker, key: m.PartitionKey, id: m.ID, slot: m.Slot, epoch: m.Epoch, retry: m.RetryCount, start: time.Now()}
	return func() {
		d.end = time.Now()
		c.mu.Lock()
		c.deliveries = append(c.deliveries, d)
		c.mu.Unlock()
	}
}

// distinct returns the number of distinct events handled.
func (c *checker) distinct() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	seen := make(map[int64]bool, len(c.deliveries))
	for _, d := range c.deliveries {
		seen[d.id] = true
	}
	return len(seen)
}

// report summarises a run.
type report struct {
	calls int
	// redeliveries are calls that repeat an (event, retry count) already
	// called: a chunk handed out again without a failure.
	redeliveries int
	perWorker    map[string]int // calls per worker
}

// verify checks the recorded calls against the events sent (id → key).
// Every recorded call counts as handled, whatever the handler returned.
func (c *checker) verify(sent map[int64]string) (report, error) {
	c.mu.Lock()
	h := &guarantee.History{
		// Fenced handlers may run on past a takeover, but any overlap on
		// one key fails below, so the bound only has to be finite.
		LeaseTTL: pgque.LeaseTTLMax,
		Attempts: make([]guarantee.Attempt, 0, len(c.deliveries)),
	}
	perWorker := make(map[string]int)
	for _, d := range c.deliveries {
		perWorker[d.worker]++
		h.Attempts = append(h.Attempts, guarantee.Attempt{Proc: d.worker, Slot: d.slot, Epoch: d.epoch, Key: d.key,
			EvID: d.id, Retry: d.retry, Outcome: guarantee.OutcomeOK, Start: d.start, End: d.end})
	}
	c.mu.Unlock()
	for id, key := range sent {
		// Within a key, ids follow the send order.
		h.Committed = append(h.Committed, guarantee.Committed{Key: key, Seq: id, EvID: id})
	}
	rep := guarantee.Check(h)
	r := report{calls: rep.Attempts, redeliveries: rep.Redeliveries, perWorker: perWorker}
	if !rep.OK() {
		return r, fmt.Errorf("%d guarantee violations, first %v", rep.ViolationCount(), rep.Violations[0])
	}
	// The guarantee checker allows a fenced zombie to overlap the new
	// owner on a key for a lease TTL; in process no call may overlap.
	if rep.ZombieOverlaps > 0 {
		return r, fmt.Errorf("%d calls overlapped a call on the same key under another lease epoch (G2)", rep.ZombieOverlaps)
	}
	return r, nil
}

// TestCheckerCatchesViolations makes sure the checker would notice a broken
// run, so that its silence in the pool tests means something.
func TestCheckerCatchesViolations(t *testing.T) {
	t.Parallel()
	t0 := time.Now()
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	sent := map[int64]string{1: "k", 2: "k", 3: "j"}
	ok := []delivery{
		{worker: "a", key: "k", id: 1, epoch: 1, start: at(0), end: at(1)},
		{worker: "a", key: "k", id: 2, epoch: 1, start: at(2), end: at(3)},
		{worker: "b", key: "j", id: 3, slot: 1, epoch: 1, start: at(0), end: at(5)},
	}
	cases := map[string]func([]delivery) []delivery{
		"overlap": func(ds []delivery) []delivery {
			ds[1].worker, ds[1].start = "b", at(0)
			return ds
		},
		"order":   func(ds []delivery) []delivery { ds[0].start, ds[0].end = at(4), at(5); return ds },
		"missing": func(ds []delivery) []delivery { return ds[:2] },
		"slot":    func(ds []delivery) []delivery { ds[1].slot = 3; return ds },
		"key":     func(ds []delivery) []delivery { ds[2].key = "k"; return ds },
	}
	c := &checker{deliveries: append([]delivery(nil), ok...)}
	if _, err := c.verify(sent); err != nil {
		t.Fatalf("a correct run fails: %v", err)
	}
	for name, corrupt := range cases {
		c := &checker{deliveries: corrupt(append([]delivery(nil), ok...))}
		if _, err := c.verify(sent); err == nil {
			t.Errorf("%s: the checker did not notice", name)
		}
	}
	// A redelivery (of an abandoned chunk) is allowed and counted.
	c = &checker{deliveries: append(append([]delivery(nil), ok...),
		delivery{worker: "b", key: "k", id: 2, epoch: 2, start: at(9), end: at(10)})}
	if r, err := c.verify(sent); err != nil || r.redeliveries != 1 {
		t.Fatalf("redelivery to a new owner: %+v, %v", r, err)
	}
}

package pgque_test

import (
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/pgque/pgque"
)

// delivery is one handler call as the checker records it.
type delivery struct {
	worker     string
	key        string
	id         int64
	slot       int
	epoch      int64
	start, end time.Time
}

// checker records every handler call of a run and verifies the guarantees:
// G1 (per-key order, one slot per key), G2 (no two calls on one key
// overlap) and no loss.
type checker struct {
	mu         sync.Mutex
	deliveries []delivery
}

// begin records the start of a call; the returned func records its end.
func (c *checker) begin(worker string, m *pgque.Message) func() {
	d := delivery{worker: worker, key: m.PartitionKey, id: m.ID, slot: m.Slot, epoch: m.Epoch, start: time.Now()}
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
	calls, redeliveries int
	perWorker           map[string]int
}

// verify checks the recorded calls against the events sent (id → key).
func (c *checker) verify(sent map[int64]string) (report, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	r := report{calls: len(c.deliveries), perWorker: make(map[string]int)}
	byKey := make(map[string][]delivery)
	seen := make(map[int64]bool)
	for _, d := range c.deliveries {
		if want, ok := sent[d.id]; !ok || want != d.key {
			return r, fmt.Errorf("event %d handled with key %q, sent with %q (known: %v)", d.id, d.key, want, ok)
		}
		if seen[d.id] {
			r.redeliveries++
		}
		seen[d.id] = true
		r.perWorker[d.worker]++
		byKey[d.key] = append(byKey[d.key], d)
	}
	for id := range sent {
		if !seen[id] {
			return r, fmt.Errorf("event %d (key %q) was never handled", id, sent[id])
		}
	}
	for key, ds := range byKey {
		sort.Slice(ds, func(i, j int) bool { return ds[i].start.Before(ds[j].start) })
		if err := checkKey(key, ds); err != nil {
			return r, err
		}
	}
	return r, nil
}

// checkKey verifies one key's calls, sorted by start time.
func checkKey(key string, ds []delivery) error {
	firstSeen := make(map[int64]bool)
	var lastFirst int64
	for i, d := range ds {
		// G2: calls on one key never overlap, whoever makes them.
		if i > 0 && d.start.Before(ds[i-1].end) {
			return fmt.Errorf("key %q: event %d by %s started before event %d by %s ended (G2)",
				key, d.id, d.worker, ds[i-1].id, ds[i-1].worker)
		}
		// G1: one slot per key.
		if d.slot != ds[0].slot {
			return fmt.Errorf("key %q delivered by slots %d and %d (G1)", key, ds[0].slot, d.slot)
		}
		// G1: first deliveries in ev_id order.
		if !firstSeen[d.id] {
			if d.id < lastFirst {
				return fmt.Errorf("key %q: event %d first delivered after event %d (G1 order)", key, d.id, lastFirst)
			}
			firstSeen[d.id] = true
			lastFirst = d.id
		}
	}
	return nil
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

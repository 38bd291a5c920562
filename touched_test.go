package pgque_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/pgque/pgque"
	"github.com/pgque/pgque/internal/testing/pgtest"
)

// slotCalls counts a pool's chunk calls per slot (pgque.SetWorkHook).
type slotCalls struct {
	mu sync.Mutex
	n  map[int]int
}

func (c *slotCalls) add(slot int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n[slot]++
}

func (c *slotCalls) snapshot() map[int]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[int]int, len(c.n))
	for s, n := range c.n {
		out[s] = n
	}
	return out
}

// sendAwait sends ev and waits until the handler reports its id on
// delivered, which must be the next id it reports; it returns the id.
func sendAwait(t *testing.T, env *testEnv, delivered <-chan int64, ev pgque.Event) int64 {
	t.Helper()
	id, err := env.client.Send(context.Background(), env.queue, ev)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-delivered:
		if got != id {
			t.Fatalf("delivered %d, want %d", got, id)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("event %d (key %q) not delivered within 10 s", id, ev.PartitionKey)
	}
	return id
}

// A 16-slot consumer at steady load, one keyed event per tick: only the
// slot the tick touched makes a call; the other fifteen stay asleep (their
// poll fallback is longer than the run). Before touched sets, every tick
// woke all sixteen.
func TestPartitionedWakesOnlyTouchedSlots(t *testing.T) {
	t.Parallel()
	env := setup(t)
	startTicker(t, env.client)
	const nslots = 16
	var chk checker
	delivered := make(chan int64, 100)
	pc := soloConsumer(t, env, nslots, false, &chk, delivered)
	calls := &slotCalls{n: make(map[int]int)}
	pgque.SetWorkHook(pc, calls.add)
	startOwningAll(t, pc, nslots)

	// The keys of slots 0..3 only, so slots 4..15 are never touched.
	var keys []string
	for s := range 4 {
		keys = append(keys, keysOnSlot(t, env, fmt.Sprintf("s%d-", s), nslots, s, 5)...)
	}
	sent := make(map[int64]string)
	sendOne := func(key string) {
		t.Helper()
		sent[sendAwait(t, env, delivered, pgque.Event{Type: "e", Payload: 1, PartitionKey: key})] = key
	}
	// Until the pool has seen a touched set, the plain tick tag wakes
	// every slot; one event shows it one. A slot busy when that wake-up
	// came keeps it pending and makes one more call whenever it gets to
	// run, so an untouched slot may make one call in the window below,
	// never more: without touched sets each would make one per event.
	sendOne(keys[0])
	pgtest.WaitFor(t, 10*time.Second, "a touched set", func() bool { return pgque.TouchedSets(pc) })

	before := calls.snapshot()
	rng := rand.New(rand.NewPCG(7, 36))
	for range 30 {
		sendOne(keys[rng.IntN(len(keys))])
	}
	after := calls.snapshot()
	if n := pgque.GatheredCalls(pc); n != 0 {
		t.Errorf("%d gathered receives without GatherReceives", n)
	}
	for s := range nslots {
		d := after[s] - before[s]
		switch {
		case s >= 4 && d > 1:
			t.Errorf("slot %d, never touched, made %d calls for 30 events", s, d)
		case s < 4:
			t.Logf("slot %d (touched) made %d calls", s, d)
		}
	}
	// The last handler returns after it signalled delivery: Stop waits
	// for it, so that the checker has its end.
	r := stopAndVerify(t, pc, &chk, sent)
	if r.redeliveries != 0 {
		t.Fatalf("%d redeliveries", r.redeliveries)
	}
}

// Random keys at a low rate, a resize 4 → 16 and a crashed process whose
// slots are taken over, with a poll fallback longer than the run: every
// event is handled, in key order, so the touched sets woke every slot that
// had work (a slot left asleep would hold its events past the deadline).
func TestPartitionedTouchedWakesDeliverWithoutPolls(t *testing.T) {
	t.Parallel()
	env := setup(t)
	startFastTicker(t, env.client)
	r := newResizeRun(t, env, false)
	r.poll, r.batch = 40*time.Second, 3
	workers := []string{"p1", "p2", "p3"}
	for _, w := range workers {
		r.start(w, 4)
	}
	stop := make(chan struct{})
	produced := r.produce(stop, 500)
	pgtest.WaitFor(t, 20*time.Second, "a first share of the stream", func() bool { return r.handled() > 100 })
	r.resize(16, workers...)
	pgtest.WaitFor(t, 20*time.Second, "work on 16 slots", func() bool { return r.handled() > r.sentCount()*3/4 })
	r.procs["p2"].cancel() // crash: no Stop, no ack, no release
	r.procs["p2"].pool.Close()
	pgtest.WaitFor(t, 30*time.Second, "p1 and p3 to take p2's slots over", func() bool {
		return len(r.procs["p1"].pc.OwnedSlots())+len(r.procs["p3"].pc.OwnedSlots()) == 16
	})
	close(stop)
	<-produced
	pgtest.WaitFor(t, 20*time.Second, "every event", func() bool { return r.handled() == r.sentCount() })
	r.verify([]int{4, 16})
}

// startOwningAll starts pc, stopped when the test ends, and waits until it
// owns all nslots slots.
func startOwningAll(t *testing.T, pc *pgque.PartitionedConsumer, nslots int) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	if err := pc.Start(ctx); err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stopCtx, stop := context.WithTimeout(context.Background(), 15*time.Second)
		defer stop()
		if err := pc.Stop(stopCtx); err != nil {
			t.Error(err)
		}
		cancel()
	})
	pgtest.WaitFor(t, 30*time.Second, fmt.Sprintf("all %d slots claimed", nslots), func() bool { return len(pc.OwnedSlots()) == nslots })
}

// soloConsumer is a consumer of nslots slots, worker "solo", woken by
// ticks alone (its poll is longer than a test), with GatherReceives as
// gather says, whose handler checks each event with chk and sends its id
// to delivered.
func soloConsumer(t *testing.T, env *testEnv, nslots int, gather bool, chk *checker, delivered chan<- int64) *pgque.PartitionedConsumer {
	t.Helper()
	client := newClient(t, env.pool)
	pc, err := client.NewPartitionedConsumer(&pgque.PartitionedConsumerConfig{
		Queue: env.queue, Consumer: "c", Slots: nslots, WorkerID: "solo",
		PollInterval: 30 * time.Second, GatherReceives: gather,
		Handler: func(_ context.Context, m *pgque.Message) error {
			defer chk.begin("solo", m)()
			delivered <- m.ID
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	return pc
}

// stopAndVerify stops pc (Stop waits for the last handler, so the checker
// has every end) and returns what chk found of sent.
func stopAndVerify(t *testing.T, pc *pgque.PartitionedConsumer, chk *checker, sent map[int64]string) report {
	t.Helper()
	stopCtx, stop := context.WithTimeout(context.Background(), 15*time.Second)
	defer stop()
	if err := pc.Stop(stopCtx); err != nil {
		t.Fatal(err)
	}
	r, err := chk.verify(sent)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

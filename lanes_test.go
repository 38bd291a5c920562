package pgque_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgque/pgque"
	"github.com/pgque/pgque/internal/dbq"
	"github.com/pgque/pgque/internal/testing/pgtest"
)

// sendSeq sends the events of keys, round robin, n per key, in one batch,
// and returns id → key.
func sendSeq(t *testing.T, env *testEnv, keys []string, n int) map[int64]string {
	t.Helper()
	var events []pgque.Event
	for i := range n {
		for _, k := range keys {
			events = append(events, pgque.Event{Type: "e", Payload: i, PartitionKey: k})
		}
	}
	ids, err := env.client.SendBatch(context.Background(), env.queue, events)
	if err != nil {
		t.Fatal(err)
	}
	sent := make(map[int64]string, len(ids))
	for i, id := range ids {
		sent[id] = events[i].PartitionKey
	}
	return sent
}

func merge(ms ...map[int64]string) map[int64]string {
	out := make(map[int64]string)
	for _, m := range ms {
		for k, v := range m {
			out[k] = v
		}
	}
	return out
}

// Two keys of one slot run side by side: the first call of key a and the
// first call of key b are each held until the other has started, a barrier
// that only concurrent lanes can pass (one goroutine for the slot would
// hold the first call for ever); the checker finds no overlap within a key.
func TestLanesTwoKeysOverlap(t *testing.T) {
	t.Parallel()
	env := setup(t)
	startTicker(t, env.client)
	var chk checker
	inside := map[string]chan struct{}{"a": make(chan struct{}), "b": make(chan struct{})}
	once := map[string]*sync.Once{"a": {}, "b": {}}
	other := map[string]string{"a": "b", "b": "a"}
	var met atomic.Int32
	startProcess(t, env, pgque.PartitionedConsumerConfig{
		Queue: env.queue, Consumer: "c", Slots: 1, WorkerID: "w",
		Handler: func(ctx context.Context, m *pgque.Message) error {
			defer chk.begin("w", m)()
			first := false
			once[m.PartitionKey].Do(func() { first = true; close(inside[m.PartitionKey]) })
			if !first {
				return nil
			}
			select {
			case <-inside[other[m.PartitionKey]]:
				met.Add(1)
			case <-time.After(20 * time.Second):
				// Not met: the test fails below, after the events drained.
			case <-ctx.Done():
				return ctx.Err()
			}
			return nil
		},
	})
	sent := sendSeq(t, env, []string{"a", "b"}, 4)
	pgtest.WaitFor(t, 60*time.Second, "all events", func() bool { return chk.distinct() == len(sent) })
	if _, err := chk.verify(sent); err != nil {
		t.Fatal(err)
	}
	if n := met.Load(); n != 2 {
		t.Fatalf("%d of the first calls of keys a and b saw the other inside: the keys did not run concurrently", n)
	}
}

// With lanes turned off (MaxWorkersPerSlot 1) the same workload never
// overlaps: the slot handles one event at a time, as before lanes.
func TestLanesOffIsSequential(t *testing.T) {
	t.Parallel()
	env := setup(t)
	startTicker(t, env.client)
	var chk checker
	startProcess(t, env, pgque.PartitionedConsumerConfig{
		Queue: env.queue, Consumer: "c", Slots: 1, WorkerID: "w", MaxWorkersPerSlot: 1,
		Handler: func(ctx context.Context, m *pgque.Message) error {
			defer chk.begin("w", m)()
			// Calls that take time: two running at once would overlap.
			return pgtest.Work(ctx, 10*time.Millisecond)
		},
	})
	sent := sendSeq(t, env, []string{"a", "b", "c"}, 4)
	pgtest.WaitFor(t, 30*time.Second, "all events", func() bool { return chk.distinct() == len(sent) })
	if _, err := chk.verify(sent); err != nil {
		t.Fatal(err)
	}
	chk.mu.Lock()
	defer chk.mu.Unlock()
	for i, x := range chk.deliveries {
		for _, y := range chk.deliveries[i+1:] {
			if x.start.Before(y.end) && y.start.Before(x.end) {
				t.Fatalf("events %d and %d overlapped with lanes off", x.id, y.id)
			}
		}
	}
}

// A chunk starts on one goroutine; when a handler in the middle of it is
// slow, the rest is split into lanes at that point: the other keys' later
// events of the chunk run while the slow one does, and the slow key's
// later events come after it, in order.
func TestLanesFanOutMidChunk(t *testing.T) {
	t.Parallel()
	env := setup(t)
	startFastTicker(t, env.client)
	var chk checker
	gate := make(chan struct{})
	slowStarted := make(chan struct{})
	var k3 atomic.Int32
	startProcess(t, env, pgque.PartitionedConsumerConfig{
		Queue: env.queue, Consumer: "c", Slots: 1, WorkerID: "w",
		Handler: func(ctx context.Context, m *pgque.Message) error {
			defer chk.begin("w", m)()
			if m.PartitionKey == "k3" && k3.Add(1) == 3 {
				close(slowStarted)
				select {
				case <-gate:
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			return nil
		},
	})
	keys := make([]string, 10)
	for i := range keys {
		keys[i] = fmt.Sprintf("k%d", i)
	}
	sent := sendSeq(t, env, keys, 10)
	select {
	case <-slowStarted:
	case <-time.After(30 * time.Second):
		t.Fatal("the slow event was not delivered")
	}
	// The slow event is k3's third; 9 keys × 10 events of the others must
	// all run while it blocks.
	pgtest.WaitFor(t, 30*time.Second, "the other keys' events while k3 is stuck", func() bool {
		chk.mu.Lock()
		defer chk.mu.Unlock()
		n := 0
		for _, d := range chk.deliveries {
			if d.key != "k3" {
				n++
			}
		}
		return n == 90
	})
	if n := k3.Load(); n != 3 {
		t.Fatalf("k3 ran %d events while its third was stuck", n)
	}
	close(gate)
	pgtest.WaitFor(t, 30*time.Second, "every event", func() bool { return chk.distinct() == len(sent) })
	r, err := chk.verify(sent)
	if err != nil {
		t.Fatal(err)
	}
	if r.redeliveries != 0 {
		t.Fatalf("%d redeliveries", r.redeliveries)
	}
}

// A key's order holds over many chunks and batches, with handlers of
// random length so that lanes finish in every order and some keys are held.
func TestLanesOrderOverManyChunks(t *testing.T) {
	t.Parallel()
	env := setup(t)
	startTicker(t, env.client)
	var chk checker
	var running, peak atomic.Int32
	startProcess(t, env, pgque.PartitionedConsumerConfig{
		Queue: env.queue, Consumer: "c", Slots: 2, WorkerID: "w", BatchSize: 16, MaxWorkers: 8,
		Handler: func(ctx context.Context, m *pgque.Message) error {
			defer chk.begin("w", m)()
			n := running.Add(1)
			defer running.Add(-1)
			for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
			}
			if m.ID%17 == 0 {
				_ = pgtest.Work(ctx, 80*time.Millisecond) // long enough to be held
			} else {
				_ = pgtest.Work(ctx, time.Duration(m.ID%3)*time.Millisecond)
			}
			return nil
		},
	})
	var sent map[int64]string
	for range 4 {
		sent = merge(sent, sendKeyed(t, env, 500, 40))
	}
	pgtest.WaitFor(t, 60*time.Second, "all events", func() bool { return chk.distinct() == len(sent) })
	r, err := chk.verify(sent)
	if err != nil {
		t.Fatal(err)
	}
	if r.redeliveries != 0 {
		t.Fatalf("%d redeliveries in a run without failures", r.redeliveries)
	}
	if p := peak.Load(); p > 8 || p < 2 {
		t.Fatalf("peak running handlers %d, want 2..8 (MaxWorkers 8)", p)
	}
}

// A key whose handler is stuck does not stop its slot: 50 other keys of the
// same slot are all handled and the slot's cursor moves past the batch of
// the stuck event while it still runs; afterwards the stuck key's events
// come in order.
func TestLanesSlowKeyDoesNotStallSlot(t *testing.T) {
	t.Parallel()
	env := setup(t)
	startFastTicker(t, env.client)
	var chk checker
	gate := make(chan struct{})
	stuck := make(chan int64, 1)
	var slowRuns atomic.Int32
	p := startProcess(t, env, pgque.PartitionedConsumerConfig{
		Queue: env.queue, Consumer: "c", Slots: 1, WorkerID: "w", BatchSize: 50,
		PollInterval: 50 * time.Millisecond,
		Handler: func(ctx context.Context, m *pgque.Message) error {
			defer chk.begin("w", m)()
			if m.PartitionKey == "slow" {
				if slowRuns.Add(1) == 1 {
					stuck <- m.BatchID
					select {
					case <-gate:
					case <-ctx.Done():
						return ctx.Err()
					}
				}
				return nil
			}
			return pgtest.Work(ctx, time.Millisecond)
		},
	})
	others := make([]string, 50)
	for i := range others {
		others[i] = fmt.Sprintf("k%d", i)
	}
	sent := sendSeq(t, env, []string{"slow"}, 3)
	var batch int64
	select {
	case batch = <-stuck:
	case <-time.After(30 * time.Second):
		t.Fatal("the slow key was not delivered")
	}
	// Events of the other keys, and more of the slow key, in later batches.
	for range 5 {
		sent = merge(sent, sendSeq(t, env, others, 4), sendSeq(t, env, []string{"slow"}, 1))
	}
	want := len(sent) - 8 // all but the slow key's 8 events
	pgtest.WaitFor(t, 60*time.Second, "the other keys while the slow key is stuck", func() bool {
		return chk.distinct() == want
	})
	if n := slowRuns.Load(); n != 1 {
		t.Fatalf("the slow key ran %d times while its head was stuck", n)
	}
	pgtest.WaitFor(t, 30*time.Second, "the slot's cursor to pass the stuck event's batch", func() bool {
		var open int
		if err := env.pool.QueryRow(context.Background(),
			`select count(*) from pgque.subscription where sub_batch = $1`, batch).Scan(&open); err != nil {
			t.Fatal(err)
		}
		st, err := dbq.New(env.pool).PartitionSlotStatus(context.Background(), env.queue, "c")
		if err != nil {
			t.Fatal(err)
		}
		// The slot's lag still counts the held key's events; what the
		// cursor has to pass is the rest.
		return open == 0 && st[0].Lag-st[0].Held-st[0].Retrying == 0
	})
	if bk, ok := blockedKey(t, env, "c", pgque.KeyOf("slow")); !ok || bk.State != pgque.BlockStateHeld || bk.Deferred < 3 {
		t.Fatalf("while stuck, the slow key's hold is %+v (found %v)", bk, ok)
	}
	// KeyHeads speaks of the hold in the words of BlockedKeys.
	heads, err := env.client.KeyHeads(context.Background(), env.queue, "c", pgque.KeyQuery{})
	if err != nil {
		t.Fatal(err)
	}
	if i := slices.IndexFunc(heads, func(h pgque.KeyHead) bool { return h.Key == pgque.KeyOf("slow") }); i < 0 || heads[i].State != pgque.KeyStateHeld {
		t.Fatalf("while stuck, the key heads are %+v; want the slow key %q", heads, pgque.KeyStateHeld)
	}
	if st := p.pc.LaneStats(); len(st) != 1 || st[0].HeldKeys != 1 || st[0].Queued != 3 || st[0].OldestInFlight.IsZero() {
		t.Fatalf("LaneStats while stuck = %+v", st)
	}
	close(gate)
	pgtest.WaitFor(t, 30*time.Second, "every event", func() bool { return chk.distinct() == len(sent) })
	r, err := chk.verify(sent)
	if err != nil {
		t.Fatal(err)
	}
	if r.redeliveries != 0 {
		t.Fatalf("%d redeliveries", r.redeliveries)
	}
	pgtest.WaitFor(t, 20*time.Second, "the hold to clear", func() bool { return len(blockedKeys(t, env, "c")) == 0 })
}

// Pause with lanes: a held key whose head then fails blocks only that
// key; its later events wait, the others flow, and after the head's retry
// succeeds the held events come in ev_id order.
func TestLanesPauseHeldHeadFails(t *testing.T) {
	t.Parallel()
	env := setup(t)
	startFastTicker(t, env.client)
	var log pauseLog
	gate := make(chan struct{})
	started := make(chan struct{})
	var once sync.Once
	startProcess(t, env, pgque.PartitionedConsumerConfig{
		Queue: env.queue, Consumer: "c", Slots: 1, FailurePolicy: pgque.FailurePolicyPause,
		PollInterval: 50 * time.Millisecond,
		RetryDelay:   func(int) time.Duration { return 200 * time.Millisecond },
		Handler: pauseHandler(&log, "w", func(m *pgque.Message, p pmsg) error {
			if p.K == "bad" && p.N == 1 && m.RetryCount == 0 {
				once.Do(func() { close(started) })
				<-gate
				return errors.New("bad#1 fails on its first attempt")
			}
			return nil
		}),
	})
	ids := sendKevs(t, env, append(seq("bad", 1, 3), seq("good", 1, 3)...)...)
	<-started
	later := sendKevs(t, env, append(seq("bad", 4, 5), seq("good", 4, 6)...)...)
	pgtest.WaitFor(t, 30*time.Second, "the good key while bad#1 runs", func() bool {
		return log.done(append(ids[3:6], later[2:]...))
	})
	if bk, ok := blockedKey(t, env, "c", pgque.KeyOf("bad")); !ok || bk.State != pgque.BlockStateHeld {
		t.Fatalf("bad's hold while its head runs: %+v (found %v)", bk, ok)
	}
	close(gate)
	pgtest.WaitFor(t, 30*time.Second, "every event", func() bool { return log.done(append(ids, later...)) })
	wantCalls(t, &log, "bad", "#1 FAIL r0", "#1 ok r1", "#2 ok r0", "#3 ok r0", "#4 ok r0", "#5 ok r0")
	wantCalls(t, &log, "good", "#1 ok r0", "#2 ok r0", "#3 ok r0", "#4 ok r0", "#5 ok r0", "#6 ok r0")
	pgtest.WaitFor(t, 20*time.Second, "the block to clear", func() bool { return len(blockedKeys(t, env, "c")) == 0 })
}

// A held key whose head then returns DeadLetter: the head is dead-lettered
// at once (not retried), under pause the key is not blocked by it, and its
// later events follow in order.
func TestLanesHeldHeadDeadLetter(t *testing.T) {
	t.Parallel()
	env := setup(t)
	startFastTicker(t, env.client)
	var log pauseLog
	gate := make(chan struct{})
	started := make(chan struct{})
	var once sync.Once
	startProcess(t, env, pgque.PartitionedConsumerConfig{
		Queue: env.queue, Consumer: "c", Slots: 1, FailurePolicy: pgque.FailurePolicyPause,
		PollInterval: 50 * time.Millisecond,
		RetryDelay:   func(int) time.Duration { return 200 * time.Millisecond },
		Handler: pauseHandler(&log, "w", func(m *pgque.Message, p pmsg) error {
			if p.K == "bad" && p.N == 1 {
				once.Do(func() { close(started) })
				<-gate
				return pgque.DeadLetter(errors.New("bad#1 cannot be processed"))
			}
			return nil
		}),
	})
	ids := sendKevs(t, env, append(seq("bad", 1, 3), seq("good", 1, 3)...)...)
	<-started
	later := sendKevs(t, env, append(seq("bad", 4, 5), seq("good", 4, 6)...)...)
	pgtest.WaitFor(t, 30*time.Second, "the good key while bad#1 runs", func() bool {
		return log.done(append(ids[3:6], later[2:]...))
	})
	if bk, ok := blockedKey(t, env, "c", pgque.KeyOf("bad")); !ok || bk.State != pgque.BlockStateHeld {
		t.Fatalf("bad's hold while its head runs: %+v (found %v)", bk, ok)
	}
	close(gate)
	pgtest.WaitFor(t, 30*time.Second, "every event but the dead letter", func() bool { return log.done(append(ids[1:], later...)) })
	wantCalls(t, &log, "bad", "#1 FAIL r0", "#2 ok r0", "#3 ok r0", "#4 ok r0", "#5 ok r0")
	dls, err := env.client.DeadLetters(context.Background(), env.queue, nil)
	if err != nil || len(dls) != 1 || dls[0].EventID != ids[0] {
		t.Fatalf("dead letters %+v, %v; want bad#1 only", dls, err)
	}
	pgtest.WaitFor(t, 20*time.Second, "the block to clear", func() bool { return len(blockedKeys(t, env, "c")) == 0 })
}

// A crash while a key is held: the next owner releases the hold, the
// running head first; every event is handled, per-key order holds across
// the takeover, and the redelivered events are counted.
func TestLanesCrashWhileHeld(t *testing.T) {
	t.Parallel()
	env := setup(t)
	startFastTicker(t, env.client)
	var chk checker
	started := make(chan struct{})
	var once sync.Once
	handler := func(worker string) pgque.HandlerFunc {
		return func(ctx context.Context, m *pgque.Message) error {
			defer chk.begin(worker, m)()
			if worker == "a" && m.PartitionKey == "slow" {
				once.Do(func() { close(started) })
				<-ctx.Done() // stuck until the crash
				return ctx.Err()
			}
			return nil
		}
	}
	cfg := pgque.PartitionedConsumerConfig{
		Queue: env.queue, Consumer: "c", Slots: 1, LeaseTTL: time.Second, PollInterval: 50 * time.Millisecond,
	}
	cfgA := cfg
	cfgA.WorkerID, cfgA.Handler = "a", handler("a")
	a := startProcess(t, env, cfgA)
	sent := sendSeq(t, env, []string{"slow", "x", "y"}, 3)
	<-started
	sent = merge(sent, sendSeq(t, env, []string{"slow", "x", "y"}, 3))
	pgtest.WaitFor(t, 30*time.Second, "the slow key to be held", func() bool {
		bk, ok := blockedKey(t, env, "c", pgque.KeyOf("slow"))
		return ok && bk.State == pgque.BlockStateHeld
	})
	a.cancel() // crash: nothing more is acknowledged or settled
	cfgB := cfg
	cfgB.WorkerID, cfgB.Handler = "b", handler("b")
	b := startProcess(t, env, cfgB)
	pgtest.WaitFor(t, 30*time.Second, "every event", func() bool { return chk.distinct() == len(sent) })
	if _, err := chk.verify(sent); err != nil {
		t.Fatal(err)
	}
	chk.mu.Lock()
	var slowByB []int64
	for _, d := range chk.deliveries {
		if d.worker == "b" && d.key == "slow" {
			slowByB = append(slowByB, d.id)
		}
	}
	chk.mu.Unlock()
	if len(slowByB) != 6 {
		t.Fatalf("b handled the slow key's events %v, want all 6 (the head redelivered first)", slowByB)
	}
	if n := b.obs.total(pgque.MetricLaneRedelivered); n < 3 {
		t.Fatalf("lane_redelivered_events_total = %v, want the held events counted", n)
	}
}

// When holding a key fails (here: the function is replaced by one that
// raises), the slot falls back to the chunk barrier: it waits for the slow
// key, settles the chunk once, and every event is handled exactly once.
func TestLanesHoldFailureFallsBackToBarrier(t *testing.T) {
	t.Parallel()
	env := setup(t)
	startFastTicker(t, env.client)
	if _, err := env.pool.Exec(context.Background(), `
		create or replace function pgque.hold_keys_partitioned(i_queue text, i_consumer text, i_slot integer,
			i_nslots integer, i_worker text, i_token uuid, i_epoch bigint, i_batch_id bigint, i_keys text[], i_heads bigint[])
		returns integer language plpgsql as $$
		begin
			raise exception 'hold refused for the test';
		end $$`); err != nil {
		t.Fatal(err)
	}
	var chk checker
	var holdTried atomic.Bool
	gate := make(chan struct{})
	startProcess(t, env, pgque.PartitionedConsumerConfig{
		Queue: env.queue, Consumer: "c", Slots: 1, WorkerID: "w", PollInterval: 50 * time.Millisecond,
		Handler: func(ctx context.Context, m *pgque.Message) error {
			defer chk.begin("w", m)()
			if m.PartitionKey == "slow" && m.RetryCount == 0 && !holdTried.Swap(true) {
				select {
				case <-gate:
				case <-time.After(500 * time.Millisecond): // long enough to be held
				}
			}
			return nil
		},
	})
	sent := merge(sendSeq(t, env, []string{"slow", "a", "b", "c"}, 3))
	pgtest.WaitFor(t, 30*time.Second, "every event", func() bool { return chk.distinct() == len(sent) })
	close(gate)
	r, err := chk.verify(sent)
	if err != nil {
		t.Fatal(err)
	}
	if r.redeliveries != 0 {
		t.Fatalf("%d redeliveries: a failed hold must not abandon the chunk", r.redeliveries)
	}
	if len(blockedKeys(t, env, "c")) != 0 {
		t.Fatal("a key is held although holding failed")
	}
}

// TestHotLaneKeepsItsPlace: a hot key's lane keeps its place among
// MaxWorkers between its events, so a chunk of many cold keys does not
// slow it to one event per turn of all of their lanes (a backlog being
// caught up). With two places, the hot lane keeps one and the cold lanes
// share the other: the hot key's tenth event starts about when the tenth
// cold one does, where giving the place back after each event queued its
// second event behind all 39 waiting cold lanes.
func TestHotLaneKeepsItsPlace(t *testing.T) {
	t.Parallel()
	env := setup(t)
	ctx := context.Background()
	startTicker(t, env.client)
	var mu sync.Mutex
	var starts []string
	done := make(chan struct{})
	var keys []string
	for i := range 10 {
		keys = append(keys, "hot", fmt.Sprintf("c%d", 4*i), fmt.Sprintf("c%d", 4*i+1), fmt.Sprintf("c%d", 4*i+2), fmt.Sprintf("c%d", 4*i+3))
	}
	p := startProcess(t, env, pgque.PartitionedConsumerConfig{
		Queue: env.queue, Consumer: "c", Slots: 1, MaxWorkers: 2, BatchSize: 100,
		ClaimInterval: 100 * time.Millisecond, PollInterval: 50 * time.Millisecond,
		Handler: func(ctx context.Context, m *pgque.Message) error {
			mu.Lock()
			starts = append(starts, m.PartitionKey)
			if len(starts) == len(keys) {
				close(done)
			}
			mu.Unlock()
			return sleepCtx(ctx, 10*time.Millisecond)
		},
	})
	pgtest.WaitFor(t, 10*time.Second, "the slot claimed", func() bool { return len(p.pc.OwnedSlots()) == 1 })
	events := make([]pgque.Event, len(keys))
	for i, k := range keys {
		events[i] = pgque.Event{Type: "e", Payload: i, PartitionKey: k}
	}
	if _, err := env.client.SendBatch(ctx, env.queue, events); err != nil { // one transaction: one chunk
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the events were not all handled")
	}
	mu.Lock()
	defer mu.Unlock()
	hot, cold := 0, 0
	for _, k := range starts {
		if k == "hot" {
			if hot++; hot == 10 {
				break
			}
		} else {
			cold++
		}
	}
	if cold > 20 {
		t.Fatalf("the hot key's last event started after %d of the 40 cold ones: %v", cold, starts)
	}
}

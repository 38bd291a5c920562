package pgque_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pgque/pgque/internal/testing/leakcheck"

	"github.com/pgque/pgque"
	"github.com/pgque/pgque/internal/dbq"
	"github.com/pgque/pgque/internal/testing/pgtest"
)

// process is one simulated process of a worker pool: its own Client (and so
// its own LISTEN session) and its own worker id.
type process struct {
	pc     *pgque.PartitionedConsumer
	cancel context.CancelFunc
	obs    *recorder
}

// fencings returns how many slots the process lost while working them.
func (p *process) fencings(t *testing.T) float64 {
	t.Helper()
	return p.obs.total(pgque.MetricLeaseFencings)
}

// startProcess starts a partitioned consumer as a separate "process".
func startProcess(t *testing.T, env *testEnv, cfg pgque.PartitionedConsumerConfig) *process {
	t.Helper()
	return startProcessLogger(t, env, cfg, testLogger(t))
}

// startProcessLogger is startProcess with its own logger.
func startProcessLogger(t *testing.T, env *testEnv, cfg pgque.PartitionedConsumerConfig, logger *slog.Logger) *process {
	t.Helper()
	obs := &recorder{}
	client, err := pgque.NewClient(env.pool, &pgque.Config{Logger: logger, Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	pc, err := client.NewPartitionedConsumer(&cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := pc.Start(ctx); err != nil {
		cancel()
		t.Fatal(err)
	}
	p := &process{pc: pc, cancel: cancel, obs: obs}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		if err := pc.Stop(ctx); err != nil {
			t.Error("stopping", pc.WorkerID(), err)
		}
		p.cancel()
	})
	return p
}

// sendKeyed sends n events spread over nkeys keys in batches, and returns
// id → key.
func sendKeyed(t *testing.T, env *testEnv, n, nkeys int) map[int64]string {
	t.Helper()
	ctx := context.Background()
	sent := make(map[int64]string, n)
	const batch = 500
	for off := 0; off < n; off += batch {
		events := make([]pgque.Event, 0, batch)
		for i := off; i < min(off+batch, n); i++ {
			events = append(events, pgque.Event{Type: "e", Payload: i, PartitionKey: fmt.Sprintf("key-%d", rand.IntN(nkeys))})
		}
		ids, err := env.client.SendBatch(ctx, env.queue, events)
		if err != nil {
			t.Fatal(err)
		}
		for i, id := range ids {
			sent[id] = events[i].PartitionKey
		}
	}
	return sent
}

// slotOwners reads who owns which slot, from the server.
func slotOwners(t *testing.T, env *testEnv, consumer string) map[string]int {
	t.Helper()
	status, err := dbq.New(env.pool).PartitionSlotStatus(context.Background(), env.queue, consumer)
	if err != nil {
		t.Fatal(err)
	}
	owners := make(map[string]int)
	for _, s := range status {
		if s.Owner != nil && s.Live {
			owners[*s.Owner]++
		} else {
			owners[""]++
		}
	}
	return owners
}

// evenSpread reports whether the owners hold all n slots, each between
// floor and ceil of n over the owners.
func evenSpread(owners map[string]int, n, workers int) bool {
	if owners[""] != 0 || len(owners) != workers {
		return false
	}
	lo, hi := n/workers, (n+workers-1)/workers
	for _, c := range owners {
		if c < lo || c > hi {
			return false
		}
	}
	return true
}

func noop(context.Context, *pgque.Message) error { return nil }

func TestPartitionedSlotCountMismatch(t *testing.T) {
	t.Parallel()
	env := setup(t)
	startProcess(t, env, pgque.PartitionedConsumerConfig{Queue: env.queue, Consumer: "c", Slots: 4, Handler: noop})
	pc, err := env.client.NewPartitionedConsumer(&pgque.PartitionedConsumerConfig{Queue: env.queue, Consumer: "c", Slots: 5, Handler: noop})
	if err != nil {
		t.Fatal(err)
	}
	if err := pc.Start(context.Background()); !errors.Is(err, pgque.ErrSlotCountMismatch) {
		t.Fatalf("Start with another N = %v, want ErrSlotCountMismatch", err)
	}
}

func TestPartitionedConfigValidation(t *testing.T) {
	t.Parallel()
	env := setup(t)
	for _, cfg := range []*pgque.PartitionedConsumerConfig{
		nil,
		{Consumer: "c", Slots: 1, Handler: noop},
		{Queue: "q", Slots: 1, Handler: noop},
		{Queue: "q", Consumer: "c", Handler: noop},
		{Queue: "q", Consumer: "c", Slots: 1},
		{Queue: "q", Consumer: "c", Slots: 1, Handler: noop, LeaseTTL: time.Millisecond},
		{Queue: "q", Consumer: "c", Slots: 1, Handler: noop, FailurePolicy: 99},
		{Queue: "q", Consumer: "c", Slots: 1, Handler: noop, MaxWorkers: -1},
		{Queue: "q", Consumer: "c", Slots: 1, Handler: noop, MaxWorkersPerSlot: -2},
		{Queue: "q", Consumer: "c", Slots: 1, Handler: noop, BatchSize: 50, MaxEventsPerSlot: 49},
		{Queue: "q", Consumer: "c", Slots: 1, Handler: noop, HoldAfter: -time.Millisecond},
		{Queue: "q", Consumer: "c", Slots: 1, Handler: noop, ClaimInterval: pgque.ClaimIntervalMax + time.Second},
		{Queue: "q", Consumer: "c", Slots: 1, Handler: noop, ClaimInterval: pgque.ClaimIntervalMin - time.Nanosecond},
	} {
		if _, err := env.client.NewPartitionedConsumer(cfg); !errors.Is(err, pgque.ErrInvalidArgument) {
			t.Errorf("NewPartitionedConsumer(%+v) = %v, want ErrInvalidArgument", cfg, err)
		}
	}
}

func TestPartitionedDeliversEveryKeyInOrder(t *testing.T) {
	t.Parallel()
	env := setup(t)
	startTicker(t, env.client)
	var chk checker
	startProcess(t, env, pgque.PartitionedConsumerConfig{
		Queue: env.queue, Consumer: "c", Slots: 4, WorkerID: "solo",
		Handler: func(_ context.Context, m *pgque.Message) error {
			defer chk.begin("solo", m)()
			if m.Epoch < 1 || m.Slot < 0 || m.Slot >= 4 {
				return fmt.Errorf("bad slot %d or epoch %d", m.Slot, m.Epoch)
			}
			return nil
		},
	})
	sent := sendKeyed(t, env, 2000, 50)
	pgtest.WaitFor(t, 30*time.Second, "all events", func() bool { return chk.distinct() == len(sent) })
	r, err := chk.verify(sent)
	if err != nil {
		t.Fatal(err)
	}
	if r.redeliveries != 0 {
		t.Fatalf("%d redeliveries in a run without failures", r.redeliveries)
	}
}

func TestPartitionedHandlerPanicBecomesNack(t *testing.T) {
	t.Parallel()
	env := setup(t)
	startTicker(t, env.client)
	var panicked atomic.Bool
	done := make(chan *pgque.Message, 1)
	startProcess(t, env, pgque.PartitionedConsumerConfig{
		Queue: env.queue, Consumer: "c", Slots: 2,
		RetryDelay: func(int) time.Duration { return 10 * time.Millisecond },
		Handler: func(_ context.Context, m *pgque.Message) error {
			if !panicked.Swap(true) {
				panic("boom")
			}
			done <- m
			return nil
		},
	})
	if _, err := env.client.Send(context.Background(), env.queue, pgque.Event{Payload: 1, PartitionKey: "k"}); err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-done:
		if m.RetryCount != 1 {
			t.Fatalf("redelivered with retry count %d, want 1", m.RetryCount)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the event was not redelivered after the panic")
	}
}

// TestPartitionedFencing takes a slot away from a worker whose handler is
// running: the handler's context is cancelled with ErrLeaseLost and the
// chunk is not acked.
func TestPartitionedFencing(t *testing.T) {
	t.Parallel()
	env := setup(t)
	ctx := context.Background()
	startTicker(t, env.client)
	causes := make(chan error, 1)
	var calls atomic.Int32
	startProcess(t, env, pgque.PartitionedConsumerConfig{
		Queue: env.queue, Consumer: "c", Slots: 1, WorkerID: "victim", LeaseTTL: time.Second,
		// One event at a time: a lane would hold the blocked key on the
		// server after its grace, and the thief would find it deferred.
		MaxWorkersPerSlot: 1,
		Handler: func(ctx context.Context, m *pgque.Message) error {
			if calls.Add(1) > 1 {
				return nil
			}
			<-ctx.Done()
			causes <- context.Cause(ctx)
			return ctx.Err()
		},
	})
	if _, err := env.client.Send(ctx, env.queue, pgque.Event{Payload: 1}); err != nil {
		t.Fatal(err)
	}
	pgtest.WaitFor(t, 20*time.Second, "the handler to start", func() bool { return calls.Load() == 1 })
	// Only the victim's token could release its lease: the test frees it
	// behind its back as the owner of the tables, and the thief claims it
	// in the same transaction, so the victim's own claimer cannot take
	// the free lease back in between.
	tx, err := env.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `update pgque.slot_lease set sl_owner = null, sl_until = null, sl_token = null
		where sl_consumer = 'c' and sl_slot = 0`); err != nil {
		t.Fatalf("freeing the victim's lease: %v", err)
	}
	epoch, token, ok, err := dbq.New(tx).ClaimSlot(ctx, env.queue, "c", 0, "thief", time.Minute, "")
	if err != nil || !ok {
		t.Fatalf("claim_slot as the thief = %v, %v", ok, err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	q := dbq.New(env.pool)
	select {
	case cause := <-causes:
		if !errors.Is(cause, pgque.ErrLeaseLost) {
			t.Fatalf("handler context cause = %v, want ErrLeaseLost", cause)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the fenced handler's context was not cancelled")
	}
	// The chunk was not acked: the thief receives the event.
	rows, err := q.ReceivePartitioned(ctx, env.queue, "c", 0, 1, "thief", token, 10, nil)
	if err != nil || len(rows) != 1 || rows[0].Epoch != epoch {
		t.Fatalf("thief received %v, %v; want the abandoned event at epoch %d", rows, err, epoch)
	}
}

// TestPartitionedStopLeavesNoGoroutinesAndReleases is not parallel: leakcheck
// inspects every goroutine of the binary.
func TestPartitionedStopLeavesNoGoroutinesAndReleases(t *testing.T) {
	env := setup(t)
	ctx := context.Background()
	before := leakcheck.Take()
	tk, err := env.client.NewTicker(nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := tk.Start(ctx); err != nil {
		t.Fatal(err)
	}
	var chk checker
	pc, err := env.client.NewPartitionedConsumer(&pgque.PartitionedConsumerConfig{
		Queue: env.queue, Consumer: "c", Slots: 4,
		Handler: func(_ context.Context, m *pgque.Message) error { defer chk.begin("w", m)(); return nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := pc.Start(ctx); err != nil {
		t.Fatal(err)
	}
	sent := sendKeyed(t, env, 200, 20)
	pgtest.WaitFor(t, 20*time.Second, "all events", func() bool { return chk.distinct() == len(sent) })
	for range 2 {
		if err := pc.Stop(ctx); err != nil {
			t.Fatal(err)
		}
		if err := tk.Stop(ctx); err != nil {
			t.Fatal(err)
		}
	}
	leakcheck.Verify(t, before)
	if owners := slotOwners(t, env, "c"); owners[""] != 4 {
		t.Fatalf("after Stop the slots are owned: %v", owners)
	}
	// Its last announcement tells the other workers it left: no slots,
	// not hungry (internal/workerpool, left), so they take its slots at
	// once instead of counting it for three claim intervals.
	var hungry bool
	var slots int
	if err := env.pool.QueryRow(ctx, `select p.wp_hungry, cardinality(p.wp_slots) from pgque.worker_presence p
		join pgque.queue q on q.queue_id = p.wp_queue where q.queue_name = $1 and p.wp_consumer = 'c'
		order by p.wp_seen desc limit 1`, env.queue).Scan(&hungry, &slots); err != nil || hungry || slots != 0 {
		t.Fatalf("last announcement after Stop: hungry %v, %d slots (%v); want a leave (not hungry, no slots)", hungry, slots, err)
	}
}

// randomLatency is a handler delay: mostly short, sometimes long.
func randomLatency() time.Duration {
	if rand.IntN(100) == 0 {
		return time.Duration(rand.IntN(20)) * time.Millisecond
	}
	return time.Duration(rand.IntN(400)) * time.Microsecond
}

// sleepCtx sleeps for d or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// poolRun is a multi-process run over one consumer.
type poolRun struct {
	t     *testing.T
	env   *testEnv
	chk   checker
	mu    sync.Mutex
	procs map[string]*process
	ttl   time.Duration
	slots int
}

func newPoolRun(t *testing.T, slots int, ttl time.Duration) *poolRun {
	env := setup(t)
	startTicker(t, env.client)
	return &poolRun{t: t, env: env, procs: make(map[string]*process), ttl: ttl, slots: slots}
}

// start adds a process.
func (r *poolRun) start(worker string) *process {
	p := startProcess(r.t, r.env, pgque.PartitionedConsumerConfig{
		Queue: r.env.queue, Consumer: "pool", Slots: r.slots, WorkerID: worker,
		LeaseTTL: r.ttl, ClaimInterval: 200 * time.Millisecond, PollInterval: 200 * time.Millisecond,
		Handler: func(ctx context.Context, m *pgque.Message) error {
			defer r.chk.begin(worker, m)()
			return sleepCtx(ctx, randomLatency())
		},
	})
	r.mu.Lock()
	r.procs[worker] = p
	r.mu.Unlock()
	return p
}

// checkRedeliveries fails the test if there were redeliveries that no
// fencing explains: without crashes, a chunk is delivered twice only when a
// slot was fenced (its lease ran out locally under load) and abandoned.
func (r *poolRun) checkRedeliveries(redeliveries int) {
	r.t.Helper()
	var fencings float64
	for _, p := range r.procs {
		fencings += p.fencings(r.t)
	}
	if fencings > 0 {
		r.t.Logf("%v slots were fenced under load; %d redeliveries", fencings, redeliveries)
	}
	if float64(redeliveries) > fencings*pgque.BatchSizeDefault {
		r.t.Fatalf("%d redeliveries, more than %v fencings × %d can explain", redeliveries, fencings, pgque.BatchSizeDefault)
	}
}

// stop stops a process gracefully.
func (r *poolRun) stop(worker string) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := r.procs[worker].pc.Stop(ctx); err != nil {
		r.t.Fatal(err)
	}
}

// waitSpread waits for an even spread over workers live processes.
func (r *poolRun) waitSpread(workers int) {
	r.t.Helper()
	var owners map[string]int
	pgtest.WaitFor(r.t, 30*time.Second, fmt.Sprintf("an even spread over %d workers", workers), func() bool {
		owners = slotOwners(r.t, r.env, "pool")
		return evenSpread(owners, r.slots, workers)
	})
	r.t.Logf("spread over %d workers: %v", workers, owners)
}

func TestPartitionedThreeProcesses(t *testing.T) {
	t.Parallel()
	r := newPoolRun(t, 8, 2*time.Second)
	for _, w := range []string{"p1", "p2", "p3"} {
		r.start(w)
	}
	sent := sendKeyed(t, r.env, 20000, 500)
	pgtest.WaitFor(t, 90*time.Second, "all events", func() bool { return r.chk.distinct() == len(sent) })
	rep, err := r.chk.verify(sent)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("calls %d, redeliveries %d, per worker %v", rep.calls, rep.redeliveries, rep.perWorker)
	r.checkRedeliveries(rep.redeliveries)
	if len(rep.perWorker) != 3 {
		t.Fatalf("work went to %v, want all three processes", rep.perWorker)
	}
	r.waitSpread(3)
}

func TestPartitionedCrashIsTakenOver(t *testing.T) {
	t.Parallel()
	const batchSize = pgque.BatchSizeDefault
	r := newPoolRun(t, 8, 2*time.Second)
	for _, w := range []string{"p1", "p2", "p3"} {
		r.start(w)
	}
	r.waitSpread(3)
	sent := sendKeyed(t, r.env, 20000, 500)
	pgtest.WaitFor(t, 60*time.Second, "a third of the events", func() bool { return r.chk.distinct() > len(sent)/3 })
	crashedSlots := len(r.procs["p2"].pc.OwnedSlots())
	r.procs["p2"].cancel() // crash: no Stop, no ack, no release
	crashedAt := time.Now()
	pgtest.WaitFor(t, 90*time.Second, "all events", func() bool { return r.chk.distinct() == len(sent) })
	rep, err := r.chk.verify(sent)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("calls %d, redeliveries %d (bound %d), per worker %v, drained %v after the crash",
		rep.calls, rep.redeliveries, crashedSlots*batchSize, rep.perWorker, time.Since(crashedAt))
	if rep.redeliveries > crashedSlots*batchSize {
		t.Fatalf("%d redeliveries, more than the %d slots × %d events the crashed process could have abandoned",
			rep.redeliveries, crashedSlots, batchSize)
	}
	r.waitSpread(2)
}

func TestPartitionedScaleUpAndDown(t *testing.T) {
	t.Parallel()
	r := newPoolRun(t, 8, 2*time.Second)
	r.start("p1")
	r.waitSpread(1)
	stop := make(chan struct{})
	produced := make(chan map[int64]string)
	go func() { // a steady stream during the whole run
		sent := make(map[int64]string)
		for {
			select {
			case <-stop:
				produced <- sent
				return
			case <-time.After(20 * time.Millisecond):
			}
			for id, k := range sendKeyed(t, r.env, 50, 100) {
				sent[id] = k
			}
		}
	}()
	r.start("p2")
	r.start("p3")
	r.waitSpread(3)
	r.start("p4")
	r.waitSpread(4)
	r.stop("p4")
	r.stop("p3")
	r.waitSpread(2)
	close(stop)
	sent := <-produced
	pgtest.WaitFor(t, 60*time.Second, "all events", func() bool { return r.chk.distinct() == len(sent) })
	rep, err := r.chk.verify(sent)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("calls %d, redeliveries %d, per worker %v", rep.calls, rep.redeliveries, rep.perWorker)
	r.checkRedeliveries(rep.redeliveries)
}

// startEvenPair starts workers p1 and p2 of consumer over slots slots (an
// even number) with the claim interval given and handlers that do
// nothing: p1 first, until it holds every slot, then p2, until each holds
// half.
func startEvenPair(t *testing.T, env *testEnv, consumer string, slots int, claim time.Duration) (p1, p2 *process) {
	t.Helper()
	cfg := func(w string) pgque.PartitionedConsumerConfig {
		return pgque.PartitionedConsumerConfig{Queue: env.queue, Consumer: consumer, Slots: slots, WorkerID: w,
			ClaimInterval: claim, PollInterval: 200 * time.Millisecond,
			Handler: func(context.Context, *pgque.Message) error { return nil }}
	}
	p1 = startProcess(t, env, cfg("p1"))
	pgtest.WaitFor(t, 10*time.Second, "p1 to hold every slot", func() bool { return len(p1.pc.OwnedSlots()) == slots })
	p2 = startProcess(t, env, cfg("p2"))
	pgtest.WaitFor(t, 30*time.Second, "an even spread", func() bool {
		return len(p1.pc.OwnedSlots()) == slots/2 && len(p2.pc.OwnedSlots()) == slots/2
	})
	return p1, p2
}

// TestPartitionedGracefulLeaveTakenOverAtOnce: a process that stops
// gracefully announces that it left and hints the others (Pool.leave),
// which take its released slots in a pass run at once. Before, they took
// its announcement for three claim intervals as its ownership, and here,
// with 8-second intervals, the survivor's first chance came 24 s or more
// after the stop. The bound leaves room for a loaded machine (CI runs
// every package at once with -race).
func TestPartitionedGracefulLeaveTakenOverAtOnce(t *testing.T) {
	t.Parallel()
	env := setup(t)
	const slots = 6
	p1, p2 := startEvenPair(t, env, "leave", slots, 8*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := p2.pc.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	pgtest.WaitFor(t, 15*time.Second, "p1 to take the slots p2 released", func() bool { return len(p1.pc.OwnedSlots()) == slots })
	t.Logf("p1 held every slot %v after p2 stopped", time.Since(stopped))
}

// TestPartitionedForgedLeaveMovesNoSlot: announce_worker takes the worker
// id on trust from any role that may consume, so a leave can be forged for
// a worker that is running. A peer that listens reads who works which slot
// from the announcements alone, so it counts the worker gone, finds itself
// short of its fair share (it announces itself hungry) and claims the
// worker's slots. The server stays the authority: claim_slot refuses slots
// whose lease is live, so no slot changes hands (same holder, same epoch),
// and the worker's own next announcement puts it back.
func TestPartitionedForgedLeaveMovesNoSlot(t *testing.T) {
	t.Parallel()
	env := setup(t)
	ctx := context.Background()
	const slots = 6
	p1, p2 := startEvenPair(t, env, "forged", slots, time.Second)
	// leases maps each slot to its holder and epoch.
	leases := func() map[int]string {
		status, err := dbq.New(env.pool).PartitionSlotLeases(ctx, env.queue, "forged")
		if err != nil {
			t.Fatal(err)
		}
		out := make(map[int]string, len(status))
		for _, s := range status {
			owner := ""
			if s.Owner != nil {
				owner = *s.Owner
			}
			out[s.Slot] = fmt.Sprintf("%s epoch %d", owner, s.Epoch)
		}
		return out
	}
	before := leases()
	// announced returns p1's newest announcement after since: when, and
	// whether it was hungry (it is once it counts p2 gone: its fair share
	// is then every slot).
	announced := func(since time.Time) (at time.Time, hungry bool) {
		err := env.pool.QueryRow(ctx, `select p.wp_seen, p.wp_hungry from pgque.worker_presence p
			join pgque.queue q on q.queue_id = p.wp_queue
			where q.queue_name = $1 and p.wp_consumer = 'forged' and p.wp_worker = 'p1' and p.wp_seen > $2
			order by p.wp_seen desc limit 1`, env.queue, since).Scan(&at, &hungry)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			t.Fatal(err)
		}
		return at, hungry
	}
	forge := func() {
		if _, err := env.pool.Exec(ctx, `select count(*) from pgque.announce_worker($1, 'forged', 'p2', false, '{}', null)`, env.queue); err != nil {
			t.Fatal(err)
		}
	}
	// Forge the leave until p1 announces that it believes it: p2's own
	// passes announce it again, once a second.
	var fooled time.Time
	pgtest.WaitFor(t, 20*time.Second, "p1 to count p2 gone after a forged leave", func() bool {
		forge()
		at, hungry := announced(fooled)
		if hungry {
			fooled = at
		}
		return hungry
	})
	// That pass tried to claim p2's slots; wait for the next one, still
	// forging, so that it had every chance to take them.
	pgtest.WaitFor(t, 20*time.Second, "p1's next pass", func() bool {
		forge()
		at, _ := announced(fooled)
		return !at.IsZero()
	})
	if after := leases(); !maps.Equal(after, before) {
		t.Fatalf("slot leases moved after a forged leave: before %v, after %v", before, after)
	}
	if n1, n2 := len(p1.pc.OwnedSlots()), len(p2.pc.OwnedSlots()); n1 != slots/2 || n2 != slots/2 {
		t.Fatalf("after a forged leave p1 holds %d slots and p2 %d; want %d each", n1, n2, slots/2)
	}
	// Without more forgery p2's next announcement puts it back, and p1
	// stops asking for more.
	pgtest.WaitFor(t, 20*time.Second, "p1 to count p2 again", func() bool {
		at, hungry := announced(fooled)
		return !at.IsZero() && !hungry
	})
}

// TestPartitionedStopBoundsItsLeave: a graceful stop whose last
// announcement waits (here for a lock on worker_presence) returns after
// leaveWait, 2 s, not when the server lets the announcement through. A
// claim pass's announcement that was under way (a loaded machine may run
// the pass the worker's own hint asks for under the lock) adds its grace,
// half a second.
func TestPartitionedStopBoundsItsLeave(t *testing.T) {
	t.Parallel()
	env := setup(t)
	ctx := context.Background()
	// The next regular pass is a minute away; the one the worker's own hint
	// asks for may still run under the lock on a loaded machine (see above).
	p := startProcess(t, env, pgque.PartitionedConsumerConfig{Queue: env.queue, Consumer: "leavelock", Slots: 2,
		ClaimInterval: time.Minute, Handler: func(context.Context, *pgque.Message) error { return nil }})
	pgtest.WaitFor(t, 10*time.Second, "both slots", func() bool { return len(p.pc.OwnedSlots()) == 2 })
	tx, err := env.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `lock table pgque.worker_presence in access exclusive mode`); err != nil {
		t.Fatal(err)
	}
	sctx, cancel := context.WithTimeout(ctx, 9*time.Second)
	defer cancel()
	start := time.Now()
	if err := p.pc.Stop(sctx); err != nil {
		t.Fatalf("Stop while the announcement waits: %v", err)
	}
	if took := time.Since(start); took < 1900*time.Millisecond || took > 6500*time.Millisecond {
		t.Fatalf("Stop took %v; want the announcement waited for about 2 s", took)
	}
}

// TestPartitionedDeadProcessTakenOverBeforeTTL: a process that dies
// without releasing its slots closes its LISTEN session, to which its
// leases are bound, so the survivor takes them over a sixth of the TTL
// after it first finds them free (claim_slot's "Dead holders"), not when
// the 30-second TTL runs out.
func TestPartitionedDeadProcessTakenOverBeforeTTL(t *testing.T) {
	t.Parallel()
	const ttl = 30 * time.Second
	r := newPoolRun(t, 4, ttl)
	r.start("p1")
	r.start("p2")
	r.waitSpread(2)
	pgtest.WaitFor(t, 10*time.Second, "every lease bound to its holder's session", func() bool {
		var bound int
		err := r.env.pool.QueryRow(context.Background(), `select count(*) from pgque.slot_lease l
			join pgque.queue q on q.queue_id = l.sl_queue
			where q.queue_name = $1 and l.sl_consumer = 'pool' and l.sl_session is not null`, r.env.queue).Scan(&bound)
		return err == nil && bound == 4
	})
	crashed := r.procs["p2"].pc.OwnedSlots()
	r.procs["p2"].cancel() // no Stop, no release: its session closes as a dead process's would
	crashedAt := time.Now()
	sent := sendKeyed(t, r.env, 400, 40)
	pgtest.WaitFor(t, ttl-5*time.Second, "all events, before the crashed process's leases expire", func() bool {
		return r.chk.distinct() == len(sent)
	})
	took := time.Since(crashedAt)
	if _, err := r.chk.verify(sent); err != nil {
		t.Fatal(err)
	}
	owners := slotOwners(t, r.env, "pool")
	if owners["p1"] != 4 {
		t.Fatalf("after the crash the slots are owned %v, want all by p1", owners)
	}
	t.Logf("slots %v of the crashed process served again within %v (ttl %v)", crashed, took, ttl)
}

// TestPartitionedLostSessionRebindsLeases: when the LISTEN session its
// leases are bound to breaks, a live process that gets a new session at
// once binds its leases to it before they are given up (TTL/8 after the
// end; a claim may take them over TTL/6 after it finds the session gone):
// no slot is fenced, and events keep being delivered, each key in order.
func TestPartitionedLostSessionRebindsLeases(t *testing.T) {
	t.Parallel()
	const ttl = 30 * time.Second
	ctx := context.Background()
	r := newPoolRun(t, 2, ttl)
	p := r.start("p1")
	bound := func(not int32) (pid int32, ok bool) {
		var n int
		err := r.env.pool.QueryRow(ctx, `select count(*), min(l.sl_session) from pgque.slot_lease l
			join pgque.queue q on q.queue_id = l.sl_queue
			where q.queue_name = $1 and l.sl_consumer = 'pool' and l.sl_owner = 'p1' and l.sl_session <> $2
			having count(distinct l.sl_session) = 1`, r.env.queue, not).Scan(&n, &pid)
		return pid, err == nil && n == 2
	}
	var pid int32
	pgtest.WaitFor(t, 10*time.Second, "both leases bound to the session", func() bool {
		var ok bool
		pid, ok = bound(0)
		return ok
	})
	if _, err := r.env.pool.Exec(ctx, "select pg_terminate_backend($1)", pid); err != nil {
		t.Fatal(err)
	}
	lost := time.Now()
	pgtest.WaitFor(t, ttl/sessionCap, "both leases bound to the new session", func() bool {
		_, ok := bound(pid)
		return ok
	})
	t.Logf("leases bound to the new session %v after the old one ended", time.Since(lost))
	sent := sendKeyed(t, r.env, 200, 20)
	pgtest.WaitFor(t, 20*time.Second, "all events", func() bool { return r.chk.distinct() == len(sent) })
	if _, err := r.chk.verify(sent); err != nil {
		t.Fatal(err)
	}
	if f := p.fencings(t); f != 0 {
		t.Errorf("%v slots fenced, want none: the leases were bound to the new session in time", f)
	}
}

// sessionCap is workerpool's sessionCapDiv: a lease bound to an ended
// session is given up TTL/8 after the end.
const sessionCap = 8

// TestPartitionedStopLetsTheClaimLandAndGivesItBack: a claim under way when
// the consumer stops is let finish rather than cancelled (a cancelled call
// the server had not read yet still ran, and took the slot for a worker
// that was gone), and a slot it takes after the stop is released before
// Stop returns, free for the next worker at once. The claim waits on the
// slot's lease row, which the test holds; _lease's own 2 s lock_timeout is
// lifted in this database, so that only the test decides when it goes on.
func TestPartitionedStopLetsTheClaimLandAndGivesItBack(t *testing.T) {
	t.Parallel()
	env := setup(t)
	ctx := context.Background()
	if _, err := env.pool.Exec(ctx, "alter function pgque._lease(text, text, integer) set lock_timeout = 0"); err != nil {
		t.Fatal(err)
	}
	oneSlotStopLetsFinish(t, env, "claim_slot", `select 1 from pgque.slot_lease l join pgque.queue q on q.queue_id = l.sl_queue
		where q.queue_name = '`+env.queue+`' and l.sl_consumer = 'c' for no key update of l`, nil)
	var owner *string
	if err := env.pool.QueryRow(ctx, `select l.sl_owner from pgque.slot_lease l join pgque.queue q on q.queue_id = l.sl_queue
		where q.queue_name = $1 and l.sl_consumer = 'c'`, env.queue).Scan(&owner); err != nil {
		t.Fatal(err)
	}
	if owner != nil {
		t.Fatalf("after Stop returned, the slot is still leased to %q: the claim that landed after the stop was not given back", *owner)
	}
}

// TestPartitionedStopLetsTheAnnouncementLandBeforeTheLeave: an
// announcement of a claim pass under way when the consumer stops is let
// finish (for a moment, 500 ms, raised here), so that the stop's own
// announcement (that the worker left) comes after it. Cancelled at once,
// it could still be recorded by the server after the leave, naming the
// slots the stop had just released as this worker's, and the peers left
// them unworked until it expired (seen under load in
// TestPartitionedGracefulLeaveTakenOverAtOnce). The announcement waits on
// a lock the test holds on worker_presence, taken before the worker's
// first pass.
func TestPartitionedStopLetsTheAnnouncementLandBeforeTheLeave(t *testing.T) {
	t.Parallel()
	env := setup(t)
	oneSlotStopLetsFinish(t, env, "announce_worker", "lock table pgque.worker_presence in share mode",
		func(pc *pgque.PartitionedConsumer) { pgque.SetAnnounceGrace(pc, time.Minute) })
	var slots []int32
	var hungry bool
	if err := env.pool.QueryRow(context.Background(), `select wp_slots, wp_hungry from pgque.worker_presence
		where wp_worker = 'w' order by wp_seen desc limit 1`).Scan(&slots, &hungry); err != nil {
		t.Fatal(err)
	}
	if len(slots) != 0 || hungry {
		t.Fatalf("the worker's last announcement after Stop: slots %v, hungry %v; want the leave's (no slots, not hungry)", slots, hungry)
	}
}

// oneSlotStopLetsFinish subscribes slot 0 of 1 of env.queue for consumer
// c, runs hold in a transaction it keeps open, starts a one-slot
// PartitionedConsumer of worker w (tune, when not nil, adjusts it before
// Start), waits until the worker's call of pgque.fn waits on a lock, and
// stops the consumer with stopLetsFinish, which ends the transaction.
func oneSlotStopLetsFinish(t *testing.T, env *testEnv, fn, hold string, tune func(*pgque.PartitionedConsumer)) {
	t.Helper()
	ctx := context.Background()
	if _, err := env.pool.Exec(ctx, "select pgque.subscribe_slot($1, 'c', 0, 1)", env.queue); err != nil {
		t.Fatal(err)
	}
	holder, err := env.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback(ctx)
	if _, err := holder.Exec(ctx, hold); err != nil {
		t.Fatal(err)
	}
	pc, err := env.client.NewPartitionedConsumer(&pgque.PartitionedConsumerConfig{
		Queue: env.queue, Consumer: "c", Slots: 1, WorkerID: "w",
		Handler: func(context.Context, *pgque.Message) error { return nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	if tune != nil {
		tune(pc)
	}
	if err := pc.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer pc.Stop(ctx)
	pgtest.WaitFor(t, 10*time.Second, fmt.Sprintf("the worker's %s call to wait on a lock", fn), func() bool { return lockWaiters(t, env, fn) == 1 })
	stopLetsFinish(t, env, holder, pc.Stop, func() <-chan struct{} { return pgque.PartitionedStopping(pc) },
		"the "+fn+" call", func() bool { return lockWaiters(t, env, fn) >= 1 })
}

package pgque_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgque/pgque"
	"github.com/pgque/pgque/internal/pgcluster"
	"github.com/pgque/pgque/internal/testing/pgtest"
)

// call is one handler call as the resize runs record it: with the N of the
// slot that delivered it, since a key changes slot when N changes.
type call struct {
	worker       string
	key          string
	id           int64
	slot, nslots int
	ok           bool
	start, end   time.Time
}

// resizeRun is a run of worker processes over one consumer while its N
// changes: each process has its own pgxpool (its own connections) and
// worker id.
type resizeRun struct {
	t     *testing.T
	env   *testEnv
	pause bool
	// crashes: the run crashes workers and Postgres, so events may be
	// handled more than once (at least once), never out of order.
	crashes bool
	// poll is the processes' PollInterval (0: 100 ms); batch the events
	// the producer sends every 20 ms (0: 40).
	poll   time.Duration
	batch  int
	mu     sync.Mutex
	calls  []call
	procs  map[string]*resizeProc
	sentMu sync.Mutex
	sent   map[int64]string
	// prodMu is held by the producer while it sends a batch, so a restart
	// can wait for the batch in flight: a commit whose answer is lost to
	// the restart would leave an event the run does not know it sent.
	prodMu sync.Mutex
}

type resizeProc struct {
	pc     *pgque.PartitionedConsumer
	pool   *pgxpool.Pool
	cancel context.CancelFunc
	obs    *recorder
}

// fencings is how many slots the run's processes lost while working them
// (a lease that ran out locally under load): each may redeliver a chunk.
func (r *resizeRun) fencings() float64 {
	var n float64
	for _, p := range r.procs {
		n += p.obs.total(pgque.MetricLeaseFencings)
	}
	return n
}

func newResizeRun(t *testing.T, env *testEnv, pause bool) *resizeRun {
	return &resizeRun{t: t, env: env, pause: pause, procs: make(map[string]*resizeProc), sent: make(map[int64]string)}
}

// fails decides whether the first attempt of an event fails (pause runs
// only): about one event in 15, fixed per event.
func (r *resizeRun) fails(m *pgque.Message) bool {
	return r.pause && m.RetryCount == 0 && (uint64(m.ID)*0x9E3779B97F4A7C15)>>60 == 0
}

// start adds a worker process configured with nslots.
func (r *resizeRun) start(worker string, nslots int) *resizeProc {
	r.t.Helper()
	pool := pgtest.Pool(r.t, r.env.dsn)
	obs := &recorder{}
	client, err := pgque.NewClient(pool, &pgque.Config{Logger: testLogger(r.t), Observer: obs})
	if err != nil {
		r.t.Fatal(err)
	}
	policy := pgque.FailurePolicySkip
	if r.pause {
		policy = pgque.FailurePolicyPause
	}
	pc, err := client.NewPartitionedConsumer(&pgque.PartitionedConsumerConfig{
		Queue: r.env.queue, Consumer: "c", Slots: nslots, WorkerID: worker, FailurePolicy: policy,
		LeaseTTL: 10 * time.Second, ClaimInterval: 200 * time.Millisecond, PollInterval: cmp.Or(r.poll, 100*time.Millisecond),
		RetryDelay: func(int) time.Duration { return 50 * time.Millisecond },
		Handler: func(ctx context.Context, m *pgque.Message) error {
			c := call{worker: worker, key: m.PartitionKey, id: m.ID, slot: m.Slot, nslots: m.NSlots, start: time.Now()}
			err := sleepCtx(ctx, randomLatency())
			if err == nil && r.fails(m) {
				err = errors.New("injected failure")
			}
			c.ok, c.end = err == nil, time.Now()
			r.mu.Lock()
			r.calls = append(r.calls, c)
			r.mu.Unlock()
			return err
		},
	})
	if err != nil {
		r.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := pc.Start(ctx); err != nil {
		cancel()
		r.t.Fatal(err)
	}
	p := &resizeProc{pc: pc, pool: pool, cancel: cancel, obs: obs}
	r.procs[worker] = p
	r.t.Cleanup(func() {
		ctx, stop := context.WithTimeout(context.Background(), 15*time.Second)
		defer stop()
		_ = pc.Stop(ctx) // a crashed process returns its context's error
		cancel()
	})
	return p
}

// produce sends batches over nkeys keys until stop is closed.
func (r *resizeRun) produce(stop <-chan struct{}, nkeys int) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			events := make([]pgque.Event, cmp.Or(r.batch, 40))
			for i := range events {
				events[i] = pgque.Event{Type: "e", Payload: i, PartitionKey: fmt.Sprintf("key-%d", rand.IntN(nkeys))}
			}
			r.prodMu.Lock()
			ids, err := r.env.client.SendBatch(context.Background(), r.env.queue, events)
			r.prodMu.Unlock()
			if err != nil {
				continue // reconnecting after a restart: nothing was sent
			}
			r.sentMu.Lock()
			for i, id := range ids {
				r.sent[id] = events[i].PartitionKey
			}
			r.sentMu.Unlock()
		}
	}()
	return done
}

// handled counts the distinct events handled successfully.
func (r *resizeRun) handled() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	seen := make(map[int64]bool)
	for _, c := range r.calls {
		if c.ok {
			seen[c.id] = true
		}
	}
	return len(seen)
}

func (r *resizeRun) sentCount() int {
	r.sentMu.Lock()
	defer r.sentMu.Unlock()
	return len(r.sent)
}

// resize resizes to n and waits until it completed and every live process
// works n slots.
func (r *resizeRun) resize(n int, live ...string) time.Duration {
	r.t.Helper()
	start := time.Now()
	// Right after a Postgres restart the first call may meet a dead
	// connection; a call that committed answers PQ070 when repeated.
	pgtest.WaitFor(r.t, 20*time.Second, fmt.Sprintf("ResizeSlots(%d) to be accepted", n), func() bool {
		err := r.env.client.ResizeSlots(context.Background(), r.env.queue, "c", n)
		if err != nil && !errors.Is(err, pgque.ErrResizeInProgress) {
			r.t.Logf("ResizeSlots(%d): %v", n, err)
			return false
		}
		return true
	})
	r.waitResize(n, live...)
	took := time.Since(start)
	r.t.Logf("resize to %d done in %v", n, took)
	return took
}

// waitResize waits until the resize to n completed and every live process
// works n slots.
func (r *resizeRun) waitResize(n int, live ...string) {
	r.t.Helper()
	sawPhase := false
	pgtest.WaitFor(r.t, 90*time.Second, fmt.Sprintf("the resize to %d", n), func() bool {
		rs, err := r.env.client.Resizes(context.Background(), r.env.queue)
		if err != nil || len(rs) != 1 {
			return false
		}
		if rs[0].Phase != pgque.ResizeDone {
			sawPhase = sawPhase || rs[0].To == n
			return false
		}
		if rs[0].NSlots != n {
			return false
		}
		for _, w := range live {
			if r.procs[w].pc.Slots() != n {
				return false
			}
		}
		return true
	})
	r.t.Logf("resize to %d: in-progress phase seen by the status: %v", n, sawPhase)
}

// verify checks every guarantee over the recorded calls: every event sent
// handled (successfully, under pause: exactly once and in ev_id order per
// key); calls of one key never overlap (G2), whatever slot or N; each call
// came from the slot its key maps to under the call's N (G1); a key's calls
// move from one N to the next exactly once, in the order of the resizes
// (no old-N call after a new-N one); first deliveries in ev_id order.
func (r *resizeRun) verify(ns []int) {
	r.t.Helper()
	r.mu.Lock()
	calls := slices.Clone(r.calls)
	r.mu.Unlock()
	r.sentMu.Lock()
	sent := r.sent
	r.sentMu.Unlock()
	byKey := make(map[string][]call)
	okCount := make(map[int64]int)
	for _, c := range calls {
		if want, known := sent[c.id]; !known || want != c.key {
			r.t.Fatalf("event %d handled with key %q, sent with %q (%v)", c.id, c.key, want, known)
		}
		byKey[c.key] = append(byKey[c.key], c)
		if c.ok {
			okCount[c.id]++
		}
	}
	// Under pause every event succeeds once, unless a crash or a slot
	// fenced under load (its unacknowledged chunk comes again) explains a
	// redelivery.
	fenced := r.fencings()
	exactlyOnce := r.pause && !r.crashes && fenced == 0
	if r.pause && !r.crashes && fenced > 0 {
		r.t.Logf("%v slots were fenced under load: redeliveries allowed", fenced)
	}
	for id, key := range sent {
		if okCount[id] == 0 {
			r.t.Fatalf("event %d of key %q was never handled", id, key)
		}
		if exactlyOnce && okCount[id] != 1 {
			r.t.Errorf("event %d of key %q succeeded %d times under pause", id, key, okCount[id])
		}
	}
	order := make(map[int]int)
	for i, n := range ns {
		order[n] = i
	}
	// An event handled successfully under one N is never handled again
	// under another: the old slots are done with it before the new ones
	// start (a retry of a failed attempt may move to the new N). After a
	// crash it may: a lane's handled events whose settle was lost with
	// Postgres are released by the slot's next owner and, when that comes
	// after the seal, carried to the new slot (at least once; order and
	// one handler at a time are still checked below).
	okUnder := make(map[int64]int)
	for _, c := range calls {
		if c.ok && !r.crashes {
			okUnder[c.id] = c.nslots
		}
	}
	for _, c := range calls {
		if n, ok := okUnder[c.id]; ok && n != c.nslots && (c.ok || nIndex(ns, c.nslots) > nIndex(ns, n)) {
			r.t.Errorf("event %d of key %q handled under N=%d and N=%d", c.id, c.key, n, c.nslots)
		}
	}
	slotOf := r.slotsOf(byKey, ns)
	redeliveries := 0
	for key, cs := range byKey {
		sort.Slice(cs, func(i, j int) bool { return cs[i].start.Before(cs[j].start) })
		first := make(map[int64]bool)
		okSeen := make(map[int64]bool)
		var lastFirst, lastOK int64
		for i, c := range cs {
			if i > 0 && c.start.Before(cs[i-1].end) {
				r.t.Fatalf("key %q: event %d (%s, slot %d/%d) started before event %d (%s, slot %d/%d) ended (G2)",
					key, c.id, c.worker, c.slot, c.nslots, cs[i-1].id, cs[i-1].worker, cs[i-1].slot, cs[i-1].nslots)
			}
			if want := slotOf[fmt.Sprintf("%s/%d", key, c.nslots)]; c.slot != want {
				r.t.Fatalf("key %q: event %d on slot %d of %d, its slot is %d (G1)", key, c.id, c.slot, c.nslots, want)
			}
			if i > 0 && order[c.nslots] < order[cs[i-1].nslots] {
				r.t.Fatalf("key %q: event %d on N=%d after event %d on N=%d: an old slot worked after a new one",
					key, c.id, c.nslots, cs[i-1].id, cs[i-1].nslots)
			}
			if first[c.id] {
				redeliveries++
				if !r.pause && redeliveries <= 5 {
					for _, f := range cs[:i] {
						if f.id == c.id {
							r.t.Logf("redelivered: key %q event %d to %s on slot %d/%d at %v, first to %s on slot %d/%d at %v",
								key, c.id, c.worker, c.slot, c.nslots, c.start.Format("05.000"), f.worker, f.slot, f.nslots, f.start.Format("05.000"))
							break
						}
					}
				}
			} else {
				if !r.pause && c.id < lastFirst {
					r.t.Fatalf("key %q: event %d first delivered after event %d (G1 order)", key, c.id, lastFirst)
				}
				first[c.id] = true
				lastFirst = max(lastFirst, c.id)
			}
			if r.pause && c.ok && !okSeen[c.id] {
				if c.id < lastOK {
					for _, x := range cs {
						r.t.Logf("  %s: event %d ok=%v on %s slot %d/%d at %s-%s", key, x.id, x.ok, x.worker, x.slot, x.nslots,
							x.start.Format("05.000"), x.end.Format("05.000"))
					}
					r.t.Fatalf("key %q: event %d succeeded after event %d (G3 pause order)", key, c.id, lastOK)
				}
				okSeen[c.id] = true
				lastOK = c.id
			}
		}
	}
	r.t.Logf("pause %v: %d events, %d keys, %d calls, %d redeliveries (failed attempts included)",
		r.pause, len(sent), len(byKey), len(calls), redeliveries)
}

// slotsOf asks the server for the slot of every key under every N.
func (r *resizeRun) slotsOf(byKey map[string][]call, ns []int) map[string]int {
	r.t.Helper()
	var keys []string
	for k := range byKey {
		keys = append(keys, k)
	}
	out := make(map[string]int)
	for _, n := range ns {
		rows, err := r.env.pool.Query(context.Background(), "select k, pgque.slot_of(k, $2) from unnest($1::text[]) k", keys, n)
		if err != nil {
			r.t.Fatal(err)
		}
		for rows.Next() {
			var k string
			var s int
			if err := rows.Scan(&k, &s); err != nil {
				r.t.Fatal(err)
			}
			out[fmt.Sprintf("%s/%d", k, n)] = s
		}
		if rows.Err() != nil {
			r.t.Fatal(rows.Err())
		}
	}
	return out
}

// TestResizeWhileWorking: three worker processes with random handler
// latencies drain a stream over 500 keys while producers keep sending; the
// consumer is resized 4 -> 16 -> 3 under them. Every guarantee holds across
// both changes, under skip and under pause with failing handlers.
func TestResizeWhileWorking(t *testing.T) {
	t.Parallel()
	t.Run("skip", func(t *testing.T) { t.Parallel(); runResizeWhileWorking(t, false) })
	t.Run("pause with failures", func(t *testing.T) { t.Parallel(); runResizeWhileWorking(t, true) })
}

func runResizeWhileWorking(t *testing.T, pause bool) {
	env := setup(t)
	startFastTicker(t, env.client)
	r := newResizeRun(t, env, pause)
	workers := []string{"p1", "p2", "p3"}
	for _, w := range workers {
		r.start(w, 4)
	}
	stop := make(chan struct{})
	produced := r.produce(stop, 500)
	pgtest.WaitFor(t, 30*time.Second, "a first share of the stream", func() bool { return r.handled() > 500 })
	r.resize(16, workers...)
	pgtest.WaitFor(t, 30*time.Second, "work on 16 slots", func() bool { return r.handled() > r.sentCount()/2 })
	r.resize(3, workers...)
	// A process deployed later with the first N follows the current one.
	late := r.start("p4", 4)
	if late.pc.Slots() != 3 {
		t.Errorf("a process started with the old N works %d slots, want 3", late.pc.Slots())
	}
	close(stop)
	<-produced
	pgtest.WaitFor(t, 90*time.Second, "every event", func() bool { return r.handled() == r.sentCount() })
	r.verify([]int{4, 16, 3})
	if n, err := env.pool.Exec(context.Background(),
		"select 1 from pgque.subscription where sub_name like 'c#%/4' or sub_name like 'c#%/16'"); err != nil || n.RowsAffected() != 0 {
		t.Errorf("subscriptions of the old N left: %v %v", n, err)
	}
}

// TestResizeSurvivesCrashAndRestart: a resize 4 -> 16 is started while a
// worker process holds slots with events in flight; the process crashes
// (its pool is closed, no ack, no release) and Postgres restarts
// immediately (crash recovery). The resize completes and the guarantees
// hold; then 16 -> 3 with a second restart during the drain.
func TestResizeSurvivesCrashAndRestart(t *testing.T) {
	t.Parallel()
	c := pgtest.NewCluster(t, pgcluster.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 180*time.Second)
	defer cancel()
	dsn, err := c.CreateDatabase(ctx, "resize_crash")
	if err != nil {
		t.Fatal(err)
	}
	pgtest.Install(t, dsn)
	pool := pgtest.Pool(t, dsn)
	env := &testEnv{dsn: dsn, pool: pool, client: newClient(t, pool), queue: "q"}
	if _, err := env.client.CreateQueue(ctx, env.queue); err != nil {
		t.Fatal(err)
	}
	startFastTicker(t, env.client)
	r := newResizeRun(t, env, true)
	r.crashes = true
	for _, w := range []string{"p1", "p2", "p3"} {
		r.start(w, 4)
	}
	stop := make(chan struct{})
	produced := r.produce(stop, 500)
	pgtest.WaitFor(t, 30*time.Second, "a first share of the stream", func() bool { return r.handled() > 500 })
	// Crash the process that works the most slots.
	victim := "p1"
	for _, w := range []string{"p2", "p3"} {
		if len(r.procs[w].pc.OwnedSlots()) > len(r.procs[victim].pc.OwnedSlots()) {
			victim = w
		}
	}
	restart := func() {
		r.prodMu.Lock()
		defer r.prodMu.Unlock()
		if err := c.Restart(ctx, pgcluster.ModeImmediate); err != nil {
			t.Fatal(err)
		}
	}
	owned := len(r.procs[victim].pc.OwnedSlots())
	var live []string
	for _, w := range []string{"p1", "p2", "p3"} {
		if w != victim {
			live = append(live, w)
		}
	}
	if err := env.client.ResizeSlots(ctx, env.queue, "c", 16); err != nil {
		t.Fatal(err)
	}
	// Crash the victim: cancel its context (no Stop) and close its
	// connections, with its chunks in flight.
	r.procs[victim].cancel()
	r.procs[victim].pool.Close()
	restart()
	t.Logf("crashed %s (it owned %d slots) and restarted Postgres mid-resize", victim, owned)
	r.waitResize(16, live...)
	pgtest.WaitFor(t, 30*time.Second, "work on 16 slots", func() bool { return r.handled() > r.sentCount()/2 })
	pgtest.WaitFor(t, 20*time.Second, "ResizeSlots(3) after the restart", func() bool {
		err := env.client.ResizeSlots(ctx, env.queue, "c", 3)
		return err == nil || errors.Is(err, pgque.ErrResizeInProgress)
	})
	restart()
	r.waitResize(3, live...)
	close(stop)
	<-produced
	pgtest.WaitFor(t, 90*time.Second, "every event", func() bool { return r.handled() == r.sentCount() })
	r.verify([]int{4, 16, 3})
}

// nIndex is the position of n in ns.
func nIndex(ns []int, n int) int { return slices.Index(ns, n) }

package pgque_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgque/pgque"
	"github.com/pgque/pgque/internal/testing/pgtest"
)

// effectsTable creates the table the transactional handlers of these tests
// write their effects to: one row per applied event.
func effectsTable(t *testing.T, env *testEnv) {
	t.Helper()
	if _, err := env.pool.Exec(context.Background(), `create table effects (ev_id bigint, worker text)`); err != nil {
		t.Fatal(err)
	}
}

// txEffects is a transactional handler's bookkeeping: every call, and a
// handler that writes one effect row per event and fails the first attempt
// of every failEvery-th event after writing (so the failure must roll the
// write back).
type txEffects struct {
	worker    string
	failEvery int64
	mu        sync.Mutex
	calls     map[int64]int
}

func (e *txEffects) handle(ctx context.Context, tx pgx.Tx, m *pgque.Message) error {
	e.mu.Lock()
	if e.calls == nil {
		e.calls = map[int64]int{}
	}
	e.calls[m.ID]++
	e.mu.Unlock()
	if _, err := tx.Exec(ctx, `insert into effects values ($1, $2)`, m.ID, e.worker); err != nil {
		return err
	}
	if e.failEvery > 0 && m.ID%e.failEvery == 0 && m.RetryCount == 0 {
		return errors.New("first attempt fails after writing")
	}
	return nil
}

func (e *txEffects) called(id int64) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.calls[id] > 0
}

// crashObserver blocks the consumer after the handler of the event crash
// picks returned (its transaction is committed, the chunk not acknowledged)
// until the handler's context ends: the test then kills the consumer there.
type crashObserver struct {
	pgque.NopObserver
	crash   func(m *pgque.Message, err error) bool
	mu      sync.Mutex
	done    []int64 // events handled without error, before the crash
	reached chan struct{}
	once    sync.Once
}

func (o *crashObserver) HandleEnd(ctx context.Context, m *pgque.Message, r pgque.HandleResult) {
	o.mu.Lock()
	if r.Err == nil {
		o.done = append(o.done, m.ID)
	}
	crash := o.crash(m, r.Err)
	o.mu.Unlock()
	if crash {
		o.once.Do(func() { close(o.reached) })
		<-ctx.Done()
	}
}

func (o *crashObserver) completed() []int64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]int64(nil), o.done...)
}

// checkExactlyOnce waits until every event in ids has its effect and the
// consumer has nothing left to retry, then checks that each has exactly one.
func checkExactlyOnce(t *testing.T, env *testEnv, ids []int64) {
	t.Helper()
	ctx := context.Background()
	count := func(q string, args ...any) int {
		var n int
		if err := env.pool.QueryRow(ctx, q, args...).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if !pgtest.Eventually(ctx, 60*time.Second, func() bool {
		return count(`select count(distinct ev_id) from effects where ev_id = any($1)`, ids) == len(ids) &&
			count(`select count(*) from pgque.retry_queue`) == 0
	}) {
		t.Fatalf("after 60 s: %d of %d events have effects, %d retries pending",
			count(`select count(distinct ev_id) from effects where ev_id = any($1)`, ids), len(ids),
			count(`select count(*) from pgque.retry_queue`))
	}
	if dup := count(`select count(*) from (select ev_id from effects group by ev_id having count(*) > 1) d`); dup != 0 {
		t.Errorf("%d events have their effect more than once", dup)
	}
	if n := count(`select count(*) from effects`); n != len(ids) {
		t.Errorf("%d effects for %d events", n, len(ids))
	}
}

func sendN(t *testing.T, env *testEnv, n int, keys int) []int64 {
	t.Helper()
	events := make([]pgque.Event, n)
	for i := range events {
		events[i] = pgque.Event{Payload: i}
		if keys > 0 {
			events[i].PartitionKey = fmt.Sprintf("k%d", i%keys)
		}
	}
	ids, err := env.client.SendBatch(context.Background(), env.queue, events)
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// TestTxExactlyOnceConsumerCrash kills a plain consumer after its handler's
// transaction committed and before the chunk was acknowledged: the next
// consumer is handed the chunk again, and the completed events' handlers
// roll back (their effects stay single). Failed first attempts roll their
// effects back and are retried. Then a consumer stops after acknowledging
// (before its next receive), and the next one applies only the new events.
func TestTxExactlyOnceConsumerCrash(t *testing.T) {
	t.Parallel()
	env := setup(t)
	ctx := context.Background()
	effectsTable(t, env)
	if _, err := env.client.Subscribe(ctx, env.queue, "c"); err != nil {
		t.Fatal(err)
	}
	ids := sendN(t, env, 20, 0)
	txTick(t, env)
	last := ids[len(ids)-1]
	obs := &crashObserver{reached: make(chan struct{}), crash: func(m *pgque.Message, err error) bool { return m.ID == last }}
	clientA, err := pgque.NewClient(env.pool, &pgque.Config{Logger: testLogger(t), Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	a := &txEffects{worker: "a", failEvery: 4}
	noRetryDelay := func(int) time.Duration { return 0 }
	conA, err := clientA.NewConsumer(&pgque.ConsumerConfig{Queue: env.queue, Consumer: "c", HandlerTx: a.handle, RetryDelay: noRetryDelay})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, kill := context.WithCancel(ctx)
	if err := conA.Start(runCtx); err != nil {
		t.Fatal(err)
	}
	<-obs.reached
	kill()
	stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_ = conA.Stop(stopCtx)
	committed := obs.completed()
	if len(committed) == 0 {
		t.Fatal("the killed consumer completed nothing")
	}

	// The ticker also puts the retries back into the queue.
	startTicker(t, env.client)
	b := &txEffects{worker: "b", failEvery: 4}
	conB := startConsumer(t, env, &pgque.ConsumerConfig{Queue: env.queue, Consumer: "c", HandlerTx: b.handle, RetryDelay: noRetryDelay})
	checkExactlyOnce(t, env, ids)
	if !b.called(committed[0]) {
		t.Errorf("event %d, completed before the crash, was not redelivered", committed[0])
	}
	// Stop after the acknowledgement, before the next receive.
	if err := conB.Stop(stopCtx); err != nil {
		t.Fatal(err)
	}
	more := sendN(t, env, 10, 0)
	txTick(t, env)
	c := &txEffects{worker: "c"}
	startConsumer(t, env, &pgque.ConsumerConfig{Queue: env.queue, Consumer: "c", HandlerTx: c.handle})
	checkExactlyOnce(t, env, append(ids, more...))
	if c.called(ids[0]) {
		t.Errorf("event %d of the acknowledged chunk was delivered again", ids[0])
	}
}

// TestTxExactlyOncePartitionedCrash kills a worker of a partitioned consumer
// after one of its handlers committed, before the chunk's acknowledgement;
// another worker takes the slots over and every event's effect exists once.
// Both failure policies, with and without key lanes; first attempts of some
// events fail after writing.
func TestTxExactlyOncePartitionedCrash(t *testing.T) {
	t.Parallel()
	for _, policy := range []pgque.FailurePolicy{pgque.FailurePolicySkip, pgque.FailurePolicyPause} {
		for _, lanes := range []int{1, 4} {
			t.Run(fmt.Sprintf("%v/lanes%d", policy, lanes), func(t *testing.T) {
				t.Parallel()
				env := setup(t)
				ctx := context.Background()
				effectsTable(t, env)
				cfg := pgque.PartitionedConsumerConfig{Queue: env.queue, Consumer: "c", Slots: 2, LeaseTTL: time.Second,
					ClaimInterval: 100 * time.Millisecond, MaxWorkersPerSlot: lanes, FailurePolicy: policy,
					RetryDelay: func(int) time.Duration { return 0 }}
				if _, err := env.client.SubscribeSlots(ctx, env.queue, "c", 2, policy); err != nil {
					t.Fatal(err)
				}
				ids := sendN(t, env, 60, 6)
				txTick(t, env)
				perSlot := map[int]int{}
				obs := &crashObserver{reached: make(chan struct{}), crash: func(m *pgque.Message, err error) bool {
					if err != nil {
						return false
					}
					perSlot[m.Slot]++
					return perSlot[m.Slot] == 5
				}}
				clientA, err := pgque.NewClient(env.pool, &pgque.Config{Logger: testLogger(t), Observer: obs})
				if err != nil {
					t.Fatal(err)
				}
				a := &txEffects{worker: "a", failEvery: 7}
				cfgA := cfg
				cfgA.WorkerID, cfgA.HandlerTx = "a", a.handle
				pcA, err := clientA.NewPartitionedConsumer(&cfgA)
				if err != nil {
					t.Fatal(err)
				}
				runCtx, kill := context.WithCancel(ctx)
				if err := pcA.Start(runCtx); err != nil {
					t.Fatal(err)
				}
				<-obs.reached
				kill()
				stopCtx, cancel := context.WithTimeout(ctx, 15*time.Second)
				defer cancel()
				_ = pcA.Stop(stopCtx)
				committed := obs.completed()

				startTicker(t, env.client)
				b := &txEffects{worker: "b", failEvery: 7}
				cfgB := cfg
				cfgB.WorkerID, cfgB.HandlerTx = "b", b.handle
				startProcess(t, env, cfgB)
				checkExactlyOnce(t, env, ids)
				redelivered := 0
				for _, id := range committed {
					if b.called(id) {
						redelivered++
					}
				}
				if redelivered == 0 {
					t.Errorf("none of the %d events completed before the crash was redelivered", len(committed))
				}
			})
		}
	}
}

// TestTxFencing takes a slot's lease over while a handler's transaction is
// open: its completion fails with ErrLeaseLost and its effect is rolled
// back.
func TestTxFencing(t *testing.T) {
	t.Parallel()
	env := setup(t)
	ctx := context.Background()
	effectsTable(t, env)
	stolen := make(chan struct{})
	inHandler := make(chan int64, 1)
	var once sync.Once
	handler := func(ctx context.Context, tx pgx.Tx, m *pgque.Message) error {
		if _, err := tx.Exec(ctx, `insert into effects values ($1, 'fenced')`, m.ID); err != nil {
			return err
		}
		first := false
		once.Do(func() { first = true })
		if first {
			inHandler <- m.ID
			<-stolen
		}
		return nil
	}
	results := make(chan error, 100)
	obs := &resultObserver{results: results}
	client, err := pgque.NewClient(env.pool, &pgque.Config{Logger: testLogger(t), Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	pc, err := client.NewPartitionedConsumer(&pgque.PartitionedConsumerConfig{Queue: env.queue, Consumer: "c", Slots: 1,
		WorkerID: "a", HandlerTx: handler})
	if err != nil {
		t.Fatal(err)
	}
	if err := pc.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stopCtx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		_ = pc.Stop(stopCtx)
	})
	sendN(t, env, 3, 1)
	startTicker(t, env.client)
	id := <-inHandler
	// A takeover: a new owner, epoch and token.
	if _, err := env.pool.Exec(ctx, `update pgque.slot_lease set sl_owner = 'thief', sl_epoch = sl_epoch + 1,
		sl_token = pgque._token_hash(gen_random_uuid())`); err != nil {
		t.Fatal(err)
	}
	close(stolen)
	if err := <-results; !errors.Is(err, pgque.ErrLeaseLost) {
		t.Fatalf("handler of event %d after the takeover: %v, want ErrLeaseLost", id, err)
	}
	var n int
	if err := env.pool.QueryRow(ctx, `select count(*) from effects where ev_id = $1`, id).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("the fenced handler's effect committed (%d rows)", n)
	}
}

// resultObserver reports every handler call's result.
type resultObserver struct {
	pgque.NopObserver
	results chan error
}

func (o *resultObserver) HandleEnd(_ context.Context, _ *pgque.Message, r pgque.HandleResult) {
	select {
	case o.results <- r.Err:
	default:
	}
}

// TestTxLanesHeldKeyCompletes holds a slow key's lane across its chunk's
// acknowledgement (the slot moves on with the other keys) and then lets
// it finish: its transactional completion, made after the ack, is proved
// by the hold and commits once; nothing is retried or applied twice.
func TestTxLanesHeldKeyCompletes(t *testing.T) {
	t.Parallel()
	env := setup(t)
	effectsTable(t, env)
	startFastTicker(t, env.client)
	gate := make(chan struct{})
	stuck := make(chan struct{})
	var mu sync.Mutex
	slowRuns := 0
	startProcess(t, env, pgque.PartitionedConsumerConfig{
		Queue: env.queue, Consumer: "c", Slots: 1, WorkerID: "w", BatchSize: 50,
		PollInterval: 50 * time.Millisecond,
		HandlerTx: func(ctx context.Context, tx pgx.Tx, m *pgque.Message) error {
			if _, err := tx.Exec(ctx, `insert into effects values ($1, 'w')`, m.ID); err != nil {
				return err
			}
			if m.PartitionKey == "slow" {
				mu.Lock()
				slowRuns++
				first := slowRuns == 1
				mu.Unlock()
				if first {
					close(stuck)
					select {
					case <-gate:
					case <-ctx.Done():
						return ctx.Err()
					}
				}
			}
			return nil
		},
	})
	sent := sendSeq(t, env, []string{"slow"}, 3)
	select {
	case <-stuck:
	case <-time.After(30 * time.Second):
		t.Fatal("the slow key was not delivered")
	}
	others := make([]string, 20)
	for i := range others {
		others[i] = fmt.Sprintf("k%d", i)
	}
	for range 3 {
		sent = merge(sent, sendSeq(t, env, others, 2))
	}
	ctx := context.Background()
	pgtest.WaitFor(t, 60*time.Second, "the other keys' effects while the slow key is held", func() bool {
		var n int
		if err := env.pool.QueryRow(ctx, `select count(*) from effects`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == len(sent)-3
	})
	close(gate)
	var ids []int64
	for id := range sent {
		ids = append(ids, id)
	}
	checkExactlyOnce(t, env, ids)
	mu.Lock()
	defer mu.Unlock()
	if slowRuns != 3 {
		t.Errorf("the slow key's handler ran %d times for its 3 events (a held completion failed and was retried?)", slowRuns)
	}
}

package pgque_test

// What the pause policy must not do, whatever its speed:
// TestPauseWritesNothingWithoutFailures (no failures: no rows of its own)
// and TestPauseHotBlockedKey (a blocked key with 10k held events pins
// nothing and delivers them in order once released). What pause costs in
// throughput is measured by `pgque bench --suite pause`, on a machine the
// rest of the test suite does not share.

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgque/pgque"
	"github.com/pgque/pgque/internal/dbq"
	"github.com/pgque/pgque/internal/testing/pgtest"
)

// forceTick makes a tick of queue now, covering every committed event.
func forceTick(t testing.TB, pool *pgxpool.Pool, queue string) {
	t.Helper()
	err := pgx.BeginFunc(context.Background(), pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(context.Background(), `select pgque.force_next_tick($1)`, queue); err != nil {
			return err
		}
		_, err := tx.Exec(context.Background(), `select pgque.ticker($1)`, queue)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// drain is a partitioned consumer over a fresh queue with a backlog that
// becomes visible in one batch when start is called.
type drain struct {
	t       *testing.T
	env     *testEnv
	queue   string
	n       int
	handled atomic.Int64
	stop    func()
}

// newDrain creates a queue, subscribes a partitioned consumer with policy
// and sends n events over nkeys keys; nothing is ticked yet.
func newDrain(t *testing.T, env *testEnv, policy pgque.FailurePolicy, round, n, nkeys int) *drain {
	t.Helper()
	ctx := context.Background()
	d := &drain{t: t, env: env, queue: fmt.Sprintf("drain%d", round), n: n}
	if _, err := env.client.CreateQueue(ctx, d.queue); err != nil {
		t.Fatal(err)
	}
	pc, err := env.client.NewPartitionedConsumer(&pgque.PartitionedConsumerConfig{
		Queue: d.queue, Consumer: "c", Slots: 4, FailurePolicy: policy, PollInterval: 10 * time.Millisecond,
		// One event at a time per slot: on a loaded machine a lane of an
		// instant handler can be descheduled past the hold grace, and a
		// held key writes key_block and deferred rows (and waits for a
		// tick this test does not make), which is not what it checks.
		MaxWorkersPerSlot: 1,
		Handler: func(context.Context, *pgque.Message) error {
			d.handled.Add(1)
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := pc.Start(ctx); err != nil {
		t.Fatal(err)
	}
	d.stop = func() {
		if err := pc.Stop(ctx); err != nil {
			t.Error(err)
		}
	}
	for off := 0; off < n; off += 1000 {
		events := make([]pgque.Event, 0, 1000)
		for i := off; i < min(off+1000, n); i++ {
			events = append(events, pgque.Event{Type: "e", Payload: i, PartitionKey: fmt.Sprintf("k%d", rand.IntN(nkeys))})
		}
		if _, err := env.client.SendBatch(ctx, d.queue, events); err != nil {
			t.Fatal(err)
		}
	}
	return d
}

// start makes the backlog visible (one tick).
func (d *drain) start() { forceTick(d.t, d.env.pool, d.queue) }

// wait waits for the drain to end and stops the consumer.
func (d *drain) wait() {
	pgtest.WaitFor(d.t, 60*time.Second, "the drain", func() bool { return d.handled.Load() == int64(d.n) })
	d.stop()
}

// tableWrites reads rows inserted, updated and deleted per pgque table of
// the database dsn names, event tables summed as "event_*". It first
// closes pool, so that every backend that wrote reports its counts.
func tableWrites(t *testing.T, pool *pgxpool.Pool, dsn string) map[string][3]int64 {
	t.Helper()
	pool.Close()
	conn := pgtest.Conn(t, dsn)
	read := func() map[string][3]int64 {
		ctx := context.Background()
		if _, err := conn.Exec(ctx, `select pg_stat_clear_snapshot()`); err != nil {
			t.Fatal(err)
		}
		rows, err := conn.Query(ctx, `select relname, n_tup_ins, n_tup_upd, n_tup_del from pg_stat_user_tables where schemaname = 'pgque'`)
		if err != nil {
			t.Fatal(err)
		}
		out := make(map[string][3]int64)
		var name string
		var w [3]int64
		if _, err := pgx.ForEachRow(rows, []any{&name, &w[0], &w[1], &w[2]}, func() error {
			if strings.HasPrefix(name, "event_") {
				name = "event_*"
			}
			s := out[name]
			out[name] = [3]int64{s[0] + w[0], s[1] + w[1], s[2] + w[2]}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		return out
	}
	// A backend reports its counts as it exits: wait until every other
	// backend of the database has gone.
	pgtest.WaitFor(t, 30*time.Second, "the pool's backends to exit", func() bool {
		var n int
		if err := conn.QueryRow(context.Background(), `select count(*) from pg_stat_activity
			where datname = current_database() and pid <> pg_backend_pid()`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 0
	})
	// PostgreSQL 15 and later hold the counts in shared memory, flushed
	// before the backend leaves pg_stat_activity: one read is final. The
	// statistics collector of older versions receives them later and says
	// nothing when it has: there the counts are taken once two reads a
	// collector interval apart agree.
	prev := read()
	if major, _ := pgtest.ServerVersion(t); major >= 15 {
		return prev
	}
	for range 50 {
		time.Sleep(500 * time.Millisecond) // PostgreSQL 14's collector gives no signal; see above
		cur := read()
		if fmt.Sprint(cur) == fmt.Sprint(prev) {
			return cur
		}
		prev = cur
	}
	t.Fatal("table statistics did not settle")
	return nil
}

// TestPauseWritesNothingWithoutFailures: without failures, pause writes
// nothing more than skip: no row of pgque.deferred or pgque.key_block, and
// the same writes as skip on every other table. Each policy runs in its
// own database of the same cluster (so that the table statistics are its
// own); in each round both drain the same backlog, each policy first in
// every other round.
func TestPauseWritesNothingWithoutFailures(t *testing.T) {
	const (
		rounds = 2
		events = 10000
		keys   = 200
	)
	envs := map[pgque.FailurePolicy]*testEnv{pgque.FailurePolicySkip: setup(t), pgque.FailurePolicyPause: setup(t)}
	for r := range rounds {
		order := []pgque.FailurePolicy{pgque.FailurePolicySkip, pgque.FailurePolicyPause}
		if r%2 == 1 {
			order[0], order[1] = order[1], order[0]
		}
		var drains []*drain
		for _, p := range order {
			drains = append(drains, newDrain(t, envs[p], p, r, events, keys))
		}
		for _, d := range drains {
			d.start()
		}
		for _, d := range drains {
			d.wait()
		}
	}

	writes := map[pgque.FailurePolicy]map[string][3]int64{}
	for p, env := range envs {
		writes[p] = tableWrites(t, env.pool, env.dsn)
	}
	names := []string{}
	for name := range writes[pgque.FailurePolicySkip] {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		s, p := writes[pgque.FailurePolicySkip][name], writes[pgque.FailurePolicyPause][name]
		if s != [3]int64{} || p != [3]int64{} {
			t.Logf("%-14s ins/upd/del  skip %v  pause %v", name, s, p)
		}
	}
	for _, name := range []string{"deferred", "key_block"} {
		if w, ok := writes[pgque.FailurePolicyPause][name]; !ok || w != [3]int64{} {
			t.Errorf("pause wrote %v (ins/upd/del) to pgque.%s without a failure (found %v)", w, name, ok)
		}
	}
	// Every row the event path writes is the same under both policies;
	// the bookkeeping rows (batches, progress, leases) follow the number
	// of chunks and polls, which timing may change by a few.
	for _, name := range []string{"event_*", "tick", "retry_queue", "dead_letter"} {
		if s, p := writes[pgque.FailurePolicySkip][name], writes[pgque.FailurePolicyPause][name]; s != p {
			t.Errorf("pgque.%s: pause wrote %v, skip %v", name, p, s)
		}
	}
	for _, name := range names {
		s, p := writes[pgque.FailurePolicySkip][name], writes[pgque.FailurePolicyPause][name]
		sum := func(w [3]int64) int64 { return w[0] + w[1] + w[2] }
		if d := sum(p) - sum(s); d > sum(s)/20+10 {
			t.Errorf("pgque.%s: pause wrote %d rows more than skip (%v vs %v)", name, d, p, s)
		}
	}
}

// TestPauseHotBlockedKey: a key blocked on a slot while 10k of its events
// arrive, mixed with events of healthy keys of the same slot. The healthy
// events are all handled, the 10k are set aside, the slot's cursor moves
// past them and the event tables rotate; once the head succeeds, the 10k
// are delivered in ev_id order, exactly once, as first deliveries. What
// the blocked key costs the healthy keys' throughput is measured by
// `pgque bench --suite pause`.
func TestPauseHotBlockedKey(t *testing.T) {
	const (
		nslots = 2
		hot    = 10000
	)
	env := setup(t)
	ctx := context.Background()
	k := "hot"
	slot := slotOf(t, env, k, nslots)
	hkeys := keysOnSlot(t, env, "healthy", nslots, slot, 20)
	startTicker(t, env.client)

	var failK atomic.Bool
	var mu sync.Mutex
	var kOK []pcall                     // the hot key's successful calls, in order
	healthyDone := map[int64]struct{}{} // healthy events handled
	startProcess(t, env, pgque.PartitionedConsumerConfig{
		Queue: env.queue, Consumer: "c", Slots: nslots, FailurePolicy: pgque.FailurePolicyPause,
		PollInterval: 50 * time.Millisecond,
		RetryDelay:   func(int) time.Duration { return time.Hour },
		Handler: func(_ context.Context, m *pgque.Message) error {
			now := time.Now()
			mu.Lock()
			defer mu.Unlock()
			if m.PartitionKey != k {
				healthyDone[m.ID] = struct{}{}
				return nil
			}
			if failK.Load() {
				return fmt.Errorf("the hot key's head keeps failing")
			}
			kOK = append(kOK, pcall{id: m.ID, retry: m.RetryCount, start: now})
			return nil
		},
	})

	// send sends, in one transaction, n healthy events, each followed by
	// hotEach events of the hot key; it returns the ids of each.
	send := func(n, hotEach int) (healthyIDs, hotIDs []int64) {
		var events []pgque.Event
		var isHot []bool
		for i := range n {
			events = append(events, pgque.Event{Type: "e", Payload: i, PartitionKey: hkeys[i%len(hkeys)]})
			isHot = append(isHot, false)
			for range hotEach {
				events = append(events, pgque.Event{Type: "e", Payload: i, PartitionKey: k})
				isHot = append(isHot, true)
			}
		}
		ids, err := env.client.SendBatch(ctx, env.queue, events)
		if err != nil {
			t.Fatal(err)
		}
		for i, id := range ids {
			if isHot[i] {
				hotIDs = append(hotIDs, id)
			} else {
				healthyIDs = append(healthyIDs, id)
			}
		}
		return healthyIDs, hotIDs
	}
	// handled reports whether every one of ids was handled.
	handled := func(ids []int64) bool {
		mu.Lock()
		defer mu.Unlock()
		for _, id := range ids {
			if _, ok := healthyDone[id]; !ok {
				return false
			}
		}
		return true
	}

	// 1. Block the hot key: its head fails, with an hour's retry delay.
	failK.Store(true)
	_, head := send(1, 1)
	pgtest.WaitFor(t, 20*time.Second, "the hot key to be blocked", func() bool {
		b, ok := blockedKey(t, env, "c", pgque.KeyOf(k))
		return ok && b.State == pgque.BlockStateBlocked
	})

	// 2. 10k events of the hot key arrive, mixed with healthy ones, in ten
	// transactions: each is set aside, and the healthy ones are handled.
	var held []int64
	var mixed []int64
	for range hot / 1000 {
		h, ids := send(100, 10)
		held = append(held, ids...)
		mixed = append(mixed, h...)
	}
	pgtest.WaitFor(t, 120*time.Second, "10k held events and the healthy ones beside them", func() bool {
		b, _ := blockedKey(t, env, "c", pgque.KeyOf(k))
		return handled(mixed) && b.Deferred == hot
	})
	if b, _ := blockedKey(t, env, "c", pgque.KeyOf(k)); b.Deferred != hot || b.HeadID != head[0] {
		t.Fatalf("blocked key %+v, want head %d and %d deferred", b, head[0], hot)
	}

	// 3. Nothing is pinned: the slot's cursor moves (its lag keeps only the
	// held events) and, with a short rotation period, maint() rotates
	// through every event table, truncating the ones that held the 10k.
	q := dbq.New(env.pool)
	pgtest.WaitFor(t, 20*time.Second, "the slot's cursor to pass every event", func() bool {
		st, err := q.PartitionSlotStatus(ctx, env.queue, "c")
		if err != nil {
			t.Fatal(err)
		}
		// The lag counts the blocked key's held events: the cursor has
		// passed everything when only they are left.
		return st[slot].Lag-st[slot].Held-st[slot].Retrying == 0
	})
	lastTick := func() int64 {
		var tick int64
		if err := env.pool.QueryRow(ctx, `select last_tick from pgque.get_consumer_info($1, $2)`,
			env.queue, fmt.Sprintf("c#%d/%d", slot, nslots)).Scan(&tick); err != nil {
			t.Fatal(err)
		}
		return tick
	}
	tickBefore := lastTick()
	if err := env.client.SetQueueConfig(ctx, env.queue, pgque.QueueRotationPeriod(10*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	curTable := func() (cur, ntables int) {
		if err := env.pool.QueryRow(ctx, `select queue_cur_table, queue_ntables from pgque.get_queue_info($1)`, env.queue).Scan(&cur, &ntables); err != nil {
			t.Fatal(err)
		}
		return cur, ntables
	}
	prev, ntables := curTable()
	switches := 0
	// Each check sends a few events (a table is switched only when the
	// consumers have moved on, which needs new ticks) and runs maint():
	// the waiting loop's own period lets the 10 ms rotation period pass.
	pgtest.WaitFor(t, 30*time.Second, "the event tables to rotate", func() bool {
		send(5, 0)
		if _, err := q.Maint(ctx); err != nil {
			t.Fatal(err)
		}
		if cur, _ := curTable(); cur != prev {
			switches++
			prev = cur
		}
		return switches > ntables
	})
	tickAfter := lastTick()
	t.Logf("the slot's cursor moved from tick %d to %d; the queue switched tables %d times (%d tables)", tickBefore, tickAfter, switches, ntables)
	if tickAfter <= tickBefore {
		t.Errorf("the slot's cursor did not move (tick %d)", tickAfter)
	}
	if b, _ := blockedKey(t, env, "c", pgque.KeyOf(k)); b.Deferred != hot {
		t.Fatalf("after rotation the blocked key holds %d events, want %d", b.Deferred, hot)
	}

	// 4. The head succeeds on a retry made due now: the 10k follow, in
	// ev_id order, exactly once, as first deliveries.
	failK.Store(false)
	if ok, err := env.client.RetryKeyNow(ctx, env.queue, "c", pgque.KeyOf(k)); err != nil || !ok {
		t.Fatalf("RetryKeyNow = %v, %v", ok, err)
	}
	want := append(slices.Clone(head), held...)
	pgtest.WaitFor(t, 120*time.Second, "the held events", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(kOK) >= len(want)
	})
	pgtest.WaitFor(t, 20*time.Second, "the block to clear", func() bool { return len(blockedKeys(t, env, "c")) == 0 })
	mu.Lock()
	defer mu.Unlock()
	got := make([]int64, len(kOK))
	for i, c := range kOK {
		got[i] = c.id
		// The head was retried once; waiting is never a retry.
		if (i == 0 && c.retry != 1) || (i > 0 && c.retry != 0) {
			t.Fatalf("hot key call %d (id %d) had retry count %d", i, c.id, c.retry)
		}
	}
	if !slices.Equal(got, want) {
		t.Fatalf("the hot key's successful calls are not its %d events in ev_id order, once each (got %d calls)", len(want), len(got))
	}
}

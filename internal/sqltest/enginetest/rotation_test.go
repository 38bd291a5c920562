package enginetest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgque/pgque/internal/testing/pgtest"
)

// setupRotation gives a rotation test a database with queue "q" that may
// rotate every millisecond, consumers registered, and a pool on it.
func setupRotation(t *testing.T, consumers ...string) (dsn string, pool beginner) {
	t.Helper()
	dsn, pool = setupDB(t)
	newQueue(t, pool, "q", consumers...)
	exec(t, pool, "select pgque.set_queue_config('q', 'rotation_period', '1 ms')")
	return dsn, pool
}

// tableState is what one event partition holds, seen from outside.
type tableState struct {
	Rows  int64
	Bytes int64
}

func tableStates(t testing.TB, q db, tables []string) []tableState {
	t.Helper()
	var out []tableState
	for _, tbl := range tables {
		var s tableState
		err := q.QueryRow(context.Background(),
			fmt.Sprintf("select count(*), pg_catalog.pg_relation_size('%s') from %s", tbl, tbl)).Scan(&s.Rows, &s.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, s)
	}
	return out
}

func curTable(t testing.TB, q db) int32 {
	t.Helper()
	return scalar[int32](t, q, "select queue_cur_table from pgque.queue where queue_name = 'q'")
}

// maintRotate runs maint() once the rotation period (1 ms) has passed. It
// fails the test when maint() blocks for long: rotation must not wait
// behind an open transaction.
func maintRotate(t testing.TB, q db) {
	t.Helper()
	waitRotationDue(t, q)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := q.Exec(ctx, "select pgque.maint()"); err != nil {
		t.Fatalf("maint(): %v", err)
	}
}

// sendN sends n events in one send_batch and returns their ids.
func sendN(t testing.TB, q db, n int, tag string) []int64 {
	t.Helper()
	return scalar[[]int64](t, q, `select pgque.send_batch('q', 'r',
		array(select jsonb_build_object('tag', $2::text, 'i', g) from generate_series(1, $1) g))`, n, tag)
}

// TestRotationWithLaggingConsumer: rotation never truncates a table holding
// events a lagging consumer still needs; once it catches up, the old tables
// are truncated and the event tables shrink back to nothing.
func TestRotationWithLaggingConsumer(t *testing.T) {
	t.Parallel()
	_, pool := setupRotation(t, "fast", "slow")
	tables := eventTables(t, pool, "q")
	if cur := curTable(t, pool); cur != 0 {
		t.Fatalf("a new queue writes to table %d, want 0", cur)
	}

	var sent []int64
	fastGot := map[int64]int{}
	fastDrain := func() {
		for _, evs := range drainBatches(t, pool, "q", "fast") {
			for _, e := range evs {
				fastGot[e.ID]++
			}
		}
	}
	// Round 0 writes table 0; the fast consumer reads it, the slow one not.
	sent = append(sent, sendN(t, pool, 2000, "r0")...)
	tick(t, pool, "q")
	fastDrain()
	table0 := tableStates(t, pool, tables)[0]
	if table0.Rows != 2000 || table0.Bytes == 0 {
		t.Fatalf("table 0 after round 0: %+v, want 2000 rows", table0)
	}

	// Rotations to table 1 and then 2 truncate only empty tables.
	for round, want := range []int32{1, 2} {
		maintRotate(t, pool)
		if cur := curTable(t, pool); cur != want {
			t.Fatalf("after rotation %d the current table is %d, want %d", round+1, cur, want)
		}
		sent = append(sent, sendN(t, pool, 500, fmt.Sprint("r", round+1))...)
		tick(t, pool, "q")
		fastDrain()
	}

	// Table 0 is next, but the slow consumer has not read it: maint must
	// leave it alone, however often it runs.
	for range 3 {
		maintRotate(t, pool)
	}
	if cur := curTable(t, pool); cur != 2 {
		t.Fatalf("rotation moved on to table %d while the slow consumer still needs table 0", cur)
	}
	if got := tableStates(t, pool, tables)[0]; got != table0 {
		t.Fatalf("table 0 changed while pinned by the slow consumer: %+v, was %+v", got, table0)
	}
	// Nor lock the table to find that out: every reader of the queue's
	// events would queue behind the request, on each maint() until the
	// slow consumer caught up.
	waitRotationDue(t, pool)
	tx, err := pool.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	exec(t, tx, "select pgque.maint()")
	held := scalar[bool](t, tx, `select exists (select 1 from pg_catalog.pg_locks
		where pid = pg_catalog.pg_backend_pid() and relation = $1::regclass and mode = 'AccessExclusiveLock')`, tables[0])
	if err := tx.Rollback(context.Background()); err != nil {
		t.Fatal(err)
	}
	if held {
		t.Fatal("maint() locked table 0 while the slow consumer pins it")
	}

	// The slow consumer catches up and gets every event, once.
	slowGot := map[int64]int{}
	for _, evs := range drainBatches(t, pool, "q", "slow") {
		checkOrdered(t, "slow batch", evs)
		for _, e := range evs {
			slowGot[e.ID]++
		}
	}
	for name, got := range map[string]map[int64]int{"fast": fastGot, "slow": slowGot} {
		if len(got) != len(sent) {
			t.Errorf("%s consumer got %d distinct events, want %d", name, len(got), len(sent))
		}
		for _, id := range sent {
			if got[id] != 1 {
				t.Errorf("%s consumer got event %d %d times, want 1", name, id, got[id])
			}
		}
	}

	// Now table 0 is truncated and becomes current; then 1 and 2 follow.
	before := tableStates(t, pool, tables)
	maintRotate(t, pool)
	if cur := curTable(t, pool); cur != 0 {
		t.Fatalf("after the slow consumer caught up the current table is %d, want 0", cur)
	}
	if got := tableStates(t, pool, tables); got[0] != (tableState{}) || got[1] != before[1] || got[2] != before[2] {
		t.Fatalf("after rotating to table 0: %+v, want table 0 empty and the others untouched (%+v)", got, before)
	}
	maintRotate(t, pool)
	maintRotate(t, pool)
	after := tableStates(t, pool, tables)
	for n, s := range after {
		if s != (tableState{}) {
			t.Errorf("table %s after a full rotation cycle: %+v, want empty and 0 bytes (was %+v)", tables[n], s, before[n])
		}
	}
	if cur := curTable(t, pool); cur != 2 {
		t.Errorf("after a full cycle the current table is %d, want 2", cur)
	}
	// And the queue still works.
	id := scalar[int64](t, pool, "select pgque.send('q', '{\"after\": true}'::jsonb)")
	tick(t, pool, "q")
	for _, c := range []string{"fast", "slow"} {
		batches := drainBatches(t, pool, "q", c)
		if len(batches) != 1 || !slices.Equal(evIDs(batches[0]), []int64{id}) {
			t.Errorf("%s after rotation got %v, want [[%d]]", c, batchIDs(batches), id)
		}
	}
}

// TestRotationWaitsForOpenProducer: a producer transaction left open while
// rotation is attempted holds a lock on the table it wrote; rotation does
// not truncate that table until the transaction ends, and its events are
// delivered.
func TestRotationWaitsForOpenProducer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn, pool := setupRotation(t, "c")
	tables := eventTables(t, pool, "q")

	// Table 0 gets one event that c consumes, so only the open producer can
	// keep it.
	consumed := scalar[int64](t, pool, "select pgque.insert_event('q', 't', 'consumed')")
	tick(t, pool, "q")
	if b := drainBatches(t, pool, "q", "c"); len(b) != 1 || len(b[0]) != 1 || b[0][0].ID != consumed {
		t.Fatalf("first batch: %v", batchIDs(b))
	}
	producer := pgtest.Conn(t, dsn)
	ptx, err := producer.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer ptx.Rollback(ctx)
	openIDs := []int64{
		scalar[int64](t, ptx, "select pgque.insert_event('q', 't', 'open 1')"),
		scalar[int64](t, ptx, "select pgque.send('q', 't', '{\"open\": 2}'::jsonb, 'key')"),
	}

	// Rotate to table 1, then 2: these tables are free.
	maintRotate(t, pool)
	maintRotate(t, pool)
	if cur := curTable(t, pool); cur != 2 {
		t.Fatalf("current table = %d, want 2", cur)
	}
	// Table 0 is next, and the open producer holds a lock on it.
	for range 2 {
		maintRotate(t, pool)
		if cur := curTable(t, pool); cur != 2 {
			t.Fatalf("rotation switched to table %d while a producer transaction holding a lock on it is open", cur)
		}
		if rows := tableStates(t, pool, tables)[0].Rows; rows != 1 {
			t.Fatalf("table 0 holds %d committed rows while the producer is open, want 1 (not truncated)", rows)
		}
	}
	var locked bool
	if err := pool.QueryRow(ctx, `select exists (select 1 from pg_catalog.pg_locks
		where pid = $1 and relation = $2::regclass and granted)`, producer.PgConn().PID(), tables[0]).Scan(&locked); err != nil {
		t.Fatal(err)
	}
	if !locked {
		t.Fatalf("the open producer holds no lock on %s; the test does not test what it says", tables[0])
	}

	// Other producers and the ticker are not held up meanwhile.
	other := scalar[int64](t, pool, "select pgque.insert_event('q', 't', 'other')")
	tick(t, pool, "q")
	if b := drainBatches(t, pool, "q", "c"); len(b) != 1 || !slices.Equal(evIDs(b[0]), []int64{other}) {
		t.Fatalf("batch while the producer is open: %v, want [[%d]]", batchIDs(b), other)
	}

	if err := ptx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	// Committed but not yet consumed: still pinned.
	maintRotate(t, pool)
	if cur := curTable(t, pool); cur != 2 {
		t.Fatalf("rotation truncated table 0 holding committed events c has not consumed (current = %d)", cur)
	}
	tick(t, pool, "q")
	b := drainBatches(t, pool, "q", "c")
	if len(b) != 1 || !slices.Equal(evIDs(b[0]), openIDs) {
		t.Fatalf("batch after the producer committed: %v, want [%v]", batchIDs(b), openIDs)
	}
	if k := b[0][1].Extra1; k == nil || *k != "key" {
		t.Errorf("partition key of event %d = %v, want key", openIDs[1], k)
	}
	maintRotate(t, pool)
	if cur := curTable(t, pool); cur != 0 {
		t.Fatalf("after the producer ended and c consumed, current table = %d, want 0", cur)
	}
	if s := tableStates(t, pool, tables)[0]; s != (tableState{}) {
		t.Errorf("table 0 after rotation: %+v, want truncated", s)
	}
}

// TestConcurrentProducersWithRotation is the concurrent-producer test with
// rotation forced throughout the run (rotation_period 1 ms, maint() every
// few ms): nothing is lost or duplicated.
func TestConcurrentProducersWithRotation(t *testing.T) {
	t.Parallel()
	res := runProducerStress(t, true)
	if !t.Failed() && res.rotations < 3 {
		t.Errorf("only %d rotations happened during the run: a full cycle (3) is needed to prove truncation loses nothing", res.rotations)
	}
}

// TestRotationKeepsRetryCopies: a retried event's copy, visible to one
// consumer only, pins its table until that consumer has read it, even when
// every other consumer is past it.
func TestRotationKeepsRetryCopies(t *testing.T) {
	t.Parallel()
	_, pool := setupRotation(t)
	exec(t, pool, "select pgque.subscribe('q', 'a')")
	exec(t, pool, "select pgque.subscribe('q', 'b')")
	tables := eventTables(t, pool, "q")

	id := scalar[int64](t, pool, `select pgque.send('q', 't', '{"n": 1}'::jsonb, 'k')`)
	tick(t, pool, "q")
	ms := mustReceive(t, pool, "q", "a", 10)
	if len(ms) != 1 || ms[0].MsgID != id {
		t.Fatalf("a received %v", msgIDs(ms))
	}
	exec(t, pool, "select pgque.nack($1, $2, '0', 'later')", ms[0].BatchID, id)
	ack(t, pool, ms[0].BatchID)
	receiveAll(t, pool, "b", 10)
	// Both consumers are past table 0's original event: rotate to table 1,
	// where the retry copy then lands.
	maintRotate(t, pool)
	if cur := curTable(t, pool); cur != 1 {
		t.Fatalf("current table = %d, want 1", cur)
	}
	if n := scalar[int32](t, pool, "select pgque.maint_retry_events()"); n != 1 {
		t.Fatalf("maint_retry_events = %d", n)
	}
	tick(t, pool, "q")
	if got := receiveAll(t, pool, "b", 10); len(got) != 0 {
		t.Fatalf("b received the retry copy %v", msgIDs(got))
	}
	if rows := tableStates(t, pool, tables)[1].Rows; rows != 1 {
		t.Fatalf("table 1 holds %d rows, want the retry copy", rows)
	}
	// Rotate on: table 2 is free, table 0 is free, table 1 is pinned by a.
	maintRotate(t, pool)
	maintRotate(t, pool)
	if cur := curTable(t, pool); cur != 0 {
		t.Fatalf("current table = %d, want 0", cur)
	}
	for range 2 {
		maintRotate(t, pool)
	}
	if cur := curTable(t, pool); cur != 0 {
		t.Fatalf("rotation truncated table 1 holding a's unread retry copy (current = %d)", cur)
	}
	got := receiveAll(t, pool, "a", 10)
	if len(got) != 1 || got[0].MsgID != id || got[0].RetryCount != 1 || str(got[0].PartitionKey) != "k" {
		t.Fatalf("a received %+v, want the retry copy of %d", got, id)
	}
	maintRotate(t, pool)
	if cur := curTable(t, pool); cur != 1 {
		t.Fatalf("after a read its copy, current table = %d, want 1", cur)
	}
	if s := tableStates(t, pool, tables)[1]; s != (tableState{}) {
		t.Errorf("table 1 after rotation: %+v, want truncated", s)
	}
}

// TestRetriesUnderRotation: producers, a ticker, maint() with rotation every
// millisecond and maint_retry_events run while consumer a nacks a random
// quarter of what it receives and consumer b acks everything. In the end every
// committed event reached b exactly once, and a once plus once per nack,
// with retry_count counting the nacks, or it is in a's dead letters after
// max_retries + 1 nacks.
func TestRetriesUnderRotation(t *testing.T) {
	t.Parallel()
	const (
		producers   = 4
		duration    = 1500 * time.Millisecond
		maxDuration = 20 * time.Second
		maxRetries  = 1
	)
	ctx := context.Background()
	_, pool := setupRotation(t)
	exec(t, pool, "select pgque.subscribe('q', 'a')")
	exec(t, pool, "select pgque.subscribe('q', 'b')")
	exec(t, pool, "select pgque.set_queue_config('q', 'ticker_max_lag', '2 ms')")
	exec(t, pool, fmt.Sprintf("select pgque.set_queue_config('q', 'max_retries', '%d')", maxRetries))

	var (
		mu        sync.Mutex
		committed = map[int64]bool{}
		aGot      = map[int64][]int32{} // retry_count of each delivery to a
		aNacked   = map[int64]int{}
		aDead     = map[int64]bool{}
		bGot      = map[int64]int{}
		rotations int
		stop      atomic.Bool
		wg        sync.WaitGroup
	)
	fail := func(format string, args ...any) {
		t.Errorf(format, args...)
		stop.Store(true)
	}
	for p := range producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(p), uint64(time.Now().UnixNano())))
			for !stop.Load() {
				tx, err := pool.Begin(ctx)
				if err != nil {
					fail("producer: %v", err)
					return
				}
				var ids []int64
				for range 1 + rng.IntN(3) {
					var id int64
					if err := tx.QueryRow(ctx, "select pgque.send('q', 't', '{}'::jsonb, $1)", fmt.Sprint("k", rng.IntN(5))).Scan(&id); err != nil {
						fail("producer: %v", err)
						tx.Rollback(ctx)
						return
					}
					ids = append(ids, id)
					_ = pgtest.Work(ctx, time.Duration(rng.IntN(2000))*time.Microsecond) // workload: an open transaction
				}
				if rng.IntN(5) == 0 {
					tx.Rollback(ctx)
					continue
				}
				if err := tx.Commit(ctx); err != nil {
					fail("producer: commit: %v", err)
					return
				}
				mu.Lock()
				for _, id := range ids {
					committed[id] = true
				}
				mu.Unlock()
			}
		}()
	}
	background := func(name string, pause time.Duration, step func() error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				if err := step(); err != nil {
					fail("%s: %v", name, err)
					return
				}
				_ = pgtest.Work(ctx, pause) // workload: the step's pace
			}
		}()
	}
	background("ticker", 3*time.Millisecond, func() error {
		_, err := pool.Exec(ctx, "select pgque.ticker('q')")
		return err
	})
	last := int32(0)
	background("maint", 5*time.Millisecond, func() error {
		if _, err := pool.Exec(ctx, "select pgque.maint_retry_events()"); err != nil {
			return err
		}
		if _, err := pool.Exec(ctx, "select pgque.maint()"); err != nil {
			return err
		}
		var cur int32
		if err := pool.QueryRow(ctx, "select queue_cur_table from pgque.queue where queue_name = 'q'").Scan(&cur); err != nil {
			return err
		}
		if cur != last {
			mu.Lock()
			rotations++
			mu.Unlock()
			last = cur
		}
		return nil
	})
	rng := rand.New(rand.NewPCG(99, uint64(time.Now().UnixNano())))
	consumeA := func() (int, error) {
		ms, err := receive(pool, "q", "a", 20)
		if err != nil || len(ms) == 0 {
			return 0, err
		}
		mu.Lock()
		defer mu.Unlock()
		for _, m := range ms {
			aGot[m.MsgID] = append(aGot[m.MsgID], m.RetryCount)
			if rng.IntN(4) == 0 && !stop.Load() {
				var n int32
				if err := pool.QueryRow(ctx, "select pgque.nack($1, $2, '0', 'random')", m.BatchID, m.MsgID).Scan(&n); err != nil {
					return 0, err
				}
				aNacked[m.MsgID]++
				if n == 0 {
					aDead[m.MsgID] = true
				}
			}
		}
		_, err = pool.Exec(ctx, "select pgque.ack($1)", ms[0].BatchID)
		return len(ms), err
	}
	consumeB := func() (int, error) {
		ms, err := receive(pool, "q", "b", 20)
		if err != nil || len(ms) == 0 {
			return 0, err
		}
		mu.Lock()
		for _, m := range ms {
			bGot[m.MsgID]++
		}
		mu.Unlock()
		_, err = pool.Exec(ctx, "select pgque.ack($1)", ms[0].BatchID)
		return len(ms), err
	}
	for name, consume := range map[string]func() (int, error){"a": consumeA, "b": consumeB} {
		background("consumer "+name, time.Millisecond, func() error {
			_, err := consume()
			return err
		})
	}

	start := time.Now()
	pgtest.Eventually(ctx, maxDuration, func() bool {
		mu.Lock()
		enough := rotations >= 3 && len(aNacked) >= 20 && len(aDead) >= 1
		mu.Unlock()
		return stop.Load() || (time.Since(start) >= duration && enough)
	})
	stop.Store(true)
	wg.Wait()
	if t.Failed() {
		return
	}
	// Drain: move due retries, tick, consume, until nothing is left.
	for range 50 {
		exec(t, pool, "select pgque.maint_retry_events()")
		tick(t, pool, "q")
		n := 0
		for _, consume := range []func() (int, error){consumeA, consumeB} {
			for {
				k, err := consume()
				if err != nil {
					t.Fatal(err)
				}
				if k == 0 {
					break
				}
				n += k
			}
		}
		if n == 0 && scalar[int64](t, pool, "select count(*) from pgque.retry_queue") == 0 {
			break
		}
	}

	mu.Lock()
	defer mu.Unlock()
	dead := map[int64]bool{}
	for _, id := range column[int64](t, pool, "select ev_id from pgque.dlq_list('q', 'a', 100000)") {
		if dead[id] {
			t.Errorf("event %d is dead-lettered twice", id)
		}
		dead[id] = true
	}
	t.Logf("%d events committed, %d nacked by a, %d dead-lettered, %d rotations", len(committed), len(aNacked), len(dead), rotations)
	if rotations < 3 || len(aNacked) < 20 || len(dead) < 1 {
		t.Errorf("the run proves too little: %d rotations, %d events nacked, %d dead letters", rotations, len(aNacked), len(dead))
	}
	for id := range committed {
		if bGot[id] != 1 {
			t.Errorf("b got event %d %d times, want 1", id, bGot[id])
		}
		got, nacks := aGot[id], aNacked[id]
		want := nacks + 1
		if dead[id] {
			want = nacks
		}
		if len(got) != want {
			t.Errorf("a got event %d %d times (retry counts %v) after %d nacks (dead-lettered: %v), want %d",
				id, len(got), got, nacks, dead[id], want)
			continue
		}
		for i, rc := range got {
			if rc != int32(i) {
				t.Errorf("a's delivery %d of event %d has retry_count %d, want %d", i, id, rc, i)
			}
		}
		if dead[id] != (nacks == maxRetries+1) {
			t.Errorf("event %d nacked %d times: dead-lettered %v, want %v", id, nacks, dead[id], nacks == maxRetries+1)
		}
	}
	for id := range aGot {
		if !committed[id] {
			t.Errorf("a got event %d that was never committed", id)
		}
	}
	for id := range bGot {
		if !committed[id] {
			t.Errorf("b got event %d that was never committed", id)
		}
	}
}

// TestRotationWaitsForRegistration: a subscription being registered (its
// transaction still open) is invisible to rotation's safety check, but the
// events committed after its starting tick are its to receive: rotation
// must not truncate them before the registration commits.
func TestRotationWaitsForRegistration(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn, pool := setupRotation(t, "c")
	tables := eventTables(t, pool, "q")

	// A producer writes into table 0 and stays open across two rotations.
	producer := pgtest.Conn(t, dsn)
	ptx, err := producer.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer ptx.Rollback(ctx)
	e1 := scalar[int64](t, ptx, "select pgque.insert_event('q', 't', 'long producer')")
	maintRotate(t, pool)
	maintRotate(t, pool)
	if cur := curTable(t, pool); cur != 2 {
		t.Fatalf("current table = %d, want 2", cur)
	}

	// A new subscription is registered; its transaction stays open.
	reg := pgtest.Conn(t, dsn)
	rtx, err := reg.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer rtx.Rollback(ctx)
	exec(t, rtx, "select pgque.subscribe('q', 'late')")

	// The producer commits after the new subscription's starting tick; c
	// reads its event; rotation comes round to table 0.
	if err := ptx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	tick(t, pool, "q")
	if b := drainBatches(t, pool, "q", "c"); len(b) != 1 || !slices.Equal(evIDs(b[0]), []int64{e1}) {
		t.Fatalf("c received %v, want [[%d]]", batchIDs(b), e1)
	}
	maintRotate(t, pool)
	if err := rtx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	got := drainBatches(t, pool, "q", "late")
	if len(got) != 1 || !slices.Equal(evIDs(got[0]), []int64{e1}) {
		t.Errorf("the late subscription received %v, want [[%d]]: rotation truncated %s (now %+v) before the registration committed",
			batchIDs(got), e1, tables[0], tableStates(t, pool, tables)[0])
	}
	// Once it has read it, rotation proceeds.
	maintRotate(t, pool)
	if cur := curTable(t, pool); cur != 0 {
		t.Errorf("current table = %d after the late subscription caught up, want 0", cur)
	}
}

// TestRotationUnderRepeatableRead: maint() run in a REPEATABLE READ (or
// SERIALIZABLE) transaction would check rotation's safety against a
// snapshot older than its table lock, and could truncate events committed
// in between. It must refuse (PQ011, like the ticker) or leave them alone.
func TestRotationUnderRepeatableRead(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn, pool := setupRotation(t, "c")
	producer := pgtest.Conn(t, dsn)
	ptx, err := producer.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer ptx.Rollback(ctx)
	e1 := scalar[int64](t, ptx, "select pgque.insert_event('q', 't', 'long producer')")
	maintRotate(t, pool)
	maintRotate(t, pool)

	// The maintenance transaction's snapshot is taken while the producer
	// runs; the producer commits before maint() locks table 0.
	m := pgtest.Conn(t, dsn)
	exec(t, m, "begin isolation level repeatable read")
	exec(t, m, "select 1")
	if err := ptx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	waitRotationDue(t, pool)
	if err := queryErr(m, "select pgque.maint()"); err != nil {
		wantCode(t, "maint() under repeatable read", err, "PQ011", "repeatable read")
		exec(t, m, "rollback")
	} else {
		exec(t, m, "commit")
	}
	tick(t, pool, "q")
	b := drainBatches(t, pool, "q", "c")
	if len(b) != 1 || !slices.Equal(evIDs(b[0]), []int64{e1}) {
		t.Errorf("c received %v, want [[%d]]: maint() under REPEATABLE READ truncated a committed event", batchIDs(b), e1)
	}

	for _, iso := range []string{"repeatable read", "serializable"} {
		exec(t, m, "begin isolation level "+iso)
		if err := queryErr(m, "select pgque.maint()"); err != nil {
			wantCode(t, "maint() under "+iso, err, "PQ011", iso)
		}
		exec(t, m, "rollback")
	}
}

// waitRotationDue waits until every queue's rotation period has passed
// since its last switch, by the clock and the rule maint() uses.
func waitRotationDue(t testing.TB, q db) {
	t.Helper()
	pgtest.WaitFor(t, 10*time.Second, "the rotation period to pass", func() bool {
		return scalar[bool](t, q, `select coalesce(bool_and(clock_timestamp() - queue_switch_time >= queue_rotation_period), true)
			from pgque.queue`)
	})
}

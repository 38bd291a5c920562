package pgque_test

// Tests of the pause failure policy (G3 pause) through the Go worker pool:
// T-G3-pause, T-DLQ-unblock, T-slot-crash, T-hot-blocked-key, a randomized
// run with failure injection, and pause vs skip without failures.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pgque/pgque"
	"github.com/pgque/pgque/internal/dbq"
	"github.com/pgque/pgque/internal/pgcluster"
	"github.com/pgque/pgque/internal/testing/pgtest"
)

// pmsg is the payload of the pause tests' events: the key (as text, for
// the record) and the event's number within its key, 1, 2, ...
type pmsg struct {
	K string `json:"k"`
	N int    `json:"n"`
}

// pcall is one handler call.
type pcall struct {
	worker     string
	key        string
	n          int
	id         int64
	retry      int
	slot       int
	ok         bool
	start, end time.Time
}

func (c pcall) String() string {
	outcome := "ok"
	if !c.ok {
		outcome = "FAIL"
	}
	return fmt.Sprintf("%s#%d(id %d, retry %d, %s, %s slot %d at %s)", c.key, c.n, c.id, c.retry, outcome, c.worker, c.slot, c.start.Format("15:04:05.000"))
}

// pauseLog records every handler call of a run.
type pauseLog struct {
	mu    sync.Mutex
	calls []pcall
	ok    map[int64]int // successful calls per ev_id
}

func (l *pauseLog) record(c pcall) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.calls = append(l.calls, c)
	if c.ok {
		if l.ok == nil {
			l.ok = make(map[int64]int)
		}
		l.ok[c.id]++
	}
}

// succeeded returns how many distinct events succeeded.
func (l *pauseLog) succeeded() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.ok)
}

// done reports whether every id succeeded.
func (l *pauseLog) done(ids []int64) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, id := range ids {
		if l.ok[id] == 0 {
			return false
		}
	}
	return true
}

// keyCalls returns the calls on key, in the order they started.
func (l *pauseLog) keyCalls(key string) []pcall {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []pcall
	for _, c := range l.calls {
		if c.key == key {
			out = append(out, c)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].start.Before(out[j].start) })
	return out
}

// okIDs returns the ids of key's successful calls, in the order they ran.
func (l *pauseLog) okIDs(key string) []int64 {
	var ids []int64
	for _, c := range l.keyCalls(key) {
		if c.ok {
			ids = append(ids, c.id)
		}
	}
	return ids
}

// failFunc decides a call's fate: nil succeeds, an error fails, a panic
// panics.
type failFunc func(m *pgque.Message, p pmsg) error

// pauseHandler records every call in log and fails as fail says.
func pauseHandler(log *pauseLog, worker string, fail failFunc) pgque.HandlerFunc {
	return func(ctx context.Context, m *pgque.Message) error {
		var p pmsg
		if err := m.Decode(&p); err != nil {
			return err
		}
		c := pcall{worker: worker, key: p.K, n: p.N, id: m.ID, retry: m.RetryCount, slot: m.Slot, start: time.Now()}
		defer func() { c.end = time.Now(); log.record(c) }() // also when fail panics
		if fail != nil {
			if err := fail(m, p); err != nil {
				return err
			}
		}
		c.ok = true
		return nil
	}
}

// kev is an event to send: key and number.
type kev struct {
	k string
	n int
}

// sendKevs sends the events in one transaction and returns their ids.
func sendKevs(t *testing.T, env *testEnv, evs ...kev) []int64 {
	t.Helper()
	events := make([]pgque.Event, len(evs))
	for i, e := range evs {
		events[i] = pgque.Event{Type: "e", Payload: pmsg{K: e.k, N: e.n}, PartitionKey: e.k}
	}
	ids, err := env.client.SendBatch(context.Background(), env.queue, events)
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// seq returns the events key#from..key#to.
func seq(key string, from, to int) []kev {
	var out []kev
	for n := from; n <= to; n++ {
		out = append(out, kev{key, n})
	}
	return out
}

// keysOnSlot returns n keys "<prefix><i>" that map to slot of nslots.
func keysOnSlot(t *testing.T, env *testEnv, prefix string, nslots, slot, n int) []string {
	t.Helper()
	rows, err := env.pool.Query(context.Background(), `select k from generate_series(0, 100000) i,
			lateral (select $1::text || i as k) s
		where pgque.slot_of(k, $2) = $3 order by i limit $4`, prefix, nslots, slot, n)
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for rows.Next() {
		var k string
		if err := rows.Scan(&k); err != nil {
			t.Fatal(err)
		}
		keys = append(keys, k)
	}
	if rows.Err() != nil || len(keys) != n {
		t.Fatalf("keysOnSlot: %v, %d keys", rows.Err(), len(keys))
	}
	return keys
}

// slotOf returns the slot of key.
func slotOf(t *testing.T, env *testEnv, key string, nslots int) int {
	t.Helper()
	var s int
	if err := env.pool.QueryRow(context.Background(), `select pgque.slot_of($1, $2)`, key, nslots).Scan(&s); err != nil {
		t.Fatal(err)
	}
	return s
}

// startFastTicker runs a ticker that also moves due retries every 100 ms.
func startFastTicker(t *testing.T, client *pgque.Client) {
	t.Helper()
	tk, err := client.NewTicker(&pgque.TickerConfig{LeaseTTL: 2 * time.Second, RetryInterval: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := tk.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := tk.Stop(ctx); err != nil {
			t.Error("stopping ticker:", err)
		}
	})
}

// blockedKeys lists the blocked keys of consumer.
func blockedKeys(t *testing.T, env *testEnv, consumer string) []pgque.BlockedKey {
	t.Helper()
	bks, err := env.client.BlockedKeys(context.Background(), env.queue, consumer)
	if err != nil {
		t.Fatal(err)
	}
	return bks
}

// blockedKey returns key's block, if any.
func blockedKey(t *testing.T, env *testEnv, consumer string, key pgque.KeyRef) (pgque.BlockedKey, bool) {
	t.Helper()
	for _, b := range blockedKeys(t, env, consumer) {
		if b.Key == key {
			return b, true
		}
	}
	return pgque.BlockedKey{}, false
}

// deadLetters returns the dead-lettered ev_ids of the queue with their
// retry counts.
func deadLetters(t *testing.T, env *testEnv) map[int64]int {
	t.Helper()
	rows, err := env.pool.Query(context.Background(), `select ev_id, ev_retry from pgque.dlq_list($1, null, 100000)`, env.queue)
	if err != nil {
		t.Fatal(err)
	}
	out := make(map[int64]int)
	for rows.Next() {
		var id int64
		var retry int
		if err := rows.Scan(&id, &retry); err != nil {
			t.Fatal(err)
		}
		out[id] = retry
	}
	if rows.Err() != nil {
		t.Fatal(rows.Err())
	}
	return out
}

// wantCalls checks key's calls, in the order they ran, against want
// ("#n ok rR" / "#n FAIL rR").
func wantCalls(t *testing.T, log *pauseLog, key string, want ...string) {
	t.Helper()
	var got []string
	calls := log.keyCalls(key)
	for _, c := range calls {
		s := fmt.Sprintf("#%d ok r%d", c.n, c.retry)
		if !c.ok {
			s = fmt.Sprintf("#%d FAIL r%d", c.n, c.retry)
		}
		got = append(got, s)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("key %s: calls %v, want %v (%v)", key, got, want, calls)
	}
}

// T-G3-pause: A#2 fails once; A#3, A#4 (and A#5, sent later) are withheld
// until A#2 succeeds on its retry; A's successful calls are exactly A#1..A#5
// in order, once each; B, on the same slot, is handled while A is blocked.
func TestPauseG3(t *testing.T) {
	t.Parallel()
	env := setup(t)
	startTicker(t, env.client)
	ks := keysOnSlot(t, env, "g3-", 2, 1, 2)
	a, b := ks[0], ks[1]
	var log pauseLog
	failed := make(chan struct{})
	var once sync.Once
	p := startProcess(t, env, pgque.PartitionedConsumerConfig{
		Queue: env.queue, Consumer: "c", Slots: 2, FailurePolicy: pgque.FailurePolicyPause,
		PollInterval: 100 * time.Millisecond,
		RetryDelay:   func(int) time.Duration { return time.Second },
		Handler: pauseHandler(&log, "w", func(m *pgque.Message, p pmsg) error {
			if p.K == a && p.N == 2 && m.RetryCount == 0 {
				once.Do(func() { close(failed) })
				return errors.New("A#2 fails on its first attempt")
			}
			return nil
		}),
	})
	if got := p.pc.Policy(); got != pgque.FailurePolicyPause {
		t.Fatalf("Policy() = %v", got)
	}
	ids := sendKevs(t, env, kev{a, 1}, kev{b, 1}, kev{a, 2}, kev{b, 2}, kev{a, 3}, kev{a, 4}, kev{b, 3})
	select {
	case <-failed:
	case <-time.After(20 * time.Second):
		t.Fatal("A#2 was not delivered")
	}
	failedAt := time.Now()
	later := sendKevs(t, env, kev{b, 4}, kev{b, 5}, kev{b, 6}, kev{a, 5})
	pgtest.WaitFor(t, 20*time.Second, "B#4..B#6", func() bool { return log.done(later[:3]) })
	bDone := time.Since(failedAt)
	if bk, ok := blockedKey(t, env, "c", pgque.KeyOf(a)); !ok || bk.State != pgque.BlockStateBlocked ||
		bk.HeadID != ids[2] || bk.Failures != 1 || bk.Slot != 1 || !strings.Contains(bk.Reason, "first attempt") {
		t.Errorf("while A#2 awaits its retry, blocked_keys shows %+v (found %v)", bk, ok)
	}
	pgtest.WaitFor(t, 20*time.Second, "every event", func() bool { return log.done(append(ids, later...)) })

	wantCalls(t, &log, a, "#1 ok r0", "#2 FAIL r0", "#2 ok r1", "#3 ok r0", "#4 ok r0", "#5 ok r0")
	wantCalls(t, &log, b, "#1 ok r0", "#2 ok r0", "#3 ok r0", "#4 ok r0", "#5 ok r0", "#6 ok r0")
	ac := log.keyCalls(a)
	retryOK := ac[2]
	for _, c := range log.keyCalls(b)[3:] {
		if !c.end.Before(retryOK.start) {
			t.Errorf("B#%d ended at %v, not before A#2's retry started (%v): B was held with A",
				c.n, c.end.Sub(failedAt), retryOK.start.Sub(failedAt))
		}
	}
	if d := retryOK.start.Sub(ac[1].end); d < 900*time.Millisecond {
		t.Errorf("A#2's retry came %v after its failure, before the 1 s retry delay", d)
	}
	t.Logf("B#4..B#6 handled %v after A#2 failed; A#2 retried after %v", bDone, retryOK.start.Sub(ac[1].end))
	pgtest.WaitFor(t, 10*time.Second, "the block to clear", func() bool { return len(blockedKeys(t, env, "c")) == 0 })
}

// T-DLQ-unblock: with max_retries 1, A#2 always fails: it is dead-lettered,
// which resolves the block without A#2 ever succeeding, and A#3, A#4
// follow with retry count 0 (waiting is not a retry).
func TestPauseDLQUnblock(t *testing.T) {
	t.Parallel()
	env := setup(t)
	ctx := context.Background()
	if err := env.client.SetQueueConfig(ctx, env.queue, pgque.QueueMaxRetries(1)); err != nil {
		t.Fatal(err)
	}
	startFastTicker(t, env.client)
	a := "dlq-a"
	var log pauseLog
	var mu sync.Mutex
	var stateAtA3 []string
	startProcess(t, env, pgque.PartitionedConsumerConfig{
		Queue: env.queue, Consumer: "c", Slots: 2, FailurePolicy: pgque.FailurePolicyPause,
		PollInterval: 100 * time.Millisecond,
		RetryDelay:   func(int) time.Duration { return 100 * time.Millisecond },
		Handler: pauseHandler(&log, "w", func(m *pgque.Message, p pmsg) error {
			switch p.N {
			case 2:
				return fmt.Errorf("A#2 always fails (attempt %d)", m.RetryCount+1)
			case 3:
				// What the server says while A#3 runs: the block was
				// resolved by the dead-lettering, not by an ack of A#2.
				bks, err := env.client.BlockedKeys(ctx, env.queue, "c")
				if err != nil {
					return err
				}
				mu.Lock()
				defer mu.Unlock()
				for _, b := range bks {
					stateAtA3 = append(stateAtA3, fmt.Sprintf("%v %s head %d", b.Key, b.State, b.HeadID))
				}
			}
			return nil
		}),
	})
	ids := sendKevs(t, env, seq(a, 1, 4)...)
	pgtest.WaitFor(t, 20*time.Second, "A#1, A#3, A#4", func() bool { return log.done([]int64{ids[0], ids[2], ids[3]}) })
	wantCalls(t, &log, a, "#1 ok r0", "#2 FAIL r0", "#2 FAIL r1", "#3 ok r0", "#4 ok r0")
	if dead := deadLetters(t, env); len(dead) != 1 || dead[ids[1]] != 1 {
		t.Fatalf("dead letters %v, want A#2 (%d) after 1 retry", dead, ids[1])
	}
	mu.Lock()
	want := fmt.Sprintf("%v %s head %d", pgque.KeyOf(a), pgque.BlockStateReleasing, ids[1])
	if !slices.Equal(stateAtA3, []string{want}) {
		t.Errorf("while A#3 ran, blocked_keys showed %v, want [%s]", stateAtA3, want)
	}
	mu.Unlock()
	pgtest.WaitFor(t, 10*time.Second, "the block to clear", func() bool { return len(blockedKeys(t, env, "c")) == 0 })
}

// TestPauseNullAndEmptyKeys: the NULL key and the empty key are different
// keys: when the NULL key fails, the empty key's events in the same chunk
// (and slot) go on. Also the operator tools: BlockedKeys, RetryKeyNow and
// UnblockKey, for the NULL key and a named one.
func TestPauseNullAndEmptyKeys(t *testing.T) {
	t.Parallel()
	env := setup(t)
	ctx := context.Background()
	startFastTicker(t, env.client)
	var log pauseLog
	var mu sync.Mutex
	healed := false // the NULL key's head succeeds from now on
	startProcess(t, env, pgque.PartitionedConsumerConfig{
		Queue: env.queue, Consumer: "c", Slots: 1, FailurePolicy: pgque.FailurePolicyPause,
		PollInterval: 100 * time.Millisecond,
		RetryDelay:   func(int) time.Duration { return time.Hour },
		Handler: pauseHandler(&log, "w", func(m *pgque.Message, p pmsg) error {
			mu.Lock()
			defer mu.Unlock()
			switch {
			case p.K == "null" && p.N == 2 && !healed:
				return errors.New("null#2 fails until healed")
			case p.K == "a" && p.N == 2:
				return errors.New("a#2 always fails")
			}
			return nil
		}),
	})
	// One transaction: the NULL key (sent from Go with PartitionKey ""),
	// the empty key (only SQL can send it) and key "a", interleaved.
	var ids []int64
	err := func() error {
		tx, err := env.pool.Begin(ctx)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback(ctx) }()
		for n := 1; n <= 3; n++ {
			for _, k := range []struct {
				name string
				key  *string
			}{{"null", nil}, {"empty", new(string)}, {"a", sptr("a")}} {
				id, err := dbq.New(tx).Send(ctx, env.queue, "e", []byte(fmt.Sprintf(`{"k":%q,"n":%d}`, k.name, n)), k.key, nil)
				if err != nil {
					return err
				}
				ids = append(ids, id)
			}
		}
		return tx.Commit(ctx)
	}()
	if err != nil {
		t.Fatal(err)
	}
	// ids: null#1 empty#1 a#1 null#2 empty#2 a#2 null#3 empty#3 a#3
	pgtest.WaitFor(t, 20*time.Second, "the empty key's events", func() bool { return log.done([]int64{ids[1], ids[4], ids[7]}) })
	pgtest.WaitFor(t, 10*time.Second, "two blocked keys", func() bool { return len(blockedKeys(t, env, "c")) == 2 })
	wantCalls(t, &log, "null", "#1 ok r0", "#2 FAIL r0")
	wantCalls(t, &log, "empty", "#1 ok r0", "#2 ok r0", "#3 ok r0")
	wantCalls(t, &log, "a", "#1 ok r0", "#2 FAIL r0")
	nb, ok := blockedKey(t, env, "c", pgque.NullKey)
	if !ok || !nb.Key.IsNull() || nb.HeadID != ids[3] || nb.Deferred != 1 || nb.State != pgque.BlockStateBlocked || nb.Reason != "null#2 fails until healed" {
		t.Fatalf("the NULL key's block: %+v (found %v)", nb, ok)
	}
	if _, ok := blockedKey(t, env, "c", pgque.KeyOf("")); ok {
		t.Fatal("the empty key is blocked")
	}
	// The slot does not look idle: its lag and head age count the two
	// failed heads (waiting for their retry) and the two events deferred
	// behind them, though its cursor has moved past all four.
	var slot pgque.SlotStatus
	pgtest.WaitFor(t, 10*time.Second, "the slot's lag to count the held events", func() bool {
		slots, err := env.client.Slots(ctx, env.queue, "c")
		if err != nil || len(slots) != 1 {
			t.Fatalf("Slots: %+v, %v", slots, err)
		}
		slot = slots[0]
		return slot.Lag == 4
	})
	if slot.Held != 2 || slot.BlockedKeys != 2 || slot.OldestPending <= 0 {
		t.Errorf("slot with two blocked keys: %+v, want 2 held, 2 blocked keys, a head age", slot)
	}

	// Errors: a key that is not blocked.
	if _, err := env.client.UnblockKey(ctx, env.queue, "c", pgque.KeyOf("")); !errors.Is(err, pgque.ErrKeyNotBlocked) {
		t.Errorf("UnblockKey of a key that is not blocked: %v", err)
	}
	if _, err := env.client.RetryKeyNow(ctx, env.queue, "c", pgque.KeyOf("nope")); !errors.Is(err, pgque.ErrKeyNotBlocked) {
		t.Errorf("RetryKeyNow of a key that is not blocked: %v", err)
	}
	if _, err := env.client.BlockedKeys(ctx, "no-such-queue", ""); !errors.Is(err, pgque.ErrQueueNotFound) {
		t.Errorf("BlockedKeys of a missing queue: %v", err)
	}

	// RetryKeyNow: the NULL key's head comes back at once (its retry delay
	// is an hour) and succeeds; null#3 follows.
	mu.Lock()
	healed = true
	mu.Unlock()
	if ok, err := env.client.RetryKeyNow(ctx, env.queue, "c", pgque.NullKey); err != nil || !ok {
		t.Fatalf("RetryKeyNow(NULL) = %v, %v", ok, err)
	}
	pgtest.WaitFor(t, 20*time.Second, "null#2 and null#3", func() bool { return log.done([]int64{ids[3], ids[6]}) })
	wantCalls(t, &log, "null", "#1 ok r0", "#2 FAIL r0", "#2 ok r1", "#3 ok r0")

	// UnblockKey: a#2 is dead-lettered by the operator, a#3 follows.
	id, err := env.client.UnblockKey(ctx, env.queue, "c", pgque.KeyOf("a"))
	if err != nil || id != ids[5] {
		t.Fatalf("UnblockKey(a) = %d, %v; want %d", id, err, ids[5])
	}
	pgtest.WaitFor(t, 20*time.Second, "a#3", func() bool { return log.done([]int64{ids[8]}) })
	wantCalls(t, &log, "a", "#1 ok r0", "#2 FAIL r0", "#3 ok r0")
	if dead := deadLetters(t, env); len(dead) != 1 || dead[ids[5]] != 1 {
		t.Fatalf("dead letters %v, want a#2 (%d)", dead, ids[5])
	}
	pgtest.WaitFor(t, 10*time.Second, "no blocked key", func() bool { return len(blockedKeys(t, env, "c")) == 0 })
}

// TestPausePolicyMismatch: a persisted policy is kept unless changed with
// SetFailurePolicy; Start with another one fails with ErrPolicyMismatch;
// a zero FailurePolicy follows the persisted one.
func TestPausePolicyMismatch(t *testing.T) {
	t.Parallel()
	env := setup(t)
	ctx := context.Background()
	start := func(policy pgque.FailurePolicy) (*pgque.PartitionedConsumer, error) {
		pc, err := env.client.NewPartitionedConsumer(&pgque.PartitionedConsumerConfig{
			Queue: env.queue, Consumer: "c", Slots: 2, FailurePolicy: policy, Handler: noop,
		})
		if err != nil {
			t.Fatal(err)
		}
		if err := pc.Start(ctx); err != nil {
			return nil, err
		}
		t.Cleanup(func() { _ = pc.Stop(ctx) })
		return pc, nil
	}
	if err := env.client.SetFailurePolicy(ctx, env.queue, "c", pgque.FailurePolicyPause); !errors.Is(err, pgque.ErrSlotNotSubscribed) {
		t.Errorf("SetFailurePolicy before any slot: %v, want ErrSlotNotSubscribed", err)
	}
	if _, err := start(pgque.FailurePolicyPause); err != nil {
		t.Fatal(err)
	}
	if _, err := start(pgque.FailurePolicySkip); !errors.Is(err, pgque.ErrPolicyMismatch) {
		t.Fatalf("Start with skip on a pause consumer: %v, want ErrPolicyMismatch", err)
	}
	pc, err := start(0)
	if err != nil || pc.Policy() != pgque.FailurePolicyPause {
		t.Fatalf("Start with a zero policy: %v, policy %v; want the persisted pause", err, pc.Policy())
	}
	if err := env.client.SetFailurePolicy(ctx, env.queue, "c", pgque.FailurePolicySkip); err != nil {
		t.Fatal(err)
	}
	if _, err := start(pgque.FailurePolicyPause); !errors.Is(err, pgque.ErrPolicyMismatch) {
		t.Fatalf("Start with pause on a skip consumer: %v, want ErrPolicyMismatch", err)
	}
	if _, err := start(pgque.FailurePolicySkip); err != nil {
		t.Fatal(err)
	}
	if err := env.client.SetFailurePolicy(ctx, env.queue, "c", 7); !errors.Is(err, pgque.ErrInvalidArgument) {
		t.Errorf("SetFailurePolicy(7): %v, want ErrInvalidArgument", err)
	}
	if _, err := env.client.NewPartitionedConsumer(&pgque.PartitionedConsumerConfig{
		Queue: env.queue, Consumer: "c", Slots: 2, FailurePolicy: 3, Handler: noop,
	}); !errors.Is(err, pgque.ErrInvalidArgument) {
		t.Errorf("NewPartitionedConsumer with policy 3: %v", err)
	}
}

// TestPausePolicySwitchedWhileRunning: an operator switches a running pause
// consumer to skip while a chunk with a failure is being handled. The
// chunk was handled under pause (A#3, A#4 held back, expecting the nack to
// defer them); under skip the nack would not, and acking would lose them.
// The pool notices, settles nothing, and handles the chunk again under skip.
func TestPausePolicySwitchedWhileRunning(t *testing.T) {
	t.Parallel()
	env := setup(t)
	ctx := context.Background()
	startFastTicker(t, env.client)
	var log pauseLog
	var once sync.Once
	p := startProcess(t, env, pgque.PartitionedConsumerConfig{
		Queue: env.queue, Consumer: "c", Slots: 1, FailurePolicy: pgque.FailurePolicyPause,
		PollInterval: 100 * time.Millisecond,
		RetryDelay:   func(int) time.Duration { return 100 * time.Millisecond },
		// The chunk's settlement is what this test is about: one event at a
		// time, so that a slow SetFailurePolicy call on a loaded machine
		// does not get A's lane held past the chunk (a held lane's outcome
		// is settled by the server's policy of the moment instead).
		MaxWorkersPerSlot: 1,
		Handler: pauseHandler(&log, "w", func(m *pgque.Message, p pmsg) error {
			if p.N != 2 {
				return nil
			}
			var err error
			once.Do(func() {
				if err = env.client.SetFailurePolicy(ctx, env.queue, "c", pgque.FailurePolicySkip); err == nil {
					err = errors.New("A#2 fails once, as the policy changes")
				}
			})
			return err
		}),
	})
	ids := sendKevs(t, env, seq("a", 1, 4)...)
	pgtest.WaitFor(t, 20*time.Second, "every event", func() bool { return log.done(ids) })
	if p.pc.Policy() != pgque.FailurePolicySkip {
		t.Fatalf("Policy() = %v after the switch", p.pc.Policy())
	}
	// First pass under pause: A#1 ok, A#2 fails, A#3 and A#4 held; not
	// settled. Second pass, under skip: the whole chunk again.
	wantCalls(t, &log, "a", "#1 ok r0", "#2 FAIL r0", "#1 ok r0", "#2 ok r0", "#3 ok r0", "#4 ok r0")
}

func sptr(s string) *string { return &s }

// T-slot-crash: the process holding a blocked key crashes (no Stop, no
// ack, no release) while the key waits for its head's retry. The block is
// durable; after the lease TTL another process takes the slot over and
// handles the head's retry, then the held events, on that slot only.
func TestPauseSlotCrash(t *testing.T) {
	t.Parallel()
	runSlotCrash(t, setup(t), nil)
}

// T-slot-crash with Postgres restarted (immediate shutdown: crash
// recovery) between the crash and the takeover.
func TestPauseSlotCrashPostgresRestart(t *testing.T) {
	t.Parallel()
	c := pgtest.NewCluster(t, pgcluster.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	dsn, err := c.CreateDatabase(ctx, "pause_crash")
	if err != nil {
		t.Fatal(err)
	}
	pgtest.Install(t, dsn)
	pool := pgtest.Pool(t, dsn)
	env := &testEnv{dsn: dsn, pool: pool, client: newClient(t, pool), queue: "q"}
	if _, err := env.client.CreateQueue(ctx, env.queue); err != nil {
		t.Fatal(err)
	}
	runSlotCrash(t, env, func() {
		if err := c.Restart(ctx, pgcluster.ModeImmediate); err != nil {
			t.Fatal(err)
		}
	})
}

func runSlotCrash(t *testing.T, env *testEnv, between func()) {
	const nslots = 2
	startFastTicker(t, env.client)
	a := "crash-a"
	slot := slotOf(t, env, a, nslots)
	others := keysOnSlot(t, env, "crash-b", nslots, 1-slot, 1)
	var log pauseLog
	cfg := func(worker string) pgque.PartitionedConsumerConfig {
		return pgque.PartitionedConsumerConfig{
			Queue: env.queue, Consumer: "c", Slots: nslots, WorkerID: worker, FailurePolicy: pgque.FailurePolicyPause,
			LeaseTTL: 2 * time.Second, ClaimInterval: 200 * time.Millisecond, PollInterval: 100 * time.Millisecond,
			// Long enough that the crashed process cannot have handled the
			// retry before it crashed.
			RetryDelay: func(int) time.Duration { return 3 * time.Second },
			Handler: pauseHandler(&log, worker, func(m *pgque.Message, p pmsg) error {
				if p.K == a && p.N == 2 && m.RetryCount == 0 {
					return errors.New("A#2 fails on its first attempt")
				}
				return nil
			}),
		}
	}
	p1 := startProcess(t, env, cfg("p1"))
	ids := sendKevs(t, env, append(seq(a, 1, 4), seq(others[0], 1, 3)...)...)
	pgtest.WaitFor(t, 20*time.Second, "A to be blocked", func() bool {
		b, ok := blockedKey(t, env, "c", pgque.KeyOf(a))
		return ok && b.State == pgque.BlockStateBlocked
	})
	p1.cancel() // crash: no Stop, no ack, no release
	crashedAt := time.Now()
	if between != nil {
		between()
	}
	// The block survives the crash (and the restart).
	var bk pgque.BlockedKey
	pgtest.WaitFor(t, 30*time.Second, "blocked_keys after the crash", func() bool {
		bks, err := env.client.BlockedKeys(context.Background(), env.queue, "c")
		if err != nil {
			return false // reconnecting after a restart
		}
		if len(bks) != 1 {
			t.Fatalf("blocked keys after the crash: %+v", bks)
		}
		bk = bks[0]
		return true
	})
	if bk.Key != pgque.KeyOf(a) || bk.State != pgque.BlockStateBlocked || bk.HeadID != ids[1] || bk.Slot != slot || bk.Deferred != 2 {
		t.Fatalf("after the crash blocked_keys shows %+v; want A blocked on slot %d, head %d, 2 deferred", bk, slot, ids[1])
	}
	startProcess(t, env, cfg("p2"))
	pgtest.WaitFor(t, 60*time.Second, "every event", func() bool { return log.done(ids) })
	t.Logf("the head's retry ran %v after the crash", log.keyCalls(a)[2].start.Sub(crashedAt))
	wantCalls(t, &log, a, "#1 ok r0", "#2 FAIL r0", "#2 ok r1", "#3 ok r0", "#4 ok r0")
	for i, c := range log.keyCalls(a) {
		want := "p2"
		if i < 2 {
			want = "p1"
		}
		if c.worker != want || c.slot != slot {
			t.Errorf("%v ran on %s slot %d, want %s slot %d", c, c.worker, c.slot, want, slot)
		}
	}
	pgtest.WaitFor(t, 10*time.Second, "the block to clear", func() bool { return len(blockedKeys(t, env, "c")) == 0 })
}

// TestPauseRandomized: 2 processes over 4 slots, several keys, random
// handler failures (errors and panics on about 10% of first attempts, and a
// few keys whose events fail several times). For every key, the successful
// calls are exactly its events in ev_id order, each once; with poison
// events, exactly its events but the dead-lettered ones.
func TestPauseRandomized(t *testing.T) {
	t.Parallel()
	t.Run("retried", func(t *testing.T) { t.Parallel(); runPauseRandomized(t, false) })
	t.Run("dead letters", func(t *testing.T) { t.Parallel(); runPauseRandomized(t, true) })
}

func runPauseRandomized(t *testing.T, poison bool) {
	const (
		nslots  = 4
		nkeys   = 24
		batches = 20
		perSend = 40
	)
	env := setup(t)
	ctx := context.Background()
	maxRetries := 10
	if poison {
		maxRetries = 2
	}
	if err := env.client.SetQueueConfig(ctx, env.queue, pgque.QueueMaxRetries(maxRetries)); err != nil {
		t.Fatal(err)
	}
	startFastTicker(t, env.client)
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	// fate decides, from the event and the attempt, whether a call fails
	// and how: deterministic per (seed, event, attempt).
	fate := func(p pmsg, attempt int) int {
		h := splitmix(uint64(seed) ^ uint64(p.N)<<20 ^ uint64(len(p.K))<<40 ^ hashString(p.K) ^ uint64(attempt)<<50)
		switch {
		case poison && p.N%53 == 7 && hashString(p.K)%3 == 0:
			return 1 // poison: always fails, dead-lettered after max_retries
		case strings.HasSuffix(p.K, "-flaky") && attempt < 3 && h%3 == 0:
			return 1 + int(h>>8)%2 // fails several times in a row
		case attempt == 0 && h%10 == 0:
			return 1 + int(h>>8)%2 // ~10% of first attempts
		}
		return 0
	}
	var log pauseLog
	var chk checker
	logger := slog.New(withoutPanics{slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug})})
	for _, w := range []string{"p1", "p2"} {
		startProcessLogger(t, env, pgque.PartitionedConsumerConfig{
			Queue: env.queue, Consumer: "c", Slots: nslots, WorkerID: w, FailurePolicy: pgque.FailurePolicyPause,
			ClaimInterval: 200 * time.Millisecond, PollInterval: 100 * time.Millisecond,
			RetryDelay: func(n int) time.Duration { return time.Duration(20*(n+1)) * time.Millisecond },
			Handler: func(ctx context.Context, m *pgque.Message) error {
				defer chk.begin(w, m)()
				return pauseHandler(&log, w, func(m *pgque.Message, p pmsg) error {
					switch fate(p, m.RetryCount) {
					case 1:
						return fmt.Errorf("injected failure of %s#%d", p.K, p.N)
					case 2:
						panic(fmt.Sprintf("injected panic on %s#%d", p.K, p.N))
					}
					return nil
				})(ctx, m)
			},
		}, logger)
	}
	keys := make([]string, nkeys)
	for i := range keys {
		keys[i] = fmt.Sprintf("r%d", i)
		if i%8 == 0 {
			keys[i] += "-flaky"
		}
	}
	sent := make(map[int64]string) // id → key
	byKey := make(map[string][]int64)
	next := make(map[string]int)
	var all []int64
	for range batches {
		var evs []kev
		for range perSend {
			k := keys[splitmix(uint64(seed)+uint64(len(all)+len(evs)))%nkeys]
			next[k]++
			evs = append(evs, kev{k, next[k]})
		}
		ids := sendKevs(t, env, evs...)
		for i, id := range ids {
			sent[id] = evs[i].k
			byKey[evs[i].k] = append(byKey[evs[i].k], id)
		}
		all = append(all, ids...)
		// Each send is a batch of its own, arriving while the earlier
		// ones are handled, failed and retried.
		forceTick(t, env.pool, env.queue)
	}
	// Every event ends acknowledged or dead-lettered.
	var dead map[int64]int
	pgtest.WaitFor(t, 60*time.Second, "every event to succeed or be dead-lettered", func() bool {
		dead = deadLetters(t, env)
		n := 0
		for _, id := range all {
			if _, ok := dead[id]; ok {
				n++
			}
		}
		return log.succeeded()+n == len(all)
	})
	if poison && len(dead) == 0 {
		t.Fatal("no poison event was dead-lettered")
	}
	if !poison && len(dead) != 0 {
		t.Fatalf("%d events dead-lettered", len(dead))
	}
	pgtest.WaitFor(t, 10*time.Second, "no blocked key", func() bool { return len(blockedKeys(t, env, "c")) == 0 })
	failures := 0
	for _, k := range keys {
		var want []int64
		for _, id := range byKey[k] {
			if _, ok := dead[id]; !ok {
				want = append(want, id)
			}
		}
		if got := log.okIDs(k); !slices.Equal(got, want) {
			t.Fatalf("key %s: successful calls %v, want %v (dead %v); calls %v", k, got, want, dead, log.keyCalls(k))
		}
		for _, c := range log.keyCalls(k) {
			if !c.ok {
				failures++
			}
		}
	}
	// G1 (one slot per key, first deliveries in order) and G2 (no overlap).
	rep, err := chk.verify(sent)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d events, %d failed calls, %d dead-lettered, %d calls; per worker %v", len(all), failures, len(dead), rep.calls, rep.perWorker)
}

// splitmix is a well-mixed hash.
func splitmix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// hashString is FNV-1a.
func hashString(s string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return h
}

// TestPausePolicySwitchRacesNack: set_failure_policy(skip) commits while a
// nack under pause is in flight (nack_partitioned reads the policy without
// a lock, and set_failure_policy releases only the blocks it can see), so
// the block that nack commits outlives the switch. It must not hold the
// key for good: under skip, the ack of the chunk that redelivered the head
// resolves it, even when the head was dead-lettered there, and the key's
// held and later events are delivered.
func TestPausePolicySwitchRacesNack(t *testing.T) {
	t.Parallel()
	env := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	q := dbq.New(env.pool)
	if err := env.client.SetQueueConfig(ctx, env.queue, pgque.QueueMaxRetries(1)); err != nil {
		t.Fatal(err)
	}
	if _, err := q.SubscribeSlotPolicy(ctx, env.queue, "c", 0, 1, sptr("pause")); err != nil {
		t.Fatal(err)
	}
	_, token, _, err := q.ClaimSlot(ctx, env.queue, "c", 0, "w", time.Hour, "")
	if err != nil {
		t.Fatal(err)
	}
	ids := sendKevs(t, env, seq("a", 1, 2)...)
	forceTick(t, env.pool, env.queue)
	// last is the chunk received last, which the fenced ack names.
	var last dbq.Delivery
	receive := func() []int64 {
		t.Helper()
		rows, err := q.ReceivePartitioned(ctx, env.queue, "c", 0, 1, "w", token, 100, nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(rows) > 0 {
			last = dbq.Delivery{Epoch: rows[0].Epoch, BatchID: rows[0].BatchID, MsgID: rows[0].MsgID}
		}
		var got []int64
		for _, r := range rows {
			got = append(got, r.MsgID)
		}
		return got
	}
	if got := receive(); !slices.Equal(got, ids) {
		t.Fatalf("received %v, want %v", got, ids)
	}
	// a#1 fails under pause: the nack blocks "a" and defers a#2 ...
	tx, err := env.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := dbq.New(tx).NackPartitioned(ctx, env.queue, "c", 0, 1, "w", token, ids[0], 0, "a#1 fails"); err != nil {
		t.Fatal(err)
	}
	// ... while an operator switches the consumer to skip (today it does
	// not wait for the nack's transaction; if it ever does, it finishes
	// after the commit).
	switched := make(chan error, 1)
	go func() { switched <- env.client.SetFailurePolicy(ctx, env.queue, "c", pgque.FailurePolicySkip) }()
	select {
	case err := <-switched:
		switched <- err
	case <-time.After(time.Second):
	}
	if _, err := dbq.New(tx).AckDelivery(ctx, env.queue, "c", 0, 1, "w", token, last); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-switched; err != nil {
		t.Fatal(err)
	}
	t.Logf("blocked keys after the race: %+v", blockedKeys(t, env, "c"))
	// a#1 keeps failing: its retry is dead-lettered (max_retries 1). a#3
	// is sent meanwhile. Under skip, a#2 and a#3 are delivered, in order.
	ids = append(ids, sendKevs(t, env, kev{"a", 3})...)
	var got []int64
	for range 10 {
		if _, err := q.MaintRetryEvents(ctx); err != nil {
			t.Fatal(err)
		}
		forceTick(t, env.pool, env.queue)
		r := receive()
		if len(r) == 0 {
			continue
		}
		for _, id := range r {
			if id == ids[0] {
				if _, err := q.NackPartitioned(ctx, env.queue, "c", 0, 1, "w", token, id, 0, "a#1 fails again"); err != nil {
					t.Fatal(err)
				}
				continue
			}
			got = append(got, id)
		}
		if _, err := q.AckDelivery(ctx, env.queue, "c", 0, 1, "w", token, last); err != nil {
			t.Fatal(err)
		}
	}
	if dead := deadLetters(t, env); len(dead) != 1 || dead[ids[0]] != 1 {
		t.Errorf("dead letters %v, want a#1 (%d) after 1 retry", dead, ids[0])
	}
	if !slices.Equal(got, ids[1:]) {
		bks, _ := env.client.BlockedKeys(ctx, env.queue, "c")
		t.Fatalf("under skip, after a#1 was dead-lettered, received %v, want a#2 and a#3 %v; blocked keys %+v", got, ids[1:], bks)
	}
	if bks := blockedKeys(t, env, "c"); len(bks) != 0 {
		t.Fatalf("blocked keys left under skip: %+v", bks)
	}
}

// withoutPanics drops the records of the injected panics (logged with
// their stacks) and keeps the rest, down to debug: a failure's log shows
// the slots' claims, releases and errors around it.
type withoutPanics struct{ slog.Handler }

func (h withoutPanics) Handle(ctx context.Context, r slog.Record) error {
	if r.Message == "pgque: handler panicked" {
		return nil
	}
	return h.Handler.Handle(ctx, r)
}

func (h withoutPanics) WithAttrs(as []slog.Attr) slog.Handler {
	return withoutPanics{h.Handler.WithAttrs(as)}
}

func (h withoutPanics) WithGroup(g string) slog.Handler { return withoutPanics{h.Handler.WithGroup(g)} }

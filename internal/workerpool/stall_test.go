package workerpool

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgque/pgque/internal/dbq"
	"github.com/pgque/pgque/internal/metrics"
	"github.com/pgque/pgque/internal/testing/pgtest"
)

// ledger records what handlers did, across pools: the events of each key in
// the order they were handled, and whether two handlers of one key ever ran
// at once (G2).
type ledger struct {
	mu      sync.Mutex
	byKey   map[string][]int64
	active  map[string]int
	overlap string
	changed chan struct{}
}

func newLedger() *ledger {
	return &ledger{byKey: map[string][]int64{}, active: map[string]int{}, changed: make(chan struct{}, 1)}
}

func (l *ledger) handle(key string, id int64) {
	l.mu.Lock()
	l.active[key]++
	if l.active[key] > 1 && l.overlap == "" {
		l.overlap = fmt.Sprintf("two handlers of key %s at once (event %d)", key, id)
	}
	l.mu.Unlock()
	// A handler that takes time, so that a second handler of the key run
	// at once would be seen inside; it waits for nothing (not a race).
	time.Sleep(time.Millisecond)
	l.mu.Lock()
	l.active[key]--
	l.byKey[key] = append(l.byKey[key], id)
	l.mu.Unlock()
	select {
	case l.changed <- struct{}{}:
	default:
	}
}

func (l *ledger) handled(key string) []int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.byKey[key])
}

// waitFor waits until key's handled events are want, in that order (G1),
// failing the test when they diverge or after timeout.
func (l *ledger) waitFor(t *testing.T, key string, want []int64, timeout time.Duration) {
	t.Helper()
	deadline := time.After(timeout)
	for {
		got := l.handled(key)
		if !slices.Equal(got, want[:min(len(got), len(want))]) || len(got) > len(want) {
			t.Fatalf("key %s handled %v, want %v in this order", key, got, want)
		}
		if len(got) == len(want) {
			return
		}
		select {
		case <-l.changed:
		case <-time.After(50 * time.Millisecond):
		case <-deadline:
			t.Fatalf("after %v key %s handled %v, want %v", timeout, key, got, want)
		}
	}
}

// consume is a WorkFunc that receives a chunk, hands each event to the
// ledger and acks it with the fenced ack. stuckAfterReceive, when it returns
// true for a slot, makes the loop hang after the receive like a database
// call that never returns (it honours only workCtx, as pgx does).
func consume(q *dbq.Queries, queue, consumer string, nslots int, worker string, l *ledger,
	stuckAfterReceive func(slot int) bool) WorkFunc {
	return func(fetchCtx, workCtx context.Context, lease *Lease) (bool, error) {
		start := time.Now()
		rows, err := q.ReceivePartitioned(fetchCtx, queue, consumer, lease.Slot, nslots, worker, lease.Token, 100, nil)
		if err != nil {
			return false, err
		}
		lease.Renewed(start)
		if stuckAfterReceive != nil && stuckAfterReceive(lease.Slot) {
			<-workCtx.Done()
			return false, context.Cause(workCtx)
		}
		if len(rows) == 0 {
			return false, nil
		}
		done := lease.Busy()
		for _, r := range rows {
			l.handle(*r.PartitionKey, r.MsgID)
		}
		done()
		ackStart := time.Now()
		d := dbq.Delivery{Epoch: rows[0].Epoch, BatchID: rows[0].BatchID, MsgID: rows[0].MsgID}
		if _, err := q.AckDelivery(workCtx, queue, consumer, lease.Slot, nslots, worker, lease.Token, d); err != nil {
			return false, err
		}
		lease.Renewed(ackStart)
		return true, nil
	}
}

func leaseLost(err error) bool {
	var pg *pgconn.PgError
	return errors.As(err, &pg) && pg.Code == "PQ032"
}

// recordLog is a slog handler that keeps every record, for tests that look
// for a warning and its attributes.
type recordLog struct {
	mu      sync.Mutex
	records []slog.Record
	changed chan struct{}
}

func newRecordLog() *recordLog { return &recordLog{changed: make(chan struct{}, 1)} }

func (h *recordLog) Enabled(context.Context, slog.Level) bool { return true }
func (h *recordLog) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	h.records = append(h.records, r.Clone())
	h.mu.Unlock()
	select {
	case h.changed <- struct{}{}:
	default:
	}
	return nil
}
func (h *recordLog) WithAttrs(as []slog.Attr) slog.Handler { return &attrLog{h, as} }
func (h *recordLog) WithGroup(string) slog.Handler         { return h }

// attrLog adds the attributes of Logger.With to each record.
type attrLog struct {
	*recordLog
	attrs []slog.Attr
}

func (a *attrLog) Handle(ctx context.Context, r slog.Record) error {
	r = r.Clone()
	r.AddAttrs(a.attrs...)
	return a.recordLog.Handle(ctx, r)
}
func (a *attrLog) WithAttrs(as []slog.Attr) slog.Handler {
	return &attrLog{a.recordLog, append(slices.Clone(a.attrs), as...)}
}

// find returns the attributes of the first record with message msg whose
// attributes include every one of match, waiting up to timeout.
func (h *recordLog) find(t *testing.T, msg string, match map[string]string, timeout time.Duration) map[string]string {
	t.Helper()
	deadline := time.After(timeout)
	for {
		h.mu.Lock()
		for _, r := range h.records {
			if r.Message != msg {
				continue
			}
			attrs := map[string]string{}
			r.Attrs(func(a slog.Attr) bool { attrs[a.Key] = a.Value.String(); return true })
			ok := true
			for k, v := range match {
				ok = ok && attrs[k] == v
			}
			if ok {
				h.mu.Unlock()
				return attrs
			}
		}
		h.mu.Unlock()
		select {
		case <-h.changed:
		case <-time.After(50 * time.Millisecond):
		case <-deadline:
			t.Fatalf("no log record %q with %v within %v", msg, match, timeout)
		}
	}
}

// counterSink counts counters by name.
type counterSink struct {
	gaugeSink
	cmu      sync.Mutex
	counters map[string]float64
}

func (c *counterSink) Record(name string, kind metrics.Kind, value float64, l metrics.Labels) {
	if kind == metrics.Counter {
		c.cmu.Lock()
		c.counters[name] += value
		c.cmu.Unlock()
	}
	c.gaugeSink.Record(name, kind, value, l)
}

func (c *counterSink) counter(name string) float64 {
	c.cmu.Lock()
	defer c.cmu.Unlock()
	return c.counters[name]
}

func newCounterSink() *counterSink {
	return &counterSink{gaugeSink: gaugeSink{values: map[string]float64{}}, counters: map[string]float64{}}
}

// stallFixture makes queue q with consumer c over 2 slots and sends n
// events for each of key0 (slot 0 of 2) and key1 (slot 1), then ticks.
func stallFixture(t *testing.T, pool *pgxpool.Pool, q string, n int) (ids0, ids1 []int64) {
	t.Helper()
	ctx := context.Background()
	for _, sql := range []string{
		"select pgque.create_queue($1)",
		"select pgque.subscribe_slot($1, 'c', s, 2) from generate_series(0, 1) s",
	} {
		if _, err := pool.Exec(ctx, sql, q); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	send := func(key string) []int64 {
		rows, err := pool.Query(ctx, "select pgque.send($1, 't', '{}'::jsonb, $2) from generate_series(1, $3)", q, key, n)
		if err != nil {
			t.Fatal(err)
		}
		ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		if err != nil {
			t.Fatal(err)
		}
		slices.Sort(ids)
		return ids
	}
	ids0, ids1 = send(key0), send(key1)
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "select pgque.force_next_tick($1)", q); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, "select pgque.ticker($1)", q)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return ids0, ids1
}

// key0 maps to slot 0 of 2, key1 to slot 1.
const key0, key1 = "tenant-3", "tenant-1"

// The stall guard, end to end: slot 0 is claimed by a worker that only
// renews its lease (claim_slot in a loop) and never receives, so the live
// pool cannot take it. The pool's stall check must see it (the warning
// names the slot, the reason and what to do; the gauge is above 0) while
// it works slot 1. Once the renewer stops, the pool takes slot 0 over
// within a lease TTL and a few claim passes and handles its events in
// order, one at a time, and the slot recovers.
func TestStalledSlotGuard(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t, pgtest.NewInstalledDB(t))
	q := dbq.New(pool)
	ids0, ids1 := stallFixture(t, pool, "sg", 20)

	// The renewer: claims slot 0 with a 1 s TTL and keeps renewing it.
	_, renewerToken, ok, err := q.ClaimSlot(ctx, "sg", "c", 0, "renewer", time.Second, "")
	if err != nil || !ok {
		t.Fatalf("claim by the renewer: %v %v", ok, err)
	}
	stopRenewer := make(chan struct{})
	renewerDone := make(chan struct{})
	go func() {
		defer close(renewerDone)
		for {
			select {
			case <-stopRenewer:
				return
			case <-time.After(100 * time.Millisecond):
			}
			if _, _, ok, err := q.ClaimSlot(ctx, "sg", "c", 0, "renewer", time.Second, renewerToken); err != nil || !ok {
				t.Errorf("renewal: %v %v", ok, err)
				return
			}
		}
	}()
	defer func() {
		select {
		case <-stopRenewer:
		default:
			close(stopRenewer)
		}
		<-renewerDone
	}()

	sink := newCounterSink()
	logs := newRecordLog()
	led := newLedger()
	p := New(Config{
		Queries: q, Logger: slog.New(logs), Metrics: metrics.New(sink),
		Queue: "sg", Consumer: "c", Worker: "live", Slots: 2, MaxActive: 2,
		LeaseTTL: time.Second, ClaimInterval: 100 * time.Millisecond, PollInterval: 50 * time.Millisecond,
		StallCheckInterval: 100 * time.Millisecond,
		Work:               consume(q, "sg", "c", 2, "live", led, nil),
		IsLeaseLost:        leaseLost, LeaseLostCause: errors.New("lease lost"),
	})
	fetchCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); p.Run(fetchCtx, ctx) }()
	defer func() { stop(); <-done }()

	led.waitFor(t, key1, ids1, 30*time.Second)
	attrs := logs.find(t, "pgque: slot stalled: it is behind and has not moved, which pins rotation of the whole queue",
		map[string]string{"slot": "0", "reason": "not progressing", "owner": "renewer"}, 30*time.Second)
	if attrs["action"] == "" || attrs["stalled_for"] == "" {
		t.Errorf("the stall warning says %v, want how long and what to do", attrs)
	}
	if g := sink.get(metrics.SlotStalled, "0"); g <= 0 {
		t.Errorf("slot 0 stalled gauge = %v after the warning, want > 0", g)
	}
	if g := sink.get(metrics.SlotStalled, "1"); g != 0 {
		t.Errorf("slot 1 stalled gauge = %v, want 0: it is worked", g)
	}
	if got := led.handled(key0); len(got) != 0 {
		t.Fatalf("slot 0 events handled while the renewer held it: %v", got)
	}

	close(stopRenewer)
	<-renewerDone
	freed := time.Now()
	led.waitFor(t, key0, ids0, 30*time.Second)
	took := time.Since(freed)
	t.Logf("slot 0 drained %v after its renewer stopped (lease TTL 1 s, claim interval 100 ms)", took)
	// The bound: the renewer's lease runs out one TTL after its last
	// renewal, then the next claim pass takes it. 10 s leaves room for a
	// loaded machine; a pool that did not take stalled slots over would
	// never get here.
	if took > 10*time.Second {
		t.Errorf("slot 0 was taken over %v after it was freed, want within a few seconds", took)
	}
	logs.find(t, "pgque: slot no longer stalled", map[string]string{"slot": "0"}, 30*time.Second)
	if led.overlap != "" {
		t.Error(led.overlap)
	}
}

// The watchdog: pool A's loop on slot 0 hangs after a receive (as on a
// database call that never returns) while A's keeper would go on renewing
// the lease. The watchdog must give the slot up within StallTimeout (the
// counter and a warning say so), pool B or A itself must take it over and
// handle slot 0's events, redelivered, in order, one handler at a time,
// with nothing lost.
func TestWatchdogGivesUpStuckSlot(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t, pgtest.NewInstalledDB(t))
	q := dbq.New(pool)
	ids0, ids1 := stallFixture(t, pool, "wd", 20)
	led := newLedger()

	var stuckOnce atomic.Bool
	stuckAt := make(chan time.Time, 1)
	sinkA := newCounterSink()
	logsA := newRecordLog()
	newPool := func(worker string, sink metrics.Sink, log slog.Handler, stuck func(int) bool) *Pool {
		return New(Config{
			Queries: q, Logger: slog.New(log), Metrics: metrics.New(sink),
			Queue: "wd", Consumer: "c", Worker: worker, Slots: 2, MaxActive: 2,
			LeaseTTL: 2 * time.Second, ClaimInterval: 100 * time.Millisecond, PollInterval: 50 * time.Millisecond,
			StallTimeout: time.Second, StallCheckInterval: -1,
			Work:        consume(q, "wd", "c", 2, worker, led, stuck),
			IsLeaseLost: leaseLost, LeaseLostCause: errors.New("lease lost"),
		})
	}
	a := newPool("a", sinkA, logsA, func(slot int) bool {
		if slot == 0 && stuckOnce.CompareAndSwap(false, true) {
			stuckAt <- time.Now()
			return true
		}
		return false
	})
	b := newPool("b", nil, slog.DiscardHandler, nil)
	// Stopping hard-stops too: a loop that is still stuck (when the
	// watchdog failed) only honours workCtx.
	run := func(p *Pool) func() {
		fetchCtx, stop := context.WithCancel(ctx)
		workCtx, kill := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); p.Run(fetchCtx, workCtx) }()
		return func() { stop(); kill(); <-done }
	}
	defer run(a)()
	var since time.Time
	select {
	case since = <-stuckAt:
	case <-time.After(30 * time.Second):
		t.Fatal("pool A never received on slot 0")
	}
	defer run(b)()

	logsA.find(t, "pgque: slot made no progress outside its handlers; giving it up so that another worker takes it over",
		map[string]string{"slot": "0"}, 30*time.Second)
	if n := sinkA.counter(metrics.SlotGivenUp); n != 1 {
		t.Errorf("pool A gave %v slots up, want 1", n)
	}
	led.waitFor(t, key0, ids0, 30*time.Second)
	took := time.Since(since)
	t.Logf("slot 0 drained %v after its loop hung (stall timeout 1 s, lease TTL 2 s)", took)
	if took > 15*time.Second {
		t.Errorf("slot 0 was worked again %v after its loop hung, want within a few seconds", took)
	}
	led.waitFor(t, key1, ids1, 30*time.Second)
	if led.overlap != "" {
		t.Error(led.overlap)
	}
}

// The tick notification's payload is computed by the server
// (pgque._tick_tag) and matched by the client (TickTag): they must agree,
// or consumers would only ever wake by polling. The payload never spells
// the queue's name.
func TestTickTagMatchesServer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t, pgtest.NewInstalledDB(t))
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	for _, q := range []string{"files", "tt", "orders_eu-1.v2"} {
		var server string
		if err := conn.QueryRow(ctx, "select pgque._tick_tag($1)", q).Scan(&server); err != nil {
			t.Fatal(err)
		}
		if got := TickTag(q); got != server || len(got) != 16 {
			t.Errorf("TickTag(%q) = %q, server %q", q, got, server)
		}
	}
	// The notification a real tick sends carries the tag.
	if _, err := conn.Exec(ctx, "listen pgque"); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "select pgque.create_queue('tt')"); err != nil {
		t.Fatal(err)
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "select pgque.force_next_tick('tt')"); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, "select pgque.ticker('tt')")
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	n, err := conn.Conn().WaitForNotification(wctx)
	if err != nil {
		t.Fatal(err)
	}
	if n.Payload != TickTag("tt") {
		t.Errorf("the tick notified %q, want TickTag(\"tt\") = %q", n.Payload, TickTag("tt"))
	}
}

// A slot with nothing to do sleeps until its poll, which may be longer than
// the stall timeout (touched sets leave idle slots asleep): the watchdog
// must not take that sleep for a hung loop. The pool drains its events,
// then polls slot 0 twice more, 2 s apart, with a 300 ms stall timeout:
// nothing is given up.
func TestWatchdogLeavesSleepingSlotAlone(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, pgtest.NewInstalledDB(t))
	q := dbq.New(pool)
	ids0, ids1 := stallFixture(t, pool, "idle", 3)
	led := newLedger()
	sink := newCounterSink()
	var mu sync.Mutex
	calls := map[int]int{}
	var drained atomic.Bool
	inner := consume(q, "idle", "c", 2, "a", led, nil)
	p := New(Config{
		Queries: q, Logger: slog.New(slog.DiscardHandler), Metrics: metrics.New(sink),
		Queue: "idle", Consumer: "c", Worker: "a", Slots: 2, MaxActive: 2,
		LeaseTTL: 2 * time.Second, ClaimInterval: 100 * time.Millisecond, PollInterval: 2 * time.Second,
		StallTimeout: 300 * time.Millisecond, StallCheckInterval: -1,
		Work: func(fetchCtx, workCtx context.Context, lease *Lease) (bool, error) {
			mu.Lock()
			calls[lease.Slot]++
			mu.Unlock()
			if drained.Load() {
				// Past the drain a poll finds nothing, at once: only the
				// sleeps between polls are left for the watchdog to judge,
				// not how long a database call takes on a loaded machine.
				return false, nil
			}
			return inner(fetchCtx, workCtx, lease)
		},
		IsLeaseLost: leaseLost, LeaseLostCause: errors.New("lease lost"),
	})
	fetchCtx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); p.Run(fetchCtx, fetchCtx) }()
	defer func() { stop(); <-done }()

	led.waitFor(t, key0, ids0, 30*time.Second)
	led.waitFor(t, key1, ids1, 30*time.Second)
	mu.Lock()
	drained.Store(true)
	after := calls[0]
	mu.Unlock()
	pgtest.WaitFor(t, 30*time.Second, "two more polls of slot 0", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return calls[0] >= after+2
	})
	if n := sink.counter(metrics.SlotGivenUp); n != 0 {
		t.Errorf("the watchdog gave %v sleeping slots up", n)
	}
}

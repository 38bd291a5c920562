package pgque_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgque/pgque"
	"github.com/pgque/pgque/internal/testing/pgtest"
)

// TestStopIsBoundedWhenAHandlerIgnoresCtx: a handler that never looks at
// its context cannot hold Stop past its deadline (plus the abandon wait):
// Stop returns an error that wraps the deadline and names the handler's
// event, for a plain and for a partitioned consumer.
func TestStopIsBoundedWhenAHandlerIgnoresCtx(t *testing.T) {
	env := setup(t)
	startTicker(t, env.client)
	ctx := context.Background()
	release := make(chan struct{})
	defer close(release)
	for _, kind := range []string{"plain", "partitioned"} {
		t.Run(kind, func(t *testing.T) {
			queue := "stuck_" + kind
			if _, err := env.client.CreateQueue(ctx, queue); err != nil {
				t.Fatal(err)
			}
			var started atomic.Int64
			h := func(_ context.Context, m *pgque.Message) error {
				started.Store(m.ID)
				<-release // ignores ctx
				return nil
			}
			var stop func(context.Context) error
			if kind == "plain" {
				con, err := env.client.NewConsumer(&pgque.ConsumerConfig{Queue: queue, Consumer: "c", Handler: h, PollInterval: 50 * time.Millisecond})
				if err != nil {
					t.Fatal(err)
				}
				if err := con.Start(ctx); err != nil {
					t.Fatal(err)
				}
				stop = con.Stop
			} else {
				pc, err := env.client.NewPartitionedConsumer(&pgque.PartitionedConsumerConfig{Queue: queue, Consumer: "p", Slots: 2,
					Handler: h, PollInterval: 50 * time.Millisecond, ClaimInterval: 100 * time.Millisecond})
				if err != nil {
					t.Fatal(err)
				}
				if err := pc.Start(ctx); err != nil {
					t.Fatal(err)
				}
				stop = pc.Stop
			}
			id, err := env.client.Send(ctx, queue, pgque.Event{Payload: 1, PartitionKey: "k"})
			if err != nil {
				t.Fatal(err)
			}
			pgtest.WaitFor(t, 20*time.Second, "the handler to start", func() bool { return started.Load() == id })
			sctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			defer cancel()
			begin := time.Now()
			err = stop(sctx)
			took := time.Since(begin)
			if took > 300*time.Millisecond+3*time.Second {
				t.Fatalf("Stop took %v with a handler ignoring ctx", took)
			}
			if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "event "+strconv.FormatInt(id, 10)) {
				t.Fatalf("Stop = %v, want DeadlineExceeded naming event %d", err, id)
			}
		})
	}
}

// TestHungRenewalDelaysNoOtherSlot: slot 0's lease row is locked by
// another session, so renewing slot 0 hangs; slot 1's handler runs for
// more than two TTLs, kept alive only by the background renewals, and must
// not lose its lease because of slot 0.
func TestHungRenewalDelaysNoOtherSlot(t *testing.T) {
	env := setup(t)
	startTicker(t, env.client)
	ctx := context.Background()
	const ttl = 2 * time.Second
	var slot1Key string
	for i := 0; slot1Key == ""; i++ {
		var s int
		k := "k" + strconv.Itoa(i)
		if err := env.pool.QueryRow(ctx, `select pgque.slot_of($1, 2)`, k).Scan(&s); err != nil {
			t.Fatal(err)
		}
		if s == 1 {
			slot1Key = k
		}
	}
	started := make(chan struct{}, 1)
	result := make(chan error, 1)
	pc, err := env.client.NewPartitionedConsumer(&pgque.PartitionedConsumerConfig{
		Queue: env.queue, Consumer: "p", Slots: 2, LeaseTTL: ttl, ClaimInterval: 100 * time.Millisecond,
		PollInterval: 50 * time.Millisecond,
		Handler: func(hctx context.Context, m *pgque.Message) error {
			started <- struct{}{}
			select {
			case <-time.After(3 * ttl):
				result <- nil
			case <-hctx.Done():
				result <- context.Cause(hctx)
			}
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := pc.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer pc.Stop(ctx)
	pgtest.WaitFor(t, 20*time.Second, "both slots", func() bool { return len(pc.OwnedSlots()) == 2 })
	locker, err := env.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer locker.Rollback(ctx)
	if _, err := locker.Exec(ctx, `select 1 from pgque.slot_lease l join pgque.queue q on q.queue_id = l.sl_queue
		where q.queue_name = $1 and l.sl_consumer = 'p' and l.sl_slot = 0 for update of l`, env.queue); err != nil {
		t.Fatal(err)
	}
	if _, err := env.client.Send(ctx, env.queue, pgque.Event{Payload: 1, PartitionKey: slot1Key}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-started:
	case <-time.After(20 * time.Second):
		t.Fatal("slot 1's handler never started")
	}
	select {
	case err := <-result:
		if err != nil {
			t.Fatalf("slot 1's handler lost its lease while slot 0's renewal hung: %v", err)
		}
	case <-time.After(10 * ttl):
		t.Fatal("slot 1's handler did not finish")
	}
	_ = locker.Rollback(ctx)
}

// TestOnSlotSeesClaimsFencesAndStops: OnSlot reports a slot's claim, its
// fence when a renewal cannot get through within the lease TTL (another
// session holds the lease row), the claim under the next epoch once it can,
// and the end at Stop.
func TestOnSlotSeesClaimsFencesAndStops(t *testing.T) {
	env := setup(t)
	ctx := context.Background()
	changes := make(chan pgque.SlotChange, 16)
	pc, err := env.client.NewPartitionedConsumer(&pgque.PartitionedConsumerConfig{Queue: env.queue, Consumer: "c", Slots: 1,
		LeaseTTL: time.Second, ClaimInterval: 100 * time.Millisecond, PollInterval: 50 * time.Millisecond,
		Handler: func(context.Context, *pgque.Message) error { return nil },
		OnSlot:  func(c pgque.SlotChange) { changes <- c }})
	if err != nil {
		t.Fatal(err)
	}
	if err := pc.Start(ctx); err != nil {
		t.Fatal(err)
	}
	next := func(what string) pgque.SlotChange {
		t.Helper()
		select {
		case c := <-changes:
			return c
		case <-time.After(30 * time.Second):
			t.Fatalf("no OnSlot call for %s", what)
			return pgque.SlotChange{}
		}
	}
	claimed := next("the claim")
	if claimed.Ended || claimed.Slot != 0 || claimed.NSlots != 1 || claimed.Epoch < 1 {
		t.Fatalf("first change %+v, want slot 0/1 claimed", claimed)
	}
	holder, err := env.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := holder.Exec(ctx, `select 1 from pgque.slot_lease where sl_consumer = 'c' for update`); err != nil {
		t.Fatal(err)
	}
	fenced := next("the fence")
	_ = holder.Rollback(ctx)
	if want := (pgque.SlotChange{Slot: 0, NSlots: 1, Epoch: claimed.Epoch, Ended: true, Fenced: true}); fenced != want {
		t.Fatalf("while a renewal waits past the TTL: %+v, want %+v", fenced, want)
	}
	again := next("the claim after the fence")
	if again.Ended || again.Epoch <= claimed.Epoch {
		t.Fatalf("after the fence: %+v, want a claim under an epoch above %d", again, claimed.Epoch)
	}
	if err := pc.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if got, want := next("the stop"), (pgque.SlotChange{Slot: 0, NSlots: 1, Epoch: again.Epoch, Ended: true}); got != want {
		t.Fatalf("at Stop: %+v, want %+v", got, want)
	}
}

// TestStopReportsWhatItCouldNotAcknowledge: a graceful Stop whose final
// acknowledgement and lease release fail (the database went away while the
// last handler ran) returns an error saying so, instead of nil: the caller
// learns that the chunk is delivered again and the slot waits for its TTL.
func TestStopReportsWhatItCouldNotAcknowledge(t *testing.T) {
	env := setup(t)
	ctx := context.Background()
	tk, err := env.client.NewTicker(nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := tk.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tk.Stop(ctx) }()
	started := make(chan struct{}, 1)
	release := make(chan struct{})
	pc, err := env.client.NewPartitionedConsumer(&pgque.PartitionedConsumerConfig{
		Queue: env.queue, Consumer: "c", Slots: 1,
		Handler: func(context.Context, *pgque.Message) error {
			select {
			case started <- struct{}{}:
			default:
			}
			<-release
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := pc.Start(ctx); err != nil {
		t.Fatal(err)
	}
	sendKeyed(t, env, 1, 1)
	<-started

	// Cut the consumer off: no new connection to its database, and every
	// open one ended.
	var db string
	if err := env.pool.QueryRow(ctx, "select current_database()").Scan(&db); err != nil {
		t.Fatal(err)
	}
	admin := pgtest.Conn(t, pgtest.DSNWith(env.dsn, "dbname", "postgres"))
	t.Cleanup(func() {
		_, _ = admin.Exec(context.Background(), fmt.Sprintf("alter database %q allow_connections true", db))
	})
	if _, err := admin.Exec(ctx, fmt.Sprintf("alter database %q allow_connections false", db)); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(ctx, "select pg_terminate_backend(pid) from pg_stat_activity where datname = $1", db); err != nil {
		t.Fatal(err)
	}

	stopped := make(chan error, 1)
	go func() {
		sctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		defer cancel()
		stopped <- pc.Stop(sctx)
	}()
	close(release)
	err = <-stopped
	if err == nil {
		t.Fatal("Stop returned nil although the chunk could not be acknowledged nor the slot released")
	}
	if errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Stop ran out of time instead of reporting the failure: %v", err)
	}
	if !strings.Contains(err.Error(), "not everything in flight was acknowledged and released") {
		t.Fatalf("Stop's error does not say what was left: %v", err)
	}
}

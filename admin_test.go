package pgque_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/pgque/pgque"
	"github.com/pgque/pgque/internal/testing/pgtest"
	"github.com/pgque/pgque/pgquemigrate"
)

// TestSchemaVersionMismatch proves Connect and every Start refuse a
// database whose pgque schema is older or newer than the library's, and say
// which version they found.
func TestSchemaVersionMismatch(t *testing.T) {
	t.Parallel()
	env := setup(t)
	ctx := context.Background()
	for _, installed := range []string{"0.0.1", "99.0.0"} {
		if _, err := env.pool.Exec(ctx, `update pgque.version set version = $1`, installed); err != nil {
			t.Fatal(err)
		}
		_, err := pgque.Connect(ctx, env.dsn, nil)
		var mismatch *pgque.SchemaVersionError
		if !errors.Is(err, pgque.ErrSchemaVersion) || !errors.As(err, &mismatch) ||
			mismatch.Installed != installed || mismatch.Want != pgque.SchemaVersion {
			t.Fatalf("Connect against schema %s = %v, want a SchemaVersionError naming it", installed, err)
		}
		// A client made with NewClient is refused by every Start.
		client := newClient(t, env.pool)
		con, err := client.NewConsumer(&pgque.ConsumerConfig{Queue: env.queue, Consumer: "c",
			Handler: func(context.Context, *pgque.Message) error { return nil }})
		if err != nil {
			t.Fatal(err)
		}
		if err := con.Start(ctx); !errors.Is(err, pgque.ErrSchemaVersion) {
			t.Fatalf("Consumer.Start against schema %s = %v, want ErrSchemaVersion", installed, err)
		}
		pc, err := client.NewPartitionedConsumer(&pgque.PartitionedConsumerConfig{Queue: env.queue, Consumer: "p", Slots: 2,
			Handler: func(context.Context, *pgque.Message) error { return nil }})
		if err != nil {
			t.Fatal(err)
		}
		if err := pc.Start(ctx); !errors.Is(err, pgque.ErrSchemaVersion) {
			t.Fatalf("PartitionedConsumer.Start against schema %s = %v, want ErrSchemaVersion", installed, err)
		}
		tk, err := client.NewTicker(nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := tk.Start(ctx); !errors.Is(err, pgque.ErrSchemaVersion) {
			t.Fatalf("Ticker.Start against schema %s = %v, want ErrSchemaVersion", installed, err)
		}
	}
	// Nothing was subscribed by the refused Starts.
	if _, err := env.pool.Exec(ctx, `update pgque.version set version = $1`, pgque.SchemaVersion); err != nil {
		t.Fatal(err)
	}
	if subs, err := env.client.Consumers(ctx, env.queue); err != nil || len(subs) != 0 {
		t.Fatalf("subscriptions after refused starts: %v, %v", subs, err)
	}
	// A schema from before version() existed reads as "unknown".
	if _, err := env.pool.Exec(ctx, `drop function pgque.version()`); err != nil {
		t.Fatal(err)
	}
	if err := newClient(t, env.pool).CheckSchema(ctx); !errors.Is(err, pgque.ErrSchemaVersion) {
		t.Fatalf("CheckSchema without schema_version() = %v, want ErrSchemaVersion", err)
	}
}

func TestSchemaNotInstalled(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewDB(t)
	if _, err := pgque.Connect(context.Background(), dsn, nil); !errors.Is(err, pgque.ErrNotInstalled) {
		t.Fatalf("Connect to a database without pgque = %v, want ErrNotInstalled", err)
	}
	pool := pgtest.Pool(t, dsn)
	res, err := pgquemigrate.Install(context.Background(), pool)
	if err != nil || !res.Fresh() || res.Version != pgque.SchemaVersion {
		t.Fatalf("Install = %+v, %v", res, err)
	}
	client, err := pgque.Connect(context.Background(), dsn, nil)
	if err != nil {
		t.Fatalf("Connect after pgquemigrate.Install: %v", err)
	}
	client.Close()
}

// TestAdminSubscriptions covers Subscribe/Unsubscribe and the slot
// variants, including the errors for what does not exist.
func TestAdminSubscriptions(t *testing.T) {
	t.Parallel()
	env := setup(t)
	ctx := context.Background()
	if created, err := env.client.Subscribe(ctx, env.queue, "plain"); err != nil || !created {
		t.Fatalf("Subscribe = %v, %v", created, err)
	}
	if created, err := env.client.Subscribe(ctx, env.queue, "plain"); err != nil || created {
		t.Fatalf("second Subscribe = %v, %v; want false, nil", created, err)
	}
	if n, err := env.client.SubscribeSlots(ctx, env.queue, "sl", 3, 0); err != nil || n != 3 {
		t.Fatalf("SubscribeSlots = %d, %v", n, err)
	}
	if _, err := env.client.SubscribeSlots(ctx, env.queue, "sl", 4, 0); !errors.Is(err, pgque.ErrSlotCountMismatch) {
		t.Fatalf("SubscribeSlots with another N = %v, want ErrSlotCountMismatch", err)
	}
	if _, err := env.client.SubscribeSlots(ctx, env.queue, "sl", 3, pgque.FailurePolicyPause); !errors.Is(err, pgque.ErrPolicyMismatch) {
		t.Fatalf("SubscribeSlots with another policy = %v, want ErrPolicyMismatch", err)
	}
	subs, err := env.client.Consumers(ctx, env.queue)
	if err != nil || len(subs) != 4 {
		t.Fatalf("Consumers = %v, %v; want plain and 3 slots", subs, err)
	}
	if _, err := env.client.Unsubscribe(ctx, env.queue, "sl#0/3"); !errors.Is(err, pgque.ErrInvalidName) {
		t.Fatalf("Unsubscribe of a slot = %v, want ErrInvalidName", err)
	}
	if err := env.client.UnsubscribeSlots(ctx, env.queue, "sl", 3); err != nil {
		t.Fatal(err)
	}
	if removed, err := env.client.Unsubscribe(ctx, env.queue, "plain"); err != nil || !removed {
		t.Fatalf("Unsubscribe = %v, %v", removed, err)
	}
	if removed, err := env.client.Unsubscribe(ctx, env.queue, "plain"); err != nil || removed {
		t.Fatalf("second Unsubscribe = %v, %v; want false, nil", removed, err)
	}
	if _, err := env.client.Unsubscribe(ctx, "nope", "plain"); !errors.Is(err, pgque.ErrQueueNotFound) {
		t.Fatalf("Unsubscribe on an unknown queue = %v, want ErrQueueNotFound", err)
	}
	if subs, err := env.client.Consumers(ctx, env.queue); err != nil || len(subs) != 0 {
		t.Fatalf("Consumers after unsubscribing = %v, %v", subs, err)
	}
	if _, err := env.client.Queues(ctx, "nope"); !errors.Is(err, pgque.ErrQueueNotFound) {
		t.Fatalf("Queues(nope) = %v, want ErrQueueNotFound", err)
	}
	qs, err := env.client.Queues(ctx, env.queue)
	if err != nil || len(qs) != 1 || qs[0].Name != env.queue || qs[0].Config.MaxRetries != 5 ||
		qs[0].Config.RotationPeriod != 2*time.Hour || qs[0].Config.TickerMaxLag != 10*time.Millisecond {
		t.Fatalf("Queues = %+v, %v", qs, err)
	}
}

// TestAdminDeadLetterFiltersAndPurge dead-letters events of two consumers
// and checks the consumer filter, the limit, replay of an unknown id and
// purge.
func TestAdminDeadLetterFiltersAndPurge(t *testing.T) {
	t.Parallel()
	env := setup(t)
	ctx := context.Background()
	if err := env.client.SetQueueConfig(ctx, env.queue, pgque.QueueMaxRetries(0)); err != nil {
		t.Fatal(err)
	}
	fail := func(context.Context, *pgque.Message) error { return errors.New("boom") }
	startTicker(t, env.client)
	startConsumer(t, env, &pgque.ConsumerConfig{Queue: env.queue, Consumer: "a", Handler: fail})
	startConsumer(t, env, &pgque.ConsumerConfig{Queue: env.queue, Consumer: "b", Handler: fail})
	for i := range 3 {
		if _, err := env.client.Send(ctx, env.queue, pgque.Event{Payload: i}); err != nil {
			t.Fatal(err)
		}
	}
	pgtest.WaitFor(t, 20*time.Second, "6 dead letters", func() bool {
		dls, err := env.client.DeadLetters(ctx, env.queue, nil)
		return err == nil && len(dls) == 6
	})
	onlyA, err := env.client.DeadLetters(ctx, env.queue, &pgque.DeadLetterFilter{Consumer: "a"})
	if err != nil || len(onlyA) != 3 {
		t.Fatalf("DeadLetters(a) = %d, %v; want 3", len(onlyA), err)
	}
	for _, d := range onlyA {
		if d.Consumer != "a" || d.Reason == "" {
			t.Fatalf("dead letter %+v: want consumer a with a reason", d)
		}
	}
	if two, err := env.client.DeadLetters(ctx, env.queue, &pgque.DeadLetterFilter{Limit: 2}); err != nil || len(two) != 2 {
		t.Fatalf("DeadLetters limit 2 = %d, %v", len(two), err)
	}
	if _, err := env.client.DeadLetters(ctx, env.queue, &pgque.DeadLetterFilter{Limit: -1}); !errors.Is(err, pgque.ErrInvalidArgument) {
		t.Fatalf("negative limit = %v, want ErrInvalidArgument", err)
	}
	if _, err := env.client.ReplayDeadLetter(ctx, env.queue, -1); !errors.Is(err, pgque.ErrDeadLetterNotFound) {
		t.Fatalf("replaying an unknown dead letter = %v, want ErrDeadLetterNotFound", err)
	}
	if n, err := env.client.PurgeDeadLetters(ctx, env.queue, &pgque.PurgeFilter{OlderThan: time.Hour}); err != nil || n != 0 {
		t.Fatalf("purge older than an hour = %d, %v; want 0", n, err)
	}
	if n, err := env.client.PurgeDeadLetters(ctx, env.queue, &pgque.PurgeFilter{Consumer: "b"}); err != nil || n != 3 {
		t.Fatalf("purge b = %d, %v; want 3", n, err)
	}
	if n, err := env.client.PurgeDeadLetters(ctx, env.queue, nil); err != nil || n != 3 {
		t.Fatalf("purge the rest = %d, %v; want 3", n, err)
	}
}

// TestSendPayloadPostgresCannotStore: valid JSON that PostgreSQL's jsonb
// refuses (a NUL character) comes back as ErrInvalidPayload with its
// SQLSTATE, and nothing is sent.
func TestSendPayloadPostgresCannotStore(t *testing.T) {
	t.Parallel()
	env := setup(t)
	ctx := context.Background()
	_, err := env.client.Send(ctx, env.queue, pgque.Event{Payload: json.RawMessage(`{"name": "a\u0000b"}`)})
	var pe *pgque.Error
	if !errors.Is(err, pgque.ErrInvalidPayload) || !errors.As(err, &pe) || pe.Code != "22P05" {
		t.Fatalf("Send with a NUL in the payload = %v, want ErrInvalidPayload (22P05)", err)
	}
	_, err = env.client.SendBatch(ctx, env.queue, []pgque.Event{{Payload: 1}, {Payload: json.RawMessage(`"\u0000"`)}})
	if !errors.Is(err, pgque.ErrInvalidPayload) {
		t.Fatalf("SendBatch with a NUL in a payload = %v, want ErrInvalidPayload", err)
	}
	qs, err := env.client.Queues(ctx, env.queue)
	if err != nil || qs[0].Unticked != 0 {
		t.Fatalf("events after refused sends: %+v, %v", qs, err)
	}
}

// TestReceiver reads a subscription by hand: what is received stays
// received until acknowledged, and work done in a rolled-back transaction
// is undone.
func TestReceiver(t *testing.T) {
	t.Parallel()
	env := setup(t)
	ctx := context.Background()
	tx, err := env.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := env.client.Receiver(tx).Subscribe(ctx, env.queue, "in_tx"); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if subs, err := env.client.Consumers(ctx, env.queue); err != nil || len(subs) != 0 {
		t.Fatalf("subscription survived the rollback: %+v, %v", subs, err)
	}

	r := env.client.Receiver(nil)
	if _, err := r.Subscribe(ctx, env.queue, "r"); err != nil {
		t.Fatal(err)
	}
	startTicker(t, env.client)
	id, err := env.client.Send(ctx, env.queue, pgque.Event{Payload: 1, PartitionKey: "k"})
	if err != nil {
		t.Fatal(err)
	}
	var msgs []*pgque.Message
	pgtest.WaitFor(t, 20*time.Second, "the event", func() bool {
		msgs, err = r.Receive(ctx, env.queue, "r", 10)
		return err == nil && len(msgs) == 1
	})
	if m := msgs[0]; m.ID != id || m.Key() != pgque.KeyOf("k") || m.Consumer != "r" {
		t.Fatalf("received %+v", m)
	}
	again, err := r.Receive(ctx, env.queue, "r", 10)
	if err != nil || len(again) != 1 || again[0].ID != id {
		t.Fatalf("before the ack the chunk is received again; got %v, %v", again, err)
	}
	if _, err := r.Ack(ctx, msgs[0].BatchID); err != nil {
		t.Fatal(err)
	}
	if rest, err := r.Receive(ctx, env.queue, "r", 10); err != nil || len(rest) != 0 {
		t.Fatalf("after the ack: %v, %v; want nothing", rest, err)
	}
	if _, err := r.Receive(ctx, "nope", "r", 10); !errors.Is(err, pgque.ErrQueueNotFound) {
		t.Fatalf("Receive on an unknown queue = %v", err)
	}
}

// TestDeadLettersOfSlotConsumerByItsName: a partitioned consumer's dead
// letters are stored per slot ("files#1/4"), yet its name selects all of
// them for listing and purging, each entry naming the consumer as
// subscribed, its slot and its key; a plain consumer whose name is a
// prefix of it is not mixed in.
func TestDeadLettersOfSlotConsumerByItsName(t *testing.T) {
	t.Parallel()
	env := setup(t)
	ctx := context.Background()
	startTicker(t, env.client)
	fail := func(_ context.Context, m *pgque.Message) error { return pgque.DeadLetter(errors.New("disk full")) }
	startProcess(t, env, pgque.PartitionedConsumerConfig{Queue: env.queue, Consumer: "storage", Slots: 4, Handler: fail})
	startConsumer(t, env, &pgque.ConsumerConfig{Queue: env.queue, Consumer: "stor", Handler: fail})
	const keys = 8
	slots := map[int]bool{}
	for i := range keys {
		key := fmt.Sprintf("tenant-%d", i)
		if _, err := env.client.Send(ctx, env.queue, pgque.Event{Payload: map[string]int{"n": i}, PartitionKey: key}); err != nil {
			t.Fatal(err)
		}
	}
	pgtest.WaitFor(t, 20*time.Second, "16 dead letters", func() bool {
		dls, err := env.client.DeadLetters(ctx, env.queue, nil)
		return err == nil && len(dls) == 2*keys
	})
	dls, err := env.client.DeadLetters(ctx, env.queue, &pgque.DeadLetterFilter{Consumer: "storage"})
	if err != nil || len(dls) != keys {
		t.Fatalf("DeadLetters(storage) = %d, %v; want %d (every slot's)", len(dls), err, keys)
	}
	for _, d := range dls {
		key, ok := d.Key.Value()
		if d.Consumer != "storage" || d.Slot < 0 || d.Slot >= 4 || !ok || d.Subscription != fmt.Sprintf("storage#%d/4", d.Slot) {
			t.Fatalf("dead letter %+v: want consumer storage, its slot and key", d)
		}
		if !strings.HasPrefix(key, "tenant-") || !json.Valid(d.Payload) {
			t.Fatalf("dead letter %+v: key %q", d, key)
		}
		slots[d.Slot] = true
	}
	if len(slots) < 2 {
		t.Fatalf("the keys fell into slots %v: the test needs several", slots)
	}
	plain, err := env.client.DeadLetters(ctx, env.queue, &pgque.DeadLetterFilter{Consumer: "stor"})
	if err != nil || len(plain) != keys || plain[0].Consumer != "stor" || plain[0].Slot != -1 || plain[0].Subscription != "stor" {
		t.Fatalf("DeadLetters(stor) = %+v, %v; want the plain consumer's %d only", plain, err, keys)
	}
	if n, err := env.client.PurgeDeadLetters(ctx, env.queue, &pgque.PurgeFilter{Consumer: "storage"}); err != nil || n != keys {
		t.Fatalf("PurgeDeadLetters(storage) = %d, %v; want %d", n, err, keys)
	}
	if left, err := env.client.DeadLetters(ctx, env.queue, nil); err != nil || len(left) != keys {
		t.Fatalf("after the purge: %d, %v; want the plain consumer's %d", len(left), err, keys)
	}
}

// SetQueueConfig sets typed settings, several at once and all or none:
// Queues and DedupWindow read back what was set, and a setting out of
// range or unknown leaves every setting of the call unchanged.
func TestSetQueueConfigTyped(t *testing.T) {
	t.Parallel()
	env := setup(t)
	ctx := context.Background()
	want := pgque.QueueConfig{TickerMaxCount: 7, TickerMaxLag: 40 * time.Millisecond, TickerIdlePeriod: 2 * time.Second,
		RotationPeriod: 3 * time.Hour, MaxRetries: 4}
	if err := env.client.SetQueueConfig(ctx, env.queue, pgque.QueueTickerMaxCount(7), pgque.QueueTickerMaxLag(40*time.Millisecond),
		pgque.QueueTickerIdlePeriod(2*time.Second), pgque.QueueRotationPeriod(3*time.Hour), pgque.QueueMaxRetries(4),
		pgque.QueueDedupWindow(90*time.Second)); err != nil {
		t.Fatal(err)
	}
	read := func() (pgque.QueueConfig, time.Duration) {
		t.Helper()
		qs, err := env.client.Queues(ctx, env.queue)
		if err != nil || len(qs) != 1 {
			t.Fatalf("Queues = %v, %v", qs, err)
		}
		w, err := env.client.DedupWindow(ctx, env.queue)
		if err != nil {
			t.Fatal(err)
		}
		return qs[0].Config, w
	}
	if got, w := read(); got != want || w != 90*time.Second {
		t.Fatalf("after setting: %+v, dedup window %v; want %+v, 1m30s", got, w, want)
	}
	for _, tc := range []struct {
		bad  pgque.QueueSetting
		want error
	}{
		{pgque.QueueTickerMaxCount(0), pgque.ErrInvalidArgument},
		{pgque.QueueRotationPeriod(-time.Second), pgque.ErrInvalidArgument},
		{pgque.QueueParam("no_such_param", "1"), pgque.ErrUnknownParameter},
	} {
		err := env.client.SetQueueConfig(ctx, env.queue, pgque.QueueMaxRetries(9), tc.bad, pgque.QueueDedupWindow(time.Minute))
		if !errors.Is(err, tc.want) {
			t.Errorf("setting %v: %v, want %v", tc.bad, err, tc.want)
		}
		if got, w := read(); got != want || w != 90*time.Second {
			t.Errorf("after the failed %v: %+v, dedup window %v; want nothing changed", tc.bad, got, w)
		}
	}
}

package pgque_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/pgque/pgque"
	"github.com/pgque/pgque/internal/dbq"
)

// TestPartitionedGathersWokenSlots: when a tick touches several slots of
// one process, their receives go out as one call (gather.go), and every
// event is still handled once, in key order, with the acknowledgements
// the gathered calls carry.
func TestPartitionedGathersWokenSlots(t *testing.T) {
	t.Parallel()
	env := setup(t)
	startTicker(t, env.client)
	const nslots = 16
	var chk checker
	delivered := make(chan int64, 1000)
	pc := soloConsumer(t, env, nslots, true, &chk, delivered)
	// A window far longer than any wake-up's spread under -race, so that
	// each burst's slots meet in one call.
	pgque.SetGatherWindow(pc, 30*time.Millisecond)
	startOwningAll(t, pc, nslots)
	ctx := context.Background()

	// Two keys on each of slots 0..7; each burst is one transaction with
	// an event of every one of them, so its tick touches 8 slots at once.
	var keys []string
	for s := range 8 {
		keys = append(keys, keysOnSlot(t, env, fmt.Sprintf("g%d-", s), nslots, s, 2)...)
	}
	sent := make(map[int64]string)
	const bursts = 15
	for b := range bursts {
		tx, err := env.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range keys {
			var id int64
			if err := tx.QueryRow(ctx, `select pgque.send($1, 'e', $2::jsonb, $3)`, env.queue, fmt.Sprint(b), k).Scan(&id); err != nil {
				t.Fatal(err)
			}
			sent[id] = k
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		for range keys {
			select {
			case <-delivered:
			case <-time.After(20 * time.Second):
				t.Fatalf("burst %d: not every event delivered", b)
			}
		}
	}
	// Until the pool has seen a touched set every slot wakes on every
	// tick, and slots still busy with the last chunk join a later call: so
	// not every burst is one call, but most are.
	if n := pgque.GatheredCalls(pc); n < bursts/2 {
		t.Errorf("%d receives for several slots in %d bursts of 8 touched slots; want at least %d", n, bursts, bursts/2)
	} else {
		t.Logf("%d receives for several slots in %d bursts", n, bursts)
	}
	r := stopAndVerify(t, pc, &chk, sent)
	t.Log(r)
	// Every chunk was acknowledged: nothing is left for the slots.
	var left int
	if err := env.pool.QueryRow(ctx, `select coalesce(sum(lag), 0) from pgque.partition_slot_status where queue = $1 and consumer = 'c'`, env.queue).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != 0 {
		t.Fatalf("%d events not acknowledged after Stop", left)
	}
}

// TestGatheredReceiveFallsBackSlotBySlot: a gathered call is all or
// nothing, so one slot whose lease is gone must not cost the others their
// chunks: the call fails, and each slot asks again alone.
func TestGatheredReceiveFallsBackSlotBySlot(t *testing.T) {
	t.Parallel()
	env := setup(t)
	ctx := context.Background()
	const nslots = 4
	if _, err := env.client.SubscribeSlots(ctx, env.queue, "c", nslots, 0); err != nil {
		t.Fatal(err)
	}
	pc, err := env.client.NewPartitionedConsumer(&pgque.PartitionedConsumerConfig{
		Queue: env.queue, Consumer: "c", Slots: nslots, WorkerID: "w", GatherReceives: true,
		Handler: func(context.Context, *pgque.Message) error { return nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	q := dbq.New(env.pool)
	var calls []dbq.SlotReceive
	for s := range 3 {
		_, token, ok, err := q.ClaimSlot(ctx, env.queue, "c", s, "w", time.Minute, "")
		if err != nil || !ok {
			t.Fatalf("claim_slot %d = %v, %v", s, ok, err)
		}
		calls = append(calls, dbq.SlotReceive{Slot: s, NSlots: nslots, Token: token})
		for _, k := range keysOnSlot(t, env, fmt.Sprintf("f%d-", s), nslots, s, 2) {
			if _, err := env.client.Send(ctx, env.queue, pgque.Event{Payload: s, PartitionKey: k}); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, err := env.pool.Exec(ctx, `select pgque.force_next_tick($1)`, env.queue); err != nil {
		t.Fatal(err)
	}
	if _, err := env.pool.Exec(ctx, `select pgque.ticker()`); err != nil {
		t.Fatal(err)
	}
	// Slot 1's token no longer proves its lease.
	calls[1].Token = dbq.LeaseToken("00000000-0000-4000-8000-000000000000")

	// As one call, the bad token fails all three and receives nothing.
	if _, err := q.ReceivePartitionedSlots(ctx, env.queue, "c", "w", 10, calls); !dbq.NotLeaseHolder(err) {
		t.Fatalf("receive_partitioned_raw_slots with slot 1's token wrong = %v, want PQ085", err)
	}
	rows, errs := pgque.GatherReceive(ctx, pc, calls)
	for i, c := range calls {
		switch {
		case c.Slot == 1:
			if !dbq.NotLeaseHolder(errs[i]) || rows[i] != nil {
				t.Errorf("slot 1 (token wrong): %d rows, %v; want PQ085", len(rows[i]), errs[i])
			}
		case errs[i] != nil || len(rows[i]) != 2:
			t.Errorf("slot %d: %d rows, %v; want its 2 events", c.Slot, len(rows[i]), errs[i])
		}
	}
	if n := pgque.GatheredCalls(pc); n != 1 {
		t.Errorf("%d gathered calls; want the one that failed", n)
	}
}

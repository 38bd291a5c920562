package pgque_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/pgque/pgque"
	"github.com/pgque/pgque/internal/testing/pgtest"
)

// slotGauges is an Observer that keeps each gauge's last value per slot.
type slotGauges struct {
	pgque.NopObserver
	mu     sync.Mutex
	values map[string]float64
}

func (g *slotGauges) Metric(m pgque.Measurement) {
	if m.Kind != pgque.MetricGauge {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.values[m.Name+"/"+m.Slot] = m.Value
}

func (g *slotGauges) get(name, slot string) float64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.values[name+"/"+slot]
}

// A PartitionedConsumer next to a slot that another worker claimed and only
// renews (claim_slot in a loop, never a receive): the client reports the
// slot stalled ("not progressing", with what to do) and the Observer gets
// MetricSlotStalled above 0 for it, while the pool drains the other slot.
// Once the renewer stops, the pool takes the slot over within a lease TTL
// and a few claim passes and handles its events in ev_id order, one
// handler at a time per key; the gauge returns to 0.
func TestPartitionedConsumerTakesOverStalledSlot(t *testing.T) {
	t.Parallel()
	env := setup(t)
	ctx := context.Background()
	obs := &slotGauges{values: map[string]float64{}}
	client, err := pgque.NewClient(env.pool, &pgque.Config{Logger: testLogger(t), Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	startTicker(t, client)
	if _, err := client.SubscribeSlots(ctx, env.queue, "c", 2, pgque.FailurePolicySkip); err != nil {
		t.Fatal(err)
	}
	// tenant-3 maps to slot 0 of 2, tenant-1 to slot 1.
	want := map[string][]int64{}
	for i := range 20 {
		for _, key := range []string{"tenant-3", "tenant-1"} {
			id, err := client.Send(ctx, env.queue, pgque.Event{Payload: i, PartitionKey: key})
			if err != nil {
				t.Fatal(err)
			}
			want[key] = append(want[key], id)
		}
	}

	// The renewer claims once and then renews with its lease token.
	var token *string
	renew := func() bool {
		var epoch *int64
		err := env.pool.QueryRow(ctx, "select epoch, token::text from pgque.claim_slot($1, 'c', 0, 'renewer', '1 second', $2::uuid)",
			env.queue, token).Scan(&epoch, &token)
		if err != nil {
			t.Error("renewer:", err)
		}
		return epoch != nil
	}
	if !renew() {
		t.Fatal("the renewer could not claim slot 0")
	}
	stopRenewer, renewerDone := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(renewerDone)
		for {
			select {
			case <-stopRenewer:
				return
			case <-time.After(100 * time.Millisecond):
			}
			if !renew() {
				t.Error("the renewer lost slot 0")
				return
			}
		}
	}()
	stopOnce := sync.OnceFunc(func() { close(stopRenewer); <-renewerDone })
	defer stopOnce()

	var mu sync.Mutex
	handled := map[string][]int64{}
	active := map[string]int{}
	overlap := ""
	pc, err := client.NewPartitionedConsumer(&pgque.PartitionedConsumerConfig{
		Queue: env.queue, Consumer: "c", Slots: 2, WorkerID: "live",
		LeaseTTL: time.Second, ClaimInterval: 100 * time.Millisecond, PollInterval: 50 * time.Millisecond,
		Handler: func(ctx context.Context, m *pgque.Message) error {
			mu.Lock()
			active[m.PartitionKey]++
			if active[m.PartitionKey] > 1 && overlap == "" {
				overlap = fmt.Sprintf("two handlers of key %s at once", m.PartitionKey)
			}
			mu.Unlock()
			_ = pgtest.Work(ctx, time.Millisecond) // a call that takes time, so that an overlap would show
			mu.Lock()
			active[m.PartitionKey]--
			handled[m.PartitionKey] = append(handled[m.PartitionKey], m.ID)
			mu.Unlock()
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := pc.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() {
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if err := pc.Stop(sctx); err != nil {
			t.Error("stopping:", err)
		}
	}()
	done := func(key string) bool {
		mu.Lock()
		defer mu.Unlock()
		got := handled[key]
		if !slices.Equal(got, want[key][:min(len(got), len(want[key]))]) {
			t.Fatalf("key %s handled %v, want %v in this order", key, got, want[key])
		}
		return len(got) == len(want[key])
	}
	waitUntil := func(what string, cond func() bool) {
		t.Helper()
		pgtest.WaitFor(t, 30*time.Second, what, cond)
	}

	waitUntil("slot 1 to drain", func() bool { return done("tenant-1") })
	var stall pgque.SlotStall
	waitUntil("the client to report slot 0 stalled", func() bool {
		stalls, err := client.SlotStalls(ctx, env.queue, "c")
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range stalls {
			if s.Slot == 0 && s.Stalled {
				stall = s
				return true
			}
		}
		return false
	})
	if stall.Reason != "not progressing" || stall.Owner != "renewer" || stall.Action == "" || stall.StalledFor < stall.StallAfter {
		t.Errorf("slot 0 reported %+v, want not progressing, owner renewer, an action, stalled past its bound", stall)
	}
	waitUntil("the stalled-slot gauge of slot 0", func() bool { return obs.get(pgque.MetricSlotStalled, "0") > 0 })
	if g := obs.get(pgque.MetricSlotStalled, "1"); g != 0 {
		t.Errorf("slot 1 stalled gauge = %v, want 0", g)
	}
	mu.Lock()
	early := len(handled["tenant-3"])
	mu.Unlock()
	if early != 0 {
		t.Fatalf("%d events of slot 0 handled while another worker held it", early)
	}

	stopOnce()
	freed := time.Now()
	waitUntil("slot 0 to drain after the renewer stopped", func() bool { return done("tenant-3") })
	took := time.Since(freed)
	t.Logf("slot 0 drained %v after its renewer stopped (lease TTL 1 s, claim interval 100 ms)", took)
	if took > 10*time.Second {
		t.Errorf("slot 0 was taken over %v after it was freed, want within a few seconds", took)
	}
	waitUntil("the stalled-slot gauge of slot 0 to return to 0", func() bool { return obs.get(pgque.MetricSlotStalled, "0") == 0 })
	mu.Lock()
	defer mu.Unlock()
	if overlap != "" {
		t.Error(overlap)
	}
}

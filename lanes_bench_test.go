package pgque_test

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgque/pgque"
	"github.com/pgque/pgque/internal/testing/pgtest"
)

// BenchmarkLanesFastPath drains a backlog of 1000 tenants' events with 16
// slots and a handler that does nothing, with key lanes on (the defaults)
// and off (MaxWorkersPerSlot 1), and reports the median ratio of the
// rates: the lanes' cost on the fast path. Run (or profile, with
// -cpuprofile) it with
//
//	go test -run '^$' -bench BenchmarkLanesFastPath -benchtime 5x .
func BenchmarkLanesFastPath(b *testing.B) {
	// Lanes off and on alternate, so that both see the same moments of a
	// shared machine.
	var ratios []float64
	for i := range b.N {
		var off, on float64
		if i%2 == 0 {
			off, on = fastDrainRate(b, 16, 20000, 1), fastDrainRate(b, 16, 20000, 0)
		} else {
			on, off = fastDrainRate(b, 16, 20000, 0), fastDrainRate(b, 16, 20000, 1)
		}
		b.Logf("lanes off %.0f ev/s, lanes on %.0f ev/s", off, on)
		ratios = append(ratios, on/off)
	}
	slices.Sort(ratios)
	b.ReportMetric(ratios[len(ratios)/2], "on/off")
}

// fastDrainRate loads events of 1000 keys and returns how fast one process
// with n slots drains them with a no-op handler.
func fastDrainRate(b *testing.B, n, events, perSlot int) float64 {
	b.StopTimer()
	pool, client, queue := benchEnv(b)
	ctx := context.Background()
	startBenchTicker(b, client)
	var done atomic.Int64
	all := make(chan struct{})
	cfg := &pgque.PartitionedConsumerConfig{Queue: queue, Consumer: "c", Slots: n, MaxWorkersPerSlot: perSlot,
		Handler: func(context.Context, *pgque.Message) error {
			if done.Add(1) == int64(events) {
				close(all)
			}
			return nil
		}}
	pc, err := client.NewPartitionedConsumer(cfg)
	if err != nil {
		b.Fatal(err)
	}
	if err := pc.Start(ctx); err != nil {
		b.Fatal(err)
	}
	if err := pc.Stop(ctx); err != nil {
		b.Fatal(err)
	}
	batch := make([]pgque.Event, 0, 1000)
	for i := range events {
		batch = append(batch, pgque.Event{Payload: i, PartitionKey: fmt.Sprintf("tenant-%d", i%1000)})
		if len(batch) == cap(batch) || i == events-1 {
			if _, err := client.SendBatch(ctx, queue, batch); err != nil {
				b.Fatal(err)
			}
			batch = batch[:0]
		}
	}
	forceTick(b, pool, queue)
	pc, err = client.NewPartitionedConsumer(cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.StartTimer()
	start := time.Now()
	if err := pc.Start(ctx); err != nil {
		b.Fatal(err)
	}
	waitDrained(b, all, &done, events)
	elapsed := time.Since(start)
	b.StopTimer()
	if err := pc.Stop(ctx); err != nil {
		b.Fatal(err)
	}
	return float64(events) / elapsed.Seconds()
}

// BenchmarkLanesHotKey drains 199 tenants' events at 5 ms each, 16
// slots, lanes on, once with a hot key that has every 10th event at 200 ms
// and once with the same other events alone, and reports the other keys'
// rates (first call to last) and their ratio.
//
//	go test -run '^$' -bench BenchmarkLanesHotKey -benchtime 1x .
func BenchmarkLanesHotKey(b *testing.B) {
	for range b.N {
		hot := hotDrainRate(b, 10000, true)
		cold := hotDrainRate(b, 10000, false)
		b.ReportMetric(hot, "ev/s-hot")
		b.ReportMetric(cold, "ev/s-cold")
		b.ReportMetric(hot/cold, "ratio")
	}
}

func hotDrainRate(b *testing.B, events int, withHot bool) float64 {
	b.StopTimer()
	pool, client, queue := benchEnv(b)
	ctx := context.Background()
	startBenchTicker(b, client)
	// One batch per 1000 events sent, as pgque bench's consume suite
	// makes them.
	tick := func() {
		if _, err := pool.Exec(ctx, "select pgque.force_next_tick($1)", queue); err != nil {
			b.Fatal(err)
		}
		if _, err := pool.Exec(ctx, "select pgque.ticker($1)", queue); err != nil {
			b.Fatal(err)
		}
	}
	others := 0
	var done atomic.Int64
	var first, last atomic.Int64
	all := make(chan struct{})
	cfg := &pgque.PartitionedConsumerConfig{Queue: queue, Consumer: "c", Slots: 16,
		Handler: func(ctx context.Context, m *pgque.Message) error {
			if m.PartitionKey == "hot" {
				select {
				case <-time.After(200 * time.Millisecond):
				case <-ctx.Done():
				}
				return ctx.Err()
			}
			first.CompareAndSwap(0, time.Now().UnixNano())
			_ = pgtest.Work(ctx, 5*time.Millisecond) // the handler cost the benchmark measures
			last.Store(time.Now().UnixNano())
			if done.Add(1) == int64(others) {
				close(all)
			}
			return nil
		}}
	pc, err := client.NewPartitionedConsumer(cfg)
	if err != nil {
		b.Fatal(err)
	}
	if err := pc.Start(ctx); err != nil {
		b.Fatal(err)
	}
	if err := pc.Stop(ctx); err != nil {
		b.Fatal(err)
	}
	batch := make([]pgque.Event, 0, 1000)
	for i := range events {
		key := fmt.Sprintf("tenant-%d", i%199)
		if i%10 == 0 {
			key = "hot"
		} else {
			others++
		}
		if withHot || key != "hot" {
			batch = append(batch, pgque.Event{Payload: i, PartitionKey: key})
		}
		if (i+1)%1000 == 0 || i == events-1 {
			if _, err := client.SendBatch(ctx, queue, batch); err != nil {
				b.Fatal(err)
			}
			batch = batch[:0]
			tick()
		}
	}
	forceTick(b, pool, queue)
	pc, err = client.NewPartitionedConsumer(cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.StartTimer()
	if err := pc.Start(ctx); err != nil {
		b.Fatal(err)
	}
	waitDrained(b, all, &done, others)
	b.StopTimer()
	stopCtx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	_ = pc.Stop(stopCtx) // the hot key's lane is abandoned
	return float64(others) / (time.Duration(last.Load() - first.Load())).Seconds()
}

package workerpool

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/pgque/pgque/internal/dbq"
	"github.com/pgque/pgque/internal/metrics"
	"github.com/pgque/pgque/internal/testing/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// Lag-aware claiming: with two free slots and room for one, a pool claims
// the slot whose oldest pending event is older. Each round puts the older
// head on the other slot, so a pool that picked at random (the order
// before head ages were read) would pass all six rounds only once in 64
// runs.
func TestClaimsOldestHeadFirst(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t, pgtest.NewInstalledDB(t))
	q := dbq.New(pool)
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := pool.Exec(ctx, sql, args...); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	exec("select pgque.create_queue('lag')")
	// tenant-3 maps to slot 0 of 2, tenant-1 to slot 1.
	keyOf := map[int]string{0: "tenant-3", 1: "tenant-1"}
	for round, older := range []int{1, 0, 1, 0, 0, 1} {
		consumer := fmt.Sprintf("c%d", round)
		// A tick first, so that the new slots start after every earlier
		// round's events.
		exec("select pgque.force_next_tick('lag'); select pgque.ticker('lag')")
		exec("select pgque.subscribe_slot('lag', $1, s, 2) from generate_series(0, 1) s", consumer)
		exec("select pgque.send('lag', 't', '{}'::jsonb, $1)", keyOf[older])
		exec("select pgque.send('lag', 't', '{}'::jsonb, $1)", keyOf[1-older])

		p := New(Config{
			Queries: q, Logger: slog.New(slog.DiscardHandler), Metrics: metrics.New(nil),
			Queue: "lag", Consumer: consumer, Worker: "w", Slots: 2, MaxActive: 1,
			LeaseTTL: time.Minute, ClaimInterval: time.Hour, PollInterval: time.Hour,
			Work:           func(context.Context, context.Context, *Lease) (bool, error) { return false, nil },
			IsLeaseLost:    func(error) bool { return false },
			LeaseLostCause: errors.New("lease lost"),
		})
		fetchCtx, stop := context.WithCancel(ctx)
		workCtx, kill := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); p.Run(fetchCtx, workCtx) }()
		pgtest.Eventually(ctx, 10*time.Second, func() bool { return len(p.Owned()) > 0 })
		owned := p.Owned()
		stop()
		<-done
		kill()
		if !slices.Equal(owned, []int{older}) {
			heads, err := q.SlotHeads(ctx, "lag", consumer)
			t.Logf("slot heads: %v %v", heads, err)
			t.Fatalf("round %d: the pool claimed %v, want only slot %d, whose head is older", round, owned, older)
		}
	}
}

// logSignal is a slog handler that sends each record's message.
type logSignal struct{ msgs chan string }

func (h logSignal) Enabled(context.Context, slog.Level) bool { return true }
func (h logSignal) Handle(_ context.Context, r slog.Record) error {
	select {
	case h.msgs <- r.Message:
	default:
	}
	return nil
}
func (h logSignal) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h logSignal) WithGroup(string) slog.Handler      { return h }

// The hot-key check: when one key holds most of a slot's pending events,
// the status refresher logs a warning and the top-key-share gauge shows it.
func TestHotKeyWarning(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t, pgtest.NewInstalledDB(t))
	for _, sql := range []string{
		"select pgque.create_queue('hot')",
		"select pgque.subscribe_slot('hot', 'c', s, 2) from generate_series(0, 1) s",
		// tenant-3 and acme map to slot 0 of 2: tenant-3 has 90 of its
		// 100 pending events.
		"select pgque.send('hot', 't', '{}'::jsonb, 'tenant-3') from generate_series(1, 90)",
		"select pgque.send('hot', 't', '{}'::jsonb, 'acme') from generate_series(1, 10)",
	} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	gauges := &gaugeSink{values: map[string]float64{}}
	m := metrics.New(gauges)
	logs := logSignal{msgs: make(chan string, 100)}
	p := New(Config{
		Queries: dbq.New(pool), Logger: slog.New(logs), Metrics: m,
		Queue: "hot", Consumer: "c", Worker: "w", Slots: 2, MaxActive: 2,
		LeaseTTL: time.Minute, ClaimInterval: time.Hour, PollInterval: time.Hour,
		StatusInterval: time.Hour, HotKeyShare: 0.5,
		Work:           func(context.Context, context.Context, *Lease) (bool, error) { return false, nil },
		IsLeaseLost:    func(error) bool { return false },
		LeaseLostCause: errors.New("lease lost"),
	})
	fetchCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); p.Run(fetchCtx, ctx) }()
	defer func() { stop(); <-done }()
	timeout := time.After(20 * time.Second)
	for {
		select {
		case msg := <-logs.msgs:
			if msg != "pgque: hot key holds most of a slot's pending events" {
				continue
			}
			if g := gauges.get(metrics.SlotTopKeyShare, "0"); g != 0.9 {
				t.Errorf("slot 0 top key share gauge = %v, want 0.9", g)
			}
			if g := gauges.get(metrics.SlotTopKeyShare, "1"); g != 0 {
				t.Errorf("slot 1 top key share gauge = %v, want 0 (nothing pending)", g)
			}
			return
		case <-timeout:
			t.Fatal("no hot-key warning was logged")
		}
	}
}

// gaugeSink keeps the last value of every gauge, by name and slot.
type gaugeSink struct {
	mu     sync.Mutex
	values map[string]float64
}

func (g *gaugeSink) Record(name string, kind metrics.Kind, value float64, l metrics.Labels) {
	if kind != metrics.Gauge {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.values[name+"/"+l.Slot] = value
}

func (g *gaugeSink) get(name, slot string) float64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.values[name+"/"+slot]
}

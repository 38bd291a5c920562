package pgque_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/pgque/pgque"
	"github.com/pgque/pgque/internal/testing/pgtest"
)

// recorder is an Observer that keeps everything it is told.
type recorder struct {
	mu      sync.Mutex
	totals  map[string]float64 // counters summed, gauges last value, durations counted
	series  map[pgque.Measurement]bool
	sends   []pgque.SendInfo
	sendErr []error
	handled []pgque.Message
	results []pgque.HandleResult
	// handleCtxOK counts handler calls whose context carried the value
	// HandleStart put in it.
	handleCtxOK int
}

type ctxKey struct{}

func (r *recorder) Metric(m pgque.Measurement) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.totals == nil {
		r.totals, r.series = map[string]float64{}, map[pgque.Measurement]bool{}
	}
	switch m.Kind {
	case pgque.MetricCounter:
		r.totals[m.Name] += m.Value
	case pgque.MetricGauge:
		r.totals[m.Name] = m.Value
	case pgque.MetricDuration:
		r.totals[m.Name]++
	}
	key := m
	key.Value = 0
	r.series[key] = true
}

func (r *recorder) SendStart(ctx context.Context, info pgque.SendInfo) context.Context {
	return context.WithValue(ctx, ctxKey{}, "send")
}

func (r *recorder) SendEnd(ctx context.Context, info pgque.SendInfo, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if ctx.Value(ctxKey{}) != "send" {
		err = errors.Join(err, errors.New("SendEnd did not get SendStart's context"))
	}
	r.sends = append(r.sends, info)
	r.sendErr = append(r.sendErr, err)
}

func (r *recorder) HandleStart(ctx context.Context, m *pgque.Message) context.Context {
	return context.WithValue(ctx, ctxKey{}, m.ID)
}

func (r *recorder) HandleEnd(ctx context.Context, m *pgque.Message, res pgque.HandleResult) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.handled = append(r.handled, *m)
	r.results = append(r.results, res)
}

func (r *recorder) total(name string) float64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.totals[name]
}

func (r *recorder) hasSeries(m pgque.Measurement) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.series[m]
}

// TestObserver runs a ticker, a partitioned consumer and sends through a
// client with an Observer, and checks every hook saw what happened: the
// sends with their sizes and keys, each handler call with its slot, epoch
// and outcome (and HandleStart's context reaching the handler), and the
// measurements by name and labels.
func TestObserver(t *testing.T) {
	t.Parallel()
	env := setup(t)
	ctx := context.Background()
	obs := &recorder{}
	client, err := pgque.NewClient(env.pool, &pgque.Config{Observer: obs, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	startTicker(t, client)
	var chk checker
	pc, err := client.NewPartitionedConsumer(&pgque.PartitionedConsumerConfig{
		Queue: env.queue, Consumer: "c", Slots: 2, ClaimInterval: 100 * time.Millisecond,
		Handler: func(ctx context.Context, m *pgque.Message) error {
			defer chk.begin("w", m)()
			if ctx.Value(ctxKey{}) == m.ID {
				obs.mu.Lock()
				obs.handleCtxOK++
				obs.mu.Unlock()
			}
			if m.PartitionKey == "b" && m.RetryCount == 0 {
				return errors.New("first try of b fails")
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
	events := []pgque.Event{{Payload: 1, PartitionKey: "a"}, {Payload: 2, PartitionKey: "b"}, {Payload: 3, PartitionKey: "c"}}
	if _, err := client.SendBatch(ctx, env.queue, events); err != nil {
		t.Fatal(err)
	}
	if _, err := client.Send(ctx, env.queue, pgque.Event{Payload: 4, PartitionKey: "d"}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.Send(ctx, "no_such_queue", pgque.Event{Payload: 5}); !errors.Is(err, pgque.ErrQueueNotFound) {
		t.Fatalf("send to a missing queue = %v", err)
	}
	pgtest.WaitFor(t, 30*time.Second, "all events and the retry", func() bool {
		return chk.distinct() == 4 && obs.total(pgque.MetricEventsProcessed) == 4
	})
	slot0 := pgque.Measurement{Name: pgque.MetricSlotLag, Kind: pgque.MetricGauge, Queue: env.queue, Consumer: "c", Slot: "0"}
	pgtest.WaitFor(t, 20*time.Second, "the slot gauges and ticker leadership", func() bool {
		return obs.hasSeries(slot0) && obs.total(pgque.MetricTickerLeader) == 1
	})

	obs.mu.Lock()
	defer obs.mu.Unlock()
	if len(obs.sends) != 3 || obs.sends[0].Events != 3 || obs.sends[1].Events != 1 || obs.sends[1].Key != pgque.KeyOf("d") {
		t.Errorf("sends observed: %+v", obs.sends)
	}
	if obs.sendErr[0] != nil || obs.sendErr[1] != nil || !errors.Is(obs.sendErr[2], pgque.ErrQueueNotFound) {
		t.Errorf("send errors observed: %v", obs.sendErr)
	}
	if len(obs.handled) != 5 || obs.handleCtxOK != 5 {
		t.Fatalf("observed %d handler calls, %d with HandleStart's context; want 5 and 5", len(obs.handled), obs.handleCtxOK)
	}
	failed := 0
	for i, m := range obs.handled {
		if m.Queue != env.queue || m.Consumer != "c" || m.Epoch == 0 || m.Slot < 0 || m.Slot > 1 {
			t.Errorf("handled message %+v lacks queue, consumer, slot or epoch", m)
		}
		if obs.results[i].Err != nil {
			failed++
			if m.PartitionKey != "b" || m.RetryCount != 0 {
				t.Errorf("unexpected failure on %+v: %v", m, obs.results[i].Err)
			}
		}
	}
	for name, want := range map[string]float64{
		pgque.MetricEventsSent: 4, pgque.MetricEventsProcessed: 4, pgque.MetricEventsFailed: 1,
		pgque.MetricEventsRetried: 1, pgque.MetricLeaseClaims: 2, pgque.MetricHandlerDuration: 5,
	} {
		if got := obs.totals[name]; got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	if failed != 1 {
		t.Errorf("observed %d failed calls, want 1", failed)
	}
	sent := pgque.Measurement{Name: pgque.MetricEventsSent, Kind: pgque.MetricCounter, Queue: env.queue}
	if !obs.series[sent] {
		t.Errorf("no %+v series; have %v", sent, obs.series)
	}
}

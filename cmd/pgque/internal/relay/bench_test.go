package relay_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/pgque/pgque"
	"github.com/pgque/pgque/cmd/pgque/internal/relay"
	"github.com/pgque/pgque/internal/testing/pgtest"
)

// BenchmarkRelay compares the relay (an HTTP POST per event to a Go
// server that sleeps the handler cost) with the same handler called in
// process, on one cluster in one run. b.N events over 1000 keys are sent
// as fast as possible and drained (ev/s); then 200 events are sent at
// 100/s and their latency from send to the handler is measured (p50 and
// p99 ms). Slots: $PGQUE_RELAY_BENCH_SLOTS, default 16; handlers running at
// once (lanes) and requests in flight: $PGQUE_RELAY_BENCH_WORKERS, default
// pgque.MaxWorkersDefault.
//
//	go test -run '^$' -bench BenchmarkRelay -benchtime 4000x ./internal/relay/
func BenchmarkRelay(b *testing.B) {
	slots := 16
	if s := os.Getenv("PGQUE_RELAY_BENCH_SLOTS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			b.Fatalf("PGQUE_RELAY_BENCH_SLOTS=%q is not a slot count", s)
		}
		slots = n
	}
	for _, cost := range []time.Duration{0, 20 * time.Millisecond} {
		for _, mode := range []string{"inproc", "relay"} {
			b.Run(fmt.Sprintf("cost=%v/slots=%d/%s", cost, slots, mode), func(b *testing.B) {
				benchRelay(b, cost, slots, mode == "relay")
			})
		}
	}
}

// benchSink records when each event reached the handler.
type benchSink struct {
	mu      sync.Mutex
	latency []time.Duration
	n       int
	want    int
	done    chan struct{}
}

func (s *benchSink) reset(want int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.latency, s.n, s.want, s.done = nil, 0, want, make(chan struct{})
}

func (s *benchSink) seen(created time.Time) {
	lat := time.Since(created)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.latency = append(s.latency, lat)
	s.n++
	if s.n == s.want {
		close(s.done)
	}
}

func benchRelay(b *testing.B, cost time.Duration, slots int, viaHTTP bool) {
	dsn := pgtest.NewInstalledDB(b)
	pool := pgtest.Pool(b, dsn)
	ctx := context.Background()
	quiet := slog.New(slog.DiscardHandler)
	client, err := pgque.NewClient(pool, &pgque.Config{Logger: quiet})
	if err != nil {
		b.Fatal(err)
	}
	if _, err := client.CreateQueue(ctx, "bench"); err != nil {
		b.Fatal(err)
	}
	tk, err := client.NewTicker(&pgque.TickerConfig{})
	if err != nil {
		b.Fatal(err)
	}
	if err := tk.Start(ctx); err != nil {
		b.Fatal(err)
	}
	defer func() { _ = tk.Stop(ctx) }()
	sink := &benchSink{}
	var handler pgque.HandlerFunc
	if viaHTTP {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_ = pgtest.Work(r.Context(), cost) // the endpoint's cost the benchmark measures
			created, _ := time.Parse(time.RFC3339Nano, r.Header.Get("ce-time"))
			sink.seen(created)
		}))
		defer srv.Close()
		// Requests in flight as many as handlers may run (lanes): the relay
		// must not be the narrower limit of the two.
		r, err := relay.New(&relay.Config{URL: srv.URL, Queue: "bench", Consumer: "c", Logger: quiet, MaxInFlight: benchWorkers(b)})
		if err != nil {
			b.Fatal(err)
		}
		defer r.Close()
		handler = r.Handle
	} else {
		handler = func(ctx context.Context, m *pgque.Message) error {
			_ = pgtest.Work(ctx, cost) // the handler's cost the benchmark measures
			sink.seen(m.CreatedAt)
			return nil
		}
	}
	pc, err := client.NewPartitionedConsumer(&pgque.PartitionedConsumerConfig{
		Queue: "bench", Consumer: "c", Slots: slots, Handler: handler, ClaimInterval: 100 * time.Millisecond,
		MaxWorkers: benchWorkers(b),
	})
	if err != nil {
		b.Fatal(err)
	}
	if err := pc.Start(ctx); err != nil {
		b.Fatal(err)
	}
	defer func() { _ = pc.Stop(ctx) }()
	// Claiming is setup, before the timer.
	pgtest.WaitFor(b, 30*time.Second, "every slot claimed", func() bool { return len(pc.OwnedSlots()) == slots })
	events := func(n, from int) []pgque.Event {
		out := make([]pgque.Event, n)
		for i := range out {
			out[i] = pgque.Event{Type: "t", Payload: i, PartitionKey: "k" + strconv.Itoa((from+i)%1000)}
		}
		return out
	}

	// Throughput: drain b.N events sent at once.
	sink.reset(b.N)
	b.ResetTimer()
	start := time.Now()
	for off := 0; off < b.N; off += 1000 {
		if _, err := client.SendBatch(ctx, "bench", events(min(1000, b.N-off), off)); err != nil {
			b.Fatal(err)
		}
	}
	select {
	case <-sink.done:
	case <-time.After(5 * time.Minute):
		b.Fatalf("drained only %d of %d events", sink.n, b.N)
	}
	elapsed := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "ev/s")

	// Latency at a light load: 200 events at 100/s.
	const paced = 200
	sink.reset(paced)
	for i := range paced {
		if _, err := client.Send(ctx, "bench", events(1, i)[0]); err != nil {
			b.Fatal(err)
		}
		// The pace is the workload (100 events a second), not a wait.
		_ = pgtest.Work(ctx, 10*time.Millisecond)
	}
	select {
	case <-sink.done:
	case <-time.After(time.Minute):
		b.Fatalf("paced: only %d of %d events handled", sink.n, paced)
	}
	sink.mu.Lock()
	lat := slices.Clone(sink.latency)
	sink.mu.Unlock()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
	b.ReportMetric(0, "ns/op")
}

// benchWorkers is the per-process handler limit of both modes:
// $PGQUE_RELAY_BENCH_WORKERS, default pgque.MaxWorkersDefault.
func benchWorkers(b *testing.B) int {
	if s := os.Getenv("PGQUE_RELAY_BENCH_WORKERS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			b.Fatalf("PGQUE_RELAY_BENCH_WORKERS=%q is not a positive number", s)
		}
		return n
	}
	return pgque.MaxWorkersDefault
}

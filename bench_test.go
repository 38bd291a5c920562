package pgque_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgque/pgque"
	"github.com/pgque/pgque/internal/testing/pgtest"
)

// benchEnv is setup for benchmarks: a fresh database, a client, a queue.
func benchEnv(b *testing.B) (*pgxpool.Pool, *pgque.Client, string) {
	b.Helper()
	dsn := pgtest.NewInstalledDB(b)
	pool := pgtest.Pool(b, dsn)
	client, err := pgque.NewClient(pool, nil)
	if err != nil {
		b.Fatal(err)
	}
	queue := fmt.Sprintf("bench%d", queueSeq.Add(1))
	if _, err := client.CreateQueue(context.Background(), queue); err != nil {
		b.Fatal(err)
	}
	return pool, client, queue
}

// startBenchTicker runs a Ticker with default settings.
func startBenchTicker(b *testing.B, client *pgque.Client) {
	b.Helper()
	tk, err := client.NewTicker(nil)
	if err != nil {
		b.Fatal(err)
	}
	if err := tk.Start(context.Background()); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = tk.Stop(context.Background()) })
}

// waitDrained waits until a benchmark's handler closed all, having
// handled total events (done counts them), and fails the benchmark after
// five minutes.
func waitDrained(b *testing.B, all <-chan struct{}, done *atomic.Int64, total int) {
	b.Helper()
	select {
	case <-all:
	case <-time.After(5 * time.Minute):
		b.Fatalf("drained %d of %d events", done.Load(), total)
	}
}

// percentile returns the p-th percentile (0..100) of sorted durations.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(float64(len(sorted)-1) * p / 100)
	return sorted[i]
}

// BenchmarkLatency measures send commit → handler start at a steady 1,000
// events/s, with default settings everywhere (Ticker, consumers). b.N is
// the number of events: run with -benchtime=5000x for five seconds.
//
//	go test -run '^$' -bench BenchmarkLatency -benchtime 5000x .
func BenchmarkLatency(b *testing.B) {
	b.Run("consumer", func(b *testing.B) {
		benchLatency(b, func(client *pgque.Client, queue string, h pgque.HandlerFunc) (func(context.Context) error, error) {
			con, err := client.NewConsumer(&pgque.ConsumerConfig{Queue: queue, Consumer: "c", Handler: h})
			if err != nil {
				return nil, err
			}
			return con.Stop, con.Start(context.Background())
		})
	})
	b.Run("partitioned-8", func(b *testing.B) {
		benchLatency(b, func(client *pgque.Client, queue string, h pgque.HandlerFunc) (func(context.Context) error, error) {
			pc, err := client.NewPartitionedConsumer(&pgque.PartitionedConsumerConfig{Queue: queue, Consumer: "c", Slots: 8, Handler: h})
			if err != nil {
				return nil, err
			}
			return pc.Stop, pc.Start(context.Background())
		})
	})
}

func benchLatency(b *testing.B, start func(*pgque.Client, string, pgque.HandlerFunc) (func(context.Context) error, error)) {
	_, client, queue := benchEnv(b)
	startBenchTicker(b, client)
	var committed sync.Map // ev_id → time.Time
	var mu sync.Mutex
	var latencies []time.Duration
	var wg sync.WaitGroup
	wg.Add(b.N)
	stop, err := start(client, queue, func(_ context.Context, m *pgque.Message) error {
		now := time.Now()
		for { // the handler may start before Send returned the id
			if at, ok := committed.Load(m.ID); ok {
				mu.Lock()
				latencies = append(latencies, now.Sub(at.(time.Time)))
				mu.Unlock()
				break
			}
			runtime.Gosched()
		}
		wg.Done()
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	defer stop(context.Background())
	pgtest.WaitFor(b, 10*time.Second, "the LISTEN session", func() bool { return pgque.NotifierSessions(client) > 0 })

	ctx := context.Background()
	b.ResetTimer()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for i := range b.N {
		<-tick.C
		id, err := client.Send(ctx, queue, pgque.Event{Payload: i, PartitionKey: strconv.Itoa(rand.IntN(1000))})
		if err != nil {
			b.Fatal(err)
		}
		// Send returned: the transaction committed. A handler that started
		// earlier (impossible by design) would record a negative latency.
		committed.Store(id, time.Now())
	}
	wg.Wait()
	b.StopTimer()
	sort.Slice(latencies, func(i, j int) bool { return latencies[i] < latencies[j] })
	b.ReportMetric(float64(percentile(latencies, 50).Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(percentile(latencies, 99).Microseconds())/1000, "p99-ms")
	b.ReportMetric(float64(latencies[len(latencies)-1].Microseconds())/1000, "max-ms")
}

// BenchmarkPartitionedSpeedup drains the same kind of backlog with a
// handler that sleeps 2 ms, once with N = 1 slot and once with N = 16 slots
// worked at once by one process, and reports the throughput ratio.
//
//	go test -run '^$' -bench BenchmarkPartitionedSpeedup -benchtime 1x .
func BenchmarkPartitionedSpeedup(b *testing.B) {
	for range b.N {
		one := drainRate(b, 1, 1000)
		sixteen := drainRate(b, 16, 8000)
		b.ReportMetric(one, "ev/s-N1")
		b.ReportMetric(sixteen, "ev/s-N16")
		b.ReportMetric(sixteen/one, "speedup")
	}
}

// drainRate subscribes n slots, loads a backlog of events with distinct
// keys, then measures how fast one process drains it.
func drainRate(b *testing.B, n, events int) float64 {
	b.StopTimer()
	pool, client, queue := benchEnv(b)
	ctx := context.Background()
	startBenchTicker(b, client)
	var done atomic.Int64
	var first atomic.Int64
	perSlot := make([]atomic.Int64, n)
	all := make(chan struct{})
	cfg := &pgque.PartitionedConsumerConfig{Queue: queue, Consumer: "c", Slots: n,
		Handler: func(ctx context.Context, m *pgque.Message) error {
			first.CompareAndSwap(0, time.Now().UnixNano())
			perSlot[m.Slot].Add(1)
			_ = pgtest.Work(ctx, 2*time.Millisecond) // the handler cost the benchmark measures
			if done.Add(1) == int64(events) {
				close(all)
			}
			return nil
		}}
	// Subscribe first: a new subscription starts at the latest tick.
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
		batch = append(batch, pgque.Event{Payload: i, PartitionKey: fmt.Sprintf("tenant-%d", i)})
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
	var loads []int64
	for i := range perSlot {
		loads = append(loads, perSlot[i].Load())
	}
	b.Logf("N=%d: %d events in %v, first handler after %v, per-slot loads %v", n, events, elapsed,
		time.Duration(first.Load()-start.UnixNano()), loads)
	return float64(events) / elapsed.Seconds()
}

// BenchmarkDrainBacklog drains a backlog of 1M events (PGQUE_BENCH_BACKLOG
// overrides) with an 8-slot partitioned consumer and a no-op handler,
// sampling the process's RSS and Go heap while it drains.
//
//	go test -run '^$' -bench BenchmarkDrainBacklog -benchtime 1x -timeout 30m .
func BenchmarkDrainBacklog(b *testing.B) {
	total := 1_000_000
	if s := os.Getenv("PGQUE_BENCH_BACKLOG"); s != "" {
		total, _ = strconv.Atoi(s)
	}
	for range b.N {
		b.StopTimer()
		pool, client, queue := benchEnv(b)
		ctx := context.Background()
		startBenchTicker(b, client)
		var done atomic.Int64
		all := make(chan struct{})
		cfg := &pgque.PartitionedConsumerConfig{Queue: queue, Consumer: "c", Slots: 8,
			Handler: func(context.Context, *pgque.Message) error {
				if done.Add(1) == int64(total) {
					close(all)
				}
				return nil
			}}
		pc, _ := client.NewPartitionedConsumer(cfg)
		if err := pc.Start(ctx); err != nil {
			b.Fatal(err)
		}
		_ = pc.Stop(ctx)
		loadStart := time.Now()
		loadBacklog(b, client, queue, total)
		b.Logf("loaded %d events in %v", total, time.Since(loadStart))
		forceTick(b, pool, queue)

		runtime.GC()
		baseRSS := rssBytes()
		pc, _ = client.NewPartitionedConsumer(cfg)
		b.StartTimer()
		start := time.Now()
		if err := pc.Start(ctx); err != nil {
			b.Fatal(err)
		}
		var maxRSS, maxHeap uint64
		sample := time.NewTicker(100 * time.Millisecond)
	wait:
		for {
			select {
			case <-all:
				break wait
			case <-sample.C:
				var ms runtime.MemStats
				runtime.ReadMemStats(&ms)
				maxRSS = max(maxRSS, rssBytes())
				maxHeap = max(maxHeap, ms.HeapInuse)
			case <-time.After(20 * time.Minute):
				b.Fatalf("drained %d of %d", done.Load(), total)
			}
		}
		elapsed := time.Since(start)
		b.StopTimer()
		sample.Stop()
		_ = pc.Stop(ctx)
		b.ReportMetric(float64(total)/elapsed.Seconds(), "ev/s")
		b.ReportMetric(float64(baseRSS)/(1<<20), "rss-before-MiB")
		b.ReportMetric(float64(maxRSS)/(1<<20), "rss-max-MiB")
		b.ReportMetric(float64(maxHeap)/(1<<20), "heap-max-MiB")
	}
}

// loadBacklog sends total events over 10k keys, 5k per send_batch.
func loadBacklog(b *testing.B, client *pgque.Client, queue string, total int) {
	ctx := context.Background()
	batch := make([]pgque.Event, 0, 5000)
	for i := range total {
		batch = append(batch, pgque.Event{Type: "FileCreated", Payload: map[string]any{"n": i, "path": "/some/file/path.txt"},
			PartitionKey: "tenant-" + strconv.Itoa(i%10000)})
		if len(batch) == cap(batch) || i == total-1 {
			if _, err := client.SendBatch(ctx, queue, batch); err != nil {
				b.Fatal(err)
			}
			batch = batch[:0]
		}
	}
}

// rssBytes reads the process's resident set size from /proc.
func rssBytes() uint64 {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(line, "VmRSS:") {
			f := strings.Fields(line)
			kb, _ := strconv.ParseUint(f[1], 10, 64)
			return kb << 10
		}
	}
	return 0
}

// BenchmarkSend compares the ways to write 1,000 keyed events: one
// send_batch call (what SendBatch does), COPY into the event table with ids
// pre-allocated from the queue's sequence (what a COPY path would have to
// do to follow the engine's rules; needs table privileges app roles lack),
// and 1,000 send calls pipelined in one pgx batch.
//
//	go test -run '^$' -bench BenchmarkSend -benchtime 200x .
func BenchmarkSend(b *testing.B) {
	const n = 1000
	events := make([]pgque.Event, n)
	for i := range events {
		events[i] = pgque.Event{Type: "FileCreated", Payload: map[string]any{"n": i, "path": "/some/file/path.txt"},
			PartitionKey: "tenant-" + strconv.Itoa(i%100)}
	}
	b.Run("send_batch", func(b *testing.B) {
		_, client, queue := benchEnv(b)
		ctx := context.Background()
		b.ResetTimer()
		for range b.N {
			if _, err := client.SendBatch(ctx, queue, events); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.N*n)/b.Elapsed().Seconds(), "ev/s")
	})
	b.Run("copy", func(b *testing.B) {
		pool, _, queue := benchEnv(b)
		ctx := context.Background()
		payloads := make([]string, n)
		for i, ev := range events {
			p, _ := jsonMarshal(ev.Payload)
			payloads[i] = p
		}
		b.ResetTimer()
		for range b.N {
			err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				// The engine's rules: ev_id from the queue's sequence, the
				// current table's partition, ev_txid by default.
				var part int
				var seq string
				if err := tx.QueryRow(ctx, `select queue_id * 16 + queue_cur_table, queue_event_seq::text
					from pgque.queue where queue_name = $1`, queue).Scan(&part, &seq); err != nil {
					return err
				}
				var ids []int64
				if err := tx.QueryRow(ctx, `select array_agg(nextval($1::regclass)) from generate_series(1, $2)`,
					seq, n).Scan(&ids); err != nil {
					return err
				}
				rows := make([][]any, n)
				for i := range rows {
					rows[i] = []any{ids[i], part, events[i].Type, payloads[i], events[i].PartitionKey}
				}
				_, err := tx.CopyFrom(ctx, pgx.Identifier{"pgque", "event"},
					[]string{"ev_id", "ev_part", "ev_type", "ev_data", "ev_extra1"}, pgx.CopyFromRows(rows))
				return err
			})
			if err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.N*n)/b.Elapsed().Seconds(), "ev/s")
	})
	b.Run("pipelined_send", func(b *testing.B) {
		pool, _, queue := benchEnv(b)
		ctx := context.Background()
		payloads := make([]string, n)
		for i, ev := range events {
			payloads[i], _ = jsonMarshal(ev.Payload)
		}
		b.ResetTimer()
		for range b.N {
			err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				var batch pgx.Batch
				for i := range n {
					batch.Queue(`select pgque.send($1::text, $2::text, $3::jsonb, $4::text)`,
						queue, events[i].Type, payloads[i], events[i].PartitionKey)
				}
				return tx.SendBatch(ctx, &batch).Close()
			})
			if err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.N*n)/b.Elapsed().Seconds(), "ev/s")
	})
}

func jsonMarshal(v any) (string, error) {
	b, err := json.Marshal(v)
	return string(b), err
}

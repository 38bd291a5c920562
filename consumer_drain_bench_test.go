package pgque_test

import (
	"context"
	"os"
	"runtime/pprof"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/pgque/pgque"
)

// BenchmarkConsumerDrain drains a backlog of 200k events (PGQUE_BENCH_BACKLOG
// overrides) with a plain Consumer and a no-op handler, and reports the
// client process's CPU time per event beside the rate: the client and the
// server take turns on every chunk, so each microsecond of client CPU per
// event is drain time. PGQUE_BENCH_CPUPROFILE=file profiles the drain
// alone (not the load before it).
//
//	PGQUE_BENCH_CPUPROFILE=drain.prof go test -run '^$' -bench BenchmarkConsumerDrain -benchtime 1x .
func BenchmarkConsumerDrain(b *testing.B) {
	total := 200_000
	if s := os.Getenv("PGQUE_BENCH_BACKLOG"); s != "" {
		total, _ = strconv.Atoi(s)
	}
	for range b.N {
		b.StopTimer()
		pool, client, queue := benchEnv(b)
		ctx := context.Background()
		if _, err := client.Subscribe(ctx, queue, "c"); err != nil {
			b.Fatal(err)
		}
		startBenchTicker(b, client)
		loadBacklog(b, client, queue, total)
		forceTick(b, pool, queue)
		var done atomic.Int64
		all := make(chan struct{})
		con, err := client.NewConsumer(&pgque.ConsumerConfig{Queue: queue, Consumer: "c",
			Handler: func(context.Context, *pgque.Message) error {
				if done.Add(1) == int64(total) {
					close(all)
				}
				return nil
			}})
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		cpu0 := cpuTime()
		if path := os.Getenv("PGQUE_BENCH_CPUPROFILE"); path != "" {
			f, err := os.Create(path)
			if err != nil {
				b.Fatal(err)
			}
			defer f.Close()
			if err := pprof.StartCPUProfile(f); err != nil {
				b.Fatal(err)
			}
		}
		start := time.Now()
		if err := con.Start(ctx); err != nil {
			b.Fatal(err)
		}
		waitDrained(b, all, &done, total)
		elapsed := time.Since(start)
		pprof.StopCPUProfile()
		b.StopTimer()
		_ = con.Stop(ctx)
		b.ReportMetric(float64(total)/elapsed.Seconds(), "ev/s")
		b.ReportMetric(float64((cpuTime()-cpu0).Nanoseconds())/float64(total), "client-cpu-ns/ev")
	}
}

// cpuTime is the CPU time this process used so far, user and system.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

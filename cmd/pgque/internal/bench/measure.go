package bench

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// measurement is a figure and the per-round samples it is the median of.
type measurement struct {
	value   float64
	samples []float64
}

func single(v float64) measurement { return measurement{value: v, samples: []float64{v}} }

// trial is one throughput case of an interleaved comparison: run does any
// untimed setup, then the timed work, and returns the figure.
type trial struct {
	name string
	run  func(ctx context.Context) (float64, error)
}

// rounds runs every trial n times, interleaved (round i runs all trials,
// starting at a different one each round so none always goes first), and
// returns each trial's median. Interleaving spreads the machine's noise over
// a case and its reference alike.
func (e *env) rounds(ctx context.Context, n int, trials ...trial) (map[string]measurement, error) {
	samples := make(map[string][]float64)
	for i := 0; i < n; i++ {
		var line []string
		for j := range trials {
			t := trials[(i+j)%len(trials)]
			v, err := t.run(ctx)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", t.name, err)
			}
			samples[t.name] = append(samples[t.name], v)
			line = append(line, fmt.Sprintf("%s=%s", t.name, fmtNum(v)))
		}
		e.logf("   round %d/%d: %s", i+1, n, strings.Join(line, " "))
	}
	out := make(map[string]measurement, len(trials))
	for name, s := range samples {
		out[name] = measurement{value: median(s), samples: s}
	}
	return out, nil
}

// median of s (s is not modified).
func median(s []float64) float64 {
	if len(s) == 0 {
		return math.NaN()
	}
	c := slices.Clone(s)
	slices.Sort(c)
	if len(c)%2 == 1 {
		return c[len(c)/2]
	}
	return (c[len(c)/2-1] + c[len(c)/2]) / 2
}

// percentile of sorted s, p in [0, 100], nearest rank.
func percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return math.NaN()
	}
	i := int(math.Ceil(p/100*float64(len(sorted)))) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

// loop runs fn on workers goroutines until d has passed and returns the
// units fn reported per second of wall time. Each worker first runs fn once
// untimed (to prepare statements and warm caches). The first error stops
// every worker and is returned.
func loop(ctx context.Context, workers int, d time.Duration, fn func(ctx context.Context, worker int) (int, error)) (float64, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var (
		total   atomic.Int64
		ready   sync.WaitGroup
		done    sync.WaitGroup
		startCh = make(chan struct{})
		begin   time.Time
	)
	fail := func(err error) { cancel(err) }
	ready.Add(workers)
	done.Add(workers)
	for w := 0; w < workers; w++ {
		go func() {
			defer done.Done()
			_, err := fn(ctx, w)
			ready.Done()
			if err != nil {
				fail(err)
				return
			}
			<-startCh
			deadline := begin.Add(d)
			for time.Now().Before(deadline) && ctx.Err() == nil {
				n, err := fn(ctx, w)
				if err != nil {
					if ctx.Err() == nil {
						fail(err)
					}
					return
				}
				total.Add(int64(n))
			}
		}()
	}
	ready.Wait()
	begin = time.Now()
	close(startCh)
	done.Wait()
	elapsed := time.Since(begin)
	if err := context.Cause(ctx); err != nil {
		return 0, err
	}
	return float64(total.Load()) / elapsed.Seconds(), nil
}

// connLoop is loop with one dedicated connection per worker, acquired from
// pool before the clock starts.
func connLoop(ctx context.Context, pool *pgxpool.Pool, conns int, d time.Duration,
	fn func(ctx context.Context, conn *pgx.Conn) (int, error)) (float64, error) {
	cs := make([]*pgxpool.Conn, conns)
	for i := range cs {
		c, err := pool.Acquire(ctx)
		if err != nil {
			for _, c := range cs[:i] {
				c.Release()
			}
			return 0, fmt.Errorf("acquiring connection %d of %d: %w", i+1, conns, err)
		}
		cs[i] = c
	}
	defer func() {
		for _, c := range cs {
			c.Release()
		}
	}()
	return loop(ctx, conns, d, func(ctx context.Context, w int) (int, error) {
		return fn(ctx, cs[w].Conn())
	})
}

// timeIt runs fn once and returns units per second.
func timeIt(ctx context.Context, fn func(ctx context.Context) (int, error)) (float64, error) {
	start := time.Now()
	n, err := fn(ctx)
	if err != nil {
		return 0, err
	}
	return float64(n) / time.Since(start).Seconds(), nil
}

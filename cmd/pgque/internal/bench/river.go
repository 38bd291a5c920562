package bench

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
)

// The River side of the peers suite: plain insert-and-work throughput (River
// has no per-key ordering), the job queue a Go team on Postgres would pick.

// riverArgs is the job: the same tenant and sequence the other workloads
// carry.
type riverArgs struct {
	Tenant string `json:"tenant"`
	Seq    int    `json:"seq"`
}

func (riverArgs) Kind() string { return "bench_event" }

type riverWorker struct {
	river.WorkerDefaults[riverArgs]
	cost    time.Duration
	handled *atomic.Int64
	first   *atomic.Int64
	lastEnd *atomic.Int64
	target  int64
	done    chan struct{}
}

func (w *riverWorker) Work(ctx context.Context, job *river.Job[riverArgs]) error {
	w.first.CompareAndSwap(0, time.Now().UnixNano())
	if w.cost > 0 {
		time.Sleep(w.cost)
	}
	end := time.Now().UnixNano()
	for {
		cur := w.lastEnd.Load()
		if end <= cur || w.lastEnd.CompareAndSwap(cur, end) {
			break
		}
	}
	if w.handled.Add(1) == w.target {
		close(w.done)
	}
	return nil
}

// riverResult holds River's insert and work rates.
type riverResult struct {
	insertRate, workRate float64
}

// migrateRiver installs River's schema into the database pool points at.
func migrateRiver(ctx context.Context, pool *pgxpool.Pool) error {
	m, err := rivermigrate.New(riverpgxv5.New(pool), &rivermigrate.Config{Logger: quietLogger})
	if err != nil {
		return err
	}
	if _, err := m.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return fmt.Errorf("migrating River: %w", err)
	}
	return nil
}

// riverMaxWorkers is the River client's MaxWorkers. River fetches at most
// MaxWorkers minus running jobs per fetch and at most once per
// FetchCooldown (100 ms by default; its docs: "throughput is limited by this
// value"), so with pgque's 8 workers and a free handler River is capped near
// 80 jobs/s, and with the 100 of its examples near 1000. 1000 goroutines
// cost a free handler nothing and let River run at what its database side
// can do; River's other defaults are kept.
const riverMaxWorkers = 1000

// runRiver inserts events jobs with InsertMany in batches of batchSize
// (timed: insert rate), then starts a client with workers workers and times
// the drain from the first job's start to the last one's end (work rate).
func runRiver(ctx context.Context, pool *pgxpool.Pool, events, workers int, cost time.Duration) (*riverResult, error) {
	if _, err := pool.Exec(ctx, "truncate river_job"); err != nil {
		return nil, err
	}
	var handled, first, lastEnd atomic.Int64
	w := &riverWorker{cost: cost, handled: &handled, first: &first, lastEnd: &lastEnd,
		target: int64(events), done: make(chan struct{})}
	workersReg := river.NewWorkers()
	if err := river.AddWorkerSafely(workersReg, w); err != nil {
		return nil, err
	}
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		Logger:  quietLogger,
		Queues:  map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: workers}},
		Workers: workersReg,
	})
	if err != nil {
		return nil, err
	}
	start := time.Now()
	for from := 0; from < events; from += batchSize {
		var params []river.InsertManyParams
		for i := from; i < min(events, from+batchSize); i++ {
			params = append(params, river.InsertManyParams{Args: riverArgs{Tenant: tenantKey(i), Seq: i}})
		}
		if _, err := client.InsertMany(ctx, params); err != nil {
			return nil, fmt.Errorf("River InsertMany: %w", err)
		}
	}
	res := &riverResult{insertRate: float64(events) / time.Since(start).Seconds()}
	if err := client.Start(ctx); err != nil {
		return nil, err
	}
	var werr error
	select {
	case <-w.done:
	case <-ctx.Done():
		werr = ctx.Err()
	case <-time.After(drainTimeout(events, cost, workers)):
		werr = fmt.Errorf("River handled %d of %d jobs before the timeout", handled.Load(), events)
	}
	stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if err := client.Stop(stopCtx); err != nil && werr == nil {
		werr = err
	}
	if werr != nil {
		return nil, werr
	}
	res.workRate = float64(events) / time.Duration(lastEnd.Load()-first.Load()).Seconds()
	return res, nil
}

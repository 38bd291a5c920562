package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgque/pgque"
)

// Defaults of Options.
const (
	TenantsDefault = 200
	EventsDefault  = 20000
	SlotsDefault   = 8
	WorkersDefault = 3
	// StallTimeoutDefault: the run fails when no event was handled for this
	// long while some are still outstanding.
	StallTimeoutDefault = 60 * time.Second
)

// producersMax caps the producer goroutines; each owns a share of the
// tenants.
const producersMax = 4

// stopTimeout bounds stopping the workers and the ticker.
const stopTimeout = 15 * time.Second

// ErrVerificationFailed is returned by Run when the run completed but one of
// the checks failed (or a guarantee was broken during the run).
var ErrVerificationFailed = errors.New("verification failed")

// errInterrupted is returned when Run's context ends before the run could
// be verified.
var errInterrupted = errors.New("demo interrupted before it could be verified")

// pausePolicy is the FailurePolicy that holds a tenant's later events while
// a failed one is retried (0 would fall back to skip and lenient runs). With
// it, runs with injected failures stay strict.
const pausePolicy = pgque.FailurePolicyPause

// Options configures Run. Zero fields take their defaults.
type Options struct {
	// DSN names the database to run in. pgque is installed (or upgraded)
	// there, and the demo's queue and schema (both named pgque_demo) are
	// re-created, and dropped again after a passing run. Empty starts a
	// throwaway cluster from the local PostgreSQL binaries and removes it at
	// the end.
	DSN string
	// Tenants is the number of tenants (partition keys).
	Tenants int
	// Events is the number of events to produce.
	Events int
	// Slots is N, the partitioned consumer's slot count.
	Slots int
	// Workers is the number of worker processes: separate Clients with
	// their own pools and worker ids, sharing the slots.
	Workers int
	// FailureRate is the fraction of first deliveries the handler fails
	// (before applying); the library retries them.
	FailureRate float64
	// Rate caps production, in events per second; 0 means as fast as the
	// database takes them.
	Rate float64
	// Duration caps the producing phase; 0 means until Events are sent.
	Duration time.Duration
	// StallTimeout: see StallTimeoutDefault.
	StallTimeout time.Duration
	// Progress receives progress: a bar when it is a terminal, plain lines
	// otherwise. Nil discards it.
	Progress io.Writer
	// Logger receives the library's logs. Nil discards them.
	Logger *slog.Logger

	hooks hooks
}

func (o *Options) withDefaults() Options {
	out := *o
	if out.Tenants == 0 {
		out.Tenants = TenantsDefault
	}
	if out.Events == 0 {
		out.Events = EventsDefault
	}
	if out.Slots == 0 {
		out.Slots = SlotsDefault
	}
	if out.Workers == 0 {
		out.Workers = WorkersDefault
	}
	if out.StallTimeout == 0 {
		out.StallTimeout = StallTimeoutDefault
	}
	if out.Progress == nil {
		out.Progress = io.Discard
	}
	if out.Logger == nil {
		out.Logger = slog.New(slog.DiscardHandler)
	}
	return out
}

// Validate reports the first invalid option.
func (o *Options) Validate() error {
	switch {
	case o.Tenants < 0 || o.Events < 0 || o.Slots < 0 || o.Workers < 0:
		return errors.New("--tenants, --events, --slots and --workers must be positive")
	case o.Slots > 1024:
		return fmt.Errorf("--slots must be at most 1024, not %d", o.Slots)
	case o.Workers > 64:
		return fmt.Errorf("--workers must be at most 64, not %d", o.Workers)
	case o.FailureRate < 0 || o.FailureRate >= 1:
		return fmt.Errorf("--failure-rate must be in [0, 1), not %g", o.FailureRate)
	case o.Rate < 0:
		return errors.New("--rate must not be negative")
	case o.Duration < 0 || o.StallTimeout < 0:
		return errors.New("durations must not be negative")
	}
	return nil
}

// Run runs the demo and verifies it. It returns the result whenever the
// workload ran (also when verification failed: the error is then
// ErrVerificationFailed), and a nil result with the error when it could not
// run. Cancelling ctx stops the run; the throwaway cluster, if any, is
// removed in every case.
func Run(ctx context.Context, opts Options) (res *Result, err error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	o := opts.withDefaults()
	env, err := setup(ctx, &o)
	if err != nil {
		if ctx.Err() != nil {
			return nil, errInterrupted
		}
		return nil, err
	}
	defer func() {
		err = errors.Join(err, env.close(res != nil && res.Passed))
	}()
	return run(ctx, &o, env)
}

// run is the workload itself: ticker, workers, producers, drain, verify.
func run(ctx context.Context, o *Options, env *environment) (*Result, error) {
	res := newResult(o)
	res.Database = env.describe
	strict := o.FailureRate == 0 || pausePolicy != 0
	res.Strict = strict
	res.Policy = pgque.FailurePolicySkip.String()
	if o.FailureRate > 0 && pausePolicy != 0 {
		res.Policy = pausePolicy.String()
	}

	runCtx, abort := context.WithCancelCause(ctx)
	defer abort(nil)
	var fatalOnce sync.Once
	fatal := func(err error) { fatalOnce.Do(func() { abort(fmt.Errorf("%w: %w", ErrVerificationFailed, err)) }) }

	tenants := tenantNames(o.Tenants)
	if err := createSchema(ctx, env.admin, tenants); err != nil {
		return nil, err
	}
	commits := newCommitLog(o.Events)
	ws := newWorkers(o.Workers, o.Events, strict, o.FailureRate, o.hooks, commits, fatal, o.Logger)

	stopAll, err := startServices(ctx, o, env, ws)
	if err != nil {
		return nil, err
	}
	defer stopAll()

	fmt.Fprintf(o.Progress, "demo: producing %d events for %d tenants; %d worker processes share %d slots\n",
		o.Events, o.Tenants, o.Workers, o.Slots)
	start := time.Now()
	prod := &production{done: make(chan struct{})}
	go prod.run(runCtx, o, env, tenants, commits)
	waitErr := waitDrained(runCtx, o, env, ws, prod, start)
	if waitErr != nil {
		abort(waitErr) // stops the producers
	}
	<-prod.done
	res.Sent, res.ProduceElapsed = prod.total(), prod.took
	if _, last := ws.progress(); !last.IsZero() {
		res.Elapsed = last.Sub(start)
	}
	stopAll()
	if prod.err != nil && runCtx.Err() == nil {
		return nil, prod.err
	}
	if cause := context.Cause(runCtx); cause != nil && ctx.Err() == nil && errors.Is(cause, ErrVerificationFailed) {
		waitErr = cause
	}
	expected := prod.gens
	if ctx.Err() != nil {
		return nil, errInterrupted
	}
	res.collect(ws, commits)
	if err := verify(ctx, env.admin, o, expected, ws, res); err != nil {
		return nil, err
	}
	if waitErr != nil {
		res.fail("run", waitErr.Error())
	}
	if !res.Passed {
		return res, ErrVerificationFailed
	}
	return res, nil
}

// startServices starts the ticker and the worker processes; stop stops
// them (idempotent).
func startServices(ctx context.Context, o *Options, env *environment, ws *workers) (stop func(), err error) {
	var stops []func(context.Context) error
	var once sync.Once
	stop = func() {
		once.Do(func() {
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), stopTimeout)
			defer cancel()
			for i := len(stops) - 1; i >= 0; i-- {
				_ = stops[i](sctx)
			}
		})
	}
	defer func() {
		if err != nil {
			stop()
		}
	}()
	base := context.WithoutCancel(ctx) // services stop through Stop, never by cancellation
	ticker, err := env.client.NewTicker(&pgque.TickerConfig{WorkerID: "demo-ticker", RetryInterval: 100 * time.Millisecond})
	if err != nil {
		return stop, err
	}
	if err := ticker.Start(base); err != nil {
		return stop, err
	}
	stops = append(stops, ticker.Stop)
	for i := range o.Workers {
		worker := fmt.Sprintf("worker-%d", i+1)
		pool, err := env.pool(ctx, o.Slots+4)
		if err != nil {
			return stop, err
		}
		stops = append(stops, func(context.Context) error { pool.Close(); return nil })
		client, err := pgque.NewClient(pool, &pgque.Config{Logger: o.Logger.With(slog.String("process", worker))})
		if err != nil {
			return stop, err
		}
		pc, err := client.NewPartitionedConsumer(&pgque.PartitionedConsumerConfig{
			Queue: Queue, Consumer: Consumer, Slots: o.Slots, WorkerID: worker,
			Handler:       ws.handler(pool, worker, i),
			FailurePolicy: policyFor(o),
			RetryDelay:    retryDelay,
			ClaimInterval: 250 * time.Millisecond,
		})
		if err != nil {
			return stop, err
		}
		// Start subscribes the slots (idempotently): the first one does it
		// before any event is produced, so nothing is missed.
		if err := pc.Start(base); err != nil {
			return stop, err
		}
		stops = append(stops, pc.Stop)
	}
	return stop, nil
}

// policyFor returns the failure policy for the run.
func policyFor(o *Options) pgque.FailurePolicy {
	if o.FailureRate > 0 && pausePolicy != 0 {
		return pausePolicy
	}
	return pgque.FailurePolicySkip
}

// retryDelay redelivers failed events quickly (100 ms doubling, capped at
// 2 s), so that runs with injected failures stay short.
func retryDelay(retry int) time.Duration {
	return min(100*time.Millisecond<<min(retry, 5), 2*time.Second)
}

// production runs the producers in the background.
type production struct {
	sent atomic.Int64  // events committed so far
	done chan struct{} // closed when every producer returned
	// Set before done is closed:
	gens map[string]*tenantGen // every tenant's events and expected state
	took time.Duration
	err  error
}

// total returns the number of events sent so far.
func (p *production) total() int { return int(p.sent.Load()) }

// finished reports whether every producer returned.
func (p *production) finished() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// run starts the producers, each owning a share of the tenants, and waits
// for them.
func (p *production) run(ctx context.Context, o *Options, env *environment, tenants []string, commits *commitLog) {
	defer close(p.done)
	start := time.Now()
	n := min(producersMax, len(tenants))
	p.gens = make(map[string]*tenantGen, len(tenants))
	prods := make([]*producer, n)
	for i := range prods {
		prods[i] = &producer{client: env.client, queue: Queue, commits: commits, rate: o.Rate / float64(n),
			events: o.Events / n, rng: rand.New(rand.NewPCG(uint64(i)+1, 0x5eed)), sent: &p.sent}
		if i < o.Events%n {
			prods[i].events++
		}
		if o.Duration > 0 {
			prods[i].until = start.Add(o.Duration)
		}
	}
	for i, t := range tenants {
		g := newTenantGen(t)
		p.gens[t] = g
		prods[i%n].tenants = append(prods[i%n].tenants, g)
	}
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i, pr := range prods {
		wg.Go(func() { errs[i] = pr.run(ctx) })
	}
	wg.Wait()
	p.took = time.Since(start)
	p.err = errors.Join(errs...)
}

// waitDrained waits until the producers are done and every event they
// sent was handled, reporting progress. It fails on a stall (no event
// handled for StallTimeout while some are outstanding), on dead letters, or
// when ctx ends.
func waitDrained(ctx context.Context, o *Options, env *environment, ws *workers, prod *production, start time.Time) error {
	pr := newProgress(o.Progress, o.Events, start)
	defer pr.finish()
	tk := time.NewTicker(100 * time.Millisecond)
	defer tk.Stop()
	lastCheck := time.Now()
	stallSince := time.Now()
	lastDone := -1
	for {
		finished := prod.finished() // before reading the count: no send can follow
		sent := prod.total()
		done, _ := ws.progress()
		if finished {
			pr.setTotal(sent)
		}
		pr.update(done)
		if finished && done >= sent {
			return nil
		}
		if done != lastDone || done >= sent {
			lastDone, stallSince = done, time.Now()
		} else if time.Since(stallSince) > o.StallTimeout {
			return fmt.Errorf("no progress for %v: %d of %d events handled", o.StallTimeout, done, sent)
		}
		if time.Since(lastCheck) > time.Second {
			lastCheck = time.Now()
			if n, err := deadLetters(ctx, env.admin); err == nil && n > 0 {
				return fmt.Errorf("%d events were dead-lettered", n)
			}
		}
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-tk.C:
		}
	}
}

// deadLetters counts the demo queue's dead letters.
func deadLetters(ctx context.Context, pool *pgxpool.Pool) (int64, error) {
	var n int64
	err := pool.QueryRow(ctx, `select dead_letters from pgque.get_queue_info($1::text)`, Queue).Scan(&n)
	return n, err
}

// tenantNames returns t0001, t0002, ...
func tenantNames(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("t%04d", i+1)
	}
	return out
}

package demo

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgque/pgque"
)

// errInjected is what the handler returns for an injected failure.
var errInjected = errors.New("injected failure (--failure-rate)")

// hooks let tests break the workload on purpose. The zero value does
// nothing.
type hooks struct {
	// skip, when it returns true, makes the handler acknowledge the event
	// without applying it: the verification must then fail.
	skip func(tenant string, seq int) bool
}

// SkipEventForTest makes the run acknowledge the event (tenant, seq)
// without applying it, so that its verification must fail. It exists for
// the command line's tests, which cannot reach the unexported hooks.
func SkipEventForTest(o *Options, tenant string, seq int) {
	o.hooks.skip = func(t string, s int) bool { return t == tenant && s == seq }
}

// workers is the state the handlers of every worker process share: the
// counters, the set of handled events, and the per-tenant in-flight flags
// that catch two workers handling one tenant at once.
type workers struct {
	strict      bool
	failureRate float64
	hooks       hooks
	commits     *commitLog
	fatal       func(error)
	logger      *slog.Logger

	inflight sync.Map // tenant → *atomic.Bool

	mu       sync.Mutex
	handled  map[int64]struct{}
	lastDone time.Time

	injected, reorders, duplicates, overlaps, violations atomic.Int64
	perWorker                                            []atomic.Int64
}

func newWorkers(n, events int, strict bool, failureRate float64, h hooks, commits *commitLog, fatal func(error), logger *slog.Logger) *workers {
	return &workers{
		strict: strict, failureRate: failureRate, hooks: h, commits: commits, fatal: fatal, logger: logger,
		handled: make(map[int64]struct{}, events), perWorker: make([]atomic.Int64, n),
	}
}

// handler returns the HandlerFunc of worker process idx, which applies
// events through its own pool.
func (w *workers) handler(pool *pgxpool.Pool, worker string, idx int) pgque.HandlerFunc {
	return func(ctx context.Context, m *pgque.Message) error {
		if m.RetryCount == 0 {
			w.commits.started(m.ID, time.Now())
		}
		var p payload
		if err := m.Decode(&p); err != nil {
			return w.violation(fmt.Errorf("event %d: undecodable payload: %w", m.ID, err))
		}
		if p.Tenant != m.PartitionKey {
			return w.violation(fmt.Errorf("event %d: payload tenant %q, partition key %q", m.ID, p.Tenant, m.PartitionKey))
		}
		busy := w.flag(p.Tenant)
		if !busy.CompareAndSwap(false, true) {
			w.overlaps.Add(1)
			return w.violation(fmt.Errorf("tenant %s: %s received seq %d while another worker was handling the tenant", p.Tenant, worker, p.Seq))
		}
		defer busy.Store(false)
		if m.RetryCount == 0 && w.inject(m.ID) {
			w.injected.Add(1)
			return errInjected
		}
		if w.hooks.skip != nil && w.hooks.skip(p.Tenant, p.Seq) {
			w.done(m.ID, idx)
			return nil
		}
		res, err := applyEvent(ctx, pool, m.Type, &p, w.strict, m.ID, worker, m.Slot, m.RetryCount)
		if err != nil {
			// Retried by the library; in a strict run the tenant's next
			// event then fails the order check, so say why.
			err = fmt.Errorf("applying event %d (tenant %s seq %d): %w", m.ID, p.Tenant, p.Seq, err)
			w.logger.ErrorContext(ctx, "demo: apply failed", slog.String("worker", worker), slog.Any("error", err))
			return err
		}
		switch {
		case res == "ok":
		case res == "reordered":
			w.reorders.Add(1)
		case res == "duplicate":
			w.duplicates.Add(1)
		case strings.HasPrefix(res, "violation: "):
			return w.violation(errors.New(strings.TrimPrefix(res, "violation: ")))
		default:
			return w.violation(fmt.Errorf("apply returned %q", res))
		}
		w.done(m.ID, idx)
		return nil
	}
}

// violation reports a broken guarantee: the run stops and fails.
func (w *workers) violation(err error) error {
	w.violations.Add(1)
	w.fatal(err)
	return err
}

// flag returns the tenant's in-flight flag.
func (w *workers) flag(tenant string) *atomic.Bool {
	if f, ok := w.inflight.Load(tenant); ok {
		return f.(*atomic.Bool)
	}
	f, _ := w.inflight.LoadOrStore(tenant, new(atomic.Bool))
	return f.(*atomic.Bool)
}

// inject decides, deterministically per event, whether its first delivery
// fails.
func (w *workers) inject(evID int64) bool {
	if w.failureRate <= 0 {
		return false
	}
	return float64(splitmix64(uint64(evID))>>11)/(1<<53) < w.failureRate
}

// done marks an event handled (acknowledged).
func (w *workers) done(evID int64, idx int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, ok := w.handled[evID]; !ok {
		w.handled[evID] = struct{}{}
		w.perWorker[idx].Add(1)
		w.lastDone = time.Now()
	}
}

// progress returns how many distinct events were handled, and when the
// last one was.
func (w *workers) progress() (int, time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.handled), w.lastDone
}

// splitmix64 is a fast, well-mixed hash of x.
func splitmix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

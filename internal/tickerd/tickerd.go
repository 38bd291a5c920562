// Package tickerd is the ticker service: it keeps the single ticker lease
// (ticker_lead), and while it leads it calls ticker() at a short interval,
// maint_retry_events() and maint() on their schedules. Any number of
// processes may run it; exactly one leads. Every call is its own short
// transaction, so the service works through a transaction-mode pooler.
package tickerd

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/pgque/pgque/internal/backoff"
	"github.com/pgque/pgque/internal/dbq"
	"github.com/pgque/pgque/internal/metrics"
	"github.com/pgque/pgque/internal/notifier"
)

// Config configures a Ticker. Every field is required.
type Config struct {
	Queries *dbq.Queries
	Logger  *slog.Logger
	Metrics *metrics.Metrics

	Worker        string
	LeaseTTL      time.Duration
	TickInterval  time.Duration
	RetryInterval time.Duration
	MaintInterval time.Duration
	// OnError, when set, receives each error the ticker logs (optional).
	OnError func(context.Context, error)
	// Notifier, when set, wakes a standing ticker when the leader resigns
	// (ResignChannel), so it takes the lease over at once (optional).
	Notifier *notifier.Notifier
}

// ResignChannel is notified by ticker_resign when a leader gives the lease
// up, and with IndexesPayload when a subscribe, unsubscribe or resize
// committed that wants event table indexes built or dropped.
const ResignChannel = "pgque_ticker"

// IndexesPayload on ResignChannel asks the leader for maint_route_indexes():
// the SQL leaves index changes to it, since their locks would last as long
// as the caller's transaction (pgque._route_index). Acted on at most once
// per indexesEvery, so a role that sends it in a loop costs one call a
// second.
const IndexesPayload = "indexes"

// indexesEvery is the least time between two maint_route_indexes() calls
// asked for by IndexesPayload.
const indexesEvery = time.Second

// reportError hands err to Config.OnError, if set.
func (t *Ticker) reportError(ctx context.Context, err error) {
	if t.cfg.OnError != nil {
		t.cfg.OnError(ctx, err)
	}
}

// Ticker is the service.
type Ticker struct {
	cfg    Config
	leader atomic.Bool
	// refused counts the lease requests another ticker's lease refused
	// (see Refused).
	refused atomic.Int64
}

// New returns a Ticker; Run runs it.
func New(cfg Config) *Ticker { return &Ticker{cfg: cfg} }

// IsLeader reports whether this ticker holds the lease right now.
func (t *Ticker) IsLeader() bool { return t.leader.Load() }

// Refused returns how many of this ticker's lease requests were refused
// because another ticker held the lease. Once it grew, the ticker stands
// by until its next check or a resignation notice: tests use it to know
// that a standing ticker has asked, where they would otherwise sleep.
func (t *Ticker) Refused() int64 { return t.refused.Load() }

// schedule tracks when each duty is due next.
type schedule struct {
	lead, retry, maint time.Time
	// indexes is set by IndexesPayload, and cleared by the next
	// maint_route_indexes(); indexesNext is when one may run again.
	indexes     bool
	indexesNext time.Time
	// leaderUntil is the local, conservative end of the lease.
	leaderUntil time.Time
}

// Run ticks until fetchCtx ends, then resigns the lease so that another
// ticker takes over at once.
func (t *Ticker) Run(fetchCtx, workCtx context.Context) {
	log := t.cfg.Logger.With(slog.String("worker", t.cfg.Worker))
	var s schedule
	failures := 0
	defer func() {
		if t.leader.Swap(false) {
			t.cfg.Metrics.TickerLeader.Set(0)
			if _, err := t.cfg.Queries.TickerResign(workCtx, t.cfg.Worker); err != nil && workCtx.Err() == nil {
				log.WarnContext(workCtx, "pgque: resigning ticker lease", slog.Any("error", err))
				t.reportError(workCtx, err)
			}
		}
	}()
	var resigned <-chan string // nil: never
	if t.cfg.Notifier != nil {
		sub := t.cfg.Notifier.Listen(ResignChannel, nil)
		defer sub.Unlisten()
		resigned = sub.C()
	}
	for fetchCtx.Err() == nil {
		start := time.Now()
		err := t.step(fetchCtx, workCtx, &s)
		if fetchCtx.Err() != nil {
			return
		}
		// Polls start TickInterval apart, however long the step took: a
		// tick is due once the last is ticker_max_lag old, stamped with
		// its poll's start, so polls spaced by TickInterval plus the step
		// would stretch the time between ticks by the step's duration.
		wait := max(0, t.cfg.TickInterval-time.Since(start))
		if err != nil {
			log.WarnContext(fetchCtx, "pgque: ticker", slog.Any("error", err))
			t.reportError(fetchCtx, err)
			wait = backoff.Errors.Delay(failures)
			failures++
		} else {
			failures = 0
			if !t.leader.Load() {
				wait = time.Until(s.lead)
			}
		}
		if !t.sleep(fetchCtx, wait, resigned, &s) {
			return
		}
	}
}

// sleep waits d, or until another ticker resigns while this one does not
// lead (then the lease is sought at once). An IndexesPayload only marks
// maint_route_indexes() due: waking the loop for it would let a role that
// sends it in a loop (NOTIFY needs no privilege) make the leader call
// ticker() as often. It reports false when ctx ended.
func (t *Ticker) sleep(ctx context.Context, d time.Duration, resigned <-chan string, s *schedule) bool {
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return false
		case <-timer.C:
			return true
		case p := <-resigned:
			switch {
			case p == IndexesPayload:
				s.indexes = true
			case p == "":
				// The LISTEN session was re-established: either may
				// have been missed.
				s.indexes = true
				s.lead = time.Time{}
				return true
			case !t.leader.Load():
				s.lead = time.Time{}
				return true
			}
		}
	}
}

// step renews or seeks leadership when due, then does the leader's duties.
//
// The lease call runs under workCtx, so a graceful stop lets it finish
// before Run resigns. Cancelled, it would only be abandoned by this
// process: a server that had not yet read the call runs it anyway, and
// when that is after the resignation it takes the lease back for a ticker
// that has stopped, and no queue ticks until the lease expires. The other
// duties leave the lease alone and stop with ctx.
func (t *Ticker) step(ctx, workCtx context.Context, s *schedule) error {
	now := time.Now()
	if !now.Before(s.lead) {
		ok, err := bounded(workCtx, t.cfg.LeaseTTL, func(ctx context.Context) (bool, error) {
			return t.cfg.Queries.TickerLead(ctx, t.cfg.Worker, t.cfg.LeaseTTL)
		})
		if err != nil {
			t.setLeader(ctx, now.Before(s.leaderUntil))
			return err
		}
		// ticker_lead renews only when less than half the TTL is left, so
		// true guarantees half a TTL from the call's start; asking again
		// every quarter keeps the local view continuous.
		s.lead = now.Add(backoff.Jitter(t.cfg.LeaseTTL/4, 0.1))
		if ok {
			s.leaderUntil = now.Add(t.cfg.LeaseTTL/2 - t.cfg.LeaseTTL/10)
		} else {
			s.leaderUntil = time.Time{}
			t.refused.Add(1)
		}
	}
	if !t.setLeader(ctx, now.Before(s.leaderUntil)) {
		return nil
	}
	if _, err := bounded(ctx, t.cfg.LeaseTTL, t.cfg.Queries.Ticker); err != nil {
		return err
	}
	t.cfg.Metrics.Ticks.Inc()
	if !now.Before(s.retry) {
		s.retry = now.Add(t.cfg.RetryInterval)
		if _, err := bounded(ctx, t.cfg.LeaseTTL, t.cfg.Queries.MaintRetryEvents); err != nil {
			return err
		}
	}
	if !now.Before(s.maint) {
		s.maint = now.Add(t.cfg.MaintInterval)
		if _, err := bounded(ctx, maintTimeout, t.cfg.Queries.Maint); err != nil {
			return err
		}
		// Routing indexes left out while their tables were full are
		// built once rotation emptied them, without blocking producers.
		return t.routeIndexes(ctx, now, s)
	}
	if s.indexes && !now.Before(s.indexesNext) {
		return t.routeIndexes(ctx, now, s)
	}
	return nil
}

// routeIndexes calls maint_route_indexes().
func (t *Ticker) routeIndexes(ctx context.Context, now time.Time, s *schedule) error {
	s.indexes = false
	s.indexesNext = now.Add(indexesEvery)
	_, err := bounded(ctx, maintTimeout, t.cfg.Queries.MaintRouteIndexes)
	return err
}

func (t *Ticker) setLeader(ctx context.Context, leader bool) bool {
	if t.leader.Swap(leader) != leader {
		v := 0.0
		if leader {
			v = 1
		}
		t.cfg.Metrics.TickerLeader.Set(v)
		t.cfg.Logger.InfoContext(ctx, "pgque: ticker leadership changed", slog.String("worker", t.cfg.Worker), slog.Bool("leader", leader))
	}
	return leader
}

// maintTimeout bounds one maint() or maint_route_indexes() call: rotation
// may legitimately take a while on a large table, but a call hung for
// longer than this (a lock that never comes) must not stop the ticker.
const maintTimeout = 5 * time.Minute

// bounded runs one background query with a timeout, so that a hung
// statement cannot stall the loop for ever: the ticks, lease renewals and
// retries are bounded by the lease TTL (past it the leadership is lost
// anyway), maintenance by maintTimeout.
func bounded[T any](ctx context.Context, d time.Duration, f func(context.Context) (T, error)) (T, error) {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	return f(ctx)
}

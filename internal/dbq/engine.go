package dbq

import (
	"context"
	"time"
)

// CreateQueue calls pgque.create_queue(queue) and reports whether the queue
// was created (false: it existed).
func (q *Queries) CreateQueue(ctx context.Context, queue string) (bool, error) {
	var n int
	err := q.db.QueryRow(ctx, `select pgque.create_queue($1::pg_catalog.text)`, queue).Scan(&n)
	return n == 1, err
}

// DropQueue calls pgque.drop_queue(queue, force).
func (q *Queries) DropQueue(ctx context.Context, queue string, force bool) error {
	_, err := q.db.Exec(ctx, `select pgque.drop_queue($1::pg_catalog.text, $2::pg_catalog.bool)`, queue, force)
	return err
}

// SetQueueConfig calls pgque.set_queue_config(queue, param, value).
func (q *Queries) SetQueueConfig(ctx context.Context, queue, param, value string) error {
	_, err := q.db.Exec(ctx, `select pgque.set_queue_config($1::pg_catalog.text, $2::pg_catalog.text, $3::pg_catalog.text)`, queue, param, value)
	return err
}

// Ticker calls pgque.ticker() and returns the number of queues ticked. The
// call is its own transaction, committed without waiting for its WAL to
// be flushed (synchronous_commit off for that transaction only): a tick
// records a snapshot and nothing else, and every record that refers to it
// comes later in the WAL, so a crash that loses the tick loses those too
// (docs/design.md, "Ticks commit without a flush"). The daemon's only
// caller runs it on a pool, never inside a caller's transaction.
func (q *Queries) Ticker(ctx context.Context) (int64, error) {
	var n *int64
	err := q.db.QueryRow(ctx, `select pgque.ticker() from pg_catalog.set_config('synchronous_commit', 'off', true)`).Scan(&n)
	if n == nil {
		return 0, err
	}
	return *n, err
}

// MissingExecute returns, of fns (function signatures such as
// "pgque.maint()"), those the session's role may not execute, in the order
// given, and the role's name. A signature that does not exist counts as
// missing.
func (q *Queries) MissingExecute(ctx context.Context, fns []string) (missing []string, role string, err error) {
	err = q.db.QueryRow(ctx, `select current_user::pg_catalog.text,
		coalesce(pg_catalog.array_agg(f order by n), '{}')
		  from pg_catalog.unnest($1::pg_catalog.text[]) with ordinality u(f, n)
		 where pg_catalog.to_regprocedure(f) is null
		    or not pg_catalog.has_function_privilege(pg_catalog.to_regprocedure(f), 'execute')`, fns).Scan(&role, &missing)
	return missing, role, err
}

// TickerLead calls pgque.ticker_lead(worker, ttl) and reports whether worker
// holds the ticker lease.
func (q *Queries) TickerLead(ctx context.Context, worker string, ttl time.Duration) (bool, error) {
	var ok bool
	err := q.db.QueryRow(ctx, `select coalesce(pgque.ticker_lead($1::pg_catalog.text, $2::interval), false)`, worker, ttl).Scan(&ok)
	return ok, err
}

// TickerResign calls pgque.ticker_resign(worker).
func (q *Queries) TickerResign(ctx context.Context, worker string) (bool, error) {
	var ok bool
	err := q.db.QueryRow(ctx, `select coalesce(pgque.ticker_resign($1::pg_catalog.text), false)`, worker).Scan(&ok)
	return ok, err
}

// MaintRetryEvents calls pgque.maint_retry_events() and returns the number of
// events re-inserted.
func (q *Queries) MaintRetryEvents(ctx context.Context) (int64, error) {
	var n *int64
	err := q.db.QueryRow(ctx, `select pgque.maint_retry_events()::bigint`).Scan(&n)
	if n == nil {
		return 0, err
	}
	return *n, err
}

// Maint calls pgque.maint() and returns the number of operations done.
func (q *Queries) Maint(ctx context.Context) (int64, error) {
	var n *int64
	err := q.db.QueryRow(ctx, `select pgque.maint()::bigint`).Scan(&n)
	if n == nil {
		return 0, err
	}
	return *n, err
}

package cli

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgque/pgque/internal/dbq"
)

// queries is the CLI's own data layer: the monitoring and dead-letter SQL
// functions of docs/sql-reference.md that internal/dbq does not bind (yet),
// one method per function or view, each a single statement. Intervals are
// read as seconds.
type queries struct {
	db dbq.DBTX
}

// queueInfo is one row of get_queue_info.
type queueInfo struct {
	Name             string   `json:"queue"`
	EvPerSec         *float64 `json:"ev_per_sec"`
	Unticked         int64    `json:"unticked"`
	TickerLagSeconds float64  `json:"ticker_lag_seconds"`
	RetryPending     int64    `json:"retry_pending"`
	DeadLetters      int64    `json:"dead_letters"`
	LastTickID       int64    `json:"last_tick_id"`
	Tables           int      `json:"tables"`
	CurrentTable     int      `json:"current_table"`
	// SinceRotation is how long ago the queue last switched tables.
	SinceRotation float64     `json:"since_rotation_seconds"`
	Config        queueConfig `json:"config"`
}

// queueConfig holds a queue's settings, in set_queue_config's terms.
type queueConfig struct {
	TickerMaxCount   int    `json:"ticker_max_count"`
	TickerMaxLag     string `json:"ticker_max_lag"`
	TickerIdlePeriod string `json:"ticker_idle_period"`
	RotationPeriod   string `json:"rotation_period"`
	MaxRetries       int    `json:"max_retries"`
	// rotationSeconds and idleSeconds are RotationPeriod and
	// TickerIdlePeriod in seconds, for the status checks.
	rotationSeconds, idleSeconds float64
}

// queueInfo calls get_queue_info(queue), or get_queue_info() for every
// queue when queue is "".
func (q *queries) queueInfo(ctx context.Context, queue string) ([]queueInfo, error) {
	rows, err := q.db.Query(ctx, `select queue_name, ev_per_sec, ev_new, extract(epoch from ticker_lag)::float8,
			retry_pending, dead_letters, last_tick_id, queue_ntables, queue_cur_table,
			extract(epoch from clock_timestamp() - queue_switch_time)::float8,
			queue_ticker_max_count, queue_ticker_max_lag::text, queue_ticker_idle_period::text,
			extract(epoch from queue_ticker_idle_period)::float8, queue_rotation_period::text,
			extract(epoch from queue_rotation_period)::float8, queue_max_retries
		from pgque.get_queue_info($1::text)`, nullIfEmpty(queue))
	if err != nil {
		return nil, dbErr("reading queue info", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (queueInfo, error) {
		var i queueInfo
		c := &i.Config
		err := r.Scan(&i.Name, &i.EvPerSec, &i.Unticked, &i.TickerLagSeconds, &i.RetryPending, &i.DeadLetters,
			&i.LastTickID, &i.Tables, &i.CurrentTable, &i.SinceRotation,
			&c.TickerMaxCount, &c.TickerMaxLag, &c.TickerIdlePeriod, &c.idleSeconds, &c.RotationPeriod, &c.rotationSeconds, &c.MaxRetries)
		return i, err
	})
	return out, dbErr("reading queue info", err)
}

// consumerInfo is one row of get_consumer_info.
type consumerInfo struct {
	Queue    string `json:"queue"`
	Consumer string `json:"consumer"`
	// LagSeconds is the age of the subscription's cursor.
	LagSeconds float64 `json:"lag_seconds"`
	// LastSeenSeconds is how long ago it last opened or finished a batch.
	LastSeenSeconds float64 `json:"last_seen_seconds"`
	Pending         int64   `json:"pending"`
	RetryPending    int64   `json:"retry_pending"`
	OpenBatch       *int64  `json:"open_batch"`
	// Warnings are filled in by status.
	Warnings []string `json:"warnings"`
}

// consumerInfo calls get_consumer_info(queue), or get_consumer_info() when
// queue is "".
func (q *queries) consumerInfo(ctx context.Context, queue string) ([]consumerInfo, error) {
	rows, err := q.db.Query(ctx, `select queue_name, consumer_name, extract(epoch from lag)::float8,
			extract(epoch from last_seen)::float8, pending_events, retry_pending, current_batch
		from pgque.get_consumer_info($1::text)`, nullIfEmpty(queue))
	if err != nil {
		return nil, dbErr("reading consumer info", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (consumerInfo, error) {
		var i consumerInfo
		err := r.Scan(&i.Queue, &i.Consumer, &i.LagSeconds, &i.LastSeenSeconds, &i.Pending, &i.RetryPending, &i.OpenBatch)
		return i, err
	})
	return out, dbErr("reading consumer info", err)
}

// slotRow is one row of the partition_slot_status view.
type slotRow struct {
	Queue    string `json:"queue"`
	Consumer string `json:"consumer"`
	Slot     int    `json:"slot"`
	NSlots   int    `json:"nslots"`
	// Owner is the live lease holder, nil when the lease expired or was
	// released.
	Owner      *string    `json:"owner"`
	LeaseUntil *time.Time `json:"lease_until"`
	Epoch      int64      `json:"epoch"`
	Lag        int64      `json:"lag"`
	// OldestPendingSeconds is the age of the oldest pending event.
	OldestPendingSeconds float64 `json:"oldest_pending_seconds"`
	Policy               string  `json:"policy"`
	OpenBatch            *int64  `json:"open_batch"`
	// LastActiveSeconds is how long ago the slot last opened or finished a
	// batch.
	LastActiveSeconds float64 `json:"last_active_seconds"`
	// HeldKeys, HeldEvents and OldestHoldSeconds describe the keys held
	// while their lanes run on (key_block state inflight): how many, the
	// events deferred for them, the age of the oldest hold. Filled in by
	// status.
	HeldKeys          int     `json:"held_keys"`
	HeldEvents        int64   `json:"held_events"`
	OldestHoldSeconds float64 `json:"oldest_hold_seconds"`
	// Warnings are filled in by status and slots status.
	Warnings []string `json:"warnings"`
}

// slotStatus reads partition_slot_status, optionally for one queue and one
// consumer, ordered by queue, consumer and slot.
func (q *queries) slotStatus(ctx context.Context, queue, consumer string) ([]slotRow, error) {
	rows, err := q.db.Query(ctx, `select queue, consumer, slot, nslots, owner, lease_until, coalesce(epoch, 0),
			coalesce(lag, 0), coalesce(extract(epoch from oldest_pending_age), 0)::float8, policy, open_batch,
			coalesce(extract(epoch from last_active), 0)::float8
		from pgque.partition_slot_status
		where ($1::text is null or queue = $1) and ($2::text is null or consumer = $2)
		order by queue, consumer, slot`, nullIfEmpty(queue), nullIfEmpty(consumer))
	if err != nil {
		return nil, dbErr("reading partition_slot_status", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (slotRow, error) {
		var s slotRow
		err := r.Scan(&s.Queue, &s.Consumer, &s.Slot, &s.NSlots, &s.Owner, &s.LeaseUntil, &s.Epoch,
			&s.Lag, &s.OldestPendingSeconds, &s.Policy, &s.OpenBatch, &s.LastActiveSeconds)
		return s, err
	})
	return out, dbErr("reading partition_slot_status", err)
}

// subscribeSlotPolicy calls subscribe_slot(queue, consumer, slot, nslots,
// policy) and reports whether the slot is new.
func (q *queries) subscribeSlotPolicy(ctx context.Context, queue, consumer string, slot, nslots int, policy string) (bool, error) {
	var n int
	err := q.db.QueryRow(ctx, `select pgque.subscribe_slot($1::text, $2::text, $3::int, $4::int, $5::text)`,
		queue, consumer, slot, nslots, policy).Scan(&n)
	return n == 1, err
}

// setFailurePolicy calls set_failure_policy(queue, consumer, policy).
func (q *queries) setFailurePolicy(ctx context.Context, queue, consumer, policy string) error {
	_, err := q.db.Exec(ctx, `select pgque.set_failure_policy($1::text, $2::text, $3::text)`, queue, consumer, policy)
	return dbErr(fmt.Sprintf("setting the failure policy of %q on queue %q", consumer, queue), err)
}

// blockedKey is one row of blocked_keys.
type blockedKey struct {
	Queue    string `json:"queue"`
	Consumer string `json:"consumer"`
	Slot     int    `json:"slot"`
	// Key is nil for the NULL key.
	Key      *string   `json:"key"`
	State    string    `json:"state"`
	HeadEvID int64     `json:"head_ev_id"`
	Since    time.Time `json:"since"`
	Failures int       `json:"failures"`
	Reason   *string   `json:"reason"`
	Deferred int64     `json:"deferred"`
}

// blockedKeys calls blocked_keys(queue, consumer).
func (q *queries) blockedKeys(ctx context.Context, queue, consumer string) ([]blockedKey, error) {
	rows, err := q.db.Query(ctx, `select queue, consumer, slot, key, state, head_ev_id, since, failures, reason, deferred
		from pgque.blocked_keys($1::text, $2::text)`, queue, nullIfEmpty(consumer))
	if err != nil {
		return nil, dbErr(fmt.Sprintf("listing blocked keys of queue %q", queue), err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (blockedKey, error) {
		var b blockedKey
		err := r.Scan(&b.Queue, &b.Consumer, &b.Slot, &b.Key, &b.State, &b.HeadEvID, &b.Since, &b.Failures, &b.Reason, &b.Deferred)
		return b, err
	})
	return out, dbErr(fmt.Sprintf("listing blocked keys of queue %q", queue), err)
}

// unblockKey calls unblock_key(queue, consumer, key) and returns the
// dead-lettered ev_id.
func (q *queries) unblockKey(ctx context.Context, queue, consumer string, key *string) (int64, error) {
	var evID int64
	err := q.db.QueryRow(ctx, `select pgque.unblock_key($1::text, $2::text, $3::text)`, queue, consumer, key).Scan(&evID)
	return evID, dbErr(fmt.Sprintf("unblocking a key of %q on queue %q", consumer, queue), err)
}

// retryKeyNow calls retry_key_now(queue, consumer, key).
func (q *queries) retryKeyNow(ctx context.Context, queue, consumer string, key *string) (int, error) {
	var n int
	err := q.db.QueryRow(ctx, `select pgque.retry_key_now($1::text, $2::text, $3::text)`, queue, consumer, key).Scan(&n)
	return n, dbErr(fmt.Sprintf("retrying a key of %q on queue %q", consumer, queue), err)
}

// deadLetter is one row of dlq_list.
type deadLetter struct {
	ID         int64     `json:"dl_id"`
	Consumer   string    `json:"consumer"`
	DeadSince  time.Time `json:"dead_since"`
	Reason     *string   `json:"reason"`
	EvID       int64     `json:"ev_id"`
	EvTime     time.Time `json:"ev_time"`
	RetryCount int       `json:"retry_count"`
	Type       *string   `json:"type"`
	Payload    *string   `json:"payload"`
	Key        *string   `json:"partition_key"`
}

// dlqList calls dlq_list(queue, consumer, max).
func (q *queries) dlqList(ctx context.Context, queue, consumer string, max int) ([]deadLetter, error) {
	rows, err := q.db.Query(ctx, `select dl_id, consumer, dl_time, reason, ev_id, ev_time, ev_retry, ev_type, ev_data, ev_extra1
		from pgque.dlq_list($1::text, $2::text, $3::int)`, queue, nullIfEmpty(consumer), max)
	if err != nil {
		return nil, dbErr(fmt.Sprintf("listing dead letters of queue %q", queue), err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (deadLetter, error) {
		var d deadLetter
		err := r.Scan(&d.ID, &d.Consumer, &d.DeadSince, &d.Reason, &d.EvID, &d.EvTime, &d.RetryCount, &d.Type, &d.Payload, &d.Key)
		return d, err
	})
	return out, dbErr(fmt.Sprintf("listing dead letters of queue %q", queue), err)
}

// dlqReplay calls dlq_replay(queue, dl_id) and returns the event id.
func (q *queries) dlqReplay(ctx context.Context, queue string, id int64) (int64, error) {
	var evID int64
	err := q.db.QueryRow(ctx, `select pgque.dlq_replay($1::text, $2::bigint)`, queue, id).Scan(&evID)
	return evID, dbErr(fmt.Sprintf("replaying dead letter %d of queue %q", id, queue), err)
}

// dlqPurge calls dlq_purge(queue, consumer, older_than) and returns how many
// dead letters it removed.
func (q *queries) dlqPurge(ctx context.Context, queue, consumer string, olderThan time.Duration) (int64, error) {
	var n int64
	err := q.db.QueryRow(ctx, `select pgque.dlq_purge($1::text, $2::text, $3::interval)`,
		queue, nullIfEmpty(consumer), olderThan).Scan(&n)
	return n, dbErr(fmt.Sprintf("purging dead letters of queue %q", queue), err)
}

// nullIfEmpty maps "" to SQL NULL.
func nullIfEmpty(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// dbError is an error from pgque's SQL, worded like the library's errors:
// "doing: message (SQLSTATE code)". It unwraps to the *pgconn.PgError.
type dbError struct {
	doing string
	pg    *pgconn.PgError
}

func (e *dbError) Error() string {
	return fmt.Sprintf("%s: %s (SQLSTATE %s)", e.doing, e.pg.Message, e.pg.Code)
}

func (e *dbError) Unwrap() error { return e.pg }

// dbErr wraps err, if any, as "doing: error".
func dbErr(doing string, err error) error {
	if err == nil {
		return nil
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return &dbError{doing: doing, pg: pgErr}
	}
	return fmt.Errorf("%s: %w", doing, err)
}

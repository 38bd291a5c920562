package dbq

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// QueueInfo is one row of get_queue_info, with intervals in seconds.
type QueueInfo struct {
	Name             string   `json:"queue"`
	EvPerSec         *float64 `json:"ev_per_sec"`
	Unticked         int64    `json:"unticked"`
	TickerLagSeconds float64  `json:"ticker_lag_seconds"`
	RetryPending     int64    `json:"retry_pending"`
	DeadLetters      int64    `json:"dead_letters"`
	LastTickID       int64    `json:"last_tick_id"`
	Tables           int      `json:"tables"`
	CurrentTable     int      `json:"current_table"`
	SinceRotation    float64  `json:"since_rotation_seconds"`
	RotationPeriod   float64  `json:"rotation_period_seconds"`
}

// QueueInfo calls get_queue_info(queue); a nil queue means every queue.
func (q *Queries) QueueInfo(ctx context.Context, queue *string) ([]QueueInfo, error) {
	rows, err := q.db.Query(ctx, `select queue_name, ev_per_sec, ev_new, extract(epoch from ticker_lag)::float8,
			retry_pending, dead_letters, last_tick_id, queue_ntables, queue_cur_table,
			extract(epoch from clock_timestamp() - queue_switch_time)::float8,
			extract(epoch from queue_rotation_period)::float8
		from pgque.get_queue_info($1::text)`, queue)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (QueueInfo, error) {
		var i QueueInfo
		err := r.Scan(&i.Name, &i.EvPerSec, &i.Unticked, &i.TickerLagSeconds, &i.RetryPending, &i.DeadLetters,
			&i.LastTickID, &i.Tables, &i.CurrentTable, &i.SinceRotation, &i.RotationPeriod)
		return i, err
	})
}

// ConsumerInfo is one row of get_consumer_info, with intervals in seconds.
type ConsumerInfo struct {
	Queue           string  `json:"queue"`
	Consumer        string  `json:"consumer"`
	LagSeconds      float64 `json:"lag_seconds"`
	LastSeenSeconds float64 `json:"last_seen_seconds"`
	Pending         int64   `json:"pending"`
	RetryPending    int64   `json:"retry_pending"`
	OpenBatch       *int64  `json:"open_batch"`
}

// ConsumerInfo calls get_consumer_info(queue); a nil queue means every
// queue. Slot subscriptions are included (their names hold '#').
func (q *Queries) ConsumerInfo(ctx context.Context, queue *string) ([]ConsumerInfo, error) {
	rows, err := q.db.Query(ctx, `select queue_name, consumer_name, extract(epoch from lag)::float8,
			extract(epoch from last_seen)::float8, pending_events, retry_pending, current_batch
		from pgque.get_consumer_info($1::text)`, queue)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (ConsumerInfo, error) {
		var i ConsumerInfo
		err := r.Scan(&i.Queue, &i.Consumer, &i.LagSeconds, &i.LastSeenSeconds, &i.Pending, &i.RetryPending, &i.OpenBatch)
		return i, err
	})
}

// SlotRow is one row of the partition_slot_status view, with intervals in
// seconds.
type SlotRow struct {
	Queue      string     `json:"queue"`
	Consumer   string     `json:"consumer"`
	Slot       int        `json:"slot"`
	NSlots     int        `json:"nslots"`
	Owner      *string    `json:"owner"`
	LeaseUntil *time.Time `json:"lease_until"`
	Epoch      int64      `json:"epoch"`
	Lag        int64      `json:"lag"`
	HeadAge    float64    `json:"head_age_seconds"`
	Policy     string     `json:"policy"`
	OpenBatch  *int64     `json:"open_batch"`
	LastActive float64    `json:"last_active_seconds"`
}

// SlotRows reads partition_slot_status, for one queue when queue is not
// nil, ordered by queue, consumer and slot.
func (q *Queries) SlotRows(ctx context.Context, queue *string) ([]SlotRow, error) {
	rows, err := q.db.Query(ctx, `select queue, consumer, slot, nslots, owner, lease_until, coalesce(epoch, 0),
			coalesce(lag, 0), coalesce(extract(epoch from oldest_pending_age), 0)::float8, policy, open_batch,
			coalesce(extract(epoch from last_active), 0)::float8
		from pgque.partition_slot_status where $1::text is null or queue = $1
		order by queue, consumer, slot`, queue)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (SlotRow, error) {
		var s SlotRow
		err := r.Scan(&s.Queue, &s.Consumer, &s.Slot, &s.NSlots, &s.Owner, &s.LeaseUntil, &s.Epoch,
			&s.Lag, &s.HeadAge, &s.Policy, &s.OpenBatch, &s.LastActive)
		return s, err
	})
}

// DeadLetter is one row of dlq_list.
type DeadLetter struct {
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

// DeadLetters calls dlq_list(queue, consumer, max); a nil consumer means
// every consumer.
func (q *Queries) DeadLetters(ctx context.Context, queue string, consumer *string, max int) ([]DeadLetter, error) {
	rows, err := q.db.Query(ctx, `select dl_id, consumer, dl_time, reason, ev_id, ev_time, ev_retry, ev_type, ev_data, ev_extra1
		from pgque.dlq_list($1::text, $2::text, $3::int)`, queue, consumer, max)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (DeadLetter, error) {
		var d DeadLetter
		err := r.Scan(&d.ID, &d.Consumer, &d.DeadSince, &d.Reason, &d.EvID, &d.EvTime, &d.RetryCount, &d.Type, &d.Payload, &d.Key)
		return d, err
	})
}

// DeadLetterReplay calls dlq_replay(queue, dl_id) and returns the ev_id.
func (q *Queries) DeadLetterReplay(ctx context.Context, queue string, id int64) (int64, error) {
	var evID int64
	err := q.db.QueryRow(ctx, `select pgque.dlq_replay($1::text, $2::bigint)`, queue, id).Scan(&evID)
	return evID, err
}

// DeadLetterPurge calls dlq_purge(queue, consumer, older_than) and returns
// how many dead letters it removed; a nil consumer means every consumer.
func (q *Queries) DeadLetterPurge(ctx context.Context, queue string, consumer *string, olderThan time.Duration) (int64, error) {
	var n int64
	err := q.db.QueryRow(ctx, `select pgque.dlq_purge($1::text, $2::text, $3::interval)`, queue, consumer, olderThan).Scan(&n)
	return n, err
}

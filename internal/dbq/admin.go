package dbq

import (
	"context"
	"time"
)

// This file binds the monitoring, dead-letter and version functions: what
// an operator's tools read, one method per SQL function. Intervals are read
// as seconds and returned as durations.

// seconds converts a number of seconds read from SQL into a duration.
func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// QueueInfo is one row of get_queue_info.
type QueueInfo struct {
	Name             string
	EvPerSec         *float64
	Unticked         int64
	TickerLag        time.Duration
	RetryPending     int64
	DeadLetters      int64
	LastTickID       int64
	Tables           int
	CurrentTable     int
	SinceRotation    time.Duration
	TickerMaxCount   int
	TickerMaxLag     time.Duration
	TickerIdlePeriod time.Duration
	RotationPeriod   time.Duration
	MaxRetries       int
}

// QueueInfo calls pgque.get_queue_info(queue); a nil queue reads every
// queue.
func (q *Queries) QueueInfo(ctx context.Context, queue *string) ([]QueueInfo, error) {
	rows, err := q.db.Query(ctx, `select queue_name, ev_per_sec, ev_new, extract(epoch from ticker_lag)::pg_catalog.float8,
			retry_pending, dead_letters, last_tick_id, queue_ntables, queue_cur_table,
			extract(epoch from pg_catalog.clock_timestamp() operator(pg_catalog.-) queue_switch_time)::pg_catalog.float8,
			queue_ticker_max_count, extract(epoch from queue_ticker_max_lag)::pg_catalog.float8,
			extract(epoch from queue_ticker_idle_period)::pg_catalog.float8,
			extract(epoch from queue_rotation_period)::pg_catalog.float8, queue_max_retries
		from pgque.get_queue_info($1::pg_catalog.text)`, queue)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []QueueInfo
	for rows.Next() {
		var i QueueInfo
		var lag, since, maxLag, idle, rotation float64
		if err := rows.Scan(&i.Name, &i.EvPerSec, &i.Unticked, &lag, &i.RetryPending, &i.DeadLetters,
			&i.LastTickID, &i.Tables, &i.CurrentTable, &since,
			&i.TickerMaxCount, &maxLag, &idle, &rotation, &i.MaxRetries); err != nil {
			return nil, err
		}
		i.TickerLag, i.SinceRotation = seconds(lag), seconds(since)
		i.TickerMaxLag, i.TickerIdlePeriod, i.RotationPeriod = seconds(maxLag), seconds(idle), seconds(rotation)
		out = append(out, i)
	}
	return out, rows.Err()
}

// ConsumerInfo is one row of get_consumer_info.
type ConsumerInfo struct {
	Queue, Consumer string
	Lag             time.Duration
	LastSeen        time.Duration
	Pending         int64
	RetryPending    int64
	OpenBatch       *int64
}

// ConsumerInfo calls pgque.get_consumer_info(queue, consumer); nil matches
// every queue or consumer.
func (q *Queries) ConsumerInfo(ctx context.Context, queue, consumer *string) ([]ConsumerInfo, error) {
	rows, err := q.db.Query(ctx, `select queue_name, consumer_name, extract(epoch from lag)::pg_catalog.float8,
			extract(epoch from last_seen)::pg_catalog.float8, pending_events, retry_pending, current_batch
		from pgque.get_consumer_info($1::pg_catalog.text, $2::pg_catalog.text)`, queue, consumer)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []ConsumerInfo
	for rows.Next() {
		var i ConsumerInfo
		var lag, seen float64
		if err := rows.Scan(&i.Queue, &i.Consumer, &lag, &seen, &i.Pending, &i.RetryPending, &i.OpenBatch); err != nil {
			return nil, err
		}
		i.Lag, i.LastSeen = seconds(lag), seconds(seen)
		out = append(out, i)
	}
	return out, rows.Err()
}

// DeadLetter is one row of dlq_list.
type DeadLetter struct {
	ID int64
	// Consumer is the subscription the event failed for (a slot's:
	// "c#3/8"); ConsumerName the consumer as subscribed, Slot its slot
	// (nil for a plain consumer).
	Consumer     string
	ConsumerName string
	Slot         *int32
	Time         time.Time
	Reason       *string
	EvID         int64
	EvTime       time.Time
	RetryCount   int
	Type         *string
	Payload      *string
	Key          *string
}

// DLQList calls pgque.dlq_list(queue, consumer, max); a nil consumer lists
// every consumer's dead letters, a slot consumer's name every slot's.
func (q *Queries) DLQList(ctx context.Context, queue string, consumer *string, max int) ([]DeadLetter, error) {
	rows, err := q.db.Query(ctx, `select dl_id, consumer, consumer_name, slot, dl_time, reason, ev_id, ev_time, ev_retry, ev_type, ev_data, key
		from pgque.dlq_list($1::pg_catalog.text, $2::pg_catalog.text, $3::int)`, queue, consumer, max)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []DeadLetter
	for rows.Next() {
		var d DeadLetter
		if err := rows.Scan(&d.ID, &d.Consumer, &d.ConsumerName, &d.Slot, &d.Time, &d.Reason, &d.EvID, &d.EvTime, &d.RetryCount,
			&d.Type, &d.Payload, &d.Key); err != nil {
			return nil, err
		}
		out = append(out, d)
	}
	return out, rows.Err()
}

// DLQReplayed is what pgque.dlq_replay_report returns.
type DLQReplayed struct {
	EvID            int64
	LaterDelivered  int64
	HistoryComplete bool
	Consumer        string
	Key             *string
}

// DLQReplay calls pgque.dlq_replay_report(queue, dl_id).
func (q *Queries) DLQReplay(ctx context.Context, queue string, id int64) (DLQReplayed, error) {
	var r DLQReplayed
	err := q.db.QueryRow(ctx, `select ev_id, later_delivered, history_complete, consumer, key
		from pgque.dlq_replay_report($1::pg_catalog.text, $2::bigint)`, queue, id).
		Scan(&r.EvID, &r.LaterDelivered, &r.HistoryComplete, &r.Consumer, &r.Key)
	return r, err
}

// DLQPurge calls pgque.dlq_purge(queue, consumer, older_than) and returns how
// many dead letters it removed; a nil consumer purges every consumer's, a
// slot consumer's name every slot's.
func (q *Queries) DLQPurge(ctx context.Context, queue string, consumer *string, olderThan time.Duration) (int64, error) {
	var n int64
	err := q.db.QueryRow(ctx, `select pgque.dlq_purge($1::pg_catalog.text, $2::pg_catalog.text, $3::interval)`, queue, consumer, olderThan).Scan(&n)
	return n, err
}

// SchemaVersion calls pgque.version(): the installed schema version,
// nil when the version row is missing.
func (q *Queries) SchemaVersion(ctx context.Context) (*string, error) {
	var v *string
	err := q.db.QueryRow(ctx, `select pgque.version()`).Scan(&v)
	return v, err
}

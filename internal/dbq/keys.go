package dbq

import (
	"context"
	"time"
)

// KeyHead is one row of key_heads.
type KeyHead struct {
	Slot int
	// Key is nil for the NULL key.
	Key       *string
	State     string
	HeadEvID  int64
	HeadAge   time.Duration
	Pending   int64
	Failures  *int
	Reason    *string
	RetryAt   *time.Time
	Deferred  int64
	Estimated bool
}

// KeyHeads calls pgque.key_heads(queue, consumer, slot, limit, scan); a nil
// slot means every slot.
func (q *Queries) KeyHeads(ctx context.Context, queue, consumer string, slot *int, limit, scan int) ([]KeyHead, error) {
	rows, err := q.db.Query(ctx, `select slot, key, state, head_ev_id, extract(epoch from head_age)::float8, pending,
			failures, reason, retry_at, deferred, estimated
		from pgque.key_heads($1::text, $2::text, $3::int, $4::int, $5::int)`, queue, consumer, slot, limit, scan)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []KeyHead
	for rows.Next() {
		var h KeyHead
		var age *float64
		if err := rows.Scan(&h.Slot, &h.Key, &h.State, &h.HeadEvID, &age, &h.Pending, &h.Failures, &h.Reason,
			&h.RetryAt, &h.Deferred, &h.Estimated); err != nil {
			return nil, err
		}
		if age != nil {
			h.HeadAge = time.Duration(*age * float64(time.Second))
		}
		out = append(out, h)
	}
	return out, rows.Err()
}

// KeyShare is one row of key_shares.
type KeyShare struct {
	Slot       int
	Pending    int64
	TopKey     *string
	TopPending int64
	Share      float64
	Keys       int64
	Estimated  bool
}

// KeyShares calls pgque.key_shares(queue, consumer, scan).
func (q *Queries) KeyShares(ctx context.Context, queue, consumer string, scan int) ([]KeyShare, error) {
	rows, err := q.db.Query(ctx, `select slot, pending, top_key, top_pending, share, keys, estimated
		from pgque.key_shares($1::text, $2::text, $3::int)`, queue, consumer, scan)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []KeyShare
	for rows.Next() {
		var s KeyShare
		if err := rows.Scan(&s.Slot, &s.Pending, &s.TopKey, &s.TopPending, &s.Share, &s.Keys, &s.Estimated); err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, rows.Err()
}

// HotKey is one row of hot_keys.
type HotKey struct {
	Key       *string
	Events    int64
	Rate      float64
	Share     float64
	Span      time.Duration
	Estimated bool
}

// HotKeys calls pgque.hot_keys(queue, window, limit, sample).
func (q *Queries) HotKeys(ctx context.Context, queue string, window time.Duration, limit, sample int) ([]HotKey, error) {
	rows, err := q.db.Query(ctx, `select key, events, rate, share, extract(epoch from span)::float8, estimated
		from pgque.hot_keys($1::text, $2::interval, $3::int, $4::int)`, queue, window, limit, sample)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []HotKey
	for rows.Next() {
		var h HotKey
		var span float64
		if err := rows.Scan(&h.Key, &h.Events, &h.Rate, &h.Share, &span, &h.Estimated); err != nil {
			return nil, err
		}
		h.Span = time.Duration(span * float64(time.Second))
		out = append(out, h)
	}
	return out, rows.Err()
}

// SlotHeads calls pgque.slot_heads(queue, consumer) and returns the age of
// each slot's first pending event; caught-up slots are absent.
func (q *Queries) SlotHeads(ctx context.Context, queue, consumer string) (map[int]time.Duration, error) {
	rows, err := q.db.Query(ctx, `select slot, extract(epoch from head_age)::float8
		from pgque.slot_heads($1::text, $2::text) where head_age is not null`, queue, consumer)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := make(map[int]time.Duration)
	for rows.Next() {
		var slot int
		var age float64
		if err := rows.Scan(&slot, &age); err != nil {
			return nil, err
		}
		out[slot] = time.Duration(age * float64(time.Second))
	}
	return out, rows.Err()
}

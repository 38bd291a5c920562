package dbq

import (
	"context"
	"time"
)

// SlotStall is one row of the partition_slot_stalls view.
type SlotStall struct {
	Queue, Consumer string
	Slot, NSlots    int
	// Owner is the worker holding a live lease, nil when none does.
	Owner *string
	// BehindFor is how long ago the first tick after the slot's cursor was
	// made; nil when the slot is caught up.
	BehindFor *time.Duration
	// SinceProgress is how long ago the slot's delivery state last moved.
	SinceProgress time.Duration
	// StalledFor is how long the slot has been behind without moving; nil
	// when it is not behind.
	StalledFor *time.Duration
	// StallAfter is the slot's stall bound (twice its lease TTL).
	StallAfter time.Duration
	// Stalled is StalledFor > StallAfter, as the server judged it.
	Stalled bool
	// Reason is "unclaimed", "lease expired" or "not progressing" when
	// Stalled, "" otherwise.
	Reason string
}

// SlotStalls reads partition_slot_stalls; "" for queue or consumer matches
// every one. It costs a few index probes per slot, whatever the backlog.
func (q *Queries) SlotStalls(ctx context.Context, queue, consumer string) ([]SlotStall, error) {
	rows, err := q.db.Query(ctx, `select queue, consumer, slot, nslots, owner,
			extract(epoch from pg_catalog.clock_timestamp() operator(pg_catalog.-) behind_since)::pg_catalog.float8,
			coalesce(extract(epoch from pg_catalog.clock_timestamp() operator(pg_catalog.-) last_progress), 0)::pg_catalog.float8,
			extract(epoch from pg_catalog.clock_timestamp() operator(pg_catalog.-) stalled_since)::pg_catalog.float8,
			extract(epoch from stall_after)::pg_catalog.float8, stalled, coalesce(reason, '')
		from pgque.partition_slot_stalls
		where ($1::pg_catalog.text operator(pg_catalog.=) '' or queue operator(pg_catalog.=) $1::pg_catalog.text)
		  and ($2::pg_catalog.text operator(pg_catalog.=) '' or consumer operator(pg_catalog.=) $2::pg_catalog.text)
		order by queue, consumer, slot`, queue, consumer)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []SlotStall
	for rows.Next() {
		var s SlotStall
		var behind, stalled *float64
		var progress, after float64
		if err := rows.Scan(&s.Queue, &s.Consumer, &s.Slot, &s.NSlots, &s.Owner, &behind, &progress, &stalled,
			&after, &s.Stalled, &s.Reason); err != nil {
			return nil, err
		}
		s.BehindFor, s.StalledFor = secondsOrNil(behind), secondsOrNil(stalled)
		s.SinceProgress, s.StallAfter = seconds(progress), seconds(after)
		out = append(out, s)
	}
	return out, rows.Err()
}

// secondsOrNil turns a nullable number of seconds into a duration.
func secondsOrNil(v *float64) *time.Duration {
	if v == nil {
		return nil
	}
	d := seconds(*v)
	return &d
}

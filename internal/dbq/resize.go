package dbq

import (
	"context"
	"time"
)

// ResizeSlots calls pgque.resize_slots(queue, consumer, nslots) and returns
// the seal tick.
func (q *Queries) ResizeSlots(ctx context.Context, queue, consumer string, nslots int) (int64, error) {
	var seal int64
	err := q.db.QueryRow(ctx, `select pgque.resize_slots($1::pg_catalog.text, $2::pg_catalog.text, $3::int)`,
		queue, consumer, nslots).Scan(&seal)
	return seal, err
}

// SlotGroup is the row of pgque.slot_group_info.
type SlotGroup struct {
	NSlots     int
	Policy     string
	ResizeTo   *int
	PastNSlots []int32
}

// SlotGroupInfo calls pgque.slot_group_info(queue, consumer).
func (q *Queries) SlotGroupInfo(ctx context.Context, queue, consumer string) (SlotGroup, error) {
	var g SlotGroup
	err := q.db.QueryRow(ctx, `select nslots, policy, resize_to, past_nslots
		from pgque.slot_group_info($1::pg_catalog.text, $2::pg_catalog.text)`, queue, consumer).
		Scan(&g.NSlots, &g.Policy, &g.ResizeTo, &g.PastNSlots)
	return g, err
}

// Resize is one row of pgque.resize_status.
type Resize struct {
	Queue, Consumer       string
	NSlots                int
	ResizeTo              *int
	Phase                 string
	SealTick              *int64
	Started, Finished     *time.Time
	SlotsDone, SlotsTotal int
	HeldKeys, BlockedKeys int
}

// ResizeStatus calls pgque.resize_status(queue); a nil queue reads every
// queue's.
func (q *Queries) ResizeStatus(ctx context.Context, queue *string) ([]Resize, error) {
	rows, err := q.db.Query(ctx, `select queue, consumer, nslots, resize_to, phase, seal_tick, started, finished,
		slots_done, slots_total, held_keys, blocked_keys from pgque.resize_status($1::pg_catalog.text)`, queue)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Resize
	for rows.Next() {
		var r Resize
		if err := rows.Scan(&r.Queue, &r.Consumer, &r.NSlots, &r.ResizeTo, &r.Phase, &r.SealTick, &r.Started, &r.Finished,
			&r.SlotsDone, &r.SlotsTotal, &r.HeldKeys, &r.BlockedKeys); err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

package pgque

import (
	"context"
	"time"

	"github.com/pgque/pgque/internal/workerpool"
)

// SlotStall is one slot's stall check, as the partition_slot_stalls view
// reports it. A slot is stalled when it is behind (a tick newer than its
// cursor exists) and its delivery state has not moved for longer than
// StallAfter (twice its lease TTL). Lease renewals are not progress. A
// stalled slot pins rotation for its whole queue; see docs/operations.md.
type SlotStall struct {
	Queue, Consumer string
	Slot, NSlots    int
	// Owner is the worker holding a live lease, "" when none does.
	Owner string
	// Behind reports whether the slot has something left to consume, and
	// BehindFor since when (the age of the first tick after its cursor).
	Behind    bool
	BehindFor time.Duration
	// SinceProgress is how long ago the slot's delivery state last moved.
	SinceProgress time.Duration
	// StallAfter is the slot's stall bound.
	StallAfter time.Duration
	// Stalled is the verdict; StalledFor is how long the slot has been
	// behind without moving (0 when not behind).
	Stalled    bool
	StalledFor time.Duration
	// Reason is "" unless Stalled: "unclaimed" or "lease expired" (no live
	// worker works the slot) or "not progressing" (the owner renews its
	// lease but does not consume).
	Reason string
	// Action says what to do about it, "" unless Stalled.
	Action string
}

// SlotStalls returns the stall check of every slot of consumer on queue;
// "" for either matches every one. It costs a few index probes per slot,
// whatever the backlog. Every pgque role may call it.
func (c *Client) SlotStalls(ctx context.Context, queue, consumer string) ([]SlotStall, error) {
	rows, err := c.queries.SlotStalls(ctx, queue, consumer)
	if err != nil {
		return nil, mapError("reading partition_slot_stalls", err)
	}
	out := make([]SlotStall, len(rows))
	for i, r := range rows {
		out[i] = SlotStall{
			Queue: r.Queue, Consumer: r.Consumer, Slot: r.Slot, NSlots: r.NSlots, Owner: deref(r.Owner),
			Behind: r.BehindFor != nil, SinceProgress: r.SinceProgress, StallAfter: r.StallAfter,
			Stalled: r.Stalled, Reason: r.Reason, Action: workerpool.StallAction(r.Reason),
		}
		if r.BehindFor != nil {
			out[i].BehindFor = *r.BehindFor
		}
		if r.StalledFor != nil {
			out[i].StalledFor = *r.StalledFor
		}
	}
	return out, nil
}

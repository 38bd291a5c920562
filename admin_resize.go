package pgque

import (
	"context"
	"fmt"
	"time"
)

// ResizeSlots starts an online resize of a partitioned consumer's slots to
// nslots and returns at once; the resize completes by itself. Producers
// keep sending and running PartitionedConsumers keep working: the old slots
// finish the events committed before the resize began (the seal), then, in
// one transaction, the new slots take over from the seal with every retry,
// blocked key and deferred event of the old slots carried to the new slot
// of its key, and the pools pick the new N up without a restart. Per-key
// order and one handler per key hold across the change; see
// docs/design.md ("Online resize"). Watch it with Resizes.
//
// It fails with ErrSlotNotSubscribed when the consumer has no slots,
// ErrResizeInProgress when a resize of it is still running, and
// ErrInvalidArgument when nslots is out of range or already the consumer's
// N. Only pgque_admin may call it.
func (c *Client) ResizeSlots(ctx context.Context, queue, consumer string, nslots int) error {
	if nslots < 1 || nslots > SlotsMax {
		return invalidConfig("nslots must be between 1 and %d, not %d", SlotsMax, nslots)
	}
	_, err := c.queries.ResizeSlots(ctx, queue, consumer, nslots)
	return mapError(fmt.Sprintf("resizing the slots of %q on queue %q to %d", consumer, queue, nslots), err)
}

// Resize phases, as Resize.Phase reports them.
const (
	// ResizeDraining: the old slots still consume events sent before the
	// seal.
	ResizeDraining = "draining"
	// ResizeSettling: every old slot reached the seal, but a key is still
	// held by a running lane on one of them.
	ResizeSettling = "settling"
	// ResizeCutover: the old slots are done; the next empty receive of one
	// of them, or the next maint(), hands over to the new slots.
	ResizeCutover = "cutover"
	// ResizeDone: the last resize completed.
	ResizeDone = "done"
)

// Resize is the state of a consumer's resize, in progress or the last one
// completed.
type Resize struct {
	Queue, Consumer string
	// NSlots is the consumer's N now; To is the N it is being resized to (0
	// when no resize is in progress).
	NSlots, To int
	// Phase is one of the Resize* phase constants.
	Phase string
	// Started and Finished bound the last resize (Finished is zero while
	// it runs).
	Started, Finished time.Time
	// SlotsDone of SlotsTotal old slots have reached the seal.
	SlotsDone, SlotsTotal int
	// HeldKeys are keys still held by running lanes on old slots;
	// BlockedKeys are blocked keys (carried over at the cutover).
	HeldKeys, BlockedKeys int
}

// Resizes returns the resizes of queue's consumers ("" for every queue):
// those in progress and the last completed one of each consumer. Every
// pgque role may call it.
func (c *Client) Resizes(ctx context.Context, queue string) ([]Resize, error) {
	var q *string
	if queue != "" {
		q = &queue
	}
	rows, err := c.queries.ResizeStatus(ctx, q)
	if err != nil {
		return nil, mapError("reading resize_status", err)
	}
	out := make([]Resize, len(rows))
	for i, r := range rows {
		out[i] = Resize{Queue: r.Queue, Consumer: r.Consumer, NSlots: r.NSlots, Phase: r.Phase,
			SlotsDone: r.SlotsDone, SlotsTotal: r.SlotsTotal, HeldKeys: r.HeldKeys, BlockedKeys: r.BlockedKeys}
		if r.ResizeTo != nil {
			out[i].To = *r.ResizeTo
		}
		if r.Started != nil {
			out[i].Started = *r.Started
		}
		if r.Finished != nil {
			out[i].Finished = *r.Finished
		}
	}
	return out, nil
}

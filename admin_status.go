package pgque

import (
	"context"
	"fmt"
	"time"
)

// QueueStatus is a queue's state and settings, as get_queue_info reports
// them: the data behind `pgque status` and `pgque queue list`.
type QueueStatus struct {
	Name string
	// EventsPerSecond is the send rate over the ticks still kept; nil until
	// there are two ticks to compare.
	EventsPerSecond *float64
	// Unticked is how many events were sent after the last tick; consumers
	// see them once the ticker closes the next tick.
	Unticked int64
	// TickerLag is the age of the last tick.
	TickerLag    time.Duration
	RetryPending int64
	DeadLetters  int64
	LastTickID   int64
	// Tables is how many event tables the queue rotates through, and
	// CurrentTable the one events go to now.
	Tables, CurrentTable int
	// SinceRotation is how long ago the queue last switched tables.
	SinceRotation time.Duration
	Config        QueueConfig
}

// Queues returns the status of queue, or of every queue (by name) when
// queue is "". It fails with ErrQueueNotFound for an unknown queue. Every
// pgque role may call it.
func (c *Client) Queues(ctx context.Context, queue string) ([]QueueStatus, error) {
	rows, err := c.queries.QueueInfo(ctx, nullIfEmpty(queue))
	if err != nil {
		return nil, mapError("reading queue info", err)
	}
	out := make([]QueueStatus, len(rows))
	for i, r := range rows {
		out[i] = QueueStatus{
			Name: r.Name, EventsPerSecond: r.EvPerSec, Unticked: r.Unticked, TickerLag: r.TickerLag,
			RetryPending: r.RetryPending, DeadLetters: r.DeadLetters, LastTickID: r.LastTickID,
			Tables: r.Tables, CurrentTable: r.CurrentTable, SinceRotation: r.SinceRotation,
			Config: QueueConfig{
				TickerMaxCount: r.TickerMaxCount, TickerMaxLag: r.TickerMaxLag, TickerIdlePeriod: r.TickerIdlePeriod,
				RotationPeriod: r.RotationPeriod, MaxRetries: r.MaxRetries,
			},
		}
	}
	return out, nil
}

// ConsumerStatus is one subscription's progress, as get_consumer_info
// reports it. A partitioned consumer has one per slot, named
// "<consumer>#<slot>/<nslots>".
type ConsumerStatus struct {
	Queue, Consumer string
	// Lag is the age of the subscription's cursor.
	Lag time.Duration
	// LastSeen is how long ago it last opened or finished a batch.
	LastSeen time.Duration
	// Pending counts the events sent after its cursor (every key).
	Pending      int64
	RetryPending int64
	// OpenBatch is the open batch's id, nil when none is open.
	OpenBatch *int64
}

// Consumers returns the subscriptions of queue, or of every queue when queue
// is "". Every pgque role may call it.
func (c *Client) Consumers(ctx context.Context, queue string) ([]ConsumerStatus, error) {
	rows, err := c.queries.ConsumerInfo(ctx, nullIfEmpty(queue), nil)
	if err != nil {
		return nil, mapError("reading consumer info", err)
	}
	out := make([]ConsumerStatus, len(rows))
	for i, r := range rows {
		out[i] = ConsumerStatus{
			Queue: r.Queue, Consumer: r.Consumer, Lag: r.Lag, LastSeen: r.LastSeen,
			Pending: r.Pending, RetryPending: r.RetryPending, OpenBatch: r.OpenBatch,
		}
	}
	return out, nil
}

// SlotStatus is one slot of a partitioned consumer, as the
// partition_slot_status view reports it.
type SlotStatus struct {
	Queue, Consumer string
	Slot, NSlots    int
	// Owner is the worker holding a live lease, "" when the lease expired,
	// was released, or was never taken.
	Owner string
	// LeaseUntil is when the last lease expires or expired; zero when the
	// slot was never claimed.
	LeaseUntil time.Time
	// Epoch counts the slot's claims; a new owner fences the old one.
	Epoch int64
	// Lag is how many events of this slot are pending: those after its
	// cursor and those it holds back, a blocked key's failed head waiting
	// for its retry and the key's later events deferred behind it, so a
	// slot with a blocked key never looks idle.
	Lag int64
	// OldestPending is the age of the slot's oldest pending event, held
	// ones included.
	OldestPending time.Duration
	// Held is how many of Lag's events wait deferred behind a held key,
	// Retrying how many wait for their retry, and BlockedKeys how many keys
	// the pause policy blocks on the slot. Lag - Held - Retrying is what
	// the slot's cursor has still to pass.
	Held, Retrying int64
	BlockedKeys    int
	Policy         FailurePolicy
	// OpenBatch is the slot's open batch, nil when none is open.
	OpenBatch *int64
	// LastActive is how long ago the slot last opened or finished a batch.
	LastActive time.Duration
}

// Slots returns the slots of consumer on queue; "" for either matches every
// one. Rows are ordered by queue, consumer and slot. Reading the lag costs a
// read of each slot's backlog. Every pgque role may call it.
func (c *Client) Slots(ctx context.Context, queue, consumer string) ([]SlotStatus, error) {
	rows, err := c.queries.PartitionSlotStatus(ctx, queue, consumer)
	if err != nil {
		return nil, mapError("reading partition_slot_status", err)
	}
	out := make([]SlotStatus, len(rows))
	for i, r := range rows {
		out[i] = SlotStatus{
			Queue: r.Queue, Consumer: r.Consumer, Slot: r.Slot, NSlots: r.NSlots, Owner: deref(r.Owner),
			Epoch: r.Epoch, Lag: r.Lag, OldestPending: r.OldestPendingAge, OpenBatch: r.OpenBatch, LastActive: r.LastActive,
			Held: r.Held, Retrying: r.Retrying, BlockedKeys: r.BlockedKeys,
		}
		if r.LeaseUntil != nil {
			out[i].LeaseUntil = *r.LeaseUntil
		}
		if p, err := parseFailurePolicy(r.Policy); err == nil {
			out[i].Policy = p
		} else {
			return nil, fmt.Errorf("reading partition_slot_status: slot %d of %q: %w", r.Slot, r.Consumer, err)
		}
	}
	return out, nil
}

package pgque

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/pgque/pgque/internal/dbq"
)

// Subscribe subscribes consumer to queue, from the next tick on, and reports
// whether the subscription is new (false: it existed). Consumer.Start does
// this itself; Subscribe is for setting a subscription up ahead of time, so
// that events sent before the first consumer starts are kept for it. It is
// Receiver(nil).Subscribe; a Receiver of a transaction subscribes in it.
func (c *Client) Subscribe(ctx context.Context, queue, consumer string) (bool, error) {
	return c.Receiver(nil).Subscribe(ctx, queue, consumer)
}

// Unsubscribe removes the plain subscription of consumer, with its open
// batch and pending retries, and reports whether it existed (unsubscribing
// twice is no error). A partitioned consumer's slots are removed with
// UnsubscribeSlots (a slot's own name is an ErrInvalidName here). It is
// Receiver(nil).Unsubscribe.
func (c *Client) Unsubscribe(ctx context.Context, queue, consumer string) (bool, error) {
	return c.Receiver(nil).Unsubscribe(ctx, queue, consumer)
}

// SubscribeSlots subscribes all nslots slots of a partitioned consumer in one
// transaction and returns how many were new. A zero policy keeps the
// persisted failure policy (FailurePolicyDefault for a new consumer);
// another policy than the persisted one fails with ErrPolicyMismatch, and
// another slot count than the persisted one with ErrSlotCountMismatch.
// PartitionedConsumer.Start does this itself.
func (c *Client) SubscribeSlots(ctx context.Context, queue, consumer string, nslots int, policy FailurePolicy) (int, error) {
	if nslots < 1 {
		return 0, invalidConfig("nslots must be at least 1, not %d", nslots)
	}
	if policy != 0 && !policy.valid() {
		return 0, invalidConfig("failure policy %v is not supported", policy)
	}
	created := 0
	err := pgx.BeginFunc(ctx, c.pool, func(tx pgx.Tx) error {
		var err error
		created, err = subscribeSlotsTx(ctx, dbq.New(tx), queue, consumer, nslots, policy)
		return err
	})
	if err != nil {
		return 0, mapError(fmt.Sprintf("subscribing %d slots of %q to queue %q", nslots, consumer, queue), err)
	}
	return created, nil
}

// SubscribeSlotsFromOldest is SubscribeSlots for a consumer that must also
// receive what was sent before it subscribed: the slots it creates start at
// the oldest event the queue still keeps, the oldest cursor of its other
// subscriptions, and it returns how many event ids were taken between
// there and where they would have started (an upper bound of the events
// gained: rolled-back sends and forced ticks take ids too). A queue without other
// subscriptions keeps nothing (its tables rotate freely), so there the
// slots start at the next tick, as with SubscribeSlots; subscribing before
// the producers start is the way to receive everything. Slots that existed
// are left where they are.
func (c *Client) SubscribeSlotsFromOldest(ctx context.Context, queue, consumer string, nslots int, policy FailurePolicy) (created int, gained int64, err error) {
	if nslots < 1 {
		return 0, 0, invalidConfig("nslots must be at least 1, not %d", nslots)
	}
	if policy != 0 && !policy.valid() {
		return 0, 0, invalidConfig("failure policy %v is not supported", policy)
	}
	err = pgx.BeginFunc(ctx, c.pool, func(tx pgx.Tx) error {
		q := dbq.New(tx)
		var err error
		if created, err = subscribeSlotsTx(ctx, q, queue, consumer, nslots, policy); err != nil || created == 0 {
			return err
		}
		gained, err = q.RewindNewSubscription(ctx, queue, consumer)
		return err
	})
	if err != nil {
		return 0, 0, mapError(fmt.Sprintf("subscribing %d slots of %q to queue %q", nslots, consumer, queue), err)
	}
	return created, gained, nil
}

// subscribeSlotsTx subscribes slots 0..nslots-1 over q (one transaction)
// and counts the new ones; a zero policy keeps the persisted one.
func subscribeSlotsTx(ctx context.Context, q *dbq.Queries, queue, consumer string, nslots int, policy FailurePolicy) (int, error) {
	var pol *string
	if policy != 0 {
		s := policy.String()
		pol = &s
	}
	created := 0
	for slot := range nslots {
		isNew, err := q.SubscribeSlotPolicy(ctx, queue, consumer, slot, nslots, pol)
		if err != nil {
			return 0, err
		}
		if isNew {
			created++
		}
	}
	return created, nil
}

// UnsubscribeSlots removes all nslots slots of a partitioned consumer in one
// transaction, with their leases, open batches and blocked keys.
func (c *Client) UnsubscribeSlots(ctx context.Context, queue, consumer string, nslots int) error {
	if nslots < 1 {
		return invalidConfig("nslots must be at least 1, not %d", nslots)
	}
	err := pgx.BeginFunc(ctx, c.pool, func(tx pgx.Tx) error {
		q := dbq.New(tx)
		for slot := range nslots {
			if err := q.UnsubscribeSlot(ctx, queue, consumer, slot, nslots); err != nil {
				return err
			}
		}
		return nil
	})
	return mapError(fmt.Sprintf("unsubscribing %d slots of %q from queue %q", nslots, consumer, queue), err)
}

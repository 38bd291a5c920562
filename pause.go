package pgque

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgque/pgque/internal/dbq"
)

// BlockState is the state of a BlockedKey. Its words are those of the
// matching KeyState constants.
type BlockState string

// Block states of a BlockedKey.
const (
	// BlockStateBlocked: the head failed and awaits its retry; every other
	// event of the key is deferred.
	BlockStateBlocked BlockState = "blocked"
	// BlockStateReleasing: the head was acknowledged or dead-lettered and the
	// deferred events are being delivered, in ev_id order; newer events of
	// the key wait for the next round.
	BlockStateReleasing BlockState = "releasing"
	// BlockStateHeld: the key's lane was still running when the rest of
	// its chunk was done; the chunk was acknowledged without it, and its
	// unfinished and later events are deferred until the lane settles (or
	// the slot's next owner releases them). HeadID is the event it ran
	// then.
	BlockStateHeld BlockState = "held"
)

// BlockedKey is a key held under FailurePolicyPause on one slot.
type BlockedKey struct {
	Queue, Consumer string
	Slot            int
	Key             KeyRef
	// State is BlockStateBlocked, BlockStateReleasing or BlockStateHeld.
	State BlockState
	// HeadID is the ev_id of the event whose failure blocked the key (the
	// head); while releasing, the head was acknowledged or dead-lettered.
	HeadID int64
	// Since is when the key was blocked.
	Since time.Time
	// Failures counts the head's failures so far.
	Failures int
	// Reason is the head's last failure, as nacked (empty if none).
	Reason string
	// Deferred is how many events of the key are held behind the head.
	Deferred int64
}

// BlockedKeys lists the keys held on the slots of consumer — by the pause
// policy, or while their lane runs (BlockStateHeld) — or of every
// consumer of the queue when consumer is "".
func (c *Client) BlockedKeys(ctx context.Context, queue, consumer string) ([]BlockedKey, error) {
	var con *string
	if consumer != "" {
		con = &consumer
	}
	rows, err := c.queries.BlockedKeys(ctx, queue, con)
	if err != nil {
		return nil, mapError(fmt.Sprintf("listing blocked keys of queue %q", queue), err)
	}
	out := make([]BlockedKey, len(rows))
	for i, r := range rows {
		out[i] = BlockedKey{
			Queue: r.Queue, Consumer: r.Consumer, Slot: r.Slot, Key: keyRefOf(r.Key), State: BlockState(r.State),
			HeadID: r.HeadEvID, Since: r.Since, Failures: r.Failures, Deferred: r.Deferred,
		}
		if r.Reason != nil {
			out[i].Reason = *r.Reason
		}
	}
	return out, nil
}

// UnblockKey gives up on the failing head of a blocked key: it dead-letters
// the head (its pending retry) and releases the events held behind it, which
// are then delivered in ev_id order. It returns the dead-lettered ev_id.
// It fails with ErrKeyNotBlocked when the key is not blocked, and with
// ErrKeyBusy when its head is being redelivered right now (try again once
// that delivery was handled). Requires the pgque_admin role.
func (c *Client) UnblockKey(ctx context.Context, queue, consumer string, key KeyRef) (int64, error) {
	id, err := c.queries.UnblockKey(ctx, queue, consumer, key.arg())
	return id, mapError(fmt.Sprintf("unblocking key %v of %q on queue %q", key, consumer, queue), err)
}

// RetryKeyNow makes the pending retry of a blocked key's head due now, so
// that it is redelivered at once instead of after its retry delay. It
// reports whether a retry was pending (false: the head is being redelivered
// already). It fails with ErrKeyNotBlocked when the key is not blocked.
// Requires the pgque_admin role.
func (c *Client) RetryKeyNow(ctx context.Context, queue, consumer string, key KeyRef) (bool, error) {
	ok, err := c.queries.RetryKeyNow(ctx, queue, consumer, key.arg())
	return ok, mapError(fmt.Sprintf("retrying key %v of %q on queue %q", key, consumer, queue), err)
}

// SetFailurePolicy changes the failure policy of every slot of consumer.
// Switching to FailurePolicySkip releases every blocked key. Running pools
// follow the change (see PartitionedConsumerConfig.FailurePolicy). Fails
// with ErrSlotNotSubscribed when the consumer has no slots. Requires the
// pgque_admin role.
func (c *Client) SetFailurePolicy(ctx context.Context, queue, consumer string, policy FailurePolicy) error {
	if !policy.valid() {
		return invalidConfig("failure policy %v is not supported", policy)
	}
	err := c.queries.SetFailurePolicy(ctx, queue, consumer, policy.String())
	return mapError(fmt.Sprintf("setting the failure policy of %q on queue %q", consumer, queue), err)
}

// serverPolicy reads the policy persisted for (queue, consumer).
func serverPolicy(ctx context.Context, q *dbq.Queries, queue, consumer string) (FailurePolicy, error) {
	s, err := q.SlotPolicy(ctx, queue, consumer)
	if errors.Is(err, pgx.ErrNoRows) { // the view has no row: no slots
		return 0, fmt.Errorf("reading the failure policy of %q on queue %q: %w", consumer, queue, ErrSlotNotSubscribed)
	}
	if err != nil {
		return 0, mapError(fmt.Sprintf("reading the failure policy of %q on queue %q", consumer, queue), err)
	}
	return parseFailurePolicy(s)
}

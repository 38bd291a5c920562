package pgque

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgque/pgque/internal/dbq"
)

// Receiver reads a subscription or a slot chunk by chunk, by hand: receive,
// look, acknowledge. It is for tools that inspect a stream (the `pgque tail`
// command) or that must run every step inside a transaction of their own;
// services use Consumer and PartitionedConsumer, which add the loop,
// retries, lease renewal and clean shutdown. Get one with Client.Receiver.
type Receiver struct {
	q *dbq.Queries
}

// Receiver returns a Receiver whose calls run in tx, or each in its own
// transaction over the client's pool when tx is nil. Everything done in a
// transaction that rolls back (subscribing, claiming, acknowledging) is
// undone.
func (c *Client) Receiver(tx pgx.Tx) *Receiver {
	if tx == nil {
		return &Receiver{q: c.queries}
	}
	return &Receiver{q: dbq.New(tx)}
}

// Subscribe subscribes consumer to queue and reports whether it is new.
func (r *Receiver) Subscribe(ctx context.Context, queue, consumer string) (bool, error) {
	created, err := r.q.Subscribe(ctx, queue, consumer)
	return created, mapError(fmt.Sprintf("subscribing %s to queue %q", consumer, queue), err)
}

// Unsubscribe removes the plain subscription and reports whether it existed.
func (r *Receiver) Unsubscribe(ctx context.Context, queue, consumer string) (bool, error) {
	removed, err := r.q.Unsubscribe(ctx, queue, consumer)
	return removed, mapError(fmt.Sprintf("unsubscribing %s from queue %q", consumer, queue), err)
}

// Receive returns the next chunk of at most max events of a plain
// subscription, all of one batch (Message.BatchID); it is empty when nothing
// is pending. The same chunk is returned again until Ack.
func (r *Receiver) Receive(ctx context.Context, queue, consumer string, max int) ([]*Message, error) {
	rows, err := r.q.Receive(ctx, queue, consumer, max)
	if err != nil {
		return nil, mapError(fmt.Sprintf("receiving for %q", consumer), err)
	}
	return toMessages(rows, queue, consumer, 0), nil
}

// Ack acknowledges the chunk last received from batchID and reports
// whether that finished the batch.
func (r *Receiver) Ack(ctx context.Context, batchID int64) (bool, error) {
	done, err := r.q.Ack(ctx, batchID)
	return done, mapError(fmt.Sprintf("acknowledging batch %d", batchID), err)
}

// ClaimSlot takes the lease of slot for worker for ttl and returns its
// epoch, or false when another live worker holds it.
func (r *Receiver) ClaimSlot(ctx context.Context, queue, consumer string, slot int, worker string, ttl time.Duration) (int64, bool, error) {
	epoch, ok, err := r.q.ClaimSlot(ctx, queue, consumer, slot, worker, ttl)
	return epoch, ok, mapError(fmt.Sprintf("claiming slot %d of %q", slot, consumer), err)
}

// ReleaseSlot gives the lease of slot up if worker holds it.
func (r *Receiver) ReleaseSlot(ctx context.Context, queue, consumer string, slot int, worker string) (bool, error) {
	ok, err := r.q.ReleaseSlot(ctx, queue, consumer, slot, worker)
	return ok, mapError(fmt.Sprintf("releasing slot %d of %q", slot, consumer), err)
}

// ReceiveSlot is Receive for slot of nslots, held by worker (it renews the
// lease; ErrLeaseLost when worker does not hold it).
func (r *Receiver) ReceiveSlot(ctx context.Context, queue, consumer string, slot, nslots int, worker string, max int) ([]*Message, error) {
	rows, err := r.q.ReceivePartitioned(ctx, queue, consumer, slot, nslots, worker, max)
	if err != nil {
		return nil, mapError(fmt.Sprintf("receiving slot %d/%d of %q", slot, nslots, consumer), err)
	}
	return toMessages(rows, queue, consumer, slot), nil
}

// AckSlot acknowledges the slot's chunk and reports whether that finished
// its batch.
func (r *Receiver) AckSlot(ctx context.Context, queue, consumer string, slot, nslots int, worker string) (bool, error) {
	done, err := r.q.AckPartitioned(ctx, queue, consumer, slot, nslots, worker)
	return done, mapError(fmt.Sprintf("acknowledging slot %d/%d of %q", slot, nslots, consumer), err)
}

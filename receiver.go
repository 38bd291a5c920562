package pgque

import (
	"context"
	"fmt"
	"log/slog"
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

// Subscribe subscribes consumer to queue, from the next tick on, and
// reports whether the subscription is new (see Client.Subscribe).
func (r *Receiver) Subscribe(ctx context.Context, queue, consumer string) (bool, error) {
	created, err := r.q.Subscribe(ctx, queue, consumer)
	return created, mapError(fmt.Sprintf("subscribing %q to queue %q", consumer, queue), err)
}

// Unsubscribe removes the plain subscription and reports whether it existed
// (see Client.Unsubscribe).
func (r *Receiver) Unsubscribe(ctx context.Context, queue, consumer string) (bool, error) {
	removed, err := r.q.Unsubscribe(ctx, queue, consumer)
	return removed, mapError(fmt.Sprintf("unsubscribing %q from queue %q", consumer, queue), err)
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

// LeaseToken is the secret credential of a slot lease: ClaimSlot returns it
// to the claimer alone (the server keeps only a hash), and every call that
// acts as the lease holder presents it. The worker id is a display name
// that anyone may see; the token is what proves the lease.
//
// It never prints: String, GoString, Format, LogValue and MarshalText all
// redact it, so a lease that ends up in a log line, an error, a %v or a
// JSON document leaks nothing. Only Secret gives the value.
type LeaseToken string

// Secret returns the token's value, for a caller that must send it itself
// (a statement of its own, another process that takes the lease over).
func (t LeaseToken) Secret() string { return string(t) }

// String returns "[redacted]".
func (t LeaseToken) String() string { return t.dbq().String() }

// GoString returns "[redacted]", for %#v.
func (t LeaseToken) GoString() string { return t.dbq().GoString() }

// Format writes "[redacted]" whatever the verb.
func (t LeaseToken) Format(f fmt.State, verb rune) { t.dbq().Format(f, verb) }

// LogValue redacts the token in log/slog records.
func (t LeaseToken) LogValue() slog.Value { return t.dbq().LogValue() }

// MarshalText redacts the token in JSON and other text encodings.
func (t LeaseToken) MarshalText() ([]byte, error) { return t.dbq().MarshalText() }

// dbq is the token as statements take it (they redact it too, should a
// query tracer print their arguments).
func (t LeaseToken) dbq() dbq.LeaseToken { return dbq.LeaseToken(t) }

// SlotLease is a lease on one slot as ClaimSlot grants it; every later call
// on the slot presents it. Worker is a display name (anyone who can read the
// lease views sees it); Token proves the lease.
type SlotLease struct {
	Queue, Consumer string
	Slot            int
	Worker          string
	// Epoch grows on every change of owner; events received under the
	// lease carry it (Message.Epoch).
	Epoch int64
	Token LeaseToken
}

// ClaimSlot takes the lease of slot for worker for ttl, or false when
// another live lease holds it (one held under the same worker id counts:
// only its token could renew it).
func (r *Receiver) ClaimSlot(ctx context.Context, queue, consumer string, slot int, worker string, ttl time.Duration) (SlotLease, bool, error) {
	epoch, token, ok, err := r.q.ClaimSlot(ctx, queue, consumer, slot, worker, ttl, "")
	if err != nil || !ok {
		return SlotLease{}, false, mapError(fmt.Sprintf("claiming slot %d of %q", slot, consumer), err)
	}
	return SlotLease{Queue: queue, Consumer: consumer, Slot: slot, Worker: worker, Epoch: epoch, Token: LeaseToken(token)}, true, nil
}

// RenewSlot extends the lease by ttl from now and reports whether it was
// still held (false: it changed hands).
func (r *Receiver) RenewSlot(ctx context.Context, lease SlotLease, ttl time.Duration) (bool, error) {
	epoch, _, ok, err := r.q.ClaimSlot(ctx, lease.Queue, lease.Consumer, lease.Slot, lease.Worker, ttl, lease.Token.dbq())
	return ok && epoch == lease.Epoch, mapError(fmt.Sprintf("renewing slot %d of %q", lease.Slot, lease.Consumer), err)
}

// ReleaseSlot gives the lease up (ErrLeaseLost when it is not held any
// more).
func (r *Receiver) ReleaseSlot(ctx context.Context, lease SlotLease) (bool, error) {
	ok, err := r.q.ReleaseSlot(ctx, lease.Queue, lease.Consumer, lease.Slot, lease.Worker, lease.Token.dbq())
	return ok, mapError(fmt.Sprintf("releasing slot %d of %q", lease.Slot, lease.Consumer), err)
}

// ReceiveSlot is Receive for the leased slot of nslots (it renews the
// lease; ErrLeaseLost when the lease is not held any more).
func (r *Receiver) ReceiveSlot(ctx context.Context, lease SlotLease, nslots, max int) ([]*Message, error) {
	rows, err := r.q.ReceivePartitioned(ctx, lease.Queue, lease.Consumer, lease.Slot, nslots, lease.Worker, lease.Token.dbq(), max, nil)
	if err != nil {
		return nil, mapError(fmt.Sprintf("receiving slot %d/%d of %q", lease.Slot, nslots, lease.Consumer), err)
	}
	return toMessages(rows, lease.Queue, lease.Consumer, lease.Slot), nil
}

// AckSlot acknowledges the chunk ReceiveSlot returned, named by any one of
// its messages m (its epoch, batch and id prove which chunk it is:
// ErrLeaseLost when that chunk is not the slot's current one), and reports
// whether that finished its batch.
func (r *Receiver) AckSlot(ctx context.Context, lease SlotLease, nslots int, m *Message) (bool, error) {
	if m == nil {
		return false, fmt.Errorf("acknowledging slot %d/%d of %q: no message of the chunk: %w", lease.Slot, nslots, lease.Consumer, ErrInvalidArgument)
	}
	done, err := r.q.AckDelivery(ctx, lease.Queue, lease.Consumer, lease.Slot, nslots, lease.Worker, lease.Token.dbq(),
		dbq.Delivery{Epoch: m.Epoch, BatchID: m.BatchID, MsgID: m.ID})
	return done, mapError(fmt.Sprintf("acknowledging slot %d/%d of %q", lease.Slot, nslots, lease.Consumer), err)
}

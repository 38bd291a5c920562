package dbq

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// UnsubscribeSlot calls pgque.unsubscribe_slot(queue, consumer, slot, nslots).
func (q *Queries) UnsubscribeSlot(ctx context.Context, queue, consumer string, slot, nslots int) error {
	_, err := q.db.Exec(ctx, `select pgque.unsubscribe_slot($1::pg_catalog.text, $2::pg_catalog.text, $3::int, $4::int)`,
		queue, consumer, slot, nslots)
	return err
}

// ClaimSlot calls pgque.claim_slot(queue, consumer, slot, worker, ttl,
// token). It returns the lease epoch, the lease token and true; or false
// when another live lease holds the slot. token is the current token when
// renewing a lease this worker holds, empty for a new claim; a renewal
// returns the same token, a new claim a new one.
func (q *Queries) ClaimSlot(ctx context.Context, queue, consumer string, slot int, worker string, ttl time.Duration, token LeaseToken) (int64, LeaseToken, bool, error) {
	return q.ClaimSlotBound(ctx, queue, consumer, slot, worker, ttl, token, 0)
}

// ClaimSlotBound is ClaimSlot binding the lease to the backend session
// with pid session, 0 for none (claim_slot's session: a lease bound to a
// session that ended is taken over before its TTL).
func (q *Queries) ClaimSlotBound(ctx context.Context, queue, consumer string, slot int, worker string, ttl time.Duration, token LeaseToken, session int32) (int64, LeaseToken, bool, error) {
	var epoch *int64
	var tok *string
	var pid *int32
	if session != 0 {
		pid = &session
	}
	err := q.db.QueryRow(ctx, `select epoch, token::pg_catalog.text
		from pgque.claim_slot($1::pg_catalog.text, $2::pg_catalog.text, $3::int, $4::pg_catalog.text, $5::interval, $6::pg_catalog.uuid, $7::int)`,
		queue, consumer, slot, worker, ttl, token, pid).Scan(&epoch, &tok)
	if err != nil || epoch == nil || tok == nil {
		return 0, "", false, err
	}
	return *epoch, LeaseToken(*tok), true, nil
}

// ReleaseSlot calls pgque.release_slot(queue, consumer, slot, worker, token)
// and reports whether the lease was released (PQ085 when the token does not
// prove it).
func (q *Queries) ReleaseSlot(ctx context.Context, queue, consumer string, slot int, worker string, token LeaseToken) (bool, error) {
	var ok *bool
	err := q.db.QueryRow(ctx, `select pgque.release_slot($1::pg_catalog.text, $2::pg_catalog.text, $3::int, $4::pg_catalog.text, $5::pg_catalog.uuid)`,
		queue, consumer, slot, worker, token).Scan(&ok)
	return ok != nil && *ok, err
}

// ReceivePartitioned calls pgque.receive_partitioned_raw(queue, consumer,
// slot, nslots, worker, token, max[, ack]): the slot's next chunk, renewing
// the lease, payloads as stored (made JSON as receive_partitioned would,
// see rawPayload). A non-nil ack is the chunk the slot handed out last:
// the same statement acknowledges it first, as AckDelivery would; when the
// call fails, it was not acknowledged.
func (q *Queries) ReceivePartitioned(ctx context.Context, queue, consumer string, slot, nslots int, worker string, token LeaseToken, max int, ack *Delivery) ([]Row, error) {
	var epoch, batch, msg *int64
	if ack != nil {
		epoch, batch, msg = &ack.Epoch, &ack.BatchID, &ack.MsgID
	}
	rows, err := q.db.Query(ctx, `select msg_id, batch_id, type, payload, retry_count, created_at, partition_key, epoch
		from pgque.receive_partitioned_raw($1::pg_catalog.text, $2::pg_catalog.text, $3::int, $4::int, $5::pg_catalog.text, $6::pg_catalog.uuid, $7::int, $8::bigint, $9::bigint, $10::bigint)`,
		queue, consumer, slot, nslots, worker, token, max, epoch, batch, msg)
	if err != nil {
		return nil, err
	}
	return readChunk(rows, epochRows, rawPayload)
}

// SlotReceive is one slot's part of ReceivePartitionedSlots: what
// ReceivePartitioned takes for it.
type SlotReceive struct {
	Slot, NSlots int
	Token        LeaseToken
	Ack          *Delivery
}

// ReceivePartitionedSlots calls pgque.receive_partitioned_raw_slots: the
// next chunk of every slot of calls, in one statement and one transaction,
// each acknowledging its Ack first. chunks[i] is calls[i]'s. It succeeds
// or fails as a whole: when it fails, nothing was acknowledged or
// received.
func (q *Queries) ReceivePartitionedSlots(ctx context.Context, queue, consumer, worker string, max int, calls []SlotReceive) (chunks [][]Row, err error) {
	n := len(calls)
	slots, nslots := make([]int32, n), make([]int32, n)
	tokens := make([]LeaseToken, n)
	epochs, batches, msgs := make([]*int64, n), make([]*int64, n), make([]*int64, n)
	at := make(map[[2]int]int, n)
	for i, c := range calls {
		slots[i], nslots[i], tokens[i] = int32(c.Slot), int32(c.NSlots), c.Token
		if c.Ack != nil {
			epochs[i], batches[i], msgs[i] = &c.Ack.Epoch, &c.Ack.BatchID, &c.Ack.MsgID
		}
		at[[2]int{c.Slot, c.NSlots}] = i
	}
	rows, err := q.db.Query(ctx, `select msg_id, batch_id, type, payload, retry_count, created_at, partition_key, epoch, slot, nslots
		from pgque.receive_partitioned_raw_slots($1::pg_catalog.text, $2::pg_catalog.text, $3::pg_catalog.text, $4::int, $5::int[], $6::int[], $7::pg_catalog.uuid[], $8::bigint[], $9::bigint[], $10::bigint[])`,
		queue, consumer, worker, max, slots, nslots, tokens, epochs, batches, msgs)
	if err != nil {
		return nil, err
	}
	all, err := readChunk(rows, slotRows, rawPayload)
	if err != nil {
		return nil, err
	}
	chunks = make([][]Row, n)
	for j := 0; j < len(all); {
		// Each slot's rows come together, in ev_id order.
		i, ok := at[[2]int{all[j].Slot, all[j].NSlots}]
		if !ok {
			return nil, fmt.Errorf("receive_partitioned_raw_slots returned a row of slot %d/%d, which was not asked for", all[j].Slot, all[j].NSlots)
		}
		k := j + 1
		for k < len(all) && all[k].Slot == all[j].Slot && all[k].NSlots == all[j].NSlots {
			k++
		}
		chunks[i] = all[j:k:k]
		j = k
	}
	return chunks, nil
}

// Delivery names the chunk a slot handed out: the lease epoch and batch id it
// was received under, and one of its events. The fenced ack and nack present
// it, so a worker whose lease changed hands since it received cannot settle
// a chunk only the next owner received.
type Delivery struct {
	Epoch, BatchID, MsgID int64
}

// AckDelivery calls the fenced pgque.ack_partitioned(queue, consumer, slot,
// nslots, worker, token, epoch, batch_id, msg_id) and reports whether the
// batch was finished.
func (q *Queries) AckDelivery(ctx context.Context, queue, consumer string, slot, nslots int, worker string, token LeaseToken, d Delivery) (bool, error) {
	var n int
	err := q.db.QueryRow(ctx, `select pgque.ack_partitioned($1::pg_catalog.text, $2::pg_catalog.text, $3::int, $4::int, $5::pg_catalog.text, $6::pg_catalog.uuid, $7::bigint, $8::bigint, $9::bigint)`,
		queue, consumer, slot, nslots, worker, token, d.Epoch, d.BatchID, d.MsgID).Scan(&n)
	return n == 1, err
}

// NackDelivery calls the fenced pgque.nack_partitioned(queue, consumer, slot,
// nslots, worker, token, epoch, batch_id, msg_id, retry_after, reason):
// msgID is the event to retry, d the chunk it was received in.
func (q *Queries) NackDelivery(ctx context.Context, queue, consumer string, slot, nslots int, worker string, token LeaseToken, d Delivery, msgID int64, retryAfter time.Duration, reason string) (bool, error) {
	var n int
	err := q.db.QueryRow(ctx, `select pgque.nack_partitioned($1::pg_catalog.text, $2::pg_catalog.text, $3::int, $4::int, $5::pg_catalog.text, $6::pg_catalog.uuid, $7::bigint, $8::bigint, $9::bigint, $10::interval, $11::pg_catalog.text)`,
		queue, consumer, slot, nslots, worker, token, d.Epoch, d.BatchID, msgID, retryArg(retryAfter), reason).Scan(&n)
	return n == 1, err
}

// NackPartitioned calls pgque.nack_partitioned(queue, consumer, slot, nslots,
// worker, token, msg_id, retry_after, reason) and reports whether the event
// was scheduled for retry (false: dead-lettered).
func (q *Queries) NackPartitioned(ctx context.Context, queue, consumer string, slot, nslots int, worker string, token LeaseToken, msgID int64, retryAfter time.Duration, reason string) (bool, error) {
	var n int
	err := q.db.QueryRow(ctx, `select pgque.nack_partitioned($1::pg_catalog.text, $2::pg_catalog.text, $3::int, $4::int, $5::pg_catalog.text, $6::pg_catalog.uuid, $7::bigint, $8::interval, $9::pg_catalog.text)`,
		queue, consumer, slot, nslots, worker, token, msgID, retryArg(retryAfter), reason).Scan(&n)
	return n == 1, err
}

// SlotStatus is one row of the partition_slot_status view.
type SlotStatus struct {
	Slot   int
	NSlots int
	// Owner is the lease holder, nil when the slot was never claimed or was
	// released.
	Owner *string
	// Live reports whether the lease is unexpired, by the server's clock.
	Live  bool
	Epoch int64
	// Lag is the number of the slot's events still to be handled: those
	// committed after its cursor and those it holds back (retrying, or
	// deferred behind a held key).
	Lag int64
	// OldestPendingAge is the age of the oldest event the slot has not
	// acknowledged yet (0 when none is pending).
	OldestPendingAge time.Duration

	// The columns below are filled by PartitionSlotStatus only.
	Queue, Consumer string
	// LeaseUntil is the lease's expiry, nil when the slot was never claimed.
	LeaseUntil *time.Time
	Policy     string
	// OpenBatch is the slot's open batch, nil when none is open.
	OpenBatch *int64
	// LastActive is how long ago the slot last opened or finished a batch.
	LastActive time.Duration
	// Held is how many events wait deferred behind a held key, Retrying
	// how many wait for their retry, and BlockedKeys how many keys the
	// pause policy blocks.
	Held, Retrying int64
	BlockedKeys    int
}

// PartitionSlotStatus reads the partition_slot_status view for one
// (queue, consumer), ordered by queue, consumer and slot; an empty queue or
// consumer matches every one. Lease liveness is judged by the server's
// clock, so client clock skew does not matter.
func (q *Queries) PartitionSlotStatus(ctx context.Context, queue, consumer string) ([]SlotStatus, error) {
	rows, err := q.db.Query(ctx, `select slot, nslots, owner, coalesce(lease_until operator(pg_catalog.>) pg_catalog.now(), false), coalesce(epoch, 0),
			coalesce(lag, 0), coalesce(extract(epoch from oldest_pending_age), 0)::pg_catalog.float8,
			queue, consumer, lease_until, policy, open_batch, coalesce(extract(epoch from last_active), 0)::pg_catalog.float8,
			held, blocked_keys, retrying
		from pgque.partition_slot_status
		where ($1::pg_catalog.text operator(pg_catalog.=) '' or queue operator(pg_catalog.=) $1::pg_catalog.text)
		  and ($2::pg_catalog.text operator(pg_catalog.=) '' or consumer operator(pg_catalog.=) $2::pg_catalog.text)
		order by queue, consumer, slot`, queue, consumer)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []SlotStatus
	for rows.Next() {
		var s SlotStatus
		var age, active float64
		if err := rows.Scan(&s.Slot, &s.NSlots, &s.Owner, &s.Live, &s.Epoch, &s.Lag, &age,
			&s.Queue, &s.Consumer, &s.LeaseUntil, &s.Policy, &s.OpenBatch, &active, &s.Held, &s.BlockedKeys, &s.Retrying); err != nil {
			return nil, err
		}
		s.OldestPendingAge = seconds(age)
		s.LastActive = seconds(active)
		out = append(out, s)
	}
	return out, rows.Err()
}

// PartitionSlotLeases reads the partition_slot_leases view for one
// consumer: owners and epochs without the per-slot lag, so it costs the same
// whatever the backlog (Lag and OldestPendingAge are left zero).
func (q *Queries) PartitionSlotLeases(ctx context.Context, queue, consumer string) ([]SlotStatus, error) {
	rows, err := q.db.Query(ctx, `select slot, nslots, owner, coalesce(lease_until operator(pg_catalog.>) pg_catalog.now(), false), coalesce(epoch, 0)
		from pgque.partition_slot_leases where queue operator(pg_catalog.=) $1::pg_catalog.text and consumer operator(pg_catalog.=) $2::pg_catalog.text order by slot`, queue, consumer)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []SlotStatus
	for rows.Next() {
		var s SlotStatus
		if err := rows.Scan(&s.Slot, &s.NSlots, &s.Owner, &s.Live, &s.Epoch); err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, rows.Err()
}

// SubscribeSlotPolicy calls pgque.subscribe_slot(queue, consumer, slot,
// nslots, policy) and reports whether the slot is new. A nil policy keeps
// the persisted one (skip for a new consumer); another policy than the
// persisted one raises PQ031.
func (q *Queries) SubscribeSlotPolicy(ctx context.Context, queue, consumer string, slot, nslots int, policy *string) (bool, error) {
	var n int
	err := q.db.QueryRow(ctx, `select pgque.subscribe_slot($1::pg_catalog.text, $2::pg_catalog.text, $3::int, $4::int, $5::pg_catalog.text)`,
		queue, consumer, slot, nslots, policy).Scan(&n)
	return n == 1, err
}

// SlotPolicy reads the failure policy persisted for (queue, consumer) from
// the partition_slot_leases view; pgx.ErrNoRows when the consumer has no
// slots.
func (q *Queries) SlotPolicy(ctx context.Context, queue, consumer string) (string, error) {
	var policy string
	err := q.db.QueryRow(ctx, `select policy from pgque.partition_slot_leases
		where queue operator(pg_catalog.=) $1::pg_catalog.text and consumer operator(pg_catalog.=) $2::pg_catalog.text limit 1`, queue, consumer).Scan(&policy)
	return policy, err
}

// SetFailurePolicy calls pgque.set_failure_policy(queue, consumer, policy).
func (q *Queries) SetFailurePolicy(ctx context.Context, queue, consumer, policy string) error {
	_, err := q.db.Exec(ctx, `select pgque.set_failure_policy($1::pg_catalog.text, $2::pg_catalog.text, $3::pg_catalog.text)`, queue, consumer, policy)
	return err
}

// BlockedKey is one row of blocked_keys.
type BlockedKey struct {
	Queue, Consumer string
	Slot            int
	// Key is nil for the NULL key.
	Key      *string
	State    string
	HeadEvID int64
	Since    time.Time
	Failures int
	Reason   *string
	Deferred int64
}

// BlockedKeys calls pgque.blocked_keys(queue, consumer); a nil consumer
// lists every consumer of the queue.
func (q *Queries) BlockedKeys(ctx context.Context, queue string, consumer *string) ([]BlockedKey, error) {
	rows, err := q.db.Query(ctx, `select queue, consumer, slot, key, state, head_ev_id, since, failures, reason, deferred
		from pgque.blocked_keys($1::pg_catalog.text, $2::pg_catalog.text)`, queue, consumer)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []BlockedKey
	for rows.Next() {
		var b BlockedKey
		if err := rows.Scan(&b.Queue, &b.Consumer, &b.Slot, &b.Key, &b.State, &b.HeadEvID, &b.Since,
			&b.Failures, &b.Reason, &b.Deferred); err != nil {
			return nil, err
		}
		out = append(out, b)
	}
	return out, rows.Err()
}

// UnblockKey calls pgque.unblock_key(queue, consumer, key) and returns the
// dead-lettered head's ev_id. A nil key is the NULL key.
func (q *Queries) UnblockKey(ctx context.Context, queue, consumer string, key *string) (int64, error) {
	var id int64
	err := q.db.QueryRow(ctx, `select pgque.unblock_key($1::pg_catalog.text, $2::pg_catalog.text, $3::pg_catalog.text)`, queue, consumer, key).Scan(&id)
	return id, err
}

// RetryKeyNow calls pgque.retry_key_now(queue, consumer, key) and reports
// whether a retry of the key's head was pending. A nil key is the NULL key.
func (q *Queries) RetryKeyNow(ctx context.Context, queue, consumer string, key *string) (bool, error) {
	var n int
	err := q.db.QueryRow(ctx, `select pgque.retry_key_now($1::pg_catalog.text, $2::pg_catalog.text, $3::pg_catalog.text)`, queue, consumer, key).Scan(&n)
	return n == 1, err
}

// MaintRouteIndexes calls pgque.maint_route_indexes() and returns how many
// routing indexes it built.
func (q *Queries) MaintRouteIndexes(ctx context.Context) (int64, error) {
	var n *int64
	err := q.db.QueryRow(ctx, `select pgque.maint_route_indexes()::bigint`).Scan(&n)
	if n == nil {
		return 0, err
	}
	return *n, err
}

// Peer is another worker of a partitioned consumer as announce_worker
// returns it.
type Peer struct {
	Worker string
	Hungry bool
	Slots  []int32
	Age    time.Duration
}

// AnnounceWorker calls pgque.announce_worker: it records this worker's
// presence and returns the other workers heard from within maxAge.
func (q *Queries) AnnounceWorker(ctx context.Context, queue, consumer, worker string, hungry bool, slots []int, maxAge time.Duration) ([]Peer, error) {
	s32 := make([]int32, len(slots))
	for i, s := range slots {
		s32[i] = int32(s)
	}
	rows, err := q.db.Query(ctx, `select worker, hungry, slots, age
		from pgque.announce_worker($1::pg_catalog.text, $2::pg_catalog.text, $3::pg_catalog.text, $4::pg_catalog.bool, $5::int[], $6::interval)`,
		queue, consumer, worker, hungry, s32, maxAge)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Peer, error) {
		var p Peer
		err := r.Scan(&p.Worker, &p.Hungry, &p.Slots, &p.Age)
		return p, err
	})
}

// CompleteDelivery calls the fenced pgque.complete_partitioned_in_tx(queue,
// consumer, slot, nslots, worker, token, epoch, batch_id, msg_id): msgID is
// the event completed, d the chunk it was received in. q must run over the
// handler's transaction.
func (q *Queries) CompleteDelivery(ctx context.Context, queue, consumer string, slot, nslots int, worker string, token LeaseToken, d Delivery, msgID int64) error {
	_, err := q.db.Exec(ctx, `select pgque.complete_partitioned_in_tx($1::pg_catalog.text, $2::pg_catalog.text, $3::int, $4::int, $5::pg_catalog.text, $6::pg_catalog.uuid, $7::bigint, $8::bigint, $9::bigint)`,
		queue, consumer, slot, nslots, worker, token, d.Epoch, d.BatchID, msgID)
	return err
}

package dbq

import (
	"context"
	"time"
)

// HoldKeysPartitioned calls pgque.hold_keys_partitioned: holds keys[i] from
// heads[i] on, every head an event of the chunk d, in one call, and returns
// how many events were deferred. A nil key is the NULL key.
func (q *Queries) HoldKeysPartitioned(ctx context.Context, queue, consumer string, slot, nslots int, worker string, token LeaseToken, d Delivery, keys []*string, heads []int64) (int, error) {
	var n int
	err := q.db.QueryRow(ctx, `select pgque.hold_keys_partitioned($1::pg_catalog.text, $2::pg_catalog.text, $3::int, $4::int, $5::pg_catalog.text, $6::pg_catalog.uuid, $7::bigint, $8::bigint, $9::pg_catalog.text[], $10::bigint[])`,
		queue, consumer, slot, nslots, worker, token, d.Epoch, d.BatchID, keys, heads).Scan(&n)
	return n, err
}

// HeldFailure is one failed event of a held key's lane.
type HeldFailure struct {
	ID int64
	// RetryAfter is the retry delay; DeadLetterNow dead-letters at once.
	RetryAfter time.Duration
	Reason     string
}

// SettleHeldPartitioned calls pgque.settle_held_partitioned for a key held
// under lease epoch and reports whether the hold was still that epoch's
// (false: a new owner released it).
func (q *Queries) SettleHeldPartitioned(ctx context.Context, queue, consumer string, slot, nslots int, worker string, token LeaseToken, epoch int64, key *string, head int64, done []int64, failed []HeldFailure) (bool, error) {
	ids := make([]int64, len(failed))
	after := make([]*time.Duration, len(failed))
	reasons := make([]string, len(failed))
	for i, f := range failed {
		ids[i], after[i], reasons[i] = f.ID, retryArg(f.RetryAfter), f.Reason
	}
	if done == nil {
		done = []int64{}
	}
	var n int
	err := q.db.QueryRow(ctx, `select pgque.settle_held_partitioned($1::pg_catalog.text, $2::pg_catalog.text, $3::int, $4::int, $5::pg_catalog.text, $6::pg_catalog.uuid, $7::bigint, $8::pg_catalog.text, $9::bigint, $10::bigint[], $11::bigint[], $12::interval[], $13::pg_catalog.text[])`,
		queue, consumer, slot, nslots, worker, token, epoch, key, head, done, ids, after, reasons).Scan(&n)
	return n == 1, err
}

// ReleaseStaleHoldsPartitioned calls
// pgque.release_stale_holds_partitioned(queue, consumer, slot, nslots,
// worker, token) and returns how many events were put back for redelivery.
func (q *Queries) ReleaseStaleHoldsPartitioned(ctx context.Context, queue, consumer string, slot, nslots int, worker string, token LeaseToken) (int, error) {
	var n int
	err := q.db.QueryRow(ctx, `select pgque.release_stale_holds_partitioned($1::pg_catalog.text, $2::pg_catalog.text, $3::int, $4::int, $5::pg_catalog.text, $6::pg_catalog.uuid)`,
		queue, consumer, slot, nslots, worker, token).Scan(&n)
	return n, err
}

package dbq

import "context"

// DeadLetterPartitioned calls pgque.dead_letter_partitioned(queue, consumer,
// slot, nslots, worker, msg_id, reason): the event goes to dead_letter at
// once, whatever its retry count.
func (q *Queries) DeadLetterPartitioned(ctx context.Context, queue, consumer string, slot, nslots int, worker string, msgID int64, reason string) error {
	_, err := q.db.Exec(ctx, `select pgque.dead_letter_partitioned($1::text, $2::text, $3::int, $4::int, $5::text, $6::bigint, $7::text)`,
		queue, consumer, slot, nslots, worker, msgID, reason)
	return err
}

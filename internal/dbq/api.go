package dbq

import (
	"context"
	"encoding/json"
	"time"

	"github.com/pgque/pgque/internal/jsonsyntax"
)

// Send calls pgque.send(queue, type, payload, partition_key[, dedup_key])
// and returns the event id. A nil key is the NULL key (slot 0); a nil dedup
// key sends without dedup, through the four-argument call. The payload
// goes as text to the text form of send: the client already holds JSON
// bytes, so the server checks their syntax instead of building a jsonb
// value and printing it back.
func (q *Queries) Send(ctx context.Context, queue, typ string, payload json.RawMessage, key, dedup *string) (int64, error) {
	var id int64
	var err error
	if dedup == nil {
		err = q.db.QueryRow(ctx, `select pgque.send($1::pg_catalog.text, $2::pg_catalog.text, $3::pg_catalog.text, $4::pg_catalog.text)`,
			queue, typ, string(payload), key).Scan(&id)
	} else {
		err = q.db.QueryRow(ctx, `select pgque.send($1::pg_catalog.text, $2::pg_catalog.text, $3::pg_catalog.text, $4::pg_catalog.text, $5::pg_catalog.text)`,
			queue, typ, string(payload), key, *dedup).Scan(&id)
	}
	return id, err
}

// SendBatch calls pgque.send_batch(queue, type, payloads, partition_keys,
// dedup_keys) and returns the event ids in input order. The payloads go
// to the text[] form, which checks their JSON syntax without building
// jsonb values. keys and dedups are
// each nil or as long as payloads.
func (q *Queries) SendBatch(ctx context.Context, queue, typ string, payloads []string, keys, dedups []*string) ([]int64, error) {
	var ids []int64
	var err error
	if dedups == nil {
		err = q.db.QueryRow(ctx, `select pgque.send_batch($1::pg_catalog.text, $2::pg_catalog.text, $3::pg_catalog.text[], $4::pg_catalog.text[])`,
			queue, typ, payloads, keys).Scan(&ids)
	} else {
		err = q.db.QueryRow(ctx, `select pgque.send_batch($1::pg_catalog.text, $2::pg_catalog.text, $3::pg_catalog.text[], $4::pg_catalog.text[], $5::pg_catalog.text[])`,
			queue, typ, payloads, keys, dedups).Scan(&ids)
	}
	return ids, err
}

// SendBatchTypes calls the mixed-type pgque.send_batch(queue, types,
// payloads, partition_keys, dedup_keys): types[i] is the type of
// payloads[i]. The rest is as SendBatch.
func (q *Queries) SendBatchTypes(ctx context.Context, queue string, types, payloads []string, keys, dedups []*string) ([]int64, error) {
	var ids []int64
	var err error
	if dedups == nil {
		err = q.db.QueryRow(ctx, `select pgque.send_batch($1::pg_catalog.text, $2::pg_catalog.text[], $3::pg_catalog.text[], $4::pg_catalog.text[])`,
			queue, types, payloads, keys).Scan(&ids)
	} else {
		err = q.db.QueryRow(ctx, `select pgque.send_batch($1::pg_catalog.text, $2::pg_catalog.text[], $3::pg_catalog.text[], $4::pg_catalog.text[], $5::pg_catalog.text[])`,
			queue, types, payloads, keys, dedups).Scan(&ids)
	}
	return ids, err
}

// Subscribe calls pgque.subscribe(queue, consumer) and reports whether the
// subscription is new.
func (q *Queries) Subscribe(ctx context.Context, queue, consumer string) (bool, error) {
	var n int
	err := q.db.QueryRow(ctx, `select pgque.subscribe($1::pg_catalog.text, $2::pg_catalog.text)`, queue, consumer).Scan(&n)
	return n == 1, err
}

// RewindNewSubscription calls pgque.rewind_new_subscription(queue,
// consumer) and returns how many event ids the rewind gained.
func (q *Queries) RewindNewSubscription(ctx context.Context, queue, consumer string) (int64, error) {
	var n int64
	err := q.db.QueryRow(ctx, `select pgque.rewind_new_subscription($1::pg_catalog.text, $2::pg_catalog.text)`, queue, consumer).Scan(&n)
	return n, err
}

// EventsBeforeSubscription calls pgque.events_before_subscription(queue,
// consumer).
func (q *Queries) EventsBeforeSubscription(ctx context.Context, queue, consumer string) (int64, error) {
	var n int64
	err := q.db.QueryRow(ctx, `select pgque.events_before_subscription($1::pg_catalog.text, $2::pg_catalog.text)`, queue, consumer).Scan(&n)
	return n, err
}

// Unsubscribe calls pgque.unsubscribe(queue, consumer) and reports whether
// the subscription existed.
func (q *Queries) Unsubscribe(ctx context.Context, queue, consumer string) (bool, error) {
	var n int
	err := q.db.QueryRow(ctx, `select pgque.unsubscribe($1::pg_catalog.text, $2::pg_catalog.text)`, queue, consumer).Scan(&n)
	return n == 1, err
}

// Row is one delivered event, as receive and receive_partitioned return it.
type Row struct {
	MsgID      int64
	BatchID    int64
	Type       string
	Payload    []byte
	RetryCount int
	// Replay marks a dead letter put back by dlq_replay (RetryCount is
	// then the count it had, kept).
	Replay       bool
	CreatedAt    time.Time
	PartitionKey *string
	// Epoch is the slot lease's epoch (receive_partitioned only).
	Epoch int64
	// Slot and NSlots are the slot the row was received for
	// (ReceivePartitionedSlots only).
	Slot, NSlots int
}

// Receive calls pgque.receive(queue, consumer, max): the next chunk of at most
// max events of the open (or next) batch, in ev_id order.
func (q *Queries) Receive(ctx context.Context, queue, consumer string, max int) ([]Row, error) {
	rows, err := q.db.Query(ctx, `select msg_id, batch_id, type, payload::pg_catalog.text, retry_count, created_at, partition_key
		from pgque.receive($1::pg_catalog.text, $2::pg_catalog.text, $3::int)`, queue, consumer, max)
	if err != nil {
		return nil, err
	}
	return readChunk(rows, plainRows, jsonbPayload)
}

// ReceiveRaw calls pgque.receive_raw(queue, consumer, max, ack_batch): when
// ackBatch is not nil it first acknowledges the chunk last received from
// that batch, then returns the next chunk, in one statement. Payloads come
// as stored, so nothing parses them on the server; rawPayload keeps the
// promise that every payload is JSON.
func (q *Queries) ReceiveRaw(ctx context.Context, queue, consumer string, max int, ackBatch *int64) ([]Row, error) {
	rows, err := q.db.Query(ctx, `select msg_id, batch_id, type, payload, retry_count, created_at, partition_key
		from pgque.receive_raw($1::pg_catalog.text, $2::pg_catalog.text, $3::int, $4::bigint)`, queue, consumer, max, ackBatch)
	if err != nil {
		return nil, err
	}
	return readChunk(rows, plainRows, rawPayload)
}

// rawPayload is a payload as stored, made JSON the way receive makes it:
// send stores JSON, which passes through untouched; data only insert_event
// can store that is not JSON becomes a JSON string of the stored text, and
// SQL NULL the JSON literal null.
func rawPayload(b []byte) []byte {
	if b == nil {
		return []byte("null")
	}
	if jsonsyntax.Valid(b) {
		return b
	}
	s, _ := json.Marshal(string(b))
	return s
}

// Ack calls pgque.ack(batch_id) and reports whether the batch was finished.
func (q *Queries) Ack(ctx context.Context, batchID int64) (bool, error) {
	var n int
	err := q.db.QueryRow(ctx, `select pgque.ack($1::bigint)`, batchID).Scan(&n)
	return n == 1, err
}

// Nack calls pgque.nack(batch_id, msg_id, retry_after, reason) and reports
// whether the event was scheduled for retry (false: dead-lettered). A
// negative retryAfter (DeadLetterNow) is sent as NULL: dead-letter at once.
func (q *Queries) Nack(ctx context.Context, batchID, msgID int64, retryAfter time.Duration, reason string) (bool, error) {
	var n int
	err := q.db.QueryRow(ctx, `select pgque.nack($1::bigint, $2::bigint, $3::interval, $4::pg_catalog.text)`,
		batchID, msgID, retryArg(retryAfter), reason).Scan(&n)
	return n == 1, err
}

// DeadLetterNow, as a nack's retry delay, dead-letters the event at once.
const DeadLetterNow time.Duration = -1

// retryArg is a nack's retry delay as SQL takes it: NULL for DeadLetterNow
// (any negative delay).
func retryArg(d time.Duration) *time.Duration {
	if d < 0 {
		return nil
	}
	return &d
}

// jsonbPayload is a payload receive returned: JSON already (the server
// printed it from jsonb), SQL NULL the JSON literal null.
func jsonbPayload(b []byte) []byte {
	if b == nil {
		return []byte("null")
	}
	return b
}

// CompleteInTx calls pgque.complete_in_tx(queue, consumer, batch_id,
// msg_id): q must run over the handler's transaction.
func (q *Queries) CompleteInTx(ctx context.Context, queue, consumer string, batchID, msgID int64) error {
	_, err := q.db.Exec(ctx, `select pgque.complete_in_tx($1::pg_catalog.text, $2::pg_catalog.text, $3::bigint, $4::bigint)`,
		queue, consumer, batchID, msgID)
	return err
}

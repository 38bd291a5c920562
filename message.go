package pgque

import (
	"encoding/json"
	"time"

	"github.com/pgque/pgque/internal/dbq"
)

// Message is one delivered event, as a handler sees it.
type Message struct {
	// ID is the event id (ev_id): the event's position in the queue, kept
	// across retries.
	ID int64
	// Queue and Consumer name the subscription that delivered the event; for
	// a partitioned consumer, Consumer is the consumer name without the slot
	// suffix.
	Queue, Consumer string
	// Type is the event's type.
	Type string
	// Payload is the event's JSON body.
	Payload json.RawMessage
	// PartitionKey is the event's key, empty when it was sent without one.
	// Key tells the NULL key from an empty one.
	PartitionKey string
	// RetryCount is 0 on first delivery and counts redeliveries after nacks.
	// A replay keeps the count the event had when it was dead-lettered
	// and goes on counting from there.
	RetryCount int
	// Replay is set when the event is a dead letter an operator put back
	// (Client.ReplayDeadLetter, pgque dlq replay), on every delivery of it,
	// its retries included. ID is then the original event's id, which a
	// replay keeps. A replay comes after the events the consumer had
	// already received, those of its own key included: a handler that
	// applies events by key in order should check, for a replay, that the
	// key's state has not moved past it (see "Replaying dead letters" in
	// docs/operations.md).
	Replay bool
	// CreatedAt is when the event was sent.
	CreatedAt time.Time
	// BatchID is the engine batch the event was delivered in.
	BatchID int64
	// Slot is the slot that delivered the event (partitioned consumers only).
	Slot int
	// NSlots is the consumer's N the slot belongs to: Slot of NSlots
	// (partitioned consumers only; it changes when the consumer is resized).
	NSlots int
	// Epoch is the slot lease's epoch when the event was received
	// (partitioned consumers only). It grows with every change of owner, so
	// it is a fencing token: a side effect stamped with the epoch can be
	// rejected downstream once a newer epoch has been seen for the slot.
	Epoch int64
	// Chunk numbers the chunk the event was received in, in this process:
	// the events of one receive share it, and a chunk received again (a
	// redelivery) gets a new number. A batch may be delivered in several
	// chunks, so BatchID alone does not tell them apart.
	Chunk uint64

	// keyed is set when the event has a key, even an empty one (only SQL
	// can send the empty key; Go sends "" as the NULL key).
	keyed bool
	// token is the slot lease's token the event was received under
	// (partitioned consumers only): a HandlerTx's completion presents it.
	token dbq.LeaseToken
}

// Key returns the event's partition key, the NULL key when it was sent
// without one. Pass it to Client.UnblockKey or Client.RetryKeyNow.
func (m *Message) Key() KeyRef {
	if m.keyed || m.PartitionKey != "" {
		return KeyOf(m.PartitionKey)
	}
	return NullKey
}

// Decode unmarshals the payload into v.
func (m *Message) Decode(v any) error {
	return json.Unmarshal(m.Payload, v)
}

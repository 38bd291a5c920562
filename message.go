package pgque

import (
	"encoding/json"
	"time"
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
	PartitionKey string
	// RetryCount is 0 on first delivery and counts redeliveries after nacks.
	RetryCount int
	// CreatedAt is when the event was sent.
	CreatedAt time.Time
	// BatchID is the engine batch the event was delivered in.
	BatchID int64
	// Slot is the slot that delivered the event (partitioned consumers only).
	Slot int
	// Epoch is the slot lease's epoch when the event was received
	// (partitioned consumers only). It grows with every change of owner, so
	// it is a fencing token: a side effect stamped with the epoch can be
	// rejected downstream once a newer epoch has been seen for the slot.
	Epoch int64
}

// Decode unmarshals the payload into v.
func (m *Message) Decode(v any) error {
	return json.Unmarshal(m.Payload, v)
}

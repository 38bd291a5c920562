package pgque

import (
	"encoding/json"
	"fmt"
)

// EventTypeDefault is the type of an event sent with an empty Type; it is
// the type the SQL send(queue, payload) gives.
const EventTypeDefault = "default"

// Event is one event to send.
type Event struct {
	// Type is a short name consumers dispatch on, e.g. "FileCreated". Empty
	// means EventTypeDefault.
	Type string
	// Payload is the event's JSON body: a json.RawMessage is sent as is
	// (after checking it is valid JSON), any other value is marshalled with
	// encoding/json.
	Payload any
	// PartitionKey routes the event: events with the same key are consumed
	// in order by one worker at a time. Empty means no key (the NULL key,
	// which always maps to slot 0).
	PartitionKey string
}

// encode returns the event's type, JSON payload and key, or an error
// wrapping ErrInvalidPayload. It never touches the database.
func (e Event) encode() (typ string, payload json.RawMessage, key *string, err error) {
	typ = e.Type
	if typ == "" {
		typ = EventTypeDefault
	}
	switch p := e.Payload.(type) {
	case json.RawMessage:
		if !json.Valid(p) {
			return "", nil, nil, fmt.Errorf("%w: json.RawMessage is not valid JSON", ErrInvalidPayload)
		}
		payload = p
	default:
		payload, err = json.Marshal(p)
		if err != nil {
			return "", nil, nil, fmt.Errorf("%w: %w", ErrInvalidPayload, err)
		}
	}
	if e.PartitionKey != "" {
		k := e.PartitionKey
		key = &k
	}
	return typ, payload, key, nil
}

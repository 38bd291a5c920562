package pgque

import (
	"encoding/json"
	"fmt"

	"github.com/pgque/pgque/internal/jsonsyntax"
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
	// DedupKey makes the send idempotent: a send with a key the queue has
	// seen within its dedup window (set_queue_config 'dedup_window',
	// default 5 minutes) stores nothing and returns the first event's id,
	// so a producer may retry a send whose outcome it does not know. Empty
	// means no dedup. At most 512 bytes; SendBatch takes at most 1000 keyed
	// events per run of one type.
	DedupKey string
}

// encode returns the event's type, JSON payload, partition key and dedup
// key, or an error wrapping ErrInvalidPayload. It never touches the
// database.
func (e Event) encode() (typ string, payload json.RawMessage, key, dedup *string, err error) {
	typ = e.Type
	if typ == "" {
		typ = EventTypeDefault
	}
	switch p := e.Payload.(type) {
	case json.RawMessage:
		if !jsonsyntax.Valid(p) {
			return "", nil, nil, nil, fmt.Errorf("%w: json.RawMessage is not valid JSON", ErrInvalidPayload)
		}
		payload = p
	default:
		payload, err = json.Marshal(p)
		if err != nil {
			return "", nil, nil, nil, fmt.Errorf("%w: %w", ErrInvalidPayload, err)
		}
	}
	// The server stores a payload as text and reads it as jsonb, which keeps
	// numbers as numeric: one past numeric's range would reach consumers as
	// a JSON string of the whole payload (docs/sql-reference.md).
	if n := jsonsyntax.NumericOverflow(payload); n != nil {
		return "", nil, nil, nil, fmt.Errorf("%w: the number %s is past the range of PostgreSQL's numeric "+
			"(131 072 digits before the decimal point, 16 383 after it), which jsonb cannot hold", ErrInvalidPayload, shortNumber(n))
	}
	if e.PartitionKey != "" {
		k := e.PartitionKey
		key = &k
	}
	if e.DedupKey != "" {
		d := e.DedupKey
		dedup = &d
	}
	return typ, payload, key, dedup, nil
}

// shortNumber is n for an error message: its first 16 and last 8 bytes
// when it is longer than 32.
func shortNumber(n []byte) string {
	if len(n) <= 32 {
		return string(n)
	}
	return fmt.Sprintf("%s...%s (%d bytes)", n[:16], n[len(n)-8:], len(n))
}

package pgque

import (
	"context"
	"encoding/json"
	"fmt"
	"time"
)

// DeadLetterLimitDefault is how many dead letters DeadLetters returns when
// DeadLetterFilter.Limit is zero.
const DeadLetterLimitDefault = 100

// DeadLetterEntry is an event that failed more than the queue's max_retries times
// (or was dead-lettered at once by a handler returning DeadLetter(err), or by
// UnblockKey), kept with the consumer it failed for.
type DeadLetterEntry struct {
	// ID identifies the dead letter within its queue (ReplayDeadLetter).
	ID int64
	// Consumer is the consumer the event failed for, as it subscribed
	// (the name DeadLetterFilter and PurgeFilter take).
	Consumer string
	// Slot is the slot of a partitioned consumer the event failed in, -1
	// for a plain consumer.
	Slot int
	// Subscription is the subscription that holds it: Consumer for a
	// plain consumer, "<consumer>#<slot>/<slots>" for a slot.
	Subscription string
	// DeadSince is when the event was dead-lettered.
	DeadSince time.Time
	// Reason is the last failure, as nacked.
	Reason string
	// EventID, EventTime, Type, Payload and Key are the event's.
	EventID   int64
	EventTime time.Time
	Type      string
	Payload   json.RawMessage
	Key       KeyRef
	// RetryCount is how many times the event had been retried.
	RetryCount int
}

// DeadLetterFilter selects dead letters. The zero value selects the oldest
// DeadLetterLimitDefault of every consumer.
type DeadLetterFilter struct {
	// Consumer, when set, selects only that consumer's dead letters: for
	// a partitioned consumer, those of every slot. A consumer the queue
	// does not know (not subscribed, no dead letters there) is
	// ErrConsumerNotFound.
	Consumer string
	// Limit caps how many are returned, oldest first; zero means
	// DeadLetterLimitDefault.
	Limit int
}

// DeadLetters lists the dead letters of queue, oldest first. A nil filter is
// the zero filter. Requires pgque_reader or pgque_admin.
func (c *Client) DeadLetters(ctx context.Context, queue string, filter *DeadLetterFilter) ([]DeadLetterEntry, error) {
	var f DeadLetterFilter
	if filter != nil {
		f = *filter
	}
	if f.Limit < 0 {
		return nil, invalidConfig("dead letter limit must not be negative, got %d", f.Limit)
	}
	if f.Limit == 0 {
		f.Limit = DeadLetterLimitDefault
	}
	rows, err := c.queries.DLQList(ctx, queue, nullIfEmpty(f.Consumer), f.Limit)
	if err != nil {
		return nil, mapError(fmt.Sprintf("listing dead letters of queue %q", queue), err)
	}
	out := make([]DeadLetterEntry, len(rows))
	for i, r := range rows {
		out[i] = DeadLetterEntry{
			ID: r.ID, Consumer: r.ConsumerName, Slot: -1, Subscription: r.Consumer, DeadSince: r.Time, Reason: deref(r.Reason),
			EventID: r.EvID, EventTime: r.EvTime, Type: deref(r.Type), Key: keyRefOf(r.Key), RetryCount: r.RetryCount,
		}
		if r.Slot != nil {
			out[i].Slot = int(*r.Slot)
		}
		if r.Payload != nil {
			out[i].Payload = json.RawMessage(*r.Payload)
		}
	}
	return out, nil
}

// ReplayDeadLetter puts dead letter id back into queue for the consumer it
// failed for only and removes it from the dead letters; it returns the
// event id. The event comes back marked (Message.Replay) with its id and
// retry count kept, after every event the consumer has already received:
// ReplayDeadLetterReport says whether later events of its key were among
// them. It fails with ErrDeadLetterNotFound when there is no such dead
// letter and with ErrConsumerNotFound when its consumer was unsubscribed.
// Requires pgque_admin.
func (c *Client) ReplayDeadLetter(ctx context.Context, queue string, id int64) (int64, error) {
	r, err := c.ReplayDeadLetterReport(ctx, queue, id)
	return r.EventID, err
}

// ReplayReport is what a replay did to its key's order.
type ReplayReport struct {
	// EventID is the replayed event's id (the original event's).
	EventID int64
	// Subscription is the subscription it was replayed for, as in
	// DeadLetterEntry; Key is its partition key.
	Subscription string
	Key          KeyRef
	// LaterDelivered counts the events of the dead letter's key, sent
	// after it, that the consumer had already been handed when it was
	// replayed: the replay reaches the handler after them, out of the
	// key's order. Zero when none was.
	LaterDelivered int64
	// HistoryComplete is false when the queue's event tables no longer
	// held the dead letter's event (they were rotated since), so later
	// events of the key may have been delivered without being counted.
	HistoryComplete bool
}

// OutOfOrder reports whether the replay may come after later events of its
// key: some were counted, or the history to count them is gone.
func (r ReplayReport) OutOfOrder() bool {
	return r.LaterDelivered > 0 || !r.HistoryComplete
}

// ReplayDeadLetterReport is ReplayDeadLetter, and reports whether the
// consumer had already been handed later events of the dead letter's key.
// It replays either way: the report is for a warning, the choice is the
// caller's (see "Replaying dead letters" in docs/operations.md).
func (c *Client) ReplayDeadLetterReport(ctx context.Context, queue string, id int64) (ReplayReport, error) {
	r, err := c.queries.DLQReplay(ctx, queue, id)
	if err != nil {
		return ReplayReport{}, mapError(fmt.Sprintf("replaying dead letter %d of queue %q", id, queue), err)
	}
	return ReplayReport{
		EventID: r.EvID, Subscription: r.Consumer, Key: keyRefOf(r.Key),
		LaterDelivered: r.LaterDelivered, HistoryComplete: r.HistoryComplete,
	}, nil
}

// PurgeFilter selects the dead letters PurgeDeadLetters deletes. The zero
// value selects all of them.
type PurgeFilter struct {
	// Consumer, when set, selects only that consumer's dead letters (of
	// every slot of a partitioned consumer); ErrConsumerNotFound when the
	// queue does not know it.
	Consumer string
	// OlderThan, when positive, keeps the dead letters younger than this.
	OlderThan time.Duration
}

// PurgeDeadLetters deletes dead letters of queue for good and returns how
// many. A nil filter is the zero filter: every dead letter of the queue.
// Requires pgque_admin.
func (c *Client) PurgeDeadLetters(ctx context.Context, queue string, filter *PurgeFilter) (int64, error) {
	var f PurgeFilter
	if filter != nil {
		f = *filter
	}
	if f.OlderThan < 0 {
		return 0, invalidConfig("purge older-than must not be negative, got %v", f.OlderThan)
	}
	n, err := c.queries.DLQPurge(ctx, queue, nullIfEmpty(f.Consumer), f.OlderThan)
	return n, mapError(fmt.Sprintf("purging dead letters of queue %q", queue), err)
}

// nullIfEmpty maps "" to SQL NULL ("any").
func nullIfEmpty(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// deref returns *s, or "" for nil.
func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

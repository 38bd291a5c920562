package pgque

import (
	"context"
	"fmt"
	"strconv"
	"time"
)

// KeyRef names one partition key, including the NULL key: the key of events
// sent without one (Event.PartitionKey ""). The zero KeyRef is the NULL key;
// KeyOf("") is the empty key, a different key that only SQL can send.
// KeyRef values are comparable.
type KeyRef struct {
	key   string
	valid bool
}

// NullKey is the NULL key.
var NullKey = KeyRef{}

// KeyOf returns the partition key k (never the NULL key).
func KeyOf(k string) KeyRef { return KeyRef{key: k, valid: true} }

// IsNull reports whether r is the NULL key.
func (r KeyRef) IsNull() bool { return !r.valid }

// Value returns the key, and false for the NULL key.
func (r KeyRef) Value() (string, bool) { return r.key, r.valid }

// String returns the key quoted, or NULL.
func (r KeyRef) String() string {
	if !r.valid {
		return "NULL"
	}
	return strconv.Quote(r.key)
}

// arg is the key as a query argument: nil for NULL.
func (r KeyRef) arg() *string {
	if !r.valid {
		return nil
	}
	k := r.key
	return &k
}

func keyRefOf(k *string) KeyRef {
	if k == nil {
		return NullKey
	}
	return KeyOf(*k)
}

// Defaults of KeyQuery.
const (
	// KeyLimitDefault is how many keys KeyHeads and HotKeys return.
	KeyLimitDefault = 20
	// KeyScanDefault bounds how many pending events KeyHeads and KeyShares
	// read per call, split between the slots. Past it the answers are
	// estimates (the heads found are still the oldest ones, since the scan
	// reads the oldest pending events first). 20 000 keeps one call near a
	// tenth of a second on a million-event backlog, cheap enough to poll
	// every few seconds; raise it for exact counts on large backlogs.
	KeyScanDefault = 20000
	// HotKeyWindowDefault is the window HotKeys measures rates over.
	HotKeyWindowDefault = time.Minute
	// HotKeyShareDefault is the share of a slot's pending events above
	// which one key counts as hot (see KeyShare.Hot).
	HotKeyShareDefault = 0.5
	// HotKeyMinPending is the backlog below which no slot counts as hot: a
	// slot with a handful of pending events is not behind, whoever owns them.
	HotKeyMinPending = 100
)

// KeyState is the state of a key with pending work (KeyHead). The words
// of a blocked key's states are those of BlockState.
type KeyState string

// Key states of a KeyHead, in order of precedence.
const (
	// KeyStateBlocked: under FailurePolicyPause the key's head failed and
	// waits for its retry; every later event of the key is deferred.
	KeyStateBlocked KeyState = "blocked"
	// KeyStateReleasing: under FailurePolicyPause the head was settled and
	// the deferred events are being put back, in order.
	KeyStateReleasing KeyState = "releasing"
	// KeyStateHeld: the key's lane was still running a handler when the
	// rest of its chunk was done (key lanes): its unfinished and later
	// events are deferred until the lane settles.
	KeyStateHeld KeyState = "held"
	// KeyStateRetrying: an event of the key waits in the retry queue.
	KeyStateRetrying KeyState = "retrying"
	// KeyStateInFlight: the key's pending events are in the slot's open
	// batch, being handled.
	KeyStateInFlight KeyState = "in flight"
	// KeyStateFlowing: the key's events wait for their slot's next batch.
	KeyStateFlowing KeyState = "flowing"
)

// KeyQuery selects what KeyHeads, KeyShares and HotKeys read. The zero
// value means every slot and the defaults.
type KeyQuery struct {
	// Slot restricts KeyHeads to one slot; nil means every slot.
	Slot *int
	// Limit is how many keys to return; 0 means KeyLimitDefault.
	Limit int
	// Scan bounds the pending events read (KeyHeads, KeyShares) or the
	// newest events sampled (HotKeys); 0 means KeyScanDefault.
	Scan int
	// Window is HotKeys' window; 0 means HotKeyWindowDefault.
	Window time.Duration
}

func (o KeyQuery) withDefaults() KeyQuery {
	if o.Limit == 0 {
		o.Limit = KeyLimitDefault
	}
	if o.Scan == 0 {
		o.Scan = KeyScanDefault
	}
	if o.Window == 0 {
		o.Window = HotKeyWindowDefault
	}
	return o
}

// KeyHead is one key of a consumer with pending work.
type KeyHead struct {
	Slot int
	Key  KeyRef
	// State is one of the KeyState constants.
	State KeyState
	// HeadID is the ev_id of the key's oldest pending event, HeadAge its age.
	HeadID  int64
	HeadAge time.Duration
	// Pending counts the key's pending events: in the log, waiting for a
	// retry and deferred.
	Pending int64
	// Failures and Reason describe a blocked or held key's failing head.
	Failures int
	Reason   string
	// RetryAt is when the key's next retry is due (zero if none waits).
	RetryAt time.Time
	// Deferred counts the events held behind a blocked head.
	Deferred int64
	// Estimated reports that the slot's scan was cut short by the scan
	// budget: Pending is then a lower bound.
	Estimated bool
}

// KeyHeads lists the keys of consumer with the oldest pending head, oldest
// first: the first place to look for a stuck key. It reads at most q.Scan
// pending events (see KeyScanDefault) and writes nothing. It fails with
// ErrSlotNotSubscribed when the consumer has no slots.
func (c *Client) KeyHeads(ctx context.Context, queue, consumer string, q KeyQuery) ([]KeyHead, error) {
	q = q.withDefaults()
	rows, err := c.queries.KeyHeads(ctx, queue, consumer, q.Slot, q.Limit, q.Scan)
	if err != nil {
		return nil, mapError(fmt.Sprintf("reading key heads of %q on queue %q", consumer, queue), err)
	}
	out := make([]KeyHead, len(rows))
	for i, r := range rows {
		out[i] = KeyHead{Slot: r.Slot, Key: keyRefOf(r.Key), State: KeyState(r.State), HeadID: r.HeadEvID, HeadAge: r.HeadAge,
			Pending: r.Pending, Deferred: r.Deferred, Estimated: r.Estimated}
		if r.Failures != nil {
			out[i].Failures = *r.Failures
		}
		if r.Reason != nil {
			out[i].Reason = *r.Reason
		}
		if r.RetryAt != nil {
			out[i].RetryAt = *r.RetryAt
		}
	}
	return out, nil
}

// KeyShare is how one slot's pending events are shared between its keys.
type KeyShare struct {
	Slot int
	// Pending is the slot's pending events seen by the scan.
	Pending int64
	// TopKey holds the most of them: TopPending, a Share (0..1) of Pending.
	TopKey     KeyRef
	TopPending int64
	Share      float64
	// Keys is how many distinct keys were seen.
	Keys      int64
	Estimated bool
}

// Hot reports whether the top key holds more than share of the slot's
// pending events, on a slot with at least HotKeyMinPending of them: that
// slot goes only as fast as one key's handler.
func (s KeyShare) Hot(share float64) bool { return s.Pending >= HotKeyMinPending && s.Share > share }

// KeyShares returns, per slot of consumer, its pending events and the key
// holding most of them. Only q.Scan matters.
func (c *Client) KeyShares(ctx context.Context, queue, consumer string, q KeyQuery) ([]KeyShare, error) {
	q = q.withDefaults()
	rows, err := c.queries.KeyShares(ctx, queue, consumer, q.Scan)
	if err != nil {
		return nil, mapError(fmt.Sprintf("reading key shares of %q on queue %q", consumer, queue), err)
	}
	out := make([]KeyShare, len(rows))
	for i, r := range rows {
		out[i] = KeyShare{Slot: r.Slot, Pending: r.Pending, TopKey: keyRefOf(r.TopKey), TopPending: r.TopPending,
			Share: r.Share, Keys: r.Keys, Estimated: r.Estimated}
	}
	return out, nil
}

// HotKey is one key's production rate over a recent window.
type HotKey struct {
	Key    KeyRef
	Events int64
	// Rate is events per second over Span.
	Rate float64
	// Share is the key's part (0..1) of all new events in the window.
	Share float64
	// Span is the window measured: the requested one, or shorter when the
	// sample did not reach back that far (Estimated).
	Span      time.Duration
	Estimated bool
}

// HotKeys returns the keys that produced the most events in the last
// q.Window, busiest first, from a sample of at most q.Scan of the newest
// events. Retried copies are not counted.
func (c *Client) HotKeys(ctx context.Context, queue string, q KeyQuery) ([]HotKey, error) {
	q = q.withDefaults()
	rows, err := c.queries.HotKeys(ctx, queue, q.Window, q.Limit, q.Scan)
	if err != nil {
		return nil, mapError(fmt.Sprintf("reading hot keys of queue %q", queue), err)
	}
	out := make([]HotKey, len(rows))
	for i, r := range rows {
		out[i] = HotKey{Key: keyRefOf(r.Key), Events: r.Events, Rate: r.Rate, Share: r.Share, Span: r.Span,
			Estimated: r.Estimated}
	}
	return out, nil
}

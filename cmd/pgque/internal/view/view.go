// Package view holds the rows the pgque command prints and serves: the
// library's status, key and dead-letter types in the shape of the JSON the
// commands have always printed (snake_case, seconds as numbers, NULL as
// null). The CLI and the web console share them, so both speak the same
// JSON.
package view

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/pgque/pgque"
)

// The rows the CLI prints: the library's status and dead-letter types in
// the shape of the JSON the commands have always printed (snake_case,
// seconds as numbers, NULL as null).

// QueueInfo is one queue as queue list, status and ticker print it.
type QueueInfo struct {
	Name             string   `json:"queue"`
	EvPerSec         *float64 `json:"ev_per_sec"`
	Unticked         int64    `json:"unticked"`
	TickerLagSeconds float64  `json:"ticker_lag_seconds"`
	RetryPending     int64    `json:"retry_pending"`
	DeadLetters      int64    `json:"dead_letters"`
	LastTickID       int64    `json:"last_tick_id"`
	Tables           int      `json:"tables"`
	CurrentTable     int      `json:"current_table"`
	// SinceRotation is how long ago the queue last switched tables.
	SinceRotation float64     `json:"since_rotation_seconds"`
	Config        QueueConfig `json:"config"`
}

// QueueConfig holds a queue's settings, in set_queue_config's terms.
type QueueConfig struct {
	TickerMaxCount   int    `json:"ticker_max_count"`
	TickerMaxLag     string `json:"ticker_max_lag"`
	TickerIdlePeriod string `json:"ticker_idle_period"`
	RotationPeriod   string `json:"rotation_period"`
	MaxRetries       int    `json:"max_retries"`
	// DedupWindow is the api layer's dedup_window; filled by queue config.
	DedupWindow string `json:"dedup_window,omitempty"`
	// RotationSeconds and IdleSeconds are RotationPeriod and
	// TickerIdlePeriod in seconds, for the status checks.
	RotationSeconds, IdleSeconds float64 `json:"-"`
}

func QueueInfoOf(q pgque.QueueStatus) QueueInfo {
	c := q.Config
	return QueueInfo{
		Name: q.Name, EvPerSec: q.EventsPerSecond, Unticked: q.Unticked, TickerLagSeconds: q.TickerLag.Seconds(),
		RetryPending: q.RetryPending, DeadLetters: q.DeadLetters, LastTickID: q.LastTickID,
		Tables: q.Tables, CurrentTable: q.CurrentTable, SinceRotation: q.SinceRotation.Seconds(),
		Config: QueueConfig{
			TickerMaxCount: c.TickerMaxCount, TickerMaxLag: FmtInterval(c.TickerMaxLag),
			TickerIdlePeriod: FmtInterval(c.TickerIdlePeriod), RotationPeriod: FmtInterval(c.RotationPeriod),
			MaxRetries: c.MaxRetries, RotationSeconds: c.RotationPeriod.Seconds(), IdleSeconds: c.TickerIdlePeriod.Seconds(),
		},
	}
}

// FmtInterval renders d the way PostgreSQL prints an interval of hours,
// minutes and seconds ("02:00:00", "00:00:00.01").
func FmtInterval(d time.Duration) string {
	neg := ""
	if d < 0 {
		neg, d = "-", -d
	}
	h, m := d/time.Hour, (d%time.Hour)/time.Minute
	sec, frac := (d%time.Minute)/time.Second, (d%time.Second)/time.Microsecond
	out := fmt.Sprintf("%s%02d:%02d:%02d", neg, h, m, sec)
	if frac > 0 {
		f := fmt.Sprintf("%06d", frac)
		for f[len(f)-1] == '0' {
			f = f[:len(f)-1]
		}
		out += "." + f
	}
	return out
}

// ConsumerInfo is one subscription as status prints it.
type ConsumerInfo struct {
	Queue    string `json:"queue"`
	Consumer string `json:"consumer"`
	// LagSeconds is the age of the subscription's cursor.
	LagSeconds float64 `json:"lag_seconds"`
	// LastSeenSeconds is how long ago it last opened or finished a batch.
	LastSeenSeconds float64 `json:"last_seen_seconds"`
	Pending         int64   `json:"pending"`
	RetryPending    int64   `json:"retry_pending"`
	OpenBatch       *int64  `json:"open_batch"`
	// Warnings are filled in by status.
	Warnings []string `json:"warnings"`
}

func ConsumerInfoOf(c pgque.ConsumerStatus) ConsumerInfo {
	return ConsumerInfo{Queue: c.Queue, Consumer: c.Consumer, LagSeconds: c.Lag.Seconds(), LastSeenSeconds: c.LastSeen.Seconds(),
		Pending: c.Pending, RetryPending: c.RetryPending, OpenBatch: c.OpenBatch}
}

// SlotRow is one slot as status and slots status print it.
type SlotRow struct {
	Queue    string `json:"queue"`
	Consumer string `json:"consumer"`
	Slot     int    `json:"slot"`
	NSlots   int    `json:"nslots"`
	// Owner is the live lease holder, nil when the lease expired or was
	// released.
	Owner      *string    `json:"owner"`
	LeaseUntil *time.Time `json:"lease_until"`
	Epoch      int64      `json:"epoch"`
	Lag        int64      `json:"lag"`
	// Lag counts the events held back by blocked keys too, and
	// OldestPendingSeconds is the age of the oldest pending event, held
	// ones included.
	OldestPendingSeconds float64 `json:"oldest_pending_seconds"`
	// BlockedKeys is how many keys the pause policy blocks on the slot,
	// and HeldBack how many of Lag's events wait behind the slot's cursor
	// for a failed or held head (retrying or deferred).
	BlockedKeys int    `json:"blocked_keys"`
	HeldBack    int64  `json:"held_back"`
	Policy      string `json:"policy"`
	OpenBatch   *int64 `json:"open_batch"`
	// LastActiveSeconds is how long ago the slot last opened or finished a
	// batch.
	LastActiveSeconds float64 `json:"last_active_seconds"`
	// HeldKeys, HeldEvents and OldestHoldSeconds describe the keys held
	// while their lanes run on (key_block state inflight): how many, the
	// events deferred for them, the age of the oldest hold. Filled in by
	// status.
	HeldKeys          int     `json:"held_keys"`
	HeldEvents        int64   `json:"held_events"`
	OldestHoldSeconds float64 `json:"oldest_hold_seconds"`
	// Warnings are filled in by status and slots status.
	Warnings []string `json:"warnings"`
}

func SlotRowsOf(slots []pgque.SlotStatus) []SlotRow {
	out := make([]SlotRow, len(slots))
	for i, s := range slots {
		out[i] = SlotRow{Queue: s.Queue, Consumer: s.Consumer, Slot: s.Slot, NSlots: s.NSlots, Owner: NilIfEmpty(s.Owner),
			Epoch: s.Epoch, Lag: s.Lag, OldestPendingSeconds: s.OldestPending.Seconds(), Policy: s.Policy.String(),
			OpenBatch: s.OpenBatch, LastActiveSeconds: s.LastActive.Seconds(), BlockedKeys: s.BlockedKeys,
			HeldBack: s.Held + s.Retrying}
		if !s.LeaseUntil.IsZero() {
			t := s.LeaseUntil
			out[i].LeaseUntil = &t
		}
	}
	return out
}

// BlockedKey is one key held by the pause policy.
type BlockedKey struct {
	Queue    string `json:"queue"`
	Consumer string `json:"consumer"`
	Slot     int    `json:"slot"`
	// Key is nil for the NULL key.
	Key      *string   `json:"key"`
	State    string    `json:"state"`
	HeadEvID int64     `json:"head_ev_id"`
	Since    time.Time `json:"since"`
	Failures int       `json:"failures"`
	Reason   *string   `json:"reason"`
	Deferred int64     `json:"deferred"`
}

func BlockedKeysOf(keys []pgque.BlockedKey) []BlockedKey {
	out := make([]BlockedKey, len(keys))
	for i, k := range keys {
		out[i] = BlockedKey{Queue: k.Queue, Consumer: k.Consumer, Slot: k.Slot, Key: KeyArgOf(k.Key), State: string(k.State),
			HeadEvID: k.HeadID, Since: k.Since, Failures: k.Failures, Reason: NilIfEmpty(k.Reason), Deferred: k.Deferred}
	}
	return out
}

// DeadLetter is one dead letter as dlq list prints it. Consumer is the
// consumer as subscribed (the name --consumer takes), Slot its slot (nil
// for a plain consumer), Subscription the subscription that holds it
// ("<consumer>#<slot>/<slots>" for a slot).
type DeadLetter struct {
	ID           int64     `json:"dl_id"`
	Consumer     string    `json:"consumer"`
	Slot         *int      `json:"slot"`
	Subscription string    `json:"subscription"`
	DeadSince    time.Time `json:"dead_since"`
	Reason       *string   `json:"reason"`
	EvID         int64     `json:"ev_id"`
	EvTime       time.Time `json:"ev_time"`
	RetryCount   int       `json:"retry_count"`
	Type         *string   `json:"type"`
	// Payload is the event's payload as JSON; a payload that is not JSON
	// (sent as text through send's text overload) is null here and
	// PayloadText holds it.
	Payload     json.RawMessage `json:"payload"`
	PayloadText *string         `json:"payload_text,omitempty"`
	Key         *string         `json:"partition_key"`
}

// PayloadString is the payload as stored, for printing.
func (d DeadLetter) PayloadString() string {
	if d.PayloadText != nil {
		return *d.PayloadText
	}
	if d.Payload == nil {
		return ""
	}
	return string(d.Payload)
}

func DeadLettersOf(dls []pgque.DeadLetterEntry) []DeadLetter {
	out := make([]DeadLetter, len(dls))
	for i, d := range dls {
		out[i] = DeadLetter{ID: d.ID, Consumer: d.Consumer, Subscription: d.Subscription, DeadSince: d.DeadSince,
			Reason: NilIfEmpty(d.Reason), EvID: d.EventID, EvTime: d.EventTime, RetryCount: d.RetryCount,
			Type: NilIfEmpty(d.Type), Key: KeyArgOf(d.Key)}
		if d.Slot >= 0 {
			slot := d.Slot
			out[i].Slot = &slot
		}
		switch {
		case d.Payload == nil:
		case json.Valid(d.Payload):
			out[i].Payload = d.Payload
		default:
			p := string(d.Payload)
			out[i].PayloadText = &p
		}
	}
	return out
}

// NilIfEmpty maps "" to nil (JSON null).
func NilIfEmpty(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// KeyArgOf returns k as the CLI prints it: nil for the NULL key.
func KeyArgOf(k pgque.KeyRef) *string {
	if v, ok := k.Value(); ok {
		return &v
	}
	return nil
}

// KeyRefOf is the reverse of KeyArgOf.
func KeyRefOf(k *string) pgque.KeyRef {
	if k == nil {
		return pgque.KeyRef{}
	}
	return pgque.KeyOf(*k)
}

// AddHold counts a key held while its lane runs (state inflight, since
// since, deferred events behind it) on the row of its slot, if slots has it,
// and returns the hold's age in seconds.
func AddHold(slots []SlotRow, queue, consumer string, slot int, since time.Time, deferred int64, now time.Time) float64 {
	age := now.Sub(since).Seconds()
	for i := range slots {
		if s := &slots[i]; s.Queue == queue && s.Consumer == consumer && s.Slot == slot {
			s.HeldKeys++
			s.HeldEvents += deferred
			s.OldestHoldSeconds = max(s.OldestHoldSeconds, age)
			break
		}
	}
	return age
}

// Blocker is one thing holding back a table rotation or a flip of the tick
// and state partitions (rotation_blockers()), as status and the console
// show it.
type Blocker struct {
	Queue *string `json:"queue"`
	Kind  string  `json:"kind"`
	What  string  `json:"what"`
	// Since is when it began; null when the server could not tell.
	Since *time.Time `json:"since"`
	// PID, Role and Holds name a session (null otherwise).
	PID   *int    `json:"pid"`
	Role  *string `json:"role"`
	Holds *string `json:"holds"`
}

// Blockers reads what holds back rotations and flips. Only an admin may:
// for another role it returns nil, false, and status simply goes without.
func Blockers(ctx context.Context, c *pgque.Client) ([]Blocker, bool, error) {
	bs, err := c.RotationBlockers(ctx)
	if errors.Is(err, pgque.ErrPermissionDenied) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	out := make([]Blocker, len(bs))
	for i, b := range bs {
		out[i] = Blocker{Queue: NilIfEmpty(b.Queue), Kind: b.Kind, What: b.What, Role: NilIfEmpty(b.Role), Holds: NilIfEmpty(b.Holds)}
		if !b.Since.IsZero() {
			out[i].Since = &b.Since
		}
		if b.PID != 0 {
			out[i].PID = &b.PID
		}
	}
	return out, true, nil
}

// Describe says in one line what holds what back and what to do about it.
func (b Blocker) Describe(now time.Time) string {
	subject := "the tick/state flips"
	if b.Queue != nil {
		subject = "rotation of queue " + *b.Queue
	}
	age := ""
	if b.Since != nil {
		age = fmt.Sprintf(" for %s", now.Sub(*b.Since).Round(time.Second))
	}
	switch b.Kind {
	case pgque.BlockerSubscription:
		return fmt.Sprintf("%s held back by subscription %s (cursor behind%s): let it consume or unsubscribe it", subject, b.What, age)
	case pgque.BlockerRetention:
		return fmt.Sprintf("%s waits for retention: %s", subject, b.What)
	}
	holds := ""
	if b.Holds != nil {
		holds = ", holding " + *b.Holds
	}
	return fmt.Sprintf("%s held back by a session%s (%s%s): end it with pg_terminate_backend", subject, age, b.What, holds)
}

// ReplayWarning is what a replay's report says about its key's order: ""
// when the replay came before every later event of its key the consumer
// had, a warning otherwise. The CLI prints it and the console shows it.
func ReplayWarning(r pgque.ReplayReport) string {
	switch {
	case r.LaterDelivered > 0:
		return fmt.Sprintf("event %d (key %s) comes back to %s after %d later event(s) of its key it already had: "+
			"it will be handled out of the key's order", r.EventID, r.Key, r.Subscription, r.LaterDelivered)
	case !r.HistoryComplete:
		return fmt.Sprintf("event %d (key %s) comes back to %s, which may already have had later events of its key: "+
			"the queue no longer holds events that old to tell", r.EventID, r.Key, r.Subscription)
	}
	return ""
}

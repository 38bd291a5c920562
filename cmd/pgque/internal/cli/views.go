package cli

import (
	"context"
	"fmt"
	"time"

	"github.com/pgque/pgque"
)

// The rows the CLI prints: the library's status and dead-letter types in
// the shape of the JSON the commands have always printed (snake_case,
// seconds as numbers, NULL as null).

// queueInfo is one queue as queue list, status and ticker print it.
type queueInfo struct {
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
	Config        queueConfig `json:"config"`
}

// queueConfig holds a queue's settings, in set_queue_config's terms.
type queueConfig struct {
	TickerMaxCount   int    `json:"ticker_max_count"`
	TickerMaxLag     string `json:"ticker_max_lag"`
	TickerIdlePeriod string `json:"ticker_idle_period"`
	RotationPeriod   string `json:"rotation_period"`
	MaxRetries       int    `json:"max_retries"`
	// rotationSeconds and idleSeconds are RotationPeriod and
	// TickerIdlePeriod in seconds, for the status checks.
	rotationSeconds, idleSeconds float64
}

func queueInfoOf(q pgque.QueueStatus) queueInfo {
	c := q.Config
	return queueInfo{
		Name: q.Name, EvPerSec: q.EventsPerSecond, Unticked: q.Unticked, TickerLagSeconds: q.TickerLag.Seconds(),
		RetryPending: q.RetryPending, DeadLetters: q.DeadLetters, LastTickID: q.LastTickID,
		Tables: q.Tables, CurrentTable: q.CurrentTable, SinceRotation: q.SinceRotation.Seconds(),
		Config: queueConfig{
			TickerMaxCount: c.TickerMaxCount, TickerMaxLag: fmtInterval(c.TickerMaxLag),
			TickerIdlePeriod: fmtInterval(c.TickerIdlePeriod), RotationPeriod: fmtInterval(c.RotationPeriod),
			MaxRetries: c.MaxRetries, rotationSeconds: c.RotationPeriod.Seconds(), idleSeconds: c.TickerIdlePeriod.Seconds(),
		},
	}
}

// queueInfos reads queue, or every queue for "".
func (s *session) queueInfos(ctx context.Context, queue string) ([]queueInfo, error) {
	qs, err := s.Queues(ctx, queue)
	if err != nil {
		return nil, err
	}
	out := make([]queueInfo, len(qs))
	for i, q := range qs {
		out[i] = queueInfoOf(q)
	}
	return out, nil
}

// consumerInfos reads the subscriptions of queue, or of every queue for "".
func (s *session) consumerInfos(ctx context.Context, queue string) ([]consumerInfo, error) {
	cs, err := s.Consumers(ctx, queue)
	if err != nil {
		return nil, err
	}
	out := make([]consumerInfo, len(cs))
	for i, c := range cs {
		out[i] = consumerInfoOf(c)
	}
	return out, nil
}

// slotRows reads the slots of consumer on queue ("" matches every one).
func (s *session) slotRows(ctx context.Context, queue, consumer string) ([]slotRow, error) {
	slots, err := s.Slots(ctx, queue, consumer)
	if err != nil {
		return nil, err
	}
	return slotRowsOf(slots), nil
}

// blockedKeys reads the blocked keys of consumer ("" for every consumer).
func (s *session) blockedKeys(ctx context.Context, queue, consumer string) ([]blockedKey, error) {
	keys, err := s.BlockedKeys(ctx, queue, consumer)
	if err != nil {
		return nil, err
	}
	return blockedKeysOf(keys), nil
}

// deadLetters lists up to max dead letters of queue (of consumer when set).
func (s *session) deadLetters(ctx context.Context, queue, consumer string, max int) ([]deadLetter, error) {
	if max == 0 {
		return nil, nil
	}
	dls, err := s.DeadLetters(ctx, queue, &pgque.DeadLetterFilter{Consumer: consumer, Limit: max})
	if err != nil {
		return nil, err
	}
	return deadLettersOf(dls), nil
}

// fmtInterval renders d the way PostgreSQL prints an interval of hours,
// minutes and seconds ("02:00:00", "00:00:00.01").
func fmtInterval(d time.Duration) string {
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

// consumerInfo is one subscription as status prints it.
type consumerInfo struct {
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

func consumerInfoOf(c pgque.ConsumerStatus) consumerInfo {
	return consumerInfo{Queue: c.Queue, Consumer: c.Consumer, LagSeconds: c.Lag.Seconds(), LastSeenSeconds: c.LastSeen.Seconds(),
		Pending: c.Pending, RetryPending: c.RetryPending, OpenBatch: c.OpenBatch}
}

// slotRow is one slot as status and slots status print it.
type slotRow struct {
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
	// OldestPendingSeconds is the age of the oldest pending event.
	OldestPendingSeconds float64 `json:"oldest_pending_seconds"`
	Policy               string  `json:"policy"`
	OpenBatch            *int64  `json:"open_batch"`
	// LastActiveSeconds is how long ago the slot last opened or finished a
	// batch.
	LastActiveSeconds float64 `json:"last_active_seconds"`
	// Warnings are filled in by status and slots status.
	Warnings []string `json:"warnings"`
}

func slotRowsOf(slots []pgque.SlotStatus) []slotRow {
	out := make([]slotRow, len(slots))
	for i, s := range slots {
		out[i] = slotRow{Queue: s.Queue, Consumer: s.Consumer, Slot: s.Slot, NSlots: s.NSlots, Owner: nilIfEmpty(s.Owner),
			Epoch: s.Epoch, Lag: s.Lag, OldestPendingSeconds: s.OldestPending.Seconds(), Policy: s.Policy.String(),
			OpenBatch: s.OpenBatch, LastActiveSeconds: s.LastActive.Seconds()}
		if !s.LeaseUntil.IsZero() {
			t := s.LeaseUntil
			out[i].LeaseUntil = &t
		}
	}
	return out
}

// blockedKey is one key held by the pause policy.
type blockedKey struct {
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

func blockedKeysOf(keys []pgque.BlockedKey) []blockedKey {
	out := make([]blockedKey, len(keys))
	for i, k := range keys {
		out[i] = blockedKey{Queue: k.Queue, Consumer: k.Consumer, Slot: k.Slot, Key: keyArgOf(k.Key), State: k.State,
			HeadEvID: k.HeadID, Since: k.Since, Failures: k.Failures, Reason: nilIfEmpty(k.Reason), Deferred: k.Deferred}
	}
	return out
}

// deadLetter is one dead letter as dlq list prints it.
type deadLetter struct {
	ID         int64     `json:"dl_id"`
	Consumer   string    `json:"consumer"`
	DeadSince  time.Time `json:"dead_since"`
	Reason     *string   `json:"reason"`
	EvID       int64     `json:"ev_id"`
	EvTime     time.Time `json:"ev_time"`
	RetryCount int       `json:"retry_count"`
	Type       *string   `json:"type"`
	Payload    *string   `json:"payload"`
	Key        *string   `json:"partition_key"`
}

func deadLettersOf(dls []pgque.DeadLetterEntry) []deadLetter {
	out := make([]deadLetter, len(dls))
	for i, d := range dls {
		out[i] = deadLetter{ID: d.ID, Consumer: d.Consumer, DeadSince: d.DeadSince, Reason: nilIfEmpty(d.Reason),
			EvID: d.EventID, EvTime: d.EventTime, RetryCount: d.RetryCount, Type: nilIfEmpty(d.Type), Key: keyArgOf(d.Key)}
		if d.Payload != nil {
			p := string(d.Payload)
			out[i].Payload = &p
		}
	}
	return out
}

// nilIfEmpty maps "" to nil (JSON null).
func nilIfEmpty(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// keyArgOf returns k as the CLI prints it: nil for the NULL key.
func keyArgOf(k pgque.KeyRef) *string {
	if v, ok := k.Value(); ok {
		return &v
	}
	return nil
}

// keyRefOf is the reverse of keyArgOf.
func keyRefOf(k *string) pgque.KeyRef {
	if k == nil {
		return pgque.KeyRef{}
	}
	return pgque.KeyOf(*k)
}

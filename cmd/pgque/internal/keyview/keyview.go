// Package keyview gathers the per-key picture of a consumer (oldest heads,
// hot keys, hot-key warnings) into one JSON-friendly report, shared by
// 'pgque keys' and the web console so that both say the same thing.
package keyview

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/pgque/pgque"
)

// Options select what Collect reads.
type Options struct {
	pgque.KeyQuery
	// HotShare is the share of a slot's pending events above which its top
	// key is reported as hot; 0 means pgque.HotKeyShareDefault.
	HotShare float64
}

// Head is one key with pending work, as JSON.
type Head struct {
	Slot int `json:"slot"`
	// Key is null for the NULL key.
	Key        *string    `json:"key"`
	State      string     `json:"state"`
	HeadID     int64      `json:"head_ev_id"`
	HeadAgeSec float64    `json:"head_age_seconds"`
	Pending    int64      `json:"pending"`
	Failures   int        `json:"failures,omitempty"`
	Reason     string     `json:"reason,omitempty"`
	RetryAt    *time.Time `json:"retry_at,omitempty"`
	Deferred   int64      `json:"deferred,omitempty"`
	Estimated  bool       `json:"estimated"`
}

// Hot is one key's production rate, as JSON.
type Hot struct {
	Key       *string `json:"key"`
	Events    int64   `json:"events"`
	Rate      float64 `json:"rate_per_second"`
	Share     float64 `json:"share"`
	SpanSec   float64 `json:"span_seconds"`
	Estimated bool    `json:"estimated"`
}

// Share is how one slot's pending events split between keys, as JSON.
type Share struct {
	Slot       int     `json:"slot"`
	Pending    int64   `json:"pending"`
	TopKey     *string `json:"top_key"`
	TopPending int64   `json:"top_pending"`
	Share      float64 `json:"share"`
	Keys       int64   `json:"keys"`
	Hot        bool    `json:"hot"`
	Estimated  bool    `json:"estimated"`
}

// Report is the per-key picture of one consumer.
type Report struct {
	Queue    string   `json:"queue"`
	Consumer string   `json:"consumer"`
	Heads    []Head   `json:"heads"`
	Hot      []Hot    `json:"hot"`
	Shares   []Share  `json:"shares"`
	Warnings []string `json:"warnings"`
}

// KeyPtr returns the key as JSON carries it: nil for the NULL key.
func KeyPtr(k pgque.KeyRef) *string {
	if v, ok := k.Value(); ok {
		return &v
	}
	return nil
}

// FormatKey renders a key for a person: quoted, or (null).
func FormatKey(k *string) string {
	if k == nil {
		return "(null)"
	}
	return strconv.Quote(*k)
}

// Collect reads the oldest heads, the hottest keys and the per-slot key
// shares of consumer, and warns for every slot whose top key holds more
// than o.HotShare of its pending events.
func Collect(ctx context.Context, c *pgque.Client, queue, consumer string, o Options) (*Report, error) {
	if o.HotShare == 0 {
		o.HotShare = pgque.HotKeyShareDefault
	}
	if o.HotShare < 0 || o.HotShare > 1 {
		return nil, fmt.Errorf("hot share must be between 0 and 1, not %v", o.HotShare)
	}
	r := &Report{Queue: queue, Consumer: consumer, Heads: []Head{}, Hot: []Hot{}, Shares: []Share{}, Warnings: []string{}}
	heads, err := c.KeyHeads(ctx, queue, consumer, o.KeyQuery)
	if err != nil {
		return nil, err
	}
	for _, h := range heads {
		j := Head{Slot: h.Slot, Key: KeyPtr(h.Key), State: string(h.State), HeadID: h.HeadID, HeadAgeSec: h.HeadAge.Seconds(),
			Pending: h.Pending, Failures: h.Failures, Reason: h.Reason, Deferred: h.Deferred, Estimated: h.Estimated}
		if !h.RetryAt.IsZero() {
			t := h.RetryAt
			j.RetryAt = &t
		}
		r.Heads = append(r.Heads, j)
	}
	hot, err := c.HotKeys(ctx, queue, o.KeyQuery)
	if err != nil {
		return nil, err
	}
	for _, h := range hot {
		r.Hot = append(r.Hot, Hot{Key: KeyPtr(h.Key), Events: h.Events, Rate: h.Rate, Share: h.Share,
			SpanSec: h.Span.Seconds(), Estimated: h.Estimated})
	}
	shares, err := c.KeyShares(ctx, queue, consumer, o.KeyQuery)
	if err != nil {
		return nil, err
	}
	for _, s := range shares {
		j := Share{Slot: s.Slot, Pending: s.Pending, TopKey: KeyPtr(s.TopKey), TopPending: s.TopPending, Share: s.Share,
			Keys: s.Keys, Hot: s.Hot(o.HotShare), Estimated: s.Estimated}
		r.Shares = append(r.Shares, j)
		if j.Hot {
			r.Warnings = append(r.Warnings, fmt.Sprintf("slot %d: key %s holds %.0f%% of its %d pending events",
				s.Slot, FormatKey(j.TopKey), 100*s.Share, s.Pending))
		}
	}
	return r, nil
}

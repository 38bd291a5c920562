// Package wakeup decides when a fetch loop looks for work again: on a
// notification, or at the latest after a jittered poll interval, so that a
// lost notification costs latency but never liveness, and idle consumers
// never spin.
package wakeup

import (
	"context"
	"time"

	"github.com/pgque/pgque/internal/backoff"
)

// Waiter blocks until the next reason to fetch.
type Waiter struct {
	// Notify delivers wake-up signals (the payload is ignored); nil means
	// poll only.
	Notify <-chan string
	// Poll is the fallback interval, jittered by ±Jitter.
	Poll   time.Duration
	Jitter float64
}

// Wait returns when a signal arrives, the poll interval passes, or ctx ends
// (then it returns ctx's error).
func (w Waiter) Wait(ctx context.Context) error {
	t := time.NewTimer(backoff.Jitter(w.Poll, w.Jitter))
	defer t.Stop()
	select {
	case <-w.Notify:
		return nil
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Signal is a coalescing wake-up: any number of Fire calls before a Wait
// wake it once.
type Signal struct {
	c chan string
}

// NewSignal returns a ready Signal.
func NewSignal() *Signal { return &Signal{c: make(chan string, 1)} }

// Fire wakes the waiter without blocking.
func (s *Signal) Fire() {
	select {
	case s.c <- "":
	default:
	}
}

// C is the channel a Waiter reads.
func (s *Signal) C() <-chan string { return s.c }

// Package startstop gives every pgque service (consumer, worker pool,
// ticker) the same lifecycle: Start returns at once; Stop stops fetching new
// work, lets the work in flight finish, and blocks until the service's
// goroutines have exited; when Stop's context expires first, the work is
// abandoned (its context cancelled) and Stop still waits for the goroutines.
// Cancelling the context given to Start abandons everything at once, as a
// crash would.
package startstop

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
)

// ErrAlreadyStarted is returned by a second Start.
var ErrAlreadyStarted = errors.New("already started")

// RunFunc is a service's body. It must stop fetching new work when fetchCtx
// ends, finish and commit the work in flight, and return; it must abandon the
// work at once when workCtx ends. fetchCtx ends no later than workCtx.
type RunFunc func(fetchCtx, workCtx context.Context)

// Service runs one RunFunc once.
type Service struct {
	// Running, when set (before Start), names the work in flight for the
	// error Stop returns when abandoned work does not return.
	Running func() []string

	mu        sync.Mutex
	started   bool
	stopFetch context.CancelFunc
	stopWork  context.CancelFunc
	done      chan struct{}
	// stopping is closed by the first Stop (nil before Start).
	stopping chan struct{}
}

// Start runs run in a new goroutine with contexts derived from ctx.
func (s *Service) Start(ctx context.Context, run RunFunc) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.started {
		return ErrAlreadyStarted
	}
	s.started = true
	workCtx, stopWork := context.WithCancel(ctx)
	fetchCtx, stopFetch := context.WithCancel(workCtx)
	s.stopFetch, s.stopWork = stopFetch, stopWork
	s.done = make(chan struct{})
	s.stopping = make(chan struct{})
	go func() {
		defer close(s.done)
		defer stopWork()
		run(fetchCtx, workCtx)
	}()
	return nil
}

// Stop stops the service gracefully and waits for it. If ctx ends first, the
// work in flight is abandoned and Stop returns ctx's error once the
// goroutines are gone. Stop is idempotent and safe to call concurrently; it
// returns nil for a service that was never started.
func (s *Service) Stop(ctx context.Context) error {
	s.mu.Lock()
	if !s.started {
		s.mu.Unlock()
		return nil
	}
	done := s.done
	s.stopFetch()
	select {
	case <-s.stopping:
	default:
		close(s.stopping)
	}
	s.mu.Unlock()

	select {
	case <-done:
		return nil
	case <-ctx.Done():
		s.stopWork()
	}
	// The work was abandoned: well-behaved work returns at once. Work that
	// ignores its context (a handler stuck in a call without a context)
	// must not hold Stop forever: after AbandonWait Stop returns anyway,
	// naming what is still running; its goroutines exit when it returns.
	t := time.NewTimer(AbandonWait)
	defer t.Stop()
	select {
	case <-done:
		return ctx.Err()
	case <-t.C:
	}
	var running []string
	if s.Running != nil {
		running = s.Running()
	}
	return &StillRunningError{Err: ctx.Err(), Running: running}
}

// Stopping is closed once Stop was called and has told the service to stop
// fetching (nil before Start): tests use it to know a graceful stop is in
// flight.
func (s *Service) Stopping() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stopping
}

// AbandonWait is how long Stop waits, after its context ended and the work
// was abandoned, for the goroutines to exit before it returns a
// *StillRunningError.
const AbandonWait = time.Second

// StillRunningError is returned by Stop when its context ended and some
// work did not return within AbandonWait of being abandoned. It unwraps to
// the context's error.
type StillRunningError struct {
	Err     error
	Running []string // what is still running, as Service.Running names it
}

func (e *StillRunningError) Error() string {
	what := "work"
	if len(e.Running) > 0 {
		what = strings.Join(e.Running, "; ")
	}
	return fmt.Sprintf("%v; still running after being abandoned: %s", e.Err, what)
}

func (e *StillRunningError) Unwrap() error { return e.Err }

// Done is closed once the service's goroutine has exited (nil before Start).
func (s *Service) Done() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.done
}

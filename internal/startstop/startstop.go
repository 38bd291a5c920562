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
	"sync"
)

// ErrAlreadyStarted is returned by a second Start.
var ErrAlreadyStarted = errors.New("already started")

// RunFunc is a service's body. It must stop fetching new work when fetchCtx
// ends, finish and commit the work in flight, and return; it must abandon the
// work at once when workCtx ends. fetchCtx ends no later than workCtx.
type RunFunc func(fetchCtx, workCtx context.Context)

// Service runs one RunFunc once.
type Service struct {
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
		<-done
		return ctx.Err()
	}
}

// Stopping is closed once Stop was called and has told the service to stop
// fetching (nil before Start): tests use it to know a graceful stop is in
// flight.
func (s *Service) Stopping() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stopping
}

// Done is closed once the service's goroutine has exited (nil before Start).
func (s *Service) Done() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.done
}

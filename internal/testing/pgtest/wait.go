package pgtest

import (
	"context"
	"testing"
	"time"
)

// waitPoll is how often WaitFor checks its condition: short enough that a
// test does not wait noticeably longer than the condition takes, long
// enough that a condition which queries the database does not load it.
const waitPoll = 5 * time.Millisecond

// WaitFor checks cond until it holds and fails t, naming what it waited
// for, once timeout has passed without it. It is the one way the tests
// wait for something to happen: the timeout is a bound for a broken
// system, never the expected duration, so a slow machine makes a test
// slower but never makes it pass or fail by chance.
//
// cond runs on the test's goroutine and may call t.Fatal.
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	if !Eventually(context.Background(), timeout, cond) {
		t.Fatalf("timed out after %v waiting for %s", timeout, what)
	}
}

// Eventually checks cond until it holds (true), timeout passes or ctx ends
// (false). It is WaitFor for code that is not a test's own goroutine, such
// as a helper process or a handler, where t.Fatal may not be called.
func Eventually(ctx context.Context, timeout time.Duration, cond func() bool) bool {
	if cond() {
		return true
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(waitPoll)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return cond()
		case <-tick.C:
			if cond() {
				return true
			}
		}
	}
}

// Work takes d, as a handler doing real work would, or returns ctx's error
// when ctx ends first. It is workload, never synchronisation: a handler
// that takes time (throughput under a handler cost, a key held while its
// handler runs), a transaction a stress test holds open across ticks, the
// pace of a load generator. The duration is part of what is under test,
// not a guess at how long something else takes; a test that must know
// that a step happened waits for it with WaitFor or a signal instead.
func Work(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-timer.C:
		return nil
	}
}

// Result is what the function given to Async returned.
type Result[T any] struct {
	Value T
	Err   error
}

// Async runs f on a goroutine of its own, for a statement a test expects
// to block (on a lock another session holds), and delivers what f returned
// on the channel, which holds it until read.
func Async[T any](f func() (T, error)) <-chan Result[T] {
	c := make(chan Result[T], 1)
	go func() {
		v, err := f()
		c <- Result[T]{v, err}
	}()
	return c
}

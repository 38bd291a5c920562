package workerpool

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgque/pgque/internal/metrics"
)

// TestClaimThatUsedUpTheTTL starts slots whose claim took as long as the
// TTL or longer (claimedAt far enough back that the local expiry is due at
// once): the expiry must find the runner's lease and fence the slot, with
// no data race and no nil dereference (run with -race), and the slot's
// work must see a cancelled context.
func TestClaimThatUsedUpTheTTL(t *testing.T) {
	lost := errors.New("lease lost")
	var worked, fenced atomic.Int64
	p := New(Config{
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Metrics: metrics.New(nil),
		Queue: "q", Consumer: "c", Worker: "w", Slots: 64, MaxActive: 64,
		LeaseTTL: time.Second, ClaimInterval: time.Second, PollInterval: time.Hour,
		Work: func(fetchCtx, workCtx context.Context, lease *Lease) (bool, error) {
			worked.Add(1)
			<-workCtx.Done()
			if context.Cause(workCtx) == lost {
				fenced.Add(1)
			}
			return false, nil
		},
		IsLeaseLost:    func(err error) bool { return errors.Is(err, lost) },
		LeaseLostCause: lost,
	})
	fetchCtx, stop := context.WithCancel(context.Background())
	defer stop()
	workCtx, hardStop := context.WithCancel(context.Background())
	defer hardStop()
	for slot := range 64 {
		// The claim started a TTL (plus a little, for half the slots) ago.
		at := time.Now().Add(-time.Second - time.Duration(slot%2)*time.Millisecond)
		p.startRunner(fetchCtx, workCtx, slot, 64, 1, "", at, 0)
	}
	done := make(chan struct{})
	go func() { p.runners.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatalf("slots whose lease had run out were not fenced: %d worked, %d fenced", worked.Load(), fenced.Load())
	}
	if n := fenced.Load(); n != worked.Load() {
		t.Fatalf("%d slots worked but %d saw the lease-lost cause", worked.Load(), n)
	}
	if len(p.Owned()) != 0 {
		t.Fatalf("fenced slots still registered: %v", p.Owned())
	}
}

// TestLeaseOfEndedSessionGivenUp: a slot whose lease is bound to a LISTEN
// session that ended, and that no renewal binds to another, is fenced
// TTL/sessionCapDiv after the end, long before the lease's TTL; one bound
// to no session is not.
func TestLeaseOfEndedSessionGivenUp(t *testing.T) {
	lost := errors.New("lease lost")
	fenced := make(chan int, 2)
	const ttl = 8 * time.Second
	p := New(Config{
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Metrics: metrics.New(nil),
		Queue: "q", Consumer: "c", Worker: "w", Slots: 2, MaxActive: 2,
		LeaseTTL: ttl, ClaimInterval: time.Second, PollInterval: time.Hour,
		Work: func(fetchCtx, workCtx context.Context, lease *Lease) (bool, error) {
			<-workCtx.Done()
			if context.Cause(workCtx) == lost {
				fenced <- lease.Slot
			}
			return false, nil
		},
		IsLeaseLost:    func(err error) bool { return errors.Is(err, lost) },
		LeaseLostCause: lost,
	})
	fetchCtx, stop := context.WithCancel(context.Background())
	workCtx, hardStop := context.WithCancel(context.Background())
	defer func() { hardStop(); stop(); p.runners.Wait() }()
	start := time.Now()
	p.startRunner(fetchCtx, workCtx, 0, 2, 1, "", start, 4242) // bound to a session this pool does not have
	p.startRunner(fetchCtx, workCtx, 1, 2, 1, "", start, 0)    // unbound
	select {
	case slot := <-fenced:
		if slot != 0 {
			t.Fatalf("slot %d was fenced, want the bound slot 0", slot)
		}
		if el := time.Since(start); el > ttl/2 {
			t.Fatalf("the bound slot was fenced after %v, want about %v", el, ttl/sessionCapDiv)
		}
	case <-time.After(ttl / 2):
		t.Fatal("the slot bound to an ended session was not given up")
	}
	// The fenced runner unregisters once its Work call has returned.
	deadline := time.Now().Add(10 * time.Second)
	for got := p.Owned(); len(got) != 1 || got[0] != 1; got = p.Owned() {
		if time.Now().After(deadline) {
			t.Fatalf("owned after the fence: %v, want the unbound slot 1", got)
		}
		time.Sleep(time.Millisecond)
	}
}

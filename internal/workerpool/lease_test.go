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
		p.startRunner(fetchCtx, workCtx, slot, 64, 1, "", at)
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

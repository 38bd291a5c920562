package workerpool

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/pgque/pgque/internal/backoff"
	"github.com/pgque/pgque/internal/dbq"
	"github.com/pgque/pgque/internal/wakeup"
)

// runner is the goroutine that works one claimed slot: chunk after chunk,
// strictly one at a time, which is what keeps per-key order.
type runner struct {
	lease *Lease
	// workCtx ends when the slot is fenced or the pool hard-stops.
	workCtx context.Context
	cancel  context.CancelCauseFunc
	// fetchCtx additionally ends when the pool stops fetching.
	fetchCtx    context.Context
	stopFetch   func() bool
	fetchCancel context.CancelFunc
	wake        *wakeup.Signal
	// release asks the runner to give the slot up at the next chunk boundary.
	release atomic.Bool
	// givenUp is set once the watchdog gave the slot up (stall.go).
	givenUp atomic.Bool
}

// startRunner registers and starts the goroutine for a freshly claimed slot.
func (p *Pool) startRunner(fetchCtx, workCtx context.Context, slot, nslots int, epoch int64, token dbq.LeaseToken, claimedAt time.Time, session int32) {
	r := &runner{wake: wakeup.NewSignal()}
	r.workCtx, r.cancel = context.WithCancelCause(workCtx)
	r.fetchCtx, r.fetchCancel = context.WithCancel(r.workCtx)
	r.lease = newLease(slot, epoch, token, p.cfg.LeaseTTL, claimedAt)
	// A graceful stop gives the slot up: its lanes hand back what they
	// have not started (Lease.GivingUp).
	r.stopFetch = context.AfterFunc(fetchCtx, func() {
		r.lease.giveUp()
		p.log().Debug("pgque: stopping: the slot hands back what it has not started", slog.Int("slot", slot))
		r.fetchCancel()
	})
	r.lease.NSlots = nslots
	r.lease.arm(func() { p.fence(r, r.lease.expiryReason()) }) // after r.lease is set: it may fire at once

	p.mu.Lock()
	p.running[slot] = r
	p.mu.Unlock()
	p.bound(r, session) // once sessionEnded can find r
	if p.cfg.OnSlot != nil {
		p.cfg.OnSlot(slot, nslots, epoch, false, false)
	}
	p.runners.Add(1)
	go p.run(r)
}

// run is the slot goroutine.
func (p *Pool) run(r *runner) {
	defer p.runners.Done()
	defer p.exited(r)
	defer p.drain(r)
	log := p.log().With(slog.Int("slot", r.lease.Slot), slog.Int("nslots", r.lease.NSlots), slog.Int64("epoch", r.lease.Epoch))
	log.DebugContext(r.workCtx, "pgque: slot claimed")
	waiter := wakeup.Waiter{Notify: r.wake.C(), Poll: p.cfg.PollInterval, Jitter: 0.2}
	for failures := 0; r.fetchCtx.Err() == nil && !r.release.Load(); {
		more, err := p.cfg.Work(r.fetchCtx, r.workCtx, r.lease)
		r.lease.Progressed()
		if r.workCtx.Err() != nil {
			return // fenced or hard stop: abandon without ack or release
		}
		if err != nil && p.cfg.IsLeaseLost(err) {
			p.fence(r, "server rejected the lease", slog.Any("error", err))
			return
		}
		if err != nil && p.slotCountChanged(r, err) {
			// A resize completed: this slot of the old N is gone, and so
			// is its lease (a lease row of the same number is the new
			// slot's): leave without releasing.
			log.InfoContext(r.workCtx, "pgque: slot count changed, leaving the slot", slog.Int("nslots", r.lease.NSlots))
			p.drain(r)
			r.lease.close()
			return
		}
		if err != nil {
			if r.fetchCtx.Err() != nil {
				if r.workCtx.Err() == nil {
					// A graceful stop whose last chunk could not be
					// settled: Stop says so.
					p.NoteStopError(err)
				}
				break
			}
			log.WarnContext(r.workCtx, "pgque: working slot", slog.Any("error", err))
			p.reportError(r.workCtx, err)
			if !backoff.Sleep(r.fetchCtx.Done(), backoff.Errors.Delay(failures)) {
				break
			}
			failures++
			continue
		}
		failures = 0
		if !more && p.idle(r, waiter) != nil {
			break
		}
	}
	p.drain(r)
	p.releaseLease(r, log)
}

// idle waits for a wake-up or the slot's poll, or for less when the last
// Work call asked to be called back sooner (Lease.CallBackWithin). Waiting
// is not being stuck: with touched sets an idle slot sleeps until its
// poll, which may be set longer than the watchdog's StallTimeout, so the
// wait counts as busy.
func (p *Pool) idle(r *runner, waiter wakeup.Waiter) error {
	done := r.lease.Busy()
	defer done()
	if d := r.lease.takeRecall(); d > 0 && d < waiter.Poll {
		waiter.Poll, waiter.Jitter = d, 0
	}
	return waiter.Wait(r.fetchCtx)
}

// drain waits for work of the lease that outlives Work calls (see
// Config.Drain). It is idempotent.
func (p *Pool) drain(r *runner) {
	if p.cfg.Drain != nil {
		p.cfg.Drain(r.workCtx, r.lease)
	}
}

// releaseLease gives the slot up at a chunk boundary so that the next owner
// can claim it at once instead of waiting for the TTL.
func (p *Pool) releaseLease(r *runner, log *slog.Logger) {
	r.lease.close()
	if r.workCtx.Err() != nil {
		return
	}
	if _, err := p.cfg.Queries.ReleaseSlot(r.workCtx, p.cfg.Queue, p.cfg.Consumer, r.lease.Slot, p.cfg.Worker, r.lease.Token); err != nil {
		if dbq.NotLeaseHolder(err) {
			// Taken over meanwhile: there is nothing left to give up.
			log.DebugContext(r.workCtx, "pgque: slot lease was not held any more at release")
			return
		}
		log.WarnContext(r.workCtx, "pgque: releasing slot", slog.Any("error", err))
		p.reportError(r.workCtx, err)
		if r.fetchCtx.Err() != nil {
			p.NoteStopError(fmt.Errorf("releasing slot %d: %w", r.lease.Slot, err))
		}
		return
	}
	log.DebugContext(r.workCtx, "pgque: slot released")
}

// exited unregisters a finished runner and asks the coordinator to look at
// the slot again.
func (p *Pool) exited(r *runner) {
	r.lease.close()
	r.stopFetch()
	r.fetchCancel()
	fenced := p.cfg.LeaseLostCause != nil && errors.Is(context.Cause(r.workCtx), p.cfg.LeaseLostCause)
	r.cancel(nil)
	if p.cfg.OnSlot != nil {
		p.cfg.OnSlot(r.lease.Slot, r.lease.NSlots, r.lease.Epoch, true, fenced)
	}
	p.mu.Lock()
	if p.running[r.lease.Slot] == r {
		delete(p.running, r.lease.Slot)
	}
	p.mu.Unlock()
	p.trigger.Fire()
}

package workerpool

import (
	"context"
	"log/slog"
	"strconv"
	"time"

	"github.com/pgque/pgque/internal/backoff"
	"github.com/pgque/pgque/internal/dbq"
)

// Stalled slots. A slot that is subscribed but not consumed pins rotation
// for its whole queue, so two things bound how long that can last while a
// pool is alive:
//
//   - The watchdog. The keeper renews the leases of slots whose loop is in a
//     long handler or between polls, so a loop stuck elsewhere (a database
//     call that never returns, a lock wait) would keep its lease forever.
//     A slot's loop shows progress at every receive, ack and return from
//     Work, and while it waits for its handlers or for work (a wake-up,
//     its poll) it is busy (Lease.Busy): handlers are user code, bounded
//     by the handler timeout, and an idle slot may sleep a poll interval
//     longer than StallTimeout. A slot that
//     is neither busy nor progressing for StallTimeout (default twice the
//     lease TTL and at least a minute: a database call may legitimately
//     wait seconds on a lock, during an upgrade for one, and giving a slot
//     up redelivers its chunk) is given up: its lease is released on the
//     server (so that any
//     worker claims it at once, with a new epoch that fences whatever the
//     stuck loop still tries), its work is cancelled, and this process
//     holds off claiming it for two claim passes, so that a healthier peer
//     can take it.
//   - The stall check. Every StallCheckInterval the pool reads
//     partition_slot_stalls (a few index probes per slot): a slot behind
//     and unmoved for twice its lease TTL is stalled. The pool sets the
//     slot_stalled_seconds gauge, logs a warning naming the slot, how long
//     and why, once when it turns stalled and again when it recovers, and
//     runs a claim pass at once: a stalled slot with no live owner is
//     claimed by the next pass of any pool with room for it.

// stallTimeoutMin is the least default StallTimeout.
const stallTimeoutMin = time.Minute

// stallTimeout is Config.StallTimeout with its default.
func (p *Pool) stallTimeout() time.Duration {
	if p.cfg.StallTimeout > 0 {
		return p.cfg.StallTimeout
	}
	return max(2*p.cfg.LeaseTTL, stallTimeoutMin)
}

// stallCheckInterval is Config.StallCheckInterval with its default; 0
// disables the check.
func (p *Pool) stallCheckInterval() time.Duration {
	switch {
	case p.cfg.StallCheckInterval < 0 || p.cfg.Queries == nil:
		return 0
	case p.cfg.StallCheckInterval == 0:
		return 10 * p.cfg.ClaimInterval
	default:
		return p.cfg.StallCheckInterval
	}
}

// stuck reports whether the watchdog should give r's slot up.
func (p *Pool) stuck(r *runner, now time.Time) bool {
	return r.workCtx.Err() == nil && !r.givenUp.Load() && r.lease.stuckFor(now) > p.stallTimeout()
}

// giveUp releases a stuck slot on the server and then fences its runner.
// Releasing first matters: the runner stays registered until it exits, so
// this process cannot claim the slot again before the release landed.
func (p *Pool) giveUp(ctx context.Context, r *runner, now time.Time) {
	if !r.givenUp.CompareAndSwap(false, true) {
		return
	}
	l := r.lease
	stuck := l.stuckFor(now)
	// Counted before the warning, so that whoever sees the warning sees
	// the count too.
	p.cfg.Metrics.SlotGivenUp.WithLabelValues(p.cfg.Queue, p.cfg.Consumer).Inc()
	p.log().WarnContext(ctx, "pgque: slot made no progress outside its handlers; giving it up so that another worker takes it over",
		slog.Int("slot", l.Slot), slog.Int64("epoch", l.Epoch), slog.Duration("stuck_for", stuck))
	p.mu.Lock()
	p.holdoff[l.Slot] = now.Add(2 * p.cfg.ClaimInterval)
	p.mu.Unlock()
	rctx, cancel := context.WithTimeout(ctx, queryTimeout(p.cfg.ClaimInterval))
	defer cancel()
	// The same lock as background renewals: none may re-take the lease
	// after this release.
	l.renewMu.Lock()
	l.closed = true
	if _, err := p.cfg.Queries.ReleaseSlot(rctx, p.cfg.Queue, p.cfg.Consumer, l.Slot, p.cfg.Worker, l.Token); err != nil && ctx.Err() == nil {
		// The lease then runs out by itself, one TTL after the last renewal.
		p.log().WarnContext(ctx, "pgque: releasing a stuck slot", slog.Int("slot", l.Slot), slog.Any("error", err))
	}
	l.renewMu.Unlock()
	p.fence(r, "watchdog: no progress", slog.Duration("stuck_for", stuck))
	p.trigger.Fire()
}

// watchStalls runs the stall check every stallCheckInterval until stop is
// closed.
func (p *Pool) watchStalls(ctx context.Context, stop <-chan struct{}) {
	stalled := make(map[int]bool)
	for {
		qctx, cancel := context.WithTimeout(ctx, queryTimeout(p.cfg.ClaimInterval))
		rows, err := p.cfg.Queries.SlotStalls(qctx, p.cfg.Queue, p.cfg.Consumer)
		cancel()
		if err == nil {
			p.observeStalls(ctx, rows, stalled)
		} else if ctx.Err() == nil {
			p.log().WarnContext(ctx, "pgque: reading partition_slot_stalls", slog.Any("error", err))
		}
		if !backoff.Sleep(stop, backoff.Jitter(p.stallCheckInterval(), 0.2)) {
			return
		}
	}
}

// observeStalls publishes the stalled-slot gauge and logs transitions;
// stalled holds the slots stalled at the last check.
func (p *Pool) observeStalls(ctx context.Context, rows []dbq.SlotStall, stalled map[int]bool) {
	claim := false
	for _, s := range rows {
		var seconds float64
		if s.Stalled && s.StalledFor != nil {
			seconds = s.StalledFor.Seconds()
		}
		p.cfg.Metrics.SlotStalled.WithLabelValues(p.cfg.Queue, p.cfg.Consumer, strconv.Itoa(s.Slot)).Set(seconds)
		switch {
		case s.Stalled && !stalled[s.Slot]:
			owner := ""
			if s.Owner != nil {
				owner = *s.Owner
			}
			p.log().WarnContext(ctx, "pgque: slot stalled: it is behind and has not moved, which pins rotation of the whole queue",
				slog.Int("slot", s.Slot), slog.Duration("stalled_for", time.Duration(seconds*float64(time.Second))), slog.String("reason", s.Reason),
				slog.String("owner", owner), slog.String("action", StallAction(s.Reason)))
		case !s.Stalled && stalled[s.Slot]:
			p.log().InfoContext(ctx, "pgque: slot no longer stalled", slog.Int("slot", s.Slot))
		}
		if s.Stalled && s.Owner == nil {
			claim = true
		}
		stalled[s.Slot] = s.Stalled
	}
	if claim {
		p.trigger.Fire()
	}
}

// StallAction says what an operator does about a slot stalled for reason
// (a partition_slot_stalls reason).
func StallAction(reason string) string {
	switch reason {
	case "unclaimed", "lease expired":
		return "no live worker claims the slot: start a worker of this consumer (or raise MaxActiveSlots so that the running ones cover every slot)"
	case "not progressing":
		return "the owner renews its lease but does not consume: check that worker (a stuck handler or database call); stopping it frees the slot one lease TTL later"
	default:
		return ""
	}
}

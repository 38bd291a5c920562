package workerpool

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pgque/pgque/internal/backoff"
	"github.com/pgque/pgque/internal/dbq"
)

// Lease is this process's view of one slot lease: the epoch it was granted
// and until when the server is known to honour it. The server is the
// authority; the local view only errs on the safe side: the slot's work is
// cancelled a little before the server could consider the lease expired.
type Lease struct {
	// Slot is the slot index, 0 ≤ Slot < N.
	Slot int
	// Epoch is the fencing token the server granted with the lease.
	Epoch int64
	// Token is the lease's secret credential, presented by every call that
	// acts as the holder. It never prints (see dbq.LeaseToken).
	Token dbq.LeaseToken
	// NSlots is the consumer's N when the slot was claimed: the slot is
	// slot Slot of NSlots, and every call on it names that N.
	NSlots int

	ttl time.Duration

	// renewMu serialises background renewals against closing, so that no
	// renewal re-takes a lease after the slot released it.
	renewMu sync.Mutex
	closed  bool

	mu        sync.Mutex
	heldUntil time.Time
	// sessionCap, when set, ends the lease locally before heldUntil: the
	// LISTEN session it is bound to ended (Pool.sessionChanged).
	sessionCap time.Time
	expiry     *time.Timer

	// renewing is set while a background renewal of this lease is in
	// flight, so that the keeper never waits on it nor starts a second.
	renewing atomic.Bool

	// progressAt (unix nanoseconds) is the last sign that the slot's loop
	// moves, and busy counts the phases in which it waits for handlers:
	// the watchdog (stall.go) gives up a slot that shows neither for
	// Config.StallTimeout.
	progressAt atomic.Int64
	busy       atomic.Int32

	// recall, when set (nanoseconds), bounds the slot's next wait for work
	// (CallBackWithin).
	recall atomic.Int64

	// session is the LISTEN session's backend pid the lease is bound to on
	// the server (0: unbound; see Pool.sessionEnded).
	session atomic.Int32

	// givingUp closes when the pool gives the slot up while it is still
	// worked: a graceful stop, or a release for fair share (GivingUp).
	givingUp     chan struct{}
	givingUpOnce sync.Once
}

// GivingUp returns a channel that closes when the pool gives the slot up
// gracefully: Stop, or a release to share the consumer's slots with
// other workers. A WorkFunc hands back what it has not started (the key
// lanes hold those keys and put their events back). Not closed by a hard
// stop or a fence (nothing is settled then), nor by a resize's release.
func (l *Lease) GivingUp() <-chan struct{} { return l.givingUp }

// giveUp closes GivingUp's channel; idempotent.
func (l *Lease) giveUp() { l.givingUpOnce.Do(func() { close(l.givingUp) }) }

// CallBackWithin asks for the slot's next Work call within d even when no
// wake-up comes: a WorkFunc that returns more = false with something still
// to send (a deferred acknowledgement) says so. It bounds one wait only.
func (l *Lease) CallBackWithin(d time.Duration) { l.recall.Store(int64(d)) }

// takeRecall returns and clears what CallBackWithin asked for.
func (l *Lease) takeRecall() time.Duration { return time.Duration(l.recall.Swap(0)) }

// expiryMargin is the fraction of the TTL by which the local view expires
// before the server's: 1/20, i.e. 5%.
const expiryMargin = 20

// Keeper timing, as fractions of the TTL. After a receive or ack the lease
// is known to last TTL/2 and expires locally at 0.45·TTL; the keeper looks
// every TTL/10 and renews leases with less than 0.4·TTL left, so a renewal
// starts between 0.1·TTL and 0.2·TTL after the last receive or ack and has
// at least 0.25·TTL to land. A slot that receives more often than every
// 0.1·TTL is never renewed by the keeper: its receives are the heartbeat.
const (
	keeperTickDiv  = 10 // check every TTL/10
	keeperRenewNum = 2  // renew below 2/5 of the TTL left
	keeperRenewDen = 5
)

// newLease records a lease granted by a claim_slot call that started at
// `at`: claim_slot sets the lease to a full TTL. The local expiry is not
// armed yet: a claim that took close to the TTL leaves no time, and the
// expiry callback must not run before the caller has stored the lease
// where the callback finds it. Call arm next.
func newLease(slot int, epoch int64, token dbq.LeaseToken, ttl time.Duration, at time.Time) *Lease {
	l := &Lease{Slot: slot, Epoch: epoch, Token: token, ttl: ttl, heldUntil: at.Add(ttl), givingUp: make(chan struct{})}
	l.progressAt.Store(at.UnixNano())
	return l
}

// arm starts the local expiry: onExpire runs when the lease runs out
// without renewal (at once if it already has). Until arm, extend and close
// only move the end.
func (l *Lease) arm(onExpire func()) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.expiry == nil {
		l.expiry = time.AfterFunc(l.remaining(), onExpire)
	}
}

// remaining is how long the lease stays valid locally. Callers hold mu or
// own l exclusively.
func (l *Lease) remaining() time.Duration {
	left := time.Until(l.heldUntil) - l.ttl/expiryMargin
	if !l.sessionCap.IsZero() {
		left = min(left, time.Until(l.sessionCap))
	}
	return left
}

// expiryReason says why the local expiry fired.
func (l *Lease) expiryReason() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.sessionCap.IsZero() && l.sessionCap.Before(l.heldUntil.Add(-l.ttl/expiryMargin)) {
		return "the LISTEN session the lease is bound to ended, and no renewal bound it to another in time"
	}
	return "lease expired before renewal"
}

// capAt ends the lease locally at until at the latest, until uncap.
func (l *Lease) capAt(until time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.sessionCap = until
	if l.expiry != nil {
		l.expiry.Reset(l.remaining())
	}
}

// uncap lifts capAt's end.
func (l *Lease) uncap() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.sessionCap.IsZero() {
		return
	}
	l.sessionCap = time.Time{}
	if l.expiry != nil {
		l.expiry.Reset(l.remaining())
	}
}

// Renewed records that a receive_partitioned or ack_partitioned call that
// started at `at` succeeded. The server renews the lease on those calls
// only when less than half of the TTL is left, so such a call guarantees
// half a TTL from its start, not a full one.
func (l *Lease) Renewed(at time.Time) {
	l.Progressed()
	l.extend(at.Add(l.ttl / 2))
}

// Progressed records that the slot's loop moved (a receive, an ack, a
// handler finished). Renewed implies it.
func (l *Lease) Progressed() { l.progressAt.Store(time.Now().UnixNano()) }

// Busy marks a phase in which the slot waits for its handlers (they run
// user code, bounded by the handler timeout, not by the watchdog) or for
// work (a wake-up or its poll); the
// returned function ends the phase and counts as progress. Phases may nest
// and overlap.
func (l *Lease) Busy() (done func()) {
	l.busy.Add(1)
	var once sync.Once
	return func() {
		once.Do(func() {
			l.Progressed()
			l.busy.Add(-1)
		})
	}
}

// stuckFor is how long the slot's loop has shown no progress, 0 while it
// waits for handlers.
func (l *Lease) stuckFor(now time.Time) time.Duration {
	if l.busy.Load() > 0 {
		return 0
	}
	return now.Sub(time.Unix(0, l.progressAt.Load()))
}

// extend moves the local end of the lease forward to until.
func (l *Lease) extend(until time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if until.After(l.heldUntil) {
		l.heldUntil = until
		if l.expiry != nil {
			l.expiry.Reset(l.remaining())
		}
	}
}

// left is how long the server honours the lease from now on, as far as
// this process knows.
func (l *Lease) left() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return time.Until(l.heldUntil)
}

// close stops background renewals and the local expiry; it waits for a
// renewal in flight.
func (l *Lease) close() {
	l.renewMu.Lock()
	l.closed = true
	l.renewMu.Unlock()
	l.mu.Lock()
	if l.expiry != nil {
		l.expiry.Stop()
	}
	l.mu.Unlock()
}

// keep renews, in the background, every lease running short (see the
// keeper timing above): slots whose handler runs long, and idle slots
// between polls. Each renewal runs on its own and is bounded by the time
// left before the local expiry (at least a quarter of the TTL), and the
// keeper never waits for one: a hung renewal delays only its own slot, which its local expiry
// then fences, never the other slots' renewals.
func (p *Pool) keep(ctx context.Context, stop <-chan struct{}) {
	threshold := p.cfg.LeaseTTL * keeperRenewNum / keeperRenewDen
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		if !backoff.Sleep(stop, backoff.Jitter(p.cfg.LeaseTTL/keeperTickDiv, 0.1)) || ctx.Err() != nil {
			return
		}
		p.mu.Lock()
		due := make([]*runner, 0, len(p.running))
		now := time.Now()
		for _, r := range p.running {
			if p.stuck(r, now) {
				// Renewing would keep a stuck slot from every other worker.
				wg.Add(1)
				go func() { defer wg.Done(); p.giveUp(ctx, r, now) }()
				continue
			}
			// A lease not bound to the current session is renewed to bind
			// it: one claimed before the session was confirmed, or bound to
			// a session that was replaced.
			rebind := p.session() != 0 && r.lease.session.Load() != p.session()
			if (r.lease.left() < threshold || rebind) && r.lease.renewing.CompareAndSwap(false, true) {
				due = append(due, r)
			}
		}
		p.mu.Unlock()
		for _, r := range due {
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer r.lease.renewing.Store(false)
				// Waiting is pointless once the lease is lost locally.
				rctx, cancel := context.WithTimeout(ctx, max(r.lease.left()-p.cfg.LeaseTTL/expiryMargin, p.cfg.LeaseTTL/4))
				defer cancel()
				p.renew(rctx, r)
			}()
		}
	}
}

// renew extends one lease with claim_slot, which renews with the same epoch
// and token when this worker's token still proves the lease. Any other
// answer means the slot was lost.
func (p *Pool) renew(ctx context.Context, r *runner) {
	l := r.lease
	l.renewMu.Lock()
	defer l.renewMu.Unlock()
	if l.closed || r.workCtx.Err() != nil {
		return
	}
	at := time.Now()
	session := p.session()
	epoch, token, ok, err := p.cfg.Queries.ClaimSlotBound(ctx, p.cfg.Queue, p.cfg.Consumer, l.Slot, p.cfg.Worker, p.cfg.LeaseTTL, l.Token, session)
	switch {
	case err != nil:
		// The local expiry fences the slot if renewals keep failing.
		if ctx.Err() == nil {
			p.log().WarnContext(ctx, "pgque: renewing slot lease", slog.Int("slot", l.Slot), slog.Any("error", err))
		}
	case !ok || epoch != l.Epoch:
		p.fence(r, "lease renewal found another epoch", slog.Int64("new_epoch", epoch), slog.Bool("held_by_other", !ok))
		if ok {
			// The slot was free, so the renewal took it as a new lease that
			// this runner will not work: give it back at once rather than
			// leave it unworked until its TTL runs out.
			if _, err := p.cfg.Queries.ReleaseSlot(ctx, p.cfg.Queue, p.cfg.Consumer, l.Slot, p.cfg.Worker, token); err != nil && ctx.Err() == nil {
				p.log().WarnContext(ctx, "pgque: giving back a lease a renewal took", slog.Int("slot", l.Slot), slog.Any("error", err))
			}
		}
	default:
		l.extend(at.Add(p.cfg.LeaseTTL))
		p.cfg.Metrics.LeaseRenewals.WithLabelValues(p.cfg.Queue, p.cfg.Consumer).Inc()
		p.bound(r, session)
	}
}

// session is the pid of the LISTEN session leases are bound to: the
// notifier's confirmed session, 0 without one (see notifier.SessionPID).
func (p *Pool) session() int32 {
	if p.cfg.Notifier == nil {
		return 0
	}
	return p.cfg.Notifier.SessionPID()
}

// bound records that r's lease is bound to session on the server. A
// lease bound to the current session needs no early end; one bound to a
// session that already ended gets it now: sessionChanged, which caps the
// leases bound to an ending session, may have run before the record.
func (p *Pool) bound(r *runner, session int32) {
	r.lease.session.Store(session)
	switch {
	case session == 0:
	case p.session() == session:
		r.lease.uncap()
	default:
		r.lease.capAt(time.Now().Add(p.cfg.LeaseTTL / sessionCapDiv))
	}
}

// sessionCapDiv: a lease bound to a LISTEN session that ended is given up
// locally TTL/8 after this process saw the end, unless a renewal binds it
// to the new session first. A claim may take it over TTL/6 after the
// claim first found the session gone (claim_slot's "Dead holders"); this
// process cannot tell a broken connection from its own death as others
// see it, so its handlers must be stopped by then, as at a local expiry.
const sessionCapDiv = 8

// sessionChanged follows the LISTEN session the leases are bound to. When
// session pid ends, the leases bound to it are capped (sessionCapDiv);
// when a new one is confirmed, every lease bound to another is renewed at
// once to bind it, which lifts the cap.
func (p *Pool) sessionChanged(ctx context.Context, pid int32, up bool) {
	p.mu.Lock()
	var due []*runner
	for _, r := range p.running {
		switch {
		case !up && r.lease.session.Load() == pid:
			r.lease.capAt(time.Now().Add(p.cfg.LeaseTTL / sessionCapDiv))
		case up && r.lease.session.Load() != pid && r.lease.renewing.CompareAndSwap(false, true):
			due = append(due, r)
		}
	}
	p.mu.Unlock()
	for _, r := range due {
		go func() {
			defer r.lease.renewing.Store(false)
			rctx, cancel := context.WithTimeout(ctx, max(r.lease.left()-p.cfg.LeaseTTL/expiryMargin, p.cfg.LeaseTTL/4))
			defer cancel()
			p.renew(rctx, r)
		}()
	}
}

// fence stops a slot at once: its handler's context is cancelled with
// LeaseLostCause and nothing more is acked.
func (p *Pool) fence(r *runner, why string, attrs ...any) {
	if r.workCtx.Err() != nil {
		return
	}
	p.cfg.Metrics.LeaseFencings.WithLabelValues(p.cfg.Queue, p.cfg.Consumer).Inc()
	args := append([]any{slog.Int("slot", r.lease.Slot), slog.Int64("epoch", r.lease.Epoch), slog.String("reason", why)}, attrs...)
	p.log().WarnContext(r.workCtx, "pgque: slot fenced", args...)
	r.cancel(p.cfg.LeaseLostCause)
}

package workerpool

import (
	"context"
	"log/slog"
	"strconv"
	"time"

	"github.com/pgque/pgque/internal/backoff"
	"github.com/pgque/pgque/internal/dbq"
	"github.com/pgque/pgque/internal/wakeup"
)

// coordinate is the claim loop: one pass per jittered ClaimInterval, and an
// early pass whenever a slot goroutine exits or a peer turns hungry. It
// returns when fetchCtx ends.
func (p *Pool) coordinate(fetchCtx, workCtx context.Context) {
	waiter := wakeup.Waiter{Notify: p.trigger.C(), Poll: p.cfg.ClaimInterval, Jitter: 0.2}
	for {
		p.pass(fetchCtx, workCtx)
		if waiter.Wait(fetchCtx) != nil {
			return
		}
	}
}

// pass learns who works which slot, plans, releases, claims, and
// announces.
func (p *Pool) pass(fetchCtx, workCtx context.Context) {
	p.followResize(fetchCtx)
	nslots := p.Slots()
	now := time.Now()
	var status []dbq.SlotStatus
	if p.cfg.Notifier != nil {
		// Announcements tell who works which slot at no cost.
		status = p.presence.status(nslots, now)
	} else {
		// Without LISTEN the leases are read from the database: the
		// lease-only view, which costs the same whatever the backlog.
		var err error
		status, err = p.cfg.Queries.PartitionSlotLeases(fetchCtx, p.cfg.Queue, p.cfg.Consumer)
		if err != nil {
			if fetchCtx.Err() == nil {
				p.log().WarnContext(fetchCtx, "pgque: reading partition_slot_leases", slog.Any("error", err))
			}
			return
		}
		status = currentSlots(status, nslots)
	}

	status = p.withHeadAges(fetchCtx, status)

	in := planInput{
		self:      p.cfg.Worker,
		slots:     nslots,
		maxActive: p.maxActive(nslots),
		status:    status,
		running:   make(map[int]bool),
		peers:     p.presence.live(now),
		holdoff:   make(map[int]bool),
	}
	p.mu.Lock()
	for s, r := range p.running {
		in.running[s] = r.release.Load()
	}
	for s, until := range p.holdoff {
		if now.Before(until) {
			in.holdoff[s] = true
		} else {
			delete(p.holdoff, s)
		}
	}
	in.prevFree = p.prevFree
	p.mu.Unlock()

	pl := makePlan(in)
	p.releaseExcess(fetchCtx, pl.release, now)
	owned := len(in.running) - len(pl.release)
	for _, releasing := range in.running {
		if releasing {
			owned--
		}
	}
	owners := make(map[int]string, len(status))
	for _, s := range status {
		if s.Owner != nil {
			owners[s.Slot] = *s.Owner
		} else {
			owners[s.Slot] = p.presence.previousOwner(s.Slot)
		}
	}
	for _, slot := range pl.claim {
		if fetchCtx.Err() != nil {
			break
		}
		if p.claim(fetchCtx, workCtx, slot, nslots, owners[slot]) {
			owned++
		}
	}

	p.mu.Lock()
	p.prevFree = pl.free
	p.mu.Unlock()
	hungry := owned < pl.target
	if fetchCtx.Err() != nil {
		return // the stop announces that this pool left (leave)
	}
	// A graceful stop lets an announcement under way land, for a moment
	// (announceGrace): cancelled at once, pgx gave it up while the server,
	// not having read it yet, still recorded it, after the stop's own
	// (leave), which it then overwrote with the slots just released, and
	// the peers went on counting them this pool's until it expired. One
	// that the server holds longer (a lock on worker_presence) is
	// cancelled, and is cancelled there, as before: the stop does not wait
	// on it.
	actx, cancel := afterStop(fetchCtx, workCtx, p.announceGrace)
	defer cancel()
	p.announce(actx, hungry)
}

// announceGrace is how long a graceful stop lets a pass's announcement
// under way go on (see pass).
const announceGrace = leaveWait / 4

// afterStop returns a context that ends with workCtx, or grace after
// fetchCtx ends, whichever comes first.
func afterStop(fetchCtx, workCtx context.Context, grace time.Duration) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(workCtx)
	unwatch := context.AfterFunc(fetchCtx, func() {
		t := time.NewTimer(grace)
		defer t.Stop()
		select {
		case <-t.C:
			cancel()
		case <-ctx.Done():
		}
	})
	return ctx, func() {
		unwatch()
		cancel()
	}
}

// announce records this worker's presence in the database and learns the
// peers' from the same call, then hints the peers' pools to run a pass.
func (p *Pool) announce(ctx context.Context, hungry bool) {
	actx, cancel := context.WithTimeout(ctx, queryTimeout(p.cfg.ClaimInterval))
	defer cancel()
	peers, err := p.cfg.Queries.AnnounceWorker(actx, p.cfg.Queue, p.cfg.Consumer, p.cfg.Worker, hungry, p.Owned(), p.presence.ttl)
	if err != nil {
		if ctx.Err() == nil {
			p.log().WarnContext(ctx, "pgque: announcing worker", slog.Any("error", err))
		}
		return
	}
	if p.presence.update(peers, time.Now()) {
		p.trigger.Fire()
	}
	if p.presence.takeLeft() {
		p.mu.Lock()
		clear(p.holdoff)
		p.mu.Unlock()
	}
	if p.cfg.Notifier == nil {
		return
	}
	if err := p.cfg.Queries.Notify(actx, PresenceChannel, hintTag(p.cfg.Queue, p.cfg.Consumer)); err != nil && ctx.Err() == nil {
		p.log().WarnContext(ctx, "pgque: sending the presence hint", slog.Any("error", err))
	}
}

// leave announces, once a graceful stop has released every slot, that
// this pool left (no slots, not hungry: see left) and hints the peers, so
// that they take the released slots at once. Without it they counted this
// pool among the live ones for three claim intervals and left its slots
// unworked for one or two passes. Best effort, and bounded by leaveWait so
// that a stop while the database is unreachable does not wait on it: a
// peer that misses it forgets this pool after the presence TTL, as after a
// crash.
func (p *Pool) leave(ctx context.Context) {
	actx, cancel := context.WithTimeout(ctx, leaveWait)
	defer cancel()
	if _, err := p.cfg.Queries.AnnounceWorker(actx, p.cfg.Queue, p.cfg.Consumer, p.cfg.Worker, false, nil, p.presence.ttl); err != nil {
		p.log().WarnContext(ctx, "pgque: announcing the stop to the other workers", slog.Any("error", err))
		return
	}
	if p.cfg.Notifier == nil {
		return
	}
	if err := p.cfg.Queries.Notify(actx, PresenceChannel, leaveTag(p.cfg.Queue, p.cfg.Consumer)); err != nil {
		p.log().WarnContext(ctx, "pgque: sending the presence hint", slog.Any("error", err))
	}
}

// leaveWait bounds a graceful stop's last announcement (leave).
const leaveWait = 2 * time.Second

// queryTimeout bounds one background query of a loop with period
// interval: long enough for a busy server, short enough that one hung
// query cannot stall the loop for long.
func queryTimeout(interval time.Duration) time.Duration {
	return max(10*time.Second, 5*interval)
}

// withHeadAges fills in the age of each free slot's oldest pending event,
// so that the plan claims the most behind free slot first. It reads
// slot_heads (two index probes per slot, whatever the backlog) only when
// there is a choice to make: at least two slots this process does not run
// are free. On an error the ages stay zero and the order is random, which
// is what claiming did before.
func (p *Pool) withHeadAges(ctx context.Context, status []dbq.SlotStatus) []dbq.SlotStatus {
	p.mu.Lock()
	free := 0
	for _, s := range status {
		if _, mine := p.running[s.Slot]; !mine && !(s.Live && s.Owner != nil) {
			free++
		}
	}
	p.mu.Unlock()
	if free < 2 {
		return status
	}
	ages, err := p.cfg.Queries.SlotHeads(ctx, p.cfg.Queue, p.cfg.Consumer)
	if err != nil {
		if ctx.Err() == nil {
			p.log().WarnContext(ctx, "pgque: reading slot_heads", slog.Any("error", err))
		}
		return status
	}
	out := make([]dbq.SlotStatus, len(status))
	for i, s := range status {
		s.OldestPendingAge = ages[s.Slot]
		out[i] = s
	}
	return out
}

// releaseExcess asks runners to give their slot up at the next chunk
// boundary, and holds the slots off this worker's claims for two passes.
func (p *Pool) releaseExcess(ctx context.Context, slots []int, now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, s := range slots {
		if r, ok := p.running[s]; ok {
			r.release.Store(true)
			r.lease.giveUp()
			r.wake.Fire()
			p.holdoff[s] = now.Add(2 * p.cfg.ClaimInterval)
			p.log().DebugContext(ctx, "pgque: releasing slot above fair share", slog.Int("slot", s))
		}
	}
}

// claim tries to take one slot and starts its goroutine on success.
//
// The call runs under workCtx: a stop that cancelled it would have pgx
// give the call up and close the connection, while a server that had not
// read it yet still ran it and granted this worker the slot, which then
// stayed out of every worker's reach until the server found the session
// gone. A slot a claim takes after the stop gets its runner as any other,
// which finds the pool stopping and releases the lease at once.
func (p *Pool) claim(fetchCtx, workCtx context.Context, slot, nslots int, prevOwner string) bool {
	at := time.Now()
	cctx, cancel := context.WithTimeout(workCtx, queryTimeout(p.cfg.ClaimInterval))
	defer cancel()
	session := p.session()
	epoch, token, ok, err := p.cfg.Queries.ClaimSlotBound(cctx, p.cfg.Queue, p.cfg.Consumer, slot, p.cfg.Worker, p.cfg.LeaseTTL, "", session)
	if err != nil {
		if workCtx.Err() == nil {
			p.log().WarnContext(workCtx, "pgque: claiming slot", slog.Int("slot", slot), slog.Any("error", err))
		}
		return false
	}
	if !ok {
		return false // another worker was faster
	}
	p.cfg.Metrics.LeaseClaims.WithLabelValues(p.cfg.Queue, p.cfg.Consumer).Inc()
	if prevOwner != "" && prevOwner != p.cfg.Worker {
		p.cfg.Metrics.LeaseTakeovers.WithLabelValues(p.cfg.Queue, p.cfg.Consumer).Inc()
	}
	p.startRunner(fetchCtx, workCtx, slot, nslots, epoch, token, at, session)
	return true
}

// observeStatus refreshes the per-slot gauges from partition_slot_status
// every StatusInterval until stop is closed. It runs apart from the claim
// loop because the view is slow with a large backlog, and it waits at least
// ten times as long as the last read took, so that it never keeps the
// database busy more than a tenth of the time.
func (p *Pool) observeStatus(ctx context.Context, stop <-chan struct{}) {
	hot := make(map[int]bool)
	for {
		start := time.Now()
		status, err := p.cfg.Queries.PartitionSlotStatus(ctx, p.cfg.Queue, p.cfg.Consumer)
		if err == nil {
			p.observe(status)
		} else if ctx.Err() == nil {
			p.log().WarnContext(ctx, "pgque: reading partition_slot_status", slog.Any("error", err))
		}
		if p.cfg.HotKeyShare > 0 {
			p.observeKeys(ctx, hot)
		}
		took := time.Since(start)
		if !backoff.Sleep(stop, backoff.Jitter(max(p.cfg.StatusInterval, 10*took), 0.2)) {
			return
		}
	}
}

// hotKeyScan bounds the pending events one hot-key check reads: enough to
// see which key dominates a slot, cheap on any backlog.
const hotKeyScan = 20000

// hotKeyMinPending is the backlog below which no slot counts as hot
// (pgque.HotKeyMinPending).
const hotKeyMinPending = 100

// observeKeys publishes each slot's top key share and logs a warning when a
// slot turns hot (one key above HotKeyShare of its pending events), and
// again when it cools down; hot holds the slots that are hot now.
func (p *Pool) observeKeys(ctx context.Context, hot map[int]bool) {
	shares, err := p.cfg.Queries.KeyShares(ctx, p.cfg.Queue, p.cfg.Consumer, hotKeyScan)
	if err != nil {
		if ctx.Err() == nil {
			p.log().WarnContext(ctx, "pgque: reading key_shares", slog.Any("error", err))
		}
		return
	}
	for _, s := range shares {
		p.cfg.Metrics.SlotTopKeyShare.WithLabelValues(p.cfg.Queue, p.cfg.Consumer, strconv.Itoa(s.Slot)).Set(s.Share)
		isHot := s.Pending >= hotKeyMinPending && s.Share > p.cfg.HotKeyShare
		switch {
		case isHot && !hot[s.Slot]:
			key := "NULL"
			if s.TopKey != nil {
				key = strconv.Quote(*s.TopKey)
			}
			p.log().WarnContext(ctx, "pgque: hot key holds most of a slot's pending events", slog.Int("slot", s.Slot),
				slog.String("key", key), slog.Float64("share", s.Share), slog.Int64("pending", s.Pending),
				slog.Bool("estimated", s.Estimated))
		case !isHot && hot[s.Slot]:
			p.log().InfoContext(ctx, "pgque: slot no longer dominated by one key", slog.Int("slot", s.Slot))
		}
		hot[s.Slot] = isHot
	}
}

// observe publishes the per-slot gauges.
func (p *Pool) observe(status []dbq.SlotStatus) {
	for _, s := range status {
		slot := strconv.Itoa(s.Slot)
		p.cfg.Metrics.SlotLag.WithLabelValues(p.cfg.Queue, p.cfg.Consumer, slot).Set(float64(s.Lag))
		p.cfg.Metrics.SlotHeadAge.WithLabelValues(p.cfg.Queue, p.cfg.Consumer, slot).Set(s.OldestPendingAge.Seconds())
	}
}

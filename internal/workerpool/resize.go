package workerpool

import (
	"context"
	"log/slog"

	"github.com/pgque/pgque/internal/dbq"
)

// Following a resize of the consumer's N.
//
// The server completes a resize in one transaction: the old slots' leases
// are gone and every call naming the old N fails with PQ030. The pool
// learns the new N on every claim pass from slot_group_info (one index
// probe), and a slot goroutine that gets PQ030 stops at once and triggers
// a pass (exited), so the new slots are claimed within a round trip of the
// first failing call. Goroutines of slots of the old N that are still
// running are asked to give up their slot at the next chunk boundary; a
// slot of the new N with the same number is claimed only once the old one
// is gone (running is keyed by slot number), so one process never works
// slot k of two N at once. The server is the authority throughout: a
// goroutine with a stale N can neither receive nor ack.

// Slots returns the N the pool works now.
func (p *Pool) Slots() int { return int(p.nslots.Load()) }

// SetSlots sets the N the pool works before Run (the consumer's N as
// Start found it on the server).
func (p *Pool) SetSlots(n int) { p.nslots.Store(int64(n)) }

// maxActive is the cap on the slots this process works with n slots.
func (p *Pool) maxActive(n int) int {
	if p.cfg.MaxActive <= 0 {
		return n
	}
	return min(p.cfg.MaxActive, n)
}

// followResize reads the consumer's N and, when it changed, switches the
// pool to it and releases the slots of the old N.
func (p *Pool) followResize(ctx context.Context) {
	qctx, cancel := context.WithTimeout(ctx, queryTimeout(p.cfg.ClaimInterval))
	defer cancel()
	g, err := p.cfg.Queries.SlotGroupInfo(qctx, p.cfg.Queue, p.cfg.Consumer)
	if err != nil {
		if ctx.Err() == nil {
			p.log().WarnContext(ctx, "pgque: reading slot_group_info", slog.Any("error", err))
		}
		return
	}
	old := p.Slots()
	if g.NSlots == old {
		return
	}
	p.nslots.Store(int64(g.NSlots))
	p.log().InfoContext(ctx, "pgque: following the consumer's new slot count", slog.Int("from", old), slog.Int("to", g.NSlots))
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, r := range p.running {
		if r.lease.NSlots != g.NSlots {
			r.release.Store(true)
			r.wake.Fire()
		}
	}
}

// currentSlots keeps the rows of slots that exist under n.
func currentSlots(status []dbq.SlotStatus, n int) []dbq.SlotStatus {
	out := status[:0:0]
	for _, s := range status {
		if s.Slot < n && (s.NSlots == 0 || s.NSlots == n) {
			out = append(out, s)
		}
	}
	return out
}

// slotCountChanged reports whether err from working r's slot comes from a
// completed resize: the server said so (PQ030), or, since a call that
// raced with the cutover may fail otherwise (the slot number is out of
// range for the new N), the consumer's N is no longer the lease's.
func (p *Pool) slotCountChanged(r *runner, err error) bool {
	if p.cfg.IsSlotCountChanged != nil && p.cfg.IsSlotCountChanged(err) {
		return true
	}
	if p.Slots() != r.lease.NSlots {
		return true
	}
	p.followResize(r.fetchCtx)
	return p.Slots() != r.lease.NSlots
}

package workerpool

import (
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/pgque/pgque/internal/dbq"
)

// Every pool announces itself after each claim pass: the slots it works and
// whether it wants more ("hungry"). Two reasons:
//
//   - The partition_slot_status view shows only workers that own a slot, so
//     a worker that owns none — a process that started while every slot was
//     held — would be invisible and starve forever. Owners above their fair
//     share release slots while some live worker is hungry.
//   - Reading the view costs O(N × backlog) (it counts every slot's pending
//     events), far too much for a claim loop that runs every second; the
//     announcements tell who works which slot for one cheap call.
//
// Announcements are written to and read from the database
// (pgque.announce_worker, one call per pass, which only pgque roles may
// make), never taken from NOTIFY payloads: any role of the cluster may
// LISTEN and NOTIFY on any channel, so a payload could be forged (a fake
// hungry worker makes real pools give their slots up) and would leak worker
// ids. After announcing, a pool sends a NOTIFY hint on PresenceChannel whose
// payload is only hintTag(queue, consumer): it makes the consumer's other
// pools run their next pass early, and a forged hint costs at most one
// early pass per hintGap (one that comes sooner runs when the gap ends). A
// pool that stops gracefully announces that it left and hints with
// leaveTag, gated apart (see left).
//
// Announcements are soft state: a worker not heard from for a few claim
// intervals is forgotten. The server stays the authority: claim_slot on a
// slot believed free simply returns NULL when it is not.

type peer struct {
	seen   time.Time
	hungry bool
	slots  []int
}

// presence remembers the other workers of one consumer that announced
// themselves recently.
type presence struct {
	queue, consumer, self string
	ttl                   time.Duration

	mu    sync.Mutex
	peers map[string]peer
	// lastOwner remembers who announced each slot last, even after the
	// announcement expired, to count takeovers.
	lastOwner map[int]string
	lastHint  time.Time
	lastLeave time.Time
	// peerLeft is set when a known peer announced that it left (see
	// takeLeft).
	peerLeft bool
}

func newPresence(queue, consumer, self string, ttl time.Duration) *presence {
	return &presence{queue: queue, consumer: consumer, self: self, ttl: ttl,
		peers: make(map[string]peer), lastOwner: make(map[int]string)}
}

// hintTag is the NOTIFY payload that wakes the pools of (queue, consumer):
// a digest, so that the channel carries no queue, consumer or worker name.
func hintTag(queue, consumer string) string {
	sum := sha256.Sum256([]byte(queue + "\x00" + consumer))
	return hex.EncodeToString(sum[:8])
}

// leaveTag is the NOTIFY payload with which a pool that stopped gracefully
// wakes the other pools of (queue, consumer) (Pool.leave): a digest too.
// It is gated apart from hintTag, so that the hints every pass sends (a
// pool's own among them) cannot swallow a leave.
func leaveTag(queue, consumer string) string {
	sum := sha256.Sum256([]byte(queue + "\x00" + consumer + "\x00left"))
	return hex.EncodeToString(sum[:8])
}

// hint reports whether a presence notification should trigger an early
// pass now: its payload is this consumer's hint or leave tag and no hint of
// that kind was taken within gap, so a flood of (possibly forged) hints
// costs at most one pass per gap and kind. A hint of this consumer that
// comes within the gap is not dropped but due when the gap ends: wait says
// when to ask again (0 when nothing is due). Dropped, a peer's hint that
// came just after this pool's own (every pass sends one, and a pool hears
// itself) waited for the next claim pass, a claim interval away.
func (pr *presence) hint(payload string, now time.Time, gap time.Duration) (bool, time.Duration) {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	last := &pr.lastHint
	switch payload {
	case hintTag(pr.queue, pr.consumer):
	case leaveTag(pr.queue, pr.consumer):
		last = &pr.lastLeave
	default:
		return false, 0
	}
	if wait := last.Add(gap).Sub(now); wait > 0 {
		return false, wait
	}
	*last = now
	return true, 0
}

// update replaces what is known of the peers by what the server returned
// (seen age ago), and reports whether it is news the coordinator should act
// on at once: a new peer, a peer turned hungry, a peer whose slots
// changed, or a peer that left.
func (pr *presence) update(peers []dbq.Peer, now time.Time) bool {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	news := false
	fresh := make(map[string]peer, len(peers))
	for _, p := range peers {
		if p.Worker == pr.self || p.Worker == "" {
			continue
		}
		if left(p) {
			if _, known := pr.peers[p.Worker]; known {
				news, pr.peerLeft = true, true
			}
			continue
		}
		slots := make([]int, len(p.Slots))
		for i, s := range p.Slots {
			slots[i] = int(s)
		}
		sort.Ints(slots)
		old, known := pr.peers[p.Worker]
		if !known || (p.Hungry && !old.hungry) || !slices.Equal(old.slots, slots) {
			news = true
		}
		fresh[p.Worker] = peer{seen: now.Add(-p.Age), hungry: p.Hungry, slots: slots}
		for _, s := range slots {
			pr.lastOwner[s] = p.Worker
		}
	}
	pr.peers = fresh
	return news
}

// takeLeft reports whether a known peer announced that it left since the
// last call: the slots this pool holds off for a hungry peer may then be
// claimed again at once (the peer they were released for may be the one
// that left).
func (pr *presence) takeLeft() bool {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	l := pr.peerLeft
	pr.peerLeft = false
	return l
}

// left reports whether p is the announcement of a pool that stopped
// gracefully (Pool.leave): no slots, and not hungry. A running pool never
// makes it, since its fair share is at least one slot, so it is hungry
// while it has none. Its peers stop counting it at once, instead of a
// presence TTL later, and take its released slots on their next pass.
func left(p dbq.Peer) bool {
	return len(p.Slots) == 0 && !p.Hungry
}

// previousOwner returns the worker that last announced slot, if any.
func (pr *presence) previousOwner(slot int) string {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	return pr.lastOwner[slot]
}

// status describes the slots as the live peers announce them, in the shape
// of the partition_slot_status view: a slot is owned (and live) when a live
// peer works it, free otherwise.
func (pr *presence) status(nslots int, now time.Time) []dbq.SlotStatus {
	out := make([]dbq.SlotStatus, nslots)
	for i := range out {
		out[i] = dbq.SlotStatus{Slot: i, NSlots: nslots}
	}
	pr.mu.Lock()
	defer pr.mu.Unlock()
	for w, p := range pr.peers {
		if now.Sub(p.seen) > pr.ttl {
			continue
		}
		for _, s := range p.slots {
			if s >= 0 && s < nslots {
				owner := w
				out[s].Owner, out[s].Live = &owner, true
			}
		}
	}
	return out
}

// live returns the peers heard from within the TTL, each with its hunger,
// and forgets the others.
func (pr *presence) live(now time.Time) map[string]bool {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	out := make(map[string]bool, len(pr.peers))
	for w, p := range pr.peers {
		if now.Sub(p.seen) > pr.ttl {
			delete(pr.peers, w)
			continue
		}
		out[w] = p.hungry
	}
	return out
}

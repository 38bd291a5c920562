package workerpool

import (
	"encoding/json"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/pgque/pgque/internal/dbq"
)

// Every pool announces itself on PresenceChannel after each claim pass: the
// slots it works and whether it wants more ("hungry"). Two reasons:
//
//   - The partition_slot_status view shows only workers that own a slot, so
//     a worker that owns none — a process that started while every slot was
//     held — would be invisible and starve forever. Owners above their fair
//     share release slots while some live worker is hungry.
//   - Reading the view costs O(N × backlog) (it counts every slot's pending
//     events), far too much for a claim loop that runs every second; the
//     announcements tell who works which slot for free.
//
// Announcements are soft state: a worker not heard from for a few claim
// intervals is forgotten. The server stays the authority: claim_slot on a
// slot believed free simply returns NULL when it is not.
type announcement struct {
	Queue    string `json:"q"`
	Consumer string `json:"c"`
	Worker   string `json:"w"`
	Hungry   bool   `json:"h"`
	Slots    []int  `json:"s"`
}

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
}

func newPresence(queue, consumer, self string, ttl time.Duration) *presence {
	return &presence{queue: queue, consumer: consumer, self: self, ttl: ttl,
		peers: make(map[string]peer), lastOwner: make(map[int]string)}
}

// payload encodes this worker's announcement.
func (pr *presence) payload(hungry bool, slots []int) string {
	sort.Ints(slots)
	b, _ := json.Marshal(announcement{Queue: pr.queue, Consumer: pr.consumer, Worker: pr.self, Hungry: hungry, Slots: slots})
	return string(b)
}

// record stores an announcement and reports whether it is news the
// coordinator should act on at once: a new peer, a peer turned hungry, or
// a peer whose slots changed.
func (pr *presence) record(payload string, now time.Time) bool {
	var a announcement
	if json.Unmarshal([]byte(payload), &a) != nil || a.Queue != pr.queue || a.Consumer != pr.consumer || a.Worker == pr.self || a.Worker == "" {
		return false
	}
	sort.Ints(a.Slots)
	pr.mu.Lock()
	defer pr.mu.Unlock()
	old, known := pr.peers[a.Worker]
	pr.peers[a.Worker] = peer{seen: now, hungry: a.Hungry, slots: a.Slots}
	for _, s := range a.Slots {
		pr.lastOwner[s] = a.Worker
	}
	return !known || now.Sub(old.seen) > pr.ttl || (a.Hungry && !old.hungry) || !slices.Equal(old.slots, a.Slots)
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

package workerpool

import (
	"encoding/json"
	"sync"
	"time"
)

// The partition_slot_status view shows only workers that own a slot, so a
// worker that owns none — a process that just started while every slot is
// held — would be invisible and starve forever. Every pool therefore
// announces itself on PresenceChannel each claim pass, saying whether it
// wants more slots ("hungry"); owners above their fair share release slots
// only while some live worker is hungry. Announcements are soft state: a
// worker not heard from for a few claim intervals is forgotten.
type announcement struct {
	Queue    string `json:"q"`
	Consumer string `json:"c"`
	Worker   string `json:"w"`
	Hungry   bool   `json:"h"`
}

type peer struct {
	seen   time.Time
	hungry bool
}

// presence remembers the other workers of one consumer that announced
// themselves recently.
type presence struct {
	queue, consumer, self string
	ttl                   time.Duration

	mu    sync.Mutex
	peers map[string]peer
}

func newPresence(queue, consumer, self string, ttl time.Duration) *presence {
	return &presence{queue: queue, consumer: consumer, self: self, ttl: ttl, peers: make(map[string]peer)}
}

// payload encodes this worker's announcement.
func (pr *presence) payload(hungry bool) string {
	b, _ := json.Marshal(announcement{Queue: pr.queue, Consumer: pr.consumer, Worker: pr.self, Hungry: hungry})
	return string(b)
}

// record stores an announcement and reports whether it is news the
// coordinator should act on at once: a new peer, or a peer turned hungry.
func (pr *presence) record(payload string, now time.Time) bool {
	var a announcement
	if json.Unmarshal([]byte(payload), &a) != nil || a.Queue != pr.queue || a.Consumer != pr.consumer || a.Worker == pr.self || a.Worker == "" {
		return false
	}
	pr.mu.Lock()
	defer pr.mu.Unlock()
	old, known := pr.peers[a.Worker]
	pr.peers[a.Worker] = peer{seen: now, hungry: a.Hungry}
	return !known || now.Sub(old.seen) > pr.ttl || (a.Hungry && !old.hungry)
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

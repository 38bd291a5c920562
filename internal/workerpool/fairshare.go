package workerpool

import (
	"math/rand/v2"
	"sort"

	"github.com/pgque/pgque/internal/dbq"
)

// planInput is everything one claim pass decides on.
type planInput struct {
	self      string
	slots     int
	maxActive int
	status    []dbq.SlotStatus
	// running maps each slot this process works to whether it was already
	// asked to release it.
	running map[int]bool
	// peers maps live announced workers (not self) to their hunger.
	peers map[string]bool
	// holdoff holds slots this process released recently for a hungry peer;
	// it does not take them back before the peer had a chance.
	holdoff map[int]bool
	// prevFree is the set of slots the previous pass saw free.
	prevFree map[int]bool
}

// plan is what one claim pass does.
type plan struct {
	// live is the number of live workers, this one included.
	live int
	// target is this process's fair share: ceil(N / live), capped at
	// MaxActive.
	target int
	// claim lists the slots to claim, best first.
	claim []int
	// release lists running slots to give up at their next chunk boundary.
	release []int
	// free is the set of slots with no live owner.
	free map[int]bool
}

// makePlan computes one claim pass (see docs/worker-pool.md):
//
//   - Live workers are the owners of unexpired leases, the recently announced
//     peers, and this worker. The fair share is ceil(N / live), capped at
//     MaxActive.
//   - Slots this worker still owns on the server but does not run (a fenced
//     slot it re-took) are adopted first.
//   - Free slots (no owner, or an expired lease) are claimed up to the fair
//     share, those with the oldest pending event first.
//   - Beyond the fair share a worker claims, up to MaxActive, a free slot
//     that stayed free for a whole pass while nobody was hungry: no free slot
//     is left unpolled while some worker has room for it.
//   - A worker above its fair share releases the excess while some peer is
//     hungry.
func makePlan(in planInput) plan {
	live := map[string]bool{in.self: true}
	for _, s := range in.status {
		if s.Live && s.Owner != nil {
			live[*s.Owner] = true
		}
	}
	othersHungry := false
	for w, hungry := range in.peers {
		live[w] = true
		othersHungry = othersHungry || hungry
	}
	pl := plan{live: len(live), free: make(map[int]bool)}
	pl.target = min((in.slots+len(live)-1)/len(live), in.maxActive)

	var adopt []int
	var free []dbq.SlotStatus
	for _, s := range in.status {
		if _, ok := in.running[s.Slot]; ok {
			continue
		}
		switch {
		case s.Live && s.Owner != nil && *s.Owner == in.self:
			adopt = append(adopt, s.Slot)
		case s.Live && s.Owner != nil:
		default:
			pl.free[s.Slot] = true
			if !in.holdoff[s.Slot] {
				free = append(free, s)
			}
		}
	}
	// Shuffle before the stable sort so that workers starting together do
	// not all race for the same slot.
	rand.Shuffle(len(free), func(i, j int) { free[i], free[j] = free[j], free[i] })
	sort.SliceStable(free, func(i, j int) bool { return free[i].OldestPendingAge > free[j].OldestPendingAge })

	mine := len(in.running)
	for _, s := range adopt {
		if mine >= in.maxActive {
			break
		}
		pl.claim = append(pl.claim, s)
		mine++
	}
	for _, s := range free {
		if mine >= in.maxActive {
			break
		}
		if mine >= pl.target && (othersHungry || !in.prevFree[s.Slot]) {
			continue
		}
		pl.claim = append(pl.claim, s.Slot)
		mine++
	}

	if othersHungry {
		keep := 0
		var candidates []int
		for s, releasing := range in.running {
			if !releasing {
				keep++
				candidates = append(candidates, s)
			}
		}
		sort.Sort(sort.Reverse(sort.IntSlice(candidates)))
		for i := 0; keep > pl.target && i < len(candidates); i++ {
			pl.release = append(pl.release, candidates[i])
			keep--
		}
	}
	return pl
}

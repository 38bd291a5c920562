package partitiontest

import (
	"fmt"
	"testing"
)

// T-no-drop: keys (NULL among them) spread over every slot, for N = 4 and
// N = 8, read in whole batches and in chunks of 3: the slots together deliver
// every event exactly once, each key on the one slot the routing formula
// names, and every slot gets a share.
func TestNoDrop(t *testing.T) {
	t.Parallel()
	d := setup(t)
	d.createQueue("nd")
	groups := []struct {
		c      string
		n, max int
	}{
		{"n4big", 4, 10000}, {"n4small", 4, 3}, {"n8big", 8, 10000}, {"n8small", 8, 3},
	}
	for _, g := range groups {
		d.subscribeSlots("nd", g.c, g.n)
	}

	keyOf := map[int64]*string{}
	for round := range 5 {
		keys := make([]*string, 0, 81)
		for i := range 80 {
			keys = append(keys, ptr(fmt.Sprintf("k-%d-%d", i%40, round)))
		}
		keys = append(keys, nil)
		for i, id := range d.sendBatch("nd", keys) {
			keyOf[id] = keys[i]
		}
		keyOf[d.send("nd", nil)] = nil
		keyOf[d.send("nd", ptr("tenant-1"))] = ptr("tenant-1")
		d.tick("nd")
	}

	for _, g := range groups {
		t.Run(g.c, func(t *testing.T) {
			slotOf := map[string]int{} // expectedSlot, memoized per key
			seen := map[int64]int{}
			perSlot := make([]int, g.n)
			var st drainStats
			for _, s := range d.claimAll("nd", g.c, g.n, "w", g.max) {
				ms, ds := drain(t, d.pool, s)
				st.receives += ds.receives
				st.partialAcks += ds.partialAcks
				st.finishingAcks += ds.finishingAcks
				for _, m := range ms {
					seen[m.ID]++
					perSlot[s.slot]++
					key, ok := keyOf[m.ID]
					if !ok {
						t.Errorf("slot %d delivered unknown event %d", s.slot, m.ID)
						continue
					}
					want, ok := slotOf[keyString(key)]
					if !ok {
						want = expectedSlot(t, d.pool, key, g.n)
						slotOf[keyString(key)] = want
					}
					if m.Slot != want {
						t.Errorf("event %d with key %s delivered on slot %d, the routing formula says %d",
							m.ID, keyString(key), m.Slot, want)
					}
				}
			}
			missing, dups := 0, 0
			for id := range keyOf {
				switch n := seen[id]; {
				case n == 0:
					missing++
					if missing <= 5 {
						t.Errorf("event %d (key %s) was never delivered", id, keyString(keyOf[id]))
					}
				case n > 1:
					dups++
					if dups <= 5 {
						t.Errorf("event %d (key %s) was delivered %d times", id, keyString(keyOf[id]), n)
					}
				}
			}
			if missing+dups > 0 || len(seen) != len(keyOf) {
				t.Errorf("%d of %d events missing, %d duplicated, %d distinct delivered", missing, len(keyOf), dups, len(seen))
			}
			for k, n := range perSlot {
				if n == 0 {
					t.Errorf("slot %d of %d got no event: the keys did not cover every slot", k, g.n)
				}
			}
			t.Logf("N=%d max=%d: per slot %v; %d receives, %d partial acks, %d finishing acks",
				g.n, g.max, perSlot, st.receives, st.partialAcks, st.finishingAcks)
			if g.max < 10 && st.partialAcks == 0 {
				t.Errorf("with max %d no batch was delivered in several chunks", g.max)
			}
		})
	}
}

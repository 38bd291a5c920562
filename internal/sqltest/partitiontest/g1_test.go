package partitiontest

import (
	"fmt"
	"slices"
	"testing"
)

// pinnedKeys are the slots of a few keys, computed ONCE, independently of
// pgque, on the harness cluster (PostgreSQL 15, UTF8) with plain SQL:
//
//	select k, hashtextextended(k, 0),
//	       (hashtextextended(k, 0) % 2 + 2) % 2,
//	       (hashtextextended(k, 0) % 8 + 8) % 8
//	  from unnest(array['tenant-1', 'tenant-2', 'tenant-3', 'acme', '', 'Zürich-日本-ü']) k;
//
// and written down here as literals. They are G1's contract with the data
// already in users' queues: if the routing or PostgreSQL's hash ever changed,
// keys would silently move to other slots and per-key order would break
// across the change. Several hashes are negative, which pins the sign-safe
// modulo; the NULL key goes to slot 0 by rule.
var pinnedKeys = []struct {
	key          *string
	hash         int64 // hashtextextended(key, 0); unused for NULL
	slot2, slot8 int
}{
	{nil, 0, 0, 0},
	{ptr("tenant-1"), -5960342201233910903, 1, 1},
	{ptr("tenant-2"), 2878192867134758635, 1, 3},
	{ptr("tenant-3"), 414815097639099290, 0, 2},
	{ptr("acme"), 7757017307627438190, 0, 6},
	{ptr(""), -6939563903564495251, 1, 5},
	{ptr("Zürich-日本-ü"), -8177299489433288447, 1, 1},
}

// pinnedSlot returns the pinned slot of key for n = 2 or 8.
func pinnedSlot(t testing.TB, key *string, n int) int {
	t.Helper()
	for _, p := range pinnedKeys {
		if (p.key == nil) == (key == nil) && (key == nil || *p.key == *key) {
			switch n {
			case 2:
				return p.slot2
			case 8:
				return p.slot8
			}
		}
	}
	t.Fatalf("no pinned slot for key %s and n %d", keyString(key), n)
	return -1
}

// T-G1a: each pinned key is delivered on exactly its pinned slot, for N = 2
// and N = 8, and slot_of agrees.
func TestG1aPinnedSlots(t *testing.T) {
	t.Parallel()
	d := setup(t)
	d.createQueue("g1a")
	for _, n := range []int{2, 8} {
		d.subscribeSlots("g1a", fmt.Sprintf("n%d", n), n)
	}

	for _, p := range pinnedKeys {
		if p.key != nil {
			if h := one[int64](t, d.pool, "select pg_catalog.hashtextextended($1, 0)", *p.key); h != p.hash {
				t.Errorf("hashtextextended(%s, 0) = %d, pinned %d: PostgreSQL's hash changed, every key would move",
					keyString(p.key), h, p.hash)
			}
		}
		for _, n := range []int{2, 8} {
			want := pinnedSlot(t, p.key, n)
			if got := one[int32](t, d.pool, "select pgque.slot_of($1, $2)", p.key, n); int(got) != want {
				t.Errorf("slot_of(%s, %d) = %d, pinned %d", keyString(p.key), n, got, want)
			}
		}
	}

	// Two events per key, in separate transactions.
	sent := map[int64]*string{}
	for range 2 {
		for _, p := range pinnedKeys {
			sent[d.send("g1a", p.key)] = p.key
		}
	}
	d.tick("g1a")

	for _, n := range []int{2, 8} {
		seen := map[int64]int{}
		for _, s := range d.claimAll("g1a", fmt.Sprintf("n%d", n), n, "w", 100) {
			ms, _ := drain(t, d.pool, s)
			for _, m := range ms {
				key, ok := sent[m.ID]
				if !ok {
					t.Errorf("N=%d: slot %d delivered unknown event %d", n, s.slot, m.ID)
					continue
				}
				if want := pinnedSlot(t, key, n); m.Slot != want {
					t.Errorf("N=%d: event %d with key %s arrived at slot %d, pinned slot %d", n, m.ID, keyString(key), m.Slot, want)
				}
				if keyString(m.Key) != keyString(key) {
					t.Errorf("N=%d: event %d arrived with key %s, sent with %s", n, m.ID, keyString(m.Key), keyString(key))
				}
				seen[m.ID]++
			}
		}
		for id, key := range sent {
			if seen[id] != 1 {
				t.Errorf("N=%d: event %d (key %s) delivered %d times, want once", n, id, keyString(key), seen[id])
			}
		}
	}
}

// T-G1b: keys interleaved A,B,A,A,B,… over many ticks (many batches), read
// in small chunks with the slots consumed in turn: each key arrives at
// exactly its pinned slot, in ev_id order, and never at another slot.
func TestG1bInterleavedOrder(t *testing.T) {
	t.Parallel()
	d := setup(t)
	d.createQueue("g1b")
	for _, n := range []int{2, 8} {
		d.subscribeSlots("g1b", fmt.Sprintf("n%d", n), n)
	}
	a, b, c, e := ptr("tenant-3"), ptr("acme"), ptr("tenant-1"), ptr("")
	pattern := []*string{a, b, a, a, b, nil, c, a, e, b, c, nil}

	sentByKey := map[string][]int64{}
	const ticks = 25
	for round := range ticks {
		var ids []int64
		if round%2 == 0 {
			for _, k := range pattern {
				ids = append(ids, d.send("g1b", k))
			}
		} else {
			ids = d.sendBatch("g1b", pattern) // one transaction, one INSERT
		}
		for i, k := range pattern {
			sentByKey[keyString(k)] = append(sentByKey[keyString(k)], ids[i])
		}
		d.tick("g1b")
	}

	for _, n := range []int{2, 8} {
		got := drainRoundRobin(t, d.pool, d.claimAll("g1b", fmt.Sprintf("n%d", n), n, "w", 2))
		byKey := map[string][]int64{}
		batches := map[string]map[int64]bool{}
		for _, m := range got {
			k := keyString(m.Key)
			if want := pinnedSlot(t, m.Key, n); m.Slot != want {
				t.Errorf("N=%d: event %d with key %s arrived at slot %d, pinned slot %d", n, m.ID, k, m.Slot, want)
			}
			if m.Retry != 0 {
				t.Errorf("N=%d: event %d has retry_count %d, nothing was retried", n, m.ID, m.Retry)
			}
			byKey[k] = append(byKey[k], m.ID)
			if batches[k] == nil {
				batches[k] = map[int64]bool{}
			}
			batches[k][m.Batch] = true
		}
		for k, want := range sentByKey {
			if !slices.Equal(byKey[k], want) {
				t.Errorf("N=%d: key %s arrived as %v, want exactly the sent events in ev_id order %v", n, k, byKey[k], want)
			}
			if len(batches[k]) < ticks {
				t.Errorf("N=%d: key %s came in %d batches, want one per tick (%d): the test did not span batches",
					n, k, len(batches[k]), ticks)
			}
		}
	}
}

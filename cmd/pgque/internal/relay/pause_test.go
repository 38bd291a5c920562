package relay_test

import (
	"context"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/pgque/pgque"
	"github.com/pgque/pgque/cmd/pgque/internal/relay"
	"github.com/pgque/pgque/internal/testing/pgtest"
)

// TestRelayPauseBlocksOnlyTheKey: under the pause policy, an endpoint
// that keeps failing one key's event holds that key's later events, while
// the other keys on the same (single) slot keep flowing; once the endpoint
// accepts it, the held events follow in order.
func TestRelayPauseBlocksOnlyTheKey(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var order []string // key/ev_id of each accepted event
	healed := false
	serveOn(t, ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		key := r.Header.Get(relay.HeaderKey)
		if key == "bad" && !healed {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		order = append(order, key+"/"+r.Header.Get(relay.HeaderEvID))
	}))
	p := startInProcWith(t, "http://"+ln.Addr().String()+"/in", "", func(rc *relay.RunConfig) {
		rc.Consumer.Slots = 1
		rc.Consumer.FailurePolicy = pgque.FailurePolicyPause
	})
	p.send(t, "bad", "bad", "good1", "good2", "bad", "good3")
	accepted := func() []string { mu.Lock(); defer mu.Unlock(); return append([]string(nil), order...) }
	pgtest.WaitFor(t, 20*time.Second, "the healthy keys delivered", func() bool { return len(accepted()) == 3 })
	for _, e := range accepted() {
		if e[:3] == "bad" {
			t.Fatalf("an event of the failing key was accepted: %v", accepted())
		}
	}
	client, err := pgque.NewClient(p.pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	// The chunk is settled (the nack blocks the key) just after its last
	// event was answered.
	var blocked []pgque.BlockedKey
	pgtest.WaitFor(t, 20*time.Second, "the failing key blocked", func() bool {
		blocked, err = client.BlockedKeys(context.Background(), p.queue, "c")
		return err == nil && len(blocked) > 0
	})
	for _, e := range accepted() {
		if e[:3] == "bad" {
			t.Fatalf("an event of the failing key was accepted: %v", accepted())
		}
	}
	if len(blocked) != 1 || blocked[0].Key != pgque.KeyOf("bad") || blocked[0].Deferred < 1 {
		t.Errorf("blocked keys %+v, want only \"bad\" with its later events held", blocked)
	}
	mu.Lock()
	healed = true
	mu.Unlock()
	pgtest.WaitFor(t, 20*time.Second, "the held key delivered", func() bool { return len(accepted()) == 6 })
	var bad []int
	for _, e := range accepted() {
		if e[:3] == "bad" {
			id, _ := strconv.Atoi(e[4:])
			bad = append(bad, id)
		}
	}
	if len(bad) != 3 || !slices.IsSorted(bad) {
		t.Errorf("the failing key's events arrived as %v, want all three in ev_id order", bad)
	}
}

package relay_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/pgque/pgque/cmd/pgque/internal/relay"
	"github.com/pgque/pgque/internal/testing/pgtest"
)

// TestRelayConcurrencyRunsKeysAtOnce: on a single slot, the relay posts the
// events of different keys at once, up to the consumer's MaxWorkers (what
// --concurrency sets) and never more, never two requests of one key at
// once, and each key's events in ev_id order.
func TestRelayConcurrencyRunsKeysAtOnce(t *testing.T) {
	const limit, keys, perKey = 3, 6, 2
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	inFlight, peak := 0, 0
	running := map[string]bool{}
	var overlap []string
	order := map[string][]int{}
	gate := make(chan struct{})
	serveOn(t, ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get(relay.HeaderKey)
		id, _ := strconv.Atoi(r.Header.Get(relay.HeaderEvID))
		mu.Lock()
		if running[key] {
			overlap = append(overlap, key)
		}
		running[key] = true
		inFlight++
		peak = max(peak, inFlight)
		mu.Unlock()
		<-gate
		mu.Lock()
		running[key] = false
		inFlight--
		order[key] = append(order[key], id)
		mu.Unlock()
	}))
	p := startInProcWith(t, "http://"+ln.Addr().String()+"/in", "", func(rc *relay.RunConfig) {
		rc.Consumer.Slots = 1
		rc.Consumer.MaxWorkers = limit
	})
	// One transaction: the events are in one batch and one chunk, so the
	// slot has all six keys' lanes at hand from the start.
	ctx := context.Background()
	tx, err := p.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for range perKey {
		for k := range keys {
			if _, err := tx.Exec(ctx, `select pgque.send($1, 't', '{}'::jsonb, $2)`, p.queue, fmt.Sprintf("k%d", k)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	current := func() int { mu.Lock(); defer mu.Unlock(); return inFlight }
	pgtest.WaitFor(t, 20*time.Second, fmt.Sprintf("%d requests of one slot in flight at once", limit), func() bool { return current() == limit })
	close(gate)
	delivered := func() int {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, ids := range order {
			n += len(ids)
		}
		return n
	}
	pgtest.WaitFor(t, 30*time.Second, "every event delivered", func() bool { return delivered() >= keys*perKey })
	mu.Lock()
	defer mu.Unlock()
	if peak != limit {
		t.Errorf("at most %d requests were in flight at once, want exactly the limit %d", peak, limit)
	}
	if len(overlap) > 0 {
		t.Errorf("two requests of one key were in flight at once: %v", overlap)
	}
	for k, ids := range order {
		if len(ids) != perKey || !slices.IsSorted(ids) {
			t.Errorf("key %s was delivered as %v, want its %d events once each in ev_id order", k, ids, perKey)
		}
	}
}

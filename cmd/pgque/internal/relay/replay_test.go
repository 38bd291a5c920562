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

// TestRelayReplayHeader: an event the endpoint fails once, then
// dead-letters, comes back, once replayed, with pgque-replay: 1, its own
// event id and the retry count it had; ordinary deliveries carry no
// pgque-replay.
func TestRelayReplayHeader(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	type seen struct{ evID, retry, replay string }
	var mu sync.Mutex
	var got []seen
	serveOn(t, ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, seen{r.Header.Get(relay.HeaderEvID), r.Header.Get(relay.HeaderRetryCount), r.Header.Get(relay.HeaderReplay)})
		switch {
		case r.Header.Get(relay.HeaderReplay) != "":
		case len(got) == 1:
			w.WriteHeader(http.StatusServiceUnavailable)
		default:
			w.Header().Set(relay.HeaderDeadLetter, "1")
			w.WriteHeader(http.StatusUnprocessableEntity)
		}
	}))
	p := startInProcWith(t, "http://"+ln.Addr().String()+"/in", "", nil)
	seenNow := func() []seen { mu.Lock(); defer mu.Unlock(); return append([]seen(nil), got...) }
	p.send(t, "k")
	pgtest.WaitFor(t, 20*time.Second, "the event dead-lettered", func() bool { return p.deadLetters(t) == 1 })
	client, err := pgque.NewClient(p.pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	dls, err := client.DeadLetters(ctx, p.queue, nil)
	if err != nil || len(dls) != 1 {
		t.Fatalf("dead letters = %v, %v; want one", dls, err)
	}
	if _, err := client.ReplayDeadLetter(ctx, p.queue, dls[0].ID); err != nil {
		t.Fatal(err)
	}
	pgtest.WaitFor(t, 20*time.Second, "the replay delivered", func() bool { return len(seenNow()) == 3 })
	id := strconv.FormatInt(dls[0].EventID, 10)
	want := []seen{{id, "0", ""}, {id, "1", ""}, {id, "1", "1"}}
	if s := seenNow(); !slices.Equal(s, want) {
		t.Fatalf("deliveries (ev id, retry count, replay) = %v, want %v", s, want)
	}
}

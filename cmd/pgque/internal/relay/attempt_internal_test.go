package relay

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgque/pgque"
)

// TestAttemptUnbuildableRequestChargesTheEvent: a request whose headers
// the transport would refuse (here a header value with CR/LF, which no
// event can produce any more) is the event's failure: an error that the
// consumer charges as a retry, not an unreachable endpoint that is tried
// again forever, and nothing reaches the endpoint.
func TestAttemptUnbuildableRequestChargesTheEvent(t *testing.T) {
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { hits.Add(1) }))
	defer srv.Close()
	r, err := New(&Config{URL: srv.URL + "/in", Queue: "q", Consumer: "c", Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	r.cfg.AuthHeader, r.cfg.AuthValue = "X-Token", "bad\r\nX-Injected: yes"
	m := &pgque.Message{ID: 7, Type: "t", Payload: json.RawMessage(`{}`), CreatedAt: time.Now()}
	res := r.attempt(context.Background(), m)
	if res.unreachable || res.err == nil {
		t.Fatalf("attempt = %+v, want an error charged to the event", res)
	}
	if n := hits.Load(); n != 0 {
		t.Fatalf("%d requests reached the endpoint", n)
	}
}

// dropper accepts connections and closes each one after reading a little
// of its request, as a server that drops clients whose request is too
// large; it counts the connections.
func dropper(t *testing.T) (url string, conns *atomic.Int64) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	conns = new(atomic.Int64)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns.Add(1)
			_, _ = c.Read(make([]byte, 1024))
			if tc, ok := c.(*net.TCPConn); ok {
				_ = tc.SetLinger(0) // a reset, not a clean close
			}
			c.Close()
		}
	}()
	return "http://" + ln.Addr().String() + "/in", conns
}

// TestAttemptOversizedEventIsTheEventsFailure: an event whose type and key
// make request headers past MaxEventHeaderBytes is dead-lettered at once,
// without a request (endpoints refuse or drop such requests, the same each
// time, and an uncharged drop held its key forever); and an endpoint that
// drops a large body while it is being sent charges the event.
func TestAttemptOversizedEventIsTheEventsFailure(t *testing.T) {
	url, conns := dropper(t)
	r, err := New(&Config{URL: url, Queue: "q", Consumer: "c", Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()

	wide := &pgque.Message{ID: 8, Type: strings.Repeat("T", MaxEventHeaderBytes), Payload: json.RawMessage(`{}`), CreatedAt: time.Now()}
	res := r.attempt(context.Background(), wide)
	if res.unreachable || !errors.Is(res.err, pgque.ErrDeadLetter) || !strings.Contains(res.err.Error(), "bytes of request headers") {
		t.Fatalf("attempt of a %d-byte type = %+v, want a dead letter", MaxEventHeaderBytes, res)
	}
	if n := conns.Load(); n != 0 {
		t.Fatalf("%d connections for an event that cannot be sent", n)
	}

	big := &pgque.Message{ID: 9, Type: "t", Payload: json.RawMessage(`"` + strings.Repeat("x", 4<<20) + `"`), CreatedAt: time.Now()}
	if res := r.attempt(context.Background(), big); res.unreachable || res.err == nil {
		t.Fatalf("attempt of a 4 MB body the endpoint dropped = %+v, want an error charged to the event", res)
	}
}

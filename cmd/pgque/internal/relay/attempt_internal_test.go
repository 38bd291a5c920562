package relay

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
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

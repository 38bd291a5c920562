package relay_test

import (
	"context"
	"net"
	"net/http"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/pgque/pgque/internal/testing/pgtest"
)

// TestRelayHeaderInjection: an event whose type holds CR/LF and a header
// line reaches the endpoint with ce-type percent-encoded (decoding returns
// the type), no injected header, and the key's next event after it; the
// endpoint is never counted down and nothing is charged as unreachable.
func TestRelayHeaderInjection(t *testing.T) {
	const evil = "evil\r\nX-Injected: yes"
	var mu sync.Mutex
	var types, injected []string
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	serveOn(t, ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		types = append(types, r.Header.Get("ce-type"))
		injected = append(injected, r.Header.Get("X-Injected"))
	}))
	p := startInProc(t, "http://"+ln.Addr().String()+"/in")
	for _, typ := range []string{evil, "after"} {
		if _, err := p.pool.Exec(context.Background(), `select pgque.send($1, $2, '{}'::jsonb, 'k')`, p.queue, typ); err != nil {
			t.Fatal(err)
		}
	}
	pgtest.WaitFor(t, 20*time.Second, "both events delivered", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(types) >= 2
	})
	mu.Lock()
	defer mu.Unlock()
	if types[0] != "evil%0D%0AX-Injected:%20yes" || types[1] != "after" {
		t.Errorf("ce-type headers %q, want the evil type percent-encoded, then %q", types, "after")
	}
	if dec, err := url.PathUnescape(types[0]); err != nil || dec != evil {
		t.Errorf("ce-type decodes to %q (%v), want %q", dec, err, evil)
	}
	for _, v := range injected {
		if v != "" {
			t.Errorf("X-Injected arrived: %q", v)
		}
	}
	if n := p.metric(t, "pgque_relay_unreachable_attempts_total", "request"); n != 0 {
		t.Errorf("%v unreachable attempts charged to the endpoint for the event's type", n)
	}
	if up := p.metric(t, "pgque_relay_endpoint_up", ""); up != 1 {
		t.Errorf("endpoint_up = %v, want 1", up)
	}
}

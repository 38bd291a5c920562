package relay_test

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgque/pgque/cmd/pgque/internal/relay"
)

// TestRelayGracefulStopAndHealth: /healthz, /readyz and /metrics are
// served; a stop while a request is in flight lets it finish (its context
// is not cancelled), acknowledges the chunk and releases the leases.
func TestRelayGracefulStopAndHealth(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	inFlight := make(chan struct{}, 1)
	release := make(chan struct{})
	var completed, cancelled atomic.Int64
	serveOn(t, ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case inFlight <- struct{}{}:
		default:
		}
		select {
		case <-release:
			completed.Add(1)
		case <-r.Context().Done():
			cancelled.Add(1)
		}
	}))
	probe, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	admin := probe.Addr().String()
	probe.Close()
	// The request outlives the stop by design; the shared 300 ms request
	// timeout would end it within the window the test waits.
	p := startInProcWith(t, "http://"+ln.Addr().String()+"/in", admin, func(rc *relay.RunConfig) {
		rc.Relay.Timeout = 10 * time.Second
	})

	get := func(path string) (int, string) {
		resp, err := http.Get("http://" + admin + path)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, _ := get("/healthz"); code != 200 {
		t.Errorf("/healthz = %d, want 200", code)
	}
	code, body := get("/readyz")
	var ready struct {
		State      string `json:"state"`
		OwnedSlots []int  `json:"owned_slots"`
	}
	if err := json.Unmarshal([]byte(body), &ready); err != nil || code != 200 || ready.State != "running" || len(ready.OwnedSlots) != 2 {
		t.Errorf("/readyz = %d %s, want 200, running, 2 owned slots", code, body)
	}

	p.send(t, "a")
	select {
	case <-inFlight:
	case <-time.After(20 * time.Second):
		t.Fatal("no request arrived")
	}
	if _, m := get("/metrics"); !strings.Contains(m, "pgque_relay_in_flight_requests 1") {
		t.Errorf("/metrics does not show the request in flight")
	}
	stopped := make(chan struct{})
	go func() { p.stop(); close(stopped) }()
	// The stop waits for the request: give it time to (wrongly) give up,
	// then answer.
	select {
	case <-stopped:
		t.Fatal("the relay stopped with a request in flight")
	case <-time.After(300 * time.Millisecond):
	}
	close(release)
	select {
	case <-stopped:
	case <-time.After(20 * time.Second):
		t.Fatal("the relay did not stop after the request finished")
	}
	if completed.Load() != 1 || cancelled.Load() != 0 {
		t.Errorf("requests completed %d, cancelled %d; want the one in flight completed", completed.Load(), cancelled.Load())
	}
	// Acknowledged (nothing pending, no open batch) and released.
	var pending, owned int
	if err := p.pool.QueryRow(context.Background(),
		`select coalesce(sum(lag), 0) + count(open_batch), count(owner) from pgque.partition_slot_status where queue = $1 and consumer = 'c'`,
		p.queue).Scan(&pending, &owned); err != nil {
		t.Fatal(err)
	}
	if pending != 0 || owned != 0 {
		t.Errorf("after the stop: %d pending or open, %d slots owned; want 0 and 0", pending, owned)
	}
}

package relay_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pgque/pgque"
	"github.com/pgque/pgque/cmd/pgque/internal/relay"
	"github.com/pgque/pgque/internal/testing/pgtest"
)

// newRelay returns a relay posting to a test server answering with h.
func newRelay(t *testing.T, h http.HandlerFunc, mod func(*relay.Config)) *relay.Relay {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	cfg := relay.Config{URL: srv.URL + "/in", Queue: "q", Consumer: "c", Timeout: 2 * time.Second,
		UnreachableBackoffMin: 10 * time.Millisecond, UnreachableBackoffMax: 20 * time.Millisecond, RetryAfterMax: time.Hour}
	if mod != nil {
		mod(&cfg)
	}
	r, err := relay.New(&cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	return r
}

func message() *pgque.Message {
	return &pgque.Message{ID: 42, Queue: "q", Consumer: "c", Type: "file.created", Payload: json.RawMessage(`{"a":1}`),
		PartitionKey: "tenant/ü %\n", RetryCount: 3, CreatedAt: time.Date(2026, 1, 2, 3, 4, 5, 6000, time.UTC), Slot: 5, Epoch: 9}
}

// TestHandleStatusContract: how each answer maps to the consumer's
// outcome.
func TestHandleStatusContract(t *testing.T) {
	date := time.Now().Add(90 * time.Second).UTC().Format(http.TimeFormat)
	for _, tc := range []struct {
		name       string
		status     int
		header     map[string]string
		ok, dead   bool
		retryAfter time.Duration // 0: the consumer's backoff
		fuzzy      bool          // retryAfter is approximate (an HTTP date)
	}{
		{name: "200 acks", status: 200, ok: true},
		{name: "204 acks", status: 204, ok: true},
		{name: "500 retries", status: 500},
		{name: "503 with seconds", status: 503, header: map[string]string{"Retry-After": "7"}, retryAfter: 7 * time.Second},
		{name: "429 with a date", status: 429, header: map[string]string{"Retry-After": date}, retryAfter: 90 * time.Second, fuzzy: true},
		{name: "Retry-After clamped", status: 503, header: map[string]string{"Retry-After": "999999999999"}, retryAfter: time.Hour},
		{name: "garbage Retry-After ignored", status: 503, header: map[string]string{"Retry-After": "soon"}},
		{name: "408 retries", status: 408},
		{name: "400 retries", status: 400},
		{name: "422 dead-letters", status: 422, dead: true},
		{name: "header dead-letters", status: 500, header: map[string]string{"pgque-dead-letter": "1"}, dead: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRelay(t, func(w http.ResponseWriter, _ *http.Request) {
				for k, v := range tc.header {
					w.Header().Set(k, v)
				}
				w.WriteHeader(tc.status)
				_, _ = w.Write([]byte("details"))
			}, nil)
			err := r.Handle(context.Background(), message())
			if tc.ok {
				if err != nil {
					t.Fatalf("Handle = %v, want nil", err)
				}
				return
			}
			if err == nil {
				t.Fatal("Handle = nil, want a failure")
			}
			if !strings.Contains(err.Error(), "details") {
				t.Errorf("error %q does not carry the response body", err)
			}
			if got := pgque.IsDeadLetter(err); got != tc.dead {
				t.Errorf("IsDeadLetter = %v, want %v (%v)", got, tc.dead, err)
			}
			d, ok := pgque.RetryDelayOf(err)
			switch {
			case tc.retryAfter == 0 && ok:
				t.Errorf("retry delay %v asked for, want the consumer's backoff", d)
			case tc.retryAfter != 0 && !ok:
				t.Errorf("no retry delay, want %v", tc.retryAfter)
			case tc.retryAfter != 0 && !tc.fuzzy && d != tc.retryAfter:
				t.Errorf("retry delay %v, want %v", d, tc.retryAfter)
			case tc.fuzzy && (d < tc.retryAfter-5*time.Second || d > tc.retryAfter):
				t.Errorf("retry delay %v, want about %v", d, tc.retryAfter)
			}
		})
	}
}

// TestHandleMisconfiguredEndpointWaits: a 404 (or 401, a redirect) is not
// the event's fault: Handle repeats the request until the endpoint
// answers, without returning a failure.
func TestHandleMisconfiguredEndpointWaits(t *testing.T) {
	var mu sync.Mutex
	calls := 0
	r := newRelay(t, func(w http.ResponseWriter, _ *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		calls++
		switch calls {
		case 1:
			w.WriteHeader(http.StatusNotFound)
		case 2:
			w.WriteHeader(http.StatusUnauthorized)
		case 3:
			w.Header().Set("Location", "/other")
			w.WriteHeader(http.StatusFound)
		default:
			w.WriteHeader(http.StatusOK)
		}
	}, nil)
	if err := r.Handle(context.Background(), message()); err != nil {
		t.Fatalf("Handle = %v, want nil once the endpoint answers", err)
	}
	if calls != 4 {
		t.Errorf("%d calls, want 4 (404, 401, 302 repeated, then 200)", calls)
	}
	// A stopping relay gives up waiting and hands the event back at once.
	r2 := newRelay(t, func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNotFound) }, nil)
	r2.BeginStop()
	err := r2.Handle(context.Background(), message())
	if d, ok := pgque.RetryDelayOf(err); err == nil || !ok || d != 0 {
		t.Errorf("Handle on a stopping relay = %v, want a failure with retry delay 0", err)
	}
}

// TestHandleHeaders: the CloudEvents binary-mode and pgque headers, the
// body, the auth header, and the key encoding.
func TestHandleHeaders(t *testing.T) {
	got := make(chan *http.Request, 2)
	bodies := make(chan string, 2)
	r := newRelay(t, func(w http.ResponseWriter, req *http.Request) {
		b, _ := io.ReadAll(req.Body)
		got <- req
		bodies <- string(b)
	}, func(c *relay.Config) { c.AuthHeader, c.AuthValue = "X-Token", "s3cret" })
	if err := r.Handle(context.Background(), message()); err != nil {
		t.Fatal(err)
	}
	req, body := <-got, <-bodies
	want := map[string]string{
		"Ce-Specversion": "1.0", "Ce-Id": "q/42", "Ce-Type": "file.created", "Ce-Source": "pgque://q/c",
		"Ce-Time": "2026-01-02T03:04:05.000006Z", "Content-Type": "application/json",
		"Pgque-Slot": "5", "Pgque-Epoch": "9", "Pgque-Retry-Count": "3", "Pgque-Ev-Id": "42",
		"Pgque-Queue": "q", "Pgque-Consumer": "c", "X-Token": "s3cret",
		"Pgque-Partition-Key": "tenant%2F%C3%BC%20%25%0A", "Idempotency-Key": "q/42",
	}
	for k, v := range want {
		if g := req.Header.Get(k); g != v {
			t.Errorf("%s = %q, want %q", k, g, v)
		}
	}
	if req.Header.Get(relay.HeaderKeyNull) != "" {
		t.Errorf("%s set on a keyed event", relay.HeaderKeyNull)
	}
	if k, err := url.PathUnescape(req.Header.Get(relay.HeaderKey)); err != nil || k != "tenant/ü %\n" {
		t.Errorf("key decodes to %q (%v)", k, err)
	}
	if body != `{"a":1}` || req.Method != http.MethodPost || req.URL.Path != "/in" {
		t.Errorf("%s %s body %q, want POST /in with the payload", req.Method, req.URL.Path, body)
	}
	// The NULL key: no key header, the null marker instead.
	m := message()
	m.PartitionKey = ""
	if err := r.Handle(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	req = <-got
	<-bodies
	if _, present := req.Header[http.CanonicalHeaderKey(relay.HeaderKey)]; present || req.Header.Get(relay.HeaderKeyNull) != "1" {
		t.Errorf("NULL key sent as %v", req.Header)
	}
}

// TestHandleInFlightCap: no more than MaxInFlight requests at once.
func TestHandleInFlightCap(t *testing.T) {
	var mu sync.Mutex
	cur, peak := 0, 0
	release := make(chan struct{})
	r := newRelay(t, func(w http.ResponseWriter, _ *http.Request) {
		mu.Lock()
		cur++
		peak = max(peak, cur)
		mu.Unlock()
		<-release
		mu.Lock()
		cur--
		mu.Unlock()
	}, func(c *relay.Config) { c.MaxInFlight = 2 })
	var wg sync.WaitGroup
	for range 6 {
		wg.Add(1)
		go func() { defer wg.Done(); _ = r.Handle(context.Background(), message()) }()
	}
	pgtest.WaitFor(t, 5*time.Second, "two requests in flight", func() bool { mu.Lock(); defer mu.Unlock(); return cur == 2 })
	close(release)
	wg.Wait()
	if peak != 2 {
		t.Errorf("peak of %d requests in flight, want the cap 2", peak)
	}
}

// TestHandleContextCancelled: a lost lease (cancelled context) aborts the
// request and returns at once.
func TestHandleContextCancelled(t *testing.T) {
	hang := make(chan struct{})
	r := newRelay(t, func(w http.ResponseWriter, req *http.Request) { <-hang }, nil)
	t.Cleanup(func() { close(hang) }) // before the server's Close, which waits for handlers
	ctx, cancel := context.WithCancelCause(context.Background())
	time.AfterFunc(100*time.Millisecond, func() { cancel(pgque.ErrLeaseLost) })
	if err := r.Handle(ctx, message()); !errors.Is(err, pgque.ErrLeaseLost) {
		t.Errorf("Handle = %v, want the context's cause", err)
	}
}

// FuzzEncodeKey: every key survives the header encoding and decodes back
// with standard percent-decoding; the header value is plain ASCII.
func FuzzEncodeKey(f *testing.F) {
	for _, s := range []string{"", "tenant-1", "ü", "a b", "%", "\x00\r\n", "a/b?c#d"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, key string) {
		enc := relay.EncodeKey(key)
		for i := 0; i < len(enc); i++ {
			if enc[i] < 0x21 || enc[i] > 0x7e {
				t.Fatalf("EncodeKey(%q) = %q has byte %#x", key, enc, enc[i])
			}
		}
		dec, err := url.PathUnescape(enc)
		if err != nil || dec != key {
			t.Fatalf("EncodeKey(%q) = %q decodes to %q (%v)", key, enc, dec, err)
		}
	})
}

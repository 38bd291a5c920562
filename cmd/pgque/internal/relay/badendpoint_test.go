package relay_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/pgque/pgque"
	"github.com/pgque/pgque/cmd/pgque/internal/relay"
	"github.com/pgque/pgque/internal/backoff"
	"github.com/pgque/pgque/internal/testing/pgtest"
	"github.com/pgque/pgque/pgqueprom"
)

// inProc is a relay run in the test process against an endpoint the test
// controls.
type inProc struct {
	pool    *pgxpool.Pool
	queue   string
	metrics *relay.Metrics
	reg     *prometheus.Registry
	logs    *syncBuffer
	stop    func()
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

const inProcWorker = "relay-in-proc"

// startInProc runs relay.Run on 2 slots posting to url, with fast
// backoffs: unreachable 50 ms doubling to 400 ms, consumer retries 200 ms
// doubling to 1 s, a 300 ms request timeout.
func startInProc(t *testing.T, url string) *inProc {
	t.Helper()
	return startInProcWith(t, url, "", nil)
}

// startInProcListen is startInProc serving /metrics, /healthz and /readyz
// on listen.
func startInProcListen(t *testing.T, url, listen string) *inProc {
	t.Helper()
	return startInProcWith(t, url, listen, nil)
}

// startInProcWith is startInProcListen with the run's config adjusted by
// mod.
func startInProcWith(t *testing.T, url, listen string, mod func(*relay.RunConfig)) *inProc {
	t.Helper()
	dsn := pgtest.NewInstalledDB(t)
	p := &inProc{pool: pgtest.Pool(t, dsn), queue: "q", logs: &syncBuffer{}}
	ctx := context.Background()
	if _, err := p.pool.Exec(ctx, `select pgque.create_queue($1)`, p.queue); err != nil {
		t.Fatal(err)
	}
	startTestTicker(t, dsn)
	reg := prometheus.NewRegistry()
	log := slog.New(slog.NewTextHandler(p.logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	obs, err := pgqueprom.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	client, err := pgque.NewClient(p.pool, &pgque.Config{Logger: log, Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	p.metrics, p.reg = relay.NewMetrics(reg), reg
	runCtx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	rc := &relay.RunConfig{
		Client: client,
		Consumer: pgque.PartitionedConsumerConfig{
			Queue: p.queue, Consumer: "c", Slots: 2, WorkerID: inProcWorker, LeaseTTL: 2 * time.Second,
			ClaimInterval: 200 * time.Millisecond, PollInterval: 100 * time.Millisecond,
			RetryDelay: backoff.Policy{Base: 200 * time.Millisecond, Max: time.Second}.Delay,
		},
		Relay: relay.Config{
			URL: url, Timeout: 300 * time.Millisecond, Metrics: p.metrics,
			UnreachableBackoffMin: 50 * time.Millisecond, UnreachableBackoffMax: 400 * time.Millisecond,
		},
		ShutdownTimeout: 10 * time.Second,
		Logger:          log,
		Listen:          listen,
		MetricsHandler:  promhttp.HandlerFor(reg, promhttp.HandlerOpts{}),
	}
	if mod != nil {
		mod(rc)
	}
	slots := rc.Consumer.Slots
	go func() { done <- relay.Run(runCtx, rc) }()
	var once sync.Once
	p.stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("relay.Run: %v", err)
			}
		})
	}
	t.Cleanup(p.stop)
	pgtest.WaitFor(t, 20*time.Second, "every slot owned", func() bool { return p.ownedSlots(t) == slots })
	return p
}

// ownedSlots counts the slots the in-process relay holds, by the server.
func (p *inProc) ownedSlots(t *testing.T) int {
	t.Helper()
	var n int
	if err := p.pool.QueryRow(context.Background(),
		`select count(*) from pgque.partition_slot_leases where queue = $1 and consumer = 'c' and owner = $2`,
		p.queue, inProcWorker).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// waitOwnsBoth waits until the relay owns both slots: it keeps them
// whatever the endpoint does. Waited for rather than read once: on a
// loaded machine a renewal late by more than half the test's 2 s lease
// fences a slot until the next claim pass (200 ms) takes it back, which
// is the pool doing its job, not the relay letting go.
func (p *inProc) waitOwnsBoth(t *testing.T, when string) {
	t.Helper()
	pgtest.WaitFor(t, 10*time.Second, "the relay to own both slots "+when, func() bool { return p.ownedSlots(t) == 2 })
}

// metric reads a counter or gauge from the relay's registry; label is the
// value of its only label ("" for none). Missing series read as 0.
func (p *inProc) metric(t *testing.T, name, label string) float64 {
	t.Helper()
	families, err := p.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			if label != "" && (len(m.GetLabel()) != 1 || m.GetLabel()[0].GetValue() != label) {
				continue
			}
			if c := m.GetCounter(); c != nil {
				return c.GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	return 0
}

// send sends one event per key.
func (p *inProc) send(t *testing.T, keys ...string) {
	t.Helper()
	for _, k := range keys {
		if _, err := p.pool.Exec(context.Background(), `select pgque.send($1, 't', '{}'::jsonb, $2)`, p.queue, k); err != nil {
			t.Fatal(err)
		}
	}
}

// deadLetters counts the queue's dead letters.
func (p *inProc) deadLetters(t *testing.T) int {
	t.Helper()
	var n int
	if err := p.pool.QueryRow(context.Background(), `select count(*) from pgque.dlq_list($1, null, 1000)`, p.queue).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// endpoint is a Go HTTP endpoint whose behaviour the test switches.
type endpoint struct {
	hits      atomic.Int64 // requests to the relay's path
	elsewhere atomic.Int64 // requests to any other path (a followed redirect)
	ok        atomic.Bool  // answer 200 (else the test's failure mode)
	mu        sync.Mutex
	retries   map[string][]string // ev_id -> retry-count headers seen on 200s
	fail      http.HandlerFunc
}

func (e *endpoint) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/in" {
		e.elsewhere.Add(1)
		w.WriteHeader(http.StatusTeapot)
		return
	}
	e.hits.Add(1)
	if !e.ok.Load() {
		e.fail(w, r)
		return
	}
	e.mu.Lock()
	e.retries[r.Header.Get(relay.HeaderEvID)] = append(e.retries[r.Header.Get(relay.HeaderEvID)], r.Header.Get(relay.HeaderRetryCount))
	e.mu.Unlock()
}

func (e *endpoint) delivered() map[string][]string {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make(map[string][]string, len(e.retries))
	for k, v := range e.retries {
		out[k] = v
	}
	return out
}

// serveOn serves h on ln until the test ends.
func serveOn(t *testing.T, ln net.Listener, h http.Handler) {
	t.Helper()
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
}

// attemptsIn counts how much count grows over d.
func attemptsIn(d time.Duration, count func() float64) float64 {
	before := count()
	// A measuring window, not a synchronisation: the callers compare the
	// rate of attempts in it with bounds, whatever the machine's speed.
	time.Sleep(d)
	return count() - before
}

// TestRelayBadEndpoints: an endpoint that is down, redirects in a loop, or
// never answers is logged and counted, retried at a bounded rate (no busy
// loop), the slots stay owned, and delivery recovers once the endpoint
// behaves.
func TestRelayBadEndpoints(t *testing.T) {
	t.Run("unreachable", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close() // nothing listens there now: connection refused
		p := startInProc(t, "http://"+addr+"/in")
		p.send(t, "a", "b", "c", "d")
		unreachable := func() float64 { return p.metric(t, "pgque_relay_unreachable_attempts_total", "connection") }
		pgtest.WaitFor(t, 20*time.Second, "failed connection attempts", func() bool { return unreachable() >= 4 })
		// Four keys wait (one lane each), but only one of them tries the
		// endpoint again per backoff period (400 ms ±20% by then): about 5
		// attempts in 2 s. A busy loop would make thousands, every key on
		// its own schedule about 20.
		if n := attemptsIn(2*time.Second, unreachable); n < 1 || n > 20 {
			t.Errorf("%v connection attempts in 2s, want between 1 and 20 (bounded backoff, still trying)", n)
		}
		if up := p.metric(t, "pgque_relay_endpoint_up", ""); up != 0 {
			t.Errorf("endpoint_up = %v while unreachable, want 0", up)
		}
		p.waitOwnsBoth(t, "during the outage")
		if logs := p.logs.String(); !strings.Contains(logs, "endpoint unreachable") || !strings.Contains(logs, "connection refused") {
			t.Errorf("logs do not say the endpoint is unreachable and why:\n%s", logs)
		}
		// The endpoint comes back on the same address.
		ln, err = net.Listen("tcp", addr)
		if err != nil {
			t.Fatalf("re-listening on %s: %v", addr, err)
		}
		ep := &endpoint{retries: map[string][]string{}}
		ep.ok.Store(true)
		serveOn(t, ln, ep)
		pgtest.WaitFor(t, 20*time.Second, "all four delivered", func() bool { return len(ep.delivered()) == 4 })
		for id, retries := range ep.delivered() {
			if retries[0] != "0" {
				t.Errorf("ev_id %s arrived with retry count %s: the outage was charged to it", id, retries[0])
			}
		}
		pgtest.WaitFor(t, 5*time.Second, "endpoint_up back to 1", func() bool { return p.metric(t, "pgque_relay_endpoint_up", "") == 1 })
		if n := p.deadLetters(t); n != 0 {
			t.Errorf("%d dead letters after an outage, want 0", n)
		}
	})

	t.Run("redirect loop", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ep := &endpoint{retries: map[string][]string{}, fail: func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, "/elsewhere", http.StatusTemporaryRedirect)
		}}
		serveOn(t, ln, ep)
		p := startInProc(t, "http://"+ln.Addr().String()+"/in")
		p.send(t, "a", "b")
		pgtest.WaitFor(t, 20*time.Second, "redirected attempts", func() bool { return ep.hits.Load() >= 3 })
		if n := attemptsIn(2*time.Second, func() float64 { return float64(ep.hits.Load()) }); n < 1 || n > 20 {
			t.Errorf("%v redirected attempts in 2s, want between 1 and 20", n)
		}
		if n := ep.elsewhere.Load(); n != 0 {
			t.Errorf("the redirect was followed %d times, want never", n)
		}
		if got := p.metric(t, "pgque_relay_requests_total", "3xx"); got < 3 {
			t.Errorf("requests_total{class=3xx} = %v, want the redirects counted", got)
		}
		if logs := p.logs.String(); !strings.Contains(logs, "redirects are not followed") {
			t.Errorf("logs do not explain the redirect:\n%s", logs)
		}
		ep.ok.Store(true)
		pgtest.WaitFor(t, 20*time.Second, "both delivered", func() bool { return len(ep.delivered()) == 2 })
		for id, retries := range ep.delivered() {
			if retries[0] != "0" {
				t.Errorf("ev_id %s arrived with retry count %s: the misconfiguration was charged to it", id, retries[0])
			}
		}
		p.waitOwnsBoth(t, "after the endpoint came back")
	})

	t.Run("never answers", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ep := &endpoint{retries: map[string][]string{}, fail: func(w http.ResponseWriter, r *http.Request) {
			<-r.Context().Done() // hangs until the relay gives up
		}}
		serveOn(t, ln, ep)
		p := startInProc(t, "http://"+ln.Addr().String()+"/in")
		p.send(t, "a", "b")
		timeouts := func() float64 { return p.metric(t, "pgque_relay_requests_total", "timeout") }
		pgtest.WaitFor(t, 20*time.Second, "timed-out requests", func() bool { return timeouts() >= 3 })
		// Each attempt takes the 300 ms timeout and is then retried after
		// the consumer's backoff (200 ms doubling): a handful per event.
		if n := attemptsIn(2*time.Second, func() float64 { return float64(ep.hits.Load()) }); n < 1 || n > 14 {
			t.Errorf("%v attempts in 2s at a handler that never answers, want between 1 and 14", n)
		}
		if got := p.metric(t, "pgque_relay_retries_total", "timeout"); got < 3 {
			t.Errorf("retries_total{reason=timeout} = %v, want the timeouts counted", got)
		}
		if logs := p.logs.String(); !strings.Contains(logs, "did not answer within 300ms") {
			t.Errorf("logs do not name the timeout:\n%s", logs)
		}
		p.waitOwnsBoth(t, "while the endpoint never answers")
		ep.ok.Store(true)
		pgtest.WaitFor(t, 20*time.Second, "both delivered", func() bool { return len(ep.delivered()) == 2 })
		if n := p.deadLetters(t); n != 0 {
			t.Errorf("%d dead letters, want 0", n)
		}
	})
}

// TestRelayConfigErrors: a URL the relay cannot use is refused up front
// with an error that names the problem.
func TestRelayConfigErrors(t *testing.T) {
	for _, tc := range []struct{ url, want string }{
		{"ftp://example.com/x", `scheme "ftp" is not http or https`},
		{"", "URL is empty"},
		{"http:///path", "has no host"},
		{"https://user:secret@example.com/", "must not carry credentials"},
		{"example.com/x", `scheme "" is not http or https`},
	} {
		_, err := relay.New(&relay.Config{URL: tc.url, Queue: "q", Consumer: "c"})
		if !errors.Is(err, relay.ErrInvalidConfig) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New(%q) = %v, want ErrInvalidConfig naming %q", tc.url, err, tc.want)
		}
		if err != nil && strings.Contains(err.Error(), "secret") {
			t.Errorf("the error %q shows the password", err)
		}
	}
	for _, h := range []string{"Host", "content-length", "ce-id", "Pgque-Slot", "Idempotency-Key"} {
		_, err := relay.New(&relay.Config{URL: "http://x/", Queue: "q", Consumer: "c", AuthHeader: h, AuthValue: "token"})
		if !errors.Is(err, relay.ErrInvalidConfig) || !strings.Contains(err.Error(), "one the relay or HTTP itself sets") {
			t.Errorf("auth header %q: %v, want ErrInvalidConfig", h, err)
		}
	}
	_, err := relay.New(&relay.Config{URL: "http://x/", Queue: "q", Consumer: "c", AuthValue: "tok\nen"})
	if !errors.Is(err, relay.ErrInvalidConfig) || strings.Contains(err.Error(), "tok") {
		t.Errorf("bad auth value: %v, want ErrInvalidConfig without the value", err)
	}
}

package web

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/pgque/pgque"
	"github.com/pgque/pgque/cmd/pgque/internal/view"
	"github.com/pgque/pgque/internal/testing/pgtest"
)

// TestConsoleShowsRotationBlockers: a transaction left open after subscribe
// holds back the rotation of a due queue; the overview the console serves
// names that session with its pid, role, start and lock.
func TestConsoleShowsRotationBlockers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := pgtest.NewInstalledDB(t)
	client, err := pgque.NewClient(pgtest.Pool(t, dsn), &pgque.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(client.Close)
	if _, err := client.CreateQueue(ctx, "q"); err != nil {
		t.Fatal(err)
	}
	if err := client.SetQueueConfig(ctx, "q", pgque.QueueRotationPeriod(time.Microsecond)); err != nil {
		t.Fatal(err)
	}
	pid := pgtest.HoldTx(t, pgtest.Conn(t, dsn), `select pgque.subscribe('q', 'held')`)
	hs := serveConsole(t, Config{Client: client, SampleInterval: 100 * time.Millisecond})

	var ov overview
	pgtest.WaitFor(t, 10*time.Second, "the held session in the overview", func() bool {
		_, body, _ := do(t, "GET", hs.URL+"/api/overview", nil, "")
		ov = overview{}
		if err := json.Unmarshal([]byte(body), &ov); err != nil {
			t.Fatal(err)
		}
		for _, b := range ov.Blockers {
			if b.Kind == pgque.BlockerSession && b.PID != nil && *b.PID == pid && b.Role != nil && b.Since != nil && b.Holds != nil {
				return true
			}
		}
		return false
	})
}

// TestConsoleOverviewAsProducer: a producer's login may not read blocked
// keys (nor rotation blockers); the console's overview still answers, with
// its queues, instead of 403 on every refresh.
func TestConsoleOverviewAsProducer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := pgtest.NewInstalledDB(t)
	admin := pgtest.Conn(t, dsn)
	role := "console_producer_" + strconv.FormatInt(time.Now().UnixNano(), 36)
	for _, s := range []string{"create role " + role + " login in role pgque_writer", "select pgque.create_queue('q')",
		"select pgque.subscribe_slot('q', 'c', s, 2, 'pause') from generate_series(0, 1) s"} {
		if _, err := admin.Exec(ctx, s); err != nil {
			t.Fatal(s, err)
		}
	}
	t.Cleanup(func() { _, _ = admin.Exec(context.Background(), "drop role "+role) })
	client, err := pgque.NewClient(pgtest.Pool(t, pgtest.DSNWith(dsn, "user", role)), &pgque.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(client.Close)
	hs := serveConsole(t, Config{Client: client, SampleInterval: 100 * time.Millisecond})

	code, body, _ := do(t, "GET", hs.URL+"/api/overview", nil, "")
	var ov overview
	if err := json.Unmarshal([]byte(body), &ov); code != 200 || err != nil {
		t.Fatalf("overview as a producer: %d %s (%v)", code, body, err)
	}
	if len(ov.Queues) != 1 || ov.Queues[0].Name != "q" {
		t.Errorf("overview as a producer: queues %+v, want q", ov.Queues)
	}
}

// serveConsole runs a console with cfg (its logger discarding, its host
// 127.0.0.1) until the test ends.
func serveConsole(t *testing.T, cfg Config) *httptest.Server {
	t.Helper()
	cfg.Logger, cfg.AllowedHosts = slog.New(slog.DiscardHandler), []string{"127.0.0.1"}
	srv, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); srv.Run(runCtx) }()
	hs := httptest.NewServer(srv)
	t.Cleanup(func() { hs.Close(); cancel(); <-done })
	return hs
}

// TestConsoleCutsLargePayloads: the dead letters page gets at most
// ConsolePayloadMax bytes of each payload, saying how long it is, and
// small payloads whole.
func TestConsoleCutsLargePayloads(t *testing.T) {
	big := `{"pad":"` + strings.Repeat("x", 3*ConsolePayloadMax) + `"}`
	d := view.DeadLetter{Payload: json.RawMessage(big)}
	cutPayload(&d)
	if d.Payload != nil || d.PayloadText == nil || len(*d.PayloadText) > ConsolePayloadMax+200 ||
		!strings.Contains(*d.PayloadText, strconv.Itoa(len(big))+" bytes in all") {
		t.Errorf("a %d-byte payload: payload %d bytes, text %v", len(big), len(d.Payload), d.PayloadText != nil)
	}
	text := strings.Repeat("é", ConsolePayloadMax) // cut inside a character
	d = view.DeadLetter{PayloadText: &text}
	cutPayload(&d)
	if !utf8.ValidString(*d.PayloadText) || len(*d.PayloadText) > ConsolePayloadMax+200 {
		t.Errorf("a long text payload was cut to %d bytes (valid UTF-8: %v)", len(*d.PayloadText), utf8.ValidString(*d.PayloadText))
	}
	small := view.DeadLetter{Payload: json.RawMessage(`{"a":1}`)}
	cutPayload(&small)
	if string(small.Payload) != `{"a":1}` || small.PayloadText != nil {
		t.Errorf("a small payload changed: %s %v", small.Payload, small.PayloadText)
	}
}

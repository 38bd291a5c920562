package cli

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/pgque/pgque"
	"github.com/pgque/pgque/cmd/pgque/internal/keyview"
	"github.com/pgque/pgque/cmd/pgque/internal/web"
	"github.com/pgque/pgque/internal/testing/pgtest"
)

// TestKeysCommand: keys lists a consumer's keys with their pending heads,
// oldest first, the hottest keys, and warns about a slot that one key
// dominates; bad flags are usage errors.
func TestKeysCommand(t *testing.T) {
	t.Parallel()
	c := &cli{t: t, dsn: pgtest.NewInstalledDB(t)}
	c.ok("", "queue", "create", "q")
	c.ok("", "slots", "subscribe", "q", "--consumer", "p", "--slots", "2")
	old := evIDs(t, c.ok("{\"n\":0}\n", "send", "q", "--key", "quiet"))
	c.ok(strings.Repeat("{\"n\":1}\n", 150), "send", "q", "--key", "busy")

	var r keyview.Report
	c.okJSON(&r, "keys", "q", "--consumer", "p", "--json")
	if len(r.Heads) != 2 || *r.Heads[0].Key != "quiet" || r.Heads[0].HeadID != old[0] || r.Heads[0].State != "flowing" ||
		*r.Heads[1].Key != "busy" || r.Heads[1].Pending != 150 || r.Heads[0].Slot != c.slotOf("quiet", 2) {
		t.Fatalf("keys --json heads = %+v, want quiet (1 event, oldest) then busy (9)", r.Heads)
	}
	if len(r.Hot) != 2 || *r.Hot[0].Key != "busy" || r.Hot[0].Events != 150 {
		t.Errorf("keys --json hot = %+v, want busy first with 150 events", r.Hot)
	}
	busySlot := c.slotOf("busy", 2)
	// Whether or not quiet shares busy's slot, busy holds most of it (150
	// of 150 or of 151); a slot with one pending event is not hot.
	if len(r.Warnings) != 1 || !strings.Contains(r.Warnings[0], `key "busy"`) {
		t.Errorf("keys --json warnings = %q, want one naming busy", r.Warnings)
	}
	for _, s := range r.Shares {
		if s.Hot != (s.Slot == busySlot) {
			t.Errorf("slot %d hot = %v", s.Slot, s.Hot)
		}
	}
	out := c.ok("", "keys", "q", "--consumer", "p")
	for _, want := range []string{"Oldest pending heads", `"quiet"`, "flowing", "Hottest keys", `"busy"`, "WARNING: slot"} {
		if !strings.Contains(out, want) {
			t.Errorf("keys printed no %q:\n%s", want, out)
		}
	}
	if out := c.ok("", "keys", "q", "--consumer", "p", "--slot", "0", "--hot-share", "1", "--json"); strings.Contains(out, "holds") {
		t.Errorf("keys with --hot-share 1 warned:\n%s", out)
	}
	var st statusReport
	c.okJSON(&st, "status", "--json")
	if w := strings.Join(st.Warnings, "\n"); !strings.Contains(w, `hot key "busy" holds`) {
		t.Errorf("status warnings = %q, want the hot key busy", st.Warnings)
	}
	checkOneLine(t, nil, c.exec("", "keys", "q", "--consumer", "p", "--hot-share", "2"), ExitUsage, "--hot-share")
	checkOneLine(t, nil, c.exec("", "keys", "q", "--consumer", "nope"), ExitFailure, "no slots")
	checkOneLine(t, nil, c.exec("", "keys", "q", "--consumer", "p", "--slot", "7"), ExitFailure, "slot must be between")
}

// TestWebCommandFlags: pgque web refuses a bad --listen and a short
// action token before it serves anything. Not parallel: it sets the
// environment.
func TestWebCommandFlags(t *testing.T) {
	c := &cli{t: t, dsn: pgtest.NewInstalledDB(t)}
	checkOneLine(t, nil, c.exec("", "web", "--listen", "no-port"), ExitUsage, "--listen")
	t.Setenv(EnvWebToken, "short")
	checkOneLine(t, nil, c.exec("", "web", "--listen", "127.0.0.1:0", "--allow-actions"), ExitUsage, "token of at least 16")
}

// serveWeb serves the console until its context ends, then shuts down
// cleanly (nil error, sampler stopped).
func TestServeWeb(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewInstalledDB(t)
	pool := pgtest.Pool(t, dsn)
	client, err := pgque.NewClient(pool, &pgque.Config{Logger: slog.New(slog.DiscardHandler), PollOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := web.New(web.Config{Client: client, Logger: slog.New(slog.DiscardHandler),
		AllowedHosts: defaultWebHosts("127.0.0.1")})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serveWeb(ctx, ln, srv) }()
	resp, err := http.Get("http://" + ln.Addr().String() + "/api/overview")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Security-Policy") == "" {
		t.Errorf("GET /api/overview: %d, CSP %q", resp.StatusCode, resp.Header.Get("Content-Security-Policy"))
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("serveWeb after cancel: %v", err)
	}
}

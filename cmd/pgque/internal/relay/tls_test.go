package relay_test

import (
	"bytes"
	"context"
	"encoding/pem"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pgque/pgque"
	"github.com/pgque/pgque/cmd/pgque/internal/relay"
)

// TestHandleTLS: an https endpoint is verified against --ca-file; without
// it the certificate is refused (an unreachable endpoint: the event is not
// charged); --insecure-skip-verify connects and warns.
func TestHandleTLS(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))
	defer srv.Close()
	ca := filepath.Join(t.TempDir(), "ca.pem")
	pemBytes := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	if err := os.WriteFile(ca, pemBytes, 0o600); err != nil {
		t.Fatal(err)
	}
	newR := func(mod func(*relay.Config)) (*relay.Relay, *bytes.Buffer) {
		var logs bytes.Buffer
		cfg := relay.Config{URL: srv.URL + "/in", Queue: "q", Consumer: "c", Timeout: 15 * time.Second, // a handshake on a loaded machine under -race can take seconds
			UnreachableBackoffMin: 10 * time.Millisecond, UnreachableBackoffMax: 20 * time.Millisecond,
			Logger: slog.New(slog.NewTextHandler(&logs, nil))}
		mod(&cfg)
		r, err := relay.New(&cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(r.Close)
		return r, &logs
	}

	r, _ := newR(func(c *relay.Config) { c.CAFile = ca })
	if err := r.Handle(context.Background(), message()); err != nil {
		t.Errorf("with the CA file: %v", err)
	}

	r, logs := newR(func(*relay.Config) {})
	r.BeginStop() // give up after the first refused attempt
	err := r.Handle(context.Background(), message())
	if d, ok := pgque.RetryDelayOf(err); err == nil || !ok || d != 0 {
		t.Errorf("untrusted certificate: Handle = %v, want the event handed back uncharged", err)
	}
	if !strings.Contains(logs.String(), "certificate") {
		t.Errorf("the log does not name the certificate problem:\n%s", logs)
	}

	r, logs = newR(func(c *relay.Config) { c.InsecureSkipVerify = true })
	if !strings.Contains(logs.String(), "verification is OFF") {
		t.Errorf("no warning about --insecure-skip-verify:\n%s", logs)
	}
	if err := r.Handle(context.Background(), message()); err != nil {
		t.Errorf("with verification off: %v", err)
	}

	if _, err := relay.New(&relay.Config{URL: srv.URL, Queue: "q", Consumer: "c", CAFile: filepath.Join(t.TempDir(), "none.pem")}); err == nil {
		t.Error("a missing CA file was accepted")
	}
}

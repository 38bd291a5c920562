package cli

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pgque/pgque/internal/testing/pgtest"
)

// TestRelayCommand: the relay takes its settings from PGQUE_RELAY_*
// variables, sends the auth header from the environment without ever
// printing it, delivers, and stops cleanly on cancellation (SIGTERM).
func TestRelayCommand(t *testing.T) {
	c := setup(t)
	c.ok("", "install")
	c.ok("", "queue", "create", "jobs")
	var mu sync.Mutex
	var auth []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		auth = append(auth, r.Header.Get("Authorization"))
	}))
	defer srv.Close()
	const secret = "Bearer tok-9f1c-secret"
	t.Setenv("PGQUE_RELAY_TO", srv.URL+"/hook")
	t.Setenv("PGQUE_RELAY_QUEUE", "jobs")
	t.Setenv("PGQUE_RELAY_CONSUMER", "hooks")
	t.Setenv("PGQUE_RELAY_SLOTS", "2")
	t.Setenv("PGQUE_RELAY_TICKER", "true")
	t.Setenv("PGQUE_RELAY_AUTH", secret)
	b := c.background("relay")
	conn := c.conn()
	// The relay subscribes when it starts: send once its slots exist.
	pgtest.WaitFor(t, 20*time.Second, "the relay's slots", func() bool {
		var n int
		_ = conn.QueryRow(context.Background(), `select count(*) from pgque.partition_slot_leases where queue = 'jobs' and owner is not null`).Scan(&n)
		return n == 2
	})
	if _, err := conn.Exec(context.Background(), `select pgque.send('jobs', 't', '{"x": 1}'::jsonb, 'k')`); err != nil {
		t.Fatal(err)
	}
	pgtest.WaitFor(t, 20*time.Second, "the delivery", func() bool { mu.Lock(); defer mu.Unlock(); return len(auth) > 0 })
	r := b.stop()
	if r.code != 0 || !strings.Contains(r.stderr, "pgque relay: stopped") {
		t.Errorf("relay did not stop cleanly: %v", r)
	}
	mu.Lock()
	if auth[0] != secret {
		t.Errorf("Authorization = %q, want the value of PGQUE_RELAY_AUTH", auth[0])
	}
	mu.Unlock()
	if strings.Contains(r.stderr+r.stdout, "tok-9f1c") {
		t.Errorf("the auth value was printed:\n%v", r)
	}
}

// TestRelayUsageErrors: bad settings exit 2 with a message naming them.
func TestRelayUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{args: []string{"relay", "--queue", "q", "--consumer", "c", "--slots", "2", "--to", "ftp://x/"}, want: `scheme "ftp" is not http or https`},
		{args: []string{"relay", "--queue", "q", "--consumer", "c", "--slots", "2"}, want: "endpoint URL is empty"},
		{args: []string{"relay", "--consumer", "c", "--slots", "2", "--to", "http://x/"}, want: "--queue is required"},
		{args: []string{"relay", "--queue", "q", "--consumer", "c", "--to", "http://x/"}, want: "--slots must be at least 1"},
		{args: []string{"relay", "--queue", "q", "--consumer", "c", "--slots", "2", "--to", "http://x/", "--policy", "wait"}, want: "--policy must be skip or pause"},
		{args: []string{"relay", "--queue", "q", "--consumer", "c", "--to", "http://x/"}, env: map[string]string{"PGQUE_RELAY_SLOTS": "many"}, want: "$PGQUE_RELAY_SLOTS"},
	} {
		for k, v := range tc.env {
			t.Setenv(k, v)
		}
		r := execIn(context.Background(), nil, "", append(tc.args, "--dsn", "postgres://127.0.0.1:1/none")...)
		if r.code != ExitUsage || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("pgque %s: want exit 2 naming %q, got %v", strings.Join(tc.args, " "), tc.want, r)
		}
		for k := range tc.env {
			t.Setenv(k, "")
		}
	}
}

package cli

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pgque/pgque/internal/testing/pgtest"
)

// TestStatusNamesRotationBlockers: a transaction left open after subscribe
// holds back the rotation of a due queue; status names that session (pid,
// role, since when, the lock) in its JSON, its table and its warnings.
func TestStatusNamesRotationBlockers(t *testing.T) {
	t.Parallel()
	c := setup(t)
	c.ok("", "install")
	c.ok("", "queue", "create", "q", "--set", "rotation_period=1 microsecond")
	pid := pgtest.HoldTx(t, pgtest.Conn(t, c.dsn), `select pgque.subscribe('q', 'held')`)

	var st statusReport
	c.okJSON(&st, "status", "--json")
	found := false
	for _, b := range st.Blockers {
		found = found || b.Kind == "session" && b.Queue != nil && *b.Queue == "q" && b.PID != nil && *b.PID == pid &&
			b.Role != nil && b.Since != nil && b.Holds != nil
	}
	if !found {
		t.Errorf("status --json rotation_blockers = %+v, want session pid %d with its role, start and lock", st.Blockers, pid)
	}
	if !strings.Contains(strings.Join(st.Warnings, "\n"), "pid "+strconv.Itoa(pid)+",") {
		t.Errorf("status warnings %q do not name pid %d", st.Warnings, pid)
	}
	if out := c.ok("", "status"); !strings.Contains(out, "ROTATION BLOCKERS") || !strings.Contains(out, strconv.Itoa(pid)) {
		t.Errorf("status printed %q, want the blocker table with pid %d", out, pid)
	}
}

// TestStatusAsProducer: blocked_keys and rotation_blockers are for readers
// and admins; a producer's login still gets the status of its queues, with
// both left out (null in the JSON) instead of a permission error.
func TestStatusAsProducer(t *testing.T) {
	t.Parallel()
	c := setup(t)
	c.ok("", "install")
	c.ok("", "queue", "create", "q")
	c.ok("", "slots", "subscribe", "q", "--consumer", "c", "--slots", "2", "--policy", "pause")
	role := "producer_" + strconv.FormatInt(time.Now().UnixNano(), 36)
	conn := pgtest.Conn(t, c.dsn)
	if _, err := conn.Exec(context.Background(), "create role "+role+" login in role pgque_writer"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = conn.Exec(context.Background(), "drop role "+role) })
	w := &cli{t: t, dsn: pgtest.DSNWith(c.dsn, "user", role)}
	var st statusReport
	w.okJSON(&st, "status", "--json")
	if len(st.Queues) != 1 || st.Queues[0].Name != "q" || st.Blocked != nil || st.Blockers != nil {
		t.Errorf("status --json as a producer: queues %+v, blocked_keys %v, rotation_blockers %v; want q, null, null",
			st.Queues, st.Blocked, st.Blockers)
	}
	if out := w.ok("", "status"); !strings.Contains(out, "q") {
		t.Errorf("status as a producer printed %q", out)
	}
}

package cli

import (
	"strconv"
	"strings"
	"testing"

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

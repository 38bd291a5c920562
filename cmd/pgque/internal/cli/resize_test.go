package cli

import (
	"context"
	"strings"
	"testing"

	"github.com/pgque/pgque/internal/testing/pgtest"
)

// TestSlotsResizeCommand: slots resize starts a resize that status shows
// with its phase and a warning while the old slots drain; a second resize
// and one of an unknown consumer fail cleanly; once the old slots were
// received up to the seal, status shows it done with the new N.
func TestSlotsResizeCommand(t *testing.T) {
	t.Parallel()
	c := &cli{t: t, dsn: pgtest.NewInstalledDB(t)}
	ctx := context.Background()
	c.ok("", "queue", "create", "q")
	c.ok("", "slots", "subscribe", "q", "--consumer", "c", "--slots", "2")
	if out := c.ok("", "slots", "resize", "q", "--consumer", "c", "--to", "4"); !strings.Contains(out, "resizing c on queue q to 4 slots") {
		t.Errorf("slots resize printed %q", out)
	}
	checkOneLine(t, nil, c.exec("", "slots", "resize", "q", "--consumer", "c", "--to", "8"), ExitFailure, "already being resized")
	checkOneLine(t, nil, c.exec("", "slots", "resize", "q", "--consumer", "nobody", "--to", "8"), ExitFailure, "has no slots")
	checkOneLine(t, nil, c.exec("", "slots", "resize", "q", "--consumer", "c", "--to", "0"), ExitUsage, "--to must be between")

	var st statusReport
	c.okJSON(&st, "status", "--json")
	if len(st.Resizes) != 1 || st.Resizes[0].Phase != "draining" || st.Resizes[0].NSlots != 2 || st.Resizes[0].To != 4 {
		t.Fatalf("status --json resizes = %+v, want one draining 2 -> 4", st.Resizes)
	}
	if !strings.Contains(strings.Join(st.Warnings, "\n"), "resize 2 -> 4 slots draining") {
		t.Errorf("status warnings %q do not name the resize", st.Warnings)
	}
	if out := c.ok("", "status"); !strings.Contains(out, "RESIZES") || !strings.Contains(out, "2 -> 4") {
		t.Errorf("status printed %q", out)
	}

	// Work the old slots up to the seal: their empty receives cut over.
	conn := c.conn()
	for slot := range 2 {
		var token string
		if err := conn.QueryRow(ctx, `select token::text from pgque.claim_slot('q', 'c', $1, 'w')`, slot).Scan(&token); err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Exec(ctx, `select count(*) from pgque.receive_partitioned('q', 'c', $1, 2, 'w', $2::uuid)`, slot, token); err != nil {
			t.Fatal(err)
		}
	}
	c.okJSON(&st, "status", "--json")
	if len(st.Resizes) != 1 || st.Resizes[0].Phase != "done" || st.Resizes[0].NSlots != 4 || st.Resizes[0].Finished == nil {
		t.Fatalf("after the old slots drained, status --json resizes = %+v, want done with 4 slots", st.Resizes)
	}
	if len(st.Slots) != 4 {
		t.Errorf("status shows %d slots, want the 4 new ones", len(st.Slots))
	}
	// With nobody working the slots, --wait gives up and says so.
	r := c.exec("", "slots", "resize", "q", "--consumer", "c", "--to", "3", "--wait", "--timeout", "1s")
	if r.code != ExitFailure || !strings.Contains(r.stderr, "waiting for the resize of c to 3 slots") {
		t.Errorf("slots resize --wait with no workers: %v, stderr %q", r, r.stderr)
	}
}

package cli

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/pgque/pgque/internal/testing/pgtest"
)

// TestPauseCommands: a consumer subscribed with --policy pause; a failed
// head blocks its key, which slots blocked and status show; unblock
// dead-letters the head; the policy can be changed, but not by
// re-subscribing with another one.
func TestPauseCommands(t *testing.T) {
	t.Parallel()
	c := &cli{t: t, dsn: pgtest.NewInstalledDB(t)}
	ctx := context.Background()
	c.ok("", "queue", "create", "q")
	c.ok("", "slots", "subscribe", "q", "--consumer", "p", "--slots", "2", "--policy", "pause")
	checkOneLine(t, nil, c.exec("", "slots", "subscribe", "q", "--consumer", "p", "--slots", "2", "--policy", "skip"), ExitFailure, "use set_failure_policy")
	checkOneLine(t, nil, c.exec("", "slots", "subscribe", "q", "--consumer", "p", "--slots", "2", "--policy", "stop"), ExitUsage, "must be skip or pause")
	c.ok("", "slots", "policy", "q", "skip", "--consumer", "p")
	if out := c.ok("", "slots", "policy", "q", "pause", "--consumer", "p"); !strings.Contains(out, "now has failure policy pause") {
		t.Errorf("slots policy printed %q", out)
	}

	ids := evIDs(t, c.ok("{\"n\":1}\n{\"n\":2}\n", "send", "q", "--key", "k"))
	slot := c.slotOf("k", 2)
	conn := c.conn()
	_, err := conn.Exec(ctx, `select pgque.force_next_tick('q'); select pgque.ticker('q')`)
	var token string
	var epoch, batch, first int64
	if err == nil {
		err = conn.QueryRow(ctx, `select token::text from pgque.claim_slot('q', 'p', $1, 'w')`, slot).Scan(&token)
	}
	if err == nil {
		err = conn.QueryRow(ctx, `select epoch, batch_id, msg_id from pgque.receive_partitioned('q', 'p', $1, 2, 'w', $2::uuid) limit 1`,
			slot, token).Scan(&epoch, &batch, &first)
	}
	if err == nil {
		_, err = conn.Exec(ctx, `select pgque.nack_partitioned('q', 'p', $1, 2, 'w', $2::uuid, $3, '1 hour', 'disk full')`, slot, token, ids[0])
	}
	if err == nil {
		_, err = conn.Exec(ctx, `select pgque.ack_partitioned('q', 'p', $1, 2, 'w', $2::uuid, $3, $4, $5)`, slot, token, epoch, batch, first)
	}
	if err != nil {
		t.Fatal(err)
	}

	var blocked []blockedKey
	c.okJSON(&blocked, "slots", "blocked", "q", "--json")
	if len(blocked) != 1 || *blocked[0].Key != "k" || blocked[0].HeadEvID != ids[0] || blocked[0].Slot != slot ||
		blocked[0].State != "blocked" || blocked[0].Deferred != 1 || *blocked[0].Reason != "disk full" {
		t.Fatalf("slots blocked --json = %+v, want key k blocked at event %d with 1 deferred", blocked, ids[0])
	}
	if out := c.ok("", "slots", "blocked", "q"); !strings.Contains(out, `"k"`) || !strings.Contains(out, "disk full") {
		t.Errorf("slots blocked printed %q", out)
	}
	var st statusReport
	c.okJSON(&st, "status", "--json")
	if len(st.Blocked) != 1 || !strings.Contains(strings.Join(st.Warnings, "\n"), `key "k" blocked`) {
		t.Errorf("status --json: blocked %+v, warnings %q", st.Blocked, st.Warnings)
	}
	// The blocked key's failed head and the event deferred behind it are
	// the queue's backlog and the slot's lag, with the blocked key beside.
	if len(st.Queues) != 1 || st.Queues[0].Pending != 2 {
		t.Errorf("status --json: queues %+v, want q with 2 pending", st.Queues)
	}
	for _, sl := range st.Slots {
		if sl.Slot == slot && (sl.Lag != 2 || sl.BlockedKeys != 1 || sl.OldestPendingSeconds <= 0) {
			t.Errorf("status --json: slot %+v, want lag 2, 1 blocked key, an oldest pending age", sl)
		}
	}
	if out := c.ok("", "slots", "status", "q"); !strings.Contains(out, "BLOCKED") {
		t.Errorf("slots status printed no BLOCKED column: %q", out)
	}

	checkOneLine(t, nil, c.exec("", "slots", "unblock", "q", "--consumer", "p"), ExitUsage, "--key")
	if out := c.ok("", "slots", "unblock", "q", "--consumer", "p", "--key", "k"); !strings.Contains(out, "dead-lettered event "+strconv.FormatInt(ids[0], 10)) {
		t.Errorf("slots unblock printed %q", out)
	}
	var dls []deadLetter
	c.okJSON(&dls, "dlq", "list", "q", "--json")
	if len(dls) != 1 || dls[0].EvID != ids[0] || dls[0].Consumer != "p" || dls[0].Slot == nil || *dls[0].Slot != slot ||
		dls[0].Subscription != "p#"+strconv.Itoa(slot)+"/2" {
		t.Errorf("dlq list after unblock = %+v", dls)
	}
	// The consumer's name selects its slots' dead letters, and the payload
	// comes back as JSON.
	var raw []map[string]any
	c.okJSON(&raw, "dlq", "list", "q", "--consumer", "p", "--json")
	if len(raw) != 1 || raw[0]["payload"].(map[string]any)["n"] != float64(1) {
		t.Errorf("dlq list --consumer p --json = %+v, want the dead letter with its payload as JSON", raw)
	}
	if out := c.ok("", "dlq", "list", "q", "--consumer", "p"); !strings.Contains(out, `{"n":1}`) || !strings.Contains(out, "SLOT") {
		t.Errorf("dlq list --consumer p printed %q", out)
	}
	// The key now releases its deferred event: no retry to hurry.
	if out := c.ok("", "slots", "retry-now", "q", "--consumer", "p", "--key", "k"); !strings.Contains(out, "no pending retry") {
		t.Errorf("slots retry-now printed %q", out)
	}
	checkOneLine(t, nil, c.exec("", "slots", "retry-now", "q", "--consumer", "p", "--key", "other"), ExitFailure, "is not blocked")
	if out := c.ok("", "dlq", "replay", "q", "--all", "--consumer", "p"); !strings.Contains(out, "replayed dead letter "+strconv.FormatInt(dls[0].ID, 10)) {
		t.Errorf("dlq replay --all --consumer p printed %q", out)
	}
	c.okJSON(&dls, "dlq", "list", "q", "--json")
	if len(dls) != 0 {
		t.Errorf("dlq list after replaying p's dead letters = %+v", dls)
	}
}

package cli

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/pgque/pgque/internal/testing/pgtest"
)

// TestDLQReplayWarnsOutOfOrder: consumer w is handed events a and b of
// key k, c of key j and d, e of key m; it dead-letters a, c, d and e and
// acknowledges b. Replaying a, which now comes after b, warns on stderr;
// replaying c, whose key had nothing later, does not, nor does replaying
// d, whose later event e is a dead letter too, replayed after it. tail
// shows them back, marked as replays.
func TestDLQReplayWarnsOutOfOrder(t *testing.T) {
	t.Parallel()
	c := &cli{t: t, dsn: pgtest.NewInstalledDB(t)}
	ctx := context.Background()
	c.ok("", "queue", "create", "q")
	c.ok("", "subscribe", "q", "w")
	a := evIDs(t, c.ok("{\"n\":1}\n{\"n\":2}\n", "send", "q", "--type", "t", "--key", "k"))
	j := evIDs(t, c.ok("{\"n\":3}\n", "send", "q", "--type", "t", "--key", "j"))
	m := evIDs(t, c.ok("{\"n\":4}\n{\"n\":5}\n", "send", "q", "--type", "t", "--key", "m"))
	conn := c.conn()
	var batch int64
	_, err := conn.Exec(ctx, `select pgque.force_next_tick('q'); select pgque.ticker('q')`)
	if err == nil {
		err = conn.QueryRow(ctx, `select max(batch_id) from pgque.receive('q', 'w', 10)`).Scan(&batch)
	}
	for _, id := range []int64{a[0], j[0], m[0], m[1]} {
		if err == nil {
			_, err = conn.Exec(ctx, `select pgque.nack($1, $2, null, 'gone')`, batch, id)
		}
	}
	if err == nil {
		_, err = conn.Exec(ctx, `select pgque.ack($1)`, batch)
	}
	if err != nil {
		t.Fatal(err)
	}
	var dls []deadLetter
	c.okJSON(&dls, "dlq", "list", "q", "--json")
	if len(dls) != 4 || dls[0].EvID != a[0] || dls[1].EvID != j[0] || dls[2].EvID != m[0] || dls[3].EvID != m[1] {
		t.Fatalf("dlq list --json = %+v, want events %d, %d and %v", dls, a[0], j[0], m)
	}

	r := c.exec("", "dlq", "replay", "q", strconv.FormatInt(dls[0].ID, 10))
	if r.code != 0 || !strings.Contains(r.stdout, "as event "+strconv.FormatInt(a[0], 10)) ||
		!strings.Contains(r.stderr, "warning: dead letter "+strconv.FormatInt(dls[0].ID, 10)) ||
		!strings.Contains(r.stderr, `key "k"`) || !strings.Contains(r.stderr, "after 1 later event") {
		t.Errorf("replaying a dead letter whose key's later event was delivered: %v", r)
	}
	r = c.exec("", "dlq", "replay", "q", strconv.FormatInt(dls[1].ID, 10))
	if r.code != 0 || !strings.Contains(r.stdout, "as event "+strconv.FormatInt(j[0], 10)) || r.stderr != "" {
		t.Errorf("replaying a dead letter with nothing later of its key: %v", r)
	}
	r = c.exec("", "dlq", "replay", "q", "--all")
	if r.code != 0 || !strings.Contains(r.stdout, "as event "+strconv.FormatInt(m[1], 10)) || r.stderr != "" {
		t.Errorf("replaying a key's dead letters in order: %v", r)
	}
	if _, err := conn.Exec(ctx, `select pgque.force_next_tick('q'); select pgque.ticker('q')`); err != nil {
		t.Fatal(err)
	}
	got := tailEvents(t, c.ok("", "tail", "q", "--consumer", "w", "--json", "--max", "4", "--timeout", "30s"))
	want := []int64{a[0], j[0], m[0], m[1]}
	for i, ev := range got {
		if len(got) != len(want) || ev.EvID != want[i] || !ev.Replay || ev.RetryCount != 0 {
			t.Fatalf("tail after the replays = %+v, want events %v marked as replays", got, want)
		}
	}
	if len(got) != len(want) {
		t.Fatalf("tail after the replays = %+v, want events %v", got, want)
	}
}

package cli

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/pgque/pgque/internal/pgtest"
)

// TestDLQReplayWarnsOutOfOrder: consumer w is handed events a and b of
// key k and c of key j, dead-letters a and c and acknowledges b. Replaying
// a, which now comes after b, warns on stderr; replaying c, whose key had
// nothing later, does not. tail shows both back, marked as replays.
func TestDLQReplayWarnsOutOfOrder(t *testing.T) {
	t.Parallel()
	c := &cli{t: t, dsn: pgtest.NewInstalledDB(t)}
	ctx := context.Background()
	c.ok("", "queue", "create", "q")
	c.ok("", "subscribe", "q", "w")
	a := evIDs(t, c.ok("{\"n\":1}\n{\"n\":2}\n", "send", "q", "--type", "t", "--key", "k"))
	j := evIDs(t, c.ok("{\"n\":3}\n", "send", "q", "--type", "t", "--key", "j"))
	conn := c.conn()
	var batch int64
	_, err := conn.Exec(ctx, `select pgque.force_next_tick('q'); select pgque.ticker('q')`)
	if err == nil {
		err = conn.QueryRow(ctx, `select max(batch_id) from pgque.receive('q', 'w', 10)`).Scan(&batch)
	}
	for _, id := range []int64{a[0], j[0]} {
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
	if len(dls) != 2 || dls[0].EvID != a[0] || dls[1].EvID != j[0] {
		t.Fatalf("dlq list --json = %+v, want events %d and %d", dls, a[0], j[0])
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
	if _, err := conn.Exec(ctx, `select pgque.force_next_tick('q'); select pgque.ticker('q')`); err != nil {
		t.Fatal(err)
	}
	got := tailEvents(t, c.ok("", "tail", "q", "--consumer", "w", "--json", "--max", "2", "--timeout", "30s"))
	if len(got) != 2 || got[0].EvID != a[0] || got[1].EvID != j[0] || !got[0].Replay || !got[1].Replay || got[0].RetryCount != 0 {
		t.Errorf("tail after the replays = %+v, want events %d and %d marked as replays", got, a[0], j[0])
	}
}

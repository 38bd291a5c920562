package cli

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
)

// TestSendMixedTypesCLI: an envelope stream of several types is sent in
// one transaction, in input order, each event with its own type (the
// --type flag for lines without one).
func TestSendMixedTypesCLI(t *testing.T) {
	t.Parallel()
	c := setup(t)
	c.ok("", "install")
	c.ok("", "queue", "create", "files")
	ids := evIDs(t, c.ok(`{"type": "FileCreated", "key": "t1", "payload": {"n": 1}}
{"type": "FileOverwritten", "key": "t1", "payload": {"n": 2}}
{"key": "t2", "payload": {"n": 3}}
{"type": "FileCreated", "key": "t2", "payload": {"n": 4}}
`, "send", "files", "--envelope", "--type", "FileDeleted"))
	rows, err := c.conn().Query(context.Background(),
		`select ev_id, ev_type, ev_extra1, ev_txid::text from pgque.event order by ev_id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var got []string
	txids := map[string]bool{}
	for rows.Next() {
		var id int64
		var typ, key, txid string
		if err := rows.Scan(&id, &typ, &key, &txid); err != nil {
			t.Fatal(err)
		}
		got = append(got, fmt.Sprintf("%d %s %s", id, typ, key))
		txids[txid] = true
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	want := []string{
		fmt.Sprintf("%d FileCreated t1", ids[0]), fmt.Sprintf("%d FileOverwritten t1", ids[1]),
		fmt.Sprintf("%d FileDeleted t2", ids[2]), fmt.Sprintf("%d FileCreated t2", ids[3]),
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("stored %v, want %v", got, want)
	}
	if len(txids) != 1 {
		t.Errorf("events stored by %d transactions, want 1", len(txids))
	}
}

// TestSlotsSubscribeFromOldest: slots subscribe --from-oldest on a queue
// whose other consumer was subscribed before the sends starts the new slots
// there and says how many earlier events they get; without the flag they
// get none.
func TestSlotsSubscribeFromOldest(t *testing.T) {
	t.Parallel()
	c := setup(t)
	c.ok("", "install")
	c.ok("", "queue", "create", "q")
	c.ok("", "subscribe", "q", "archive")
	c.ok("{\"n\":1}\n{\"n\":2}\n", "send", "q", "--key", "k")
	if _, err := c.conn().Exec(context.Background(), `select pgque.force_next_tick('q'); select pgque.ticker('q')`); err != nil {
		t.Fatal(err)
	}
	if out := c.ok("", "slots", "subscribe", "q", "--consumer", "old", "--slots", "2", "--from-oldest"); !strings.Contains(out, "(2 new), from the oldest kept event (") {
		t.Errorf("slots subscribe --from-oldest printed %q", out)
	}
	if out := c.ok("", "slots", "subscribe", "q", "--consumer", "old", "--slots", "2", "--from-oldest"); !strings.Contains(out, "(0 new)") {
		t.Errorf("slots subscribe --from-oldest again printed %q", out)
	}
	var before []int64
	for _, consumer := range []string{"old", "new"} {
		if consumer == "new" {
			c.ok("", "slots", "subscribe", "q", "--consumer", "new", "--slots", "2")
		}
		var n int64
		if err := c.conn().QueryRow(context.Background(), `select pgque.events_before_subscription('q', $1)`, consumer).Scan(&n); err != nil {
			t.Fatal(err)
		}
		before = append(before, n)
	}
	if before[0] != 0 || before[1] != 2 {
		t.Errorf("events before the subscriptions of old and new: %v, want [0 2]", before)
	}

	// One style for naming the consumer, --consumer, with the argument
	// after the queue still accepted.
	if out := c.ok("", "subscribe", "q", "--consumer", "audit"); !strings.Contains(out, "subscribed audit to queue q") {
		t.Errorf("subscribe --consumer printed %q", out)
	}
	if out := c.ok("", "slots", "subscribe", "q", "positional", "--slots", "2"); !strings.Contains(out, "subscribed positional to queue q with 2 slots (2 new)") {
		t.Errorf("slots subscribe with the consumer as argument printed %q", out)
	}
	if out := c.ok("", "unsubscribe", "q", "--consumer", "audit"); !strings.Contains(out, "unsubscribed audit from queue q") {
		t.Errorf("unsubscribe --consumer printed %q", out)
	}
}

// TestIdleQueueDisplay: a queue with nothing to deliver shows its ticker
// lag as idle (not as an age climbing toward ticker_idle_period), and the
// keys of a consumer with no recent events name no "last 0s" window.
func TestIdleQueueDisplay(t *testing.T) {
	t.Parallel()
	c := setup(t)
	c.ok("", "install")
	c.ok("", "queue", "create", "q")
	c.ok("", "slots", "subscribe", "q", "--consumer", "p", "--slots", "2")
	if out := c.ok("", "queue", "list"); !strings.Contains(out, "idle") {
		t.Errorf("queue list of an idle queue printed %q, want its ticker lag as idle", out)
	}
	out := c.ok("", "keys", "q", "--consumer", "p")
	if strings.Contains(out, "last 0s") || !strings.Contains(out, "no events sent lately") {
		t.Errorf("keys of an idle consumer printed %q", out)
	}
}

// TestSlotWarningsHeldBack: a slot whose only pending events wait behind a
// blocked key's failed head is not "stuck" for want of a batch (the
// blocked-key warning covers it); one with events its cursor has not
// passed is.
func TestSlotWarningsHeldBack(t *testing.T) {
	th := &thresholds{stuckAfter: StuckAfterDefault}
	owner := "w"
	held := slotRow{Owner: &owner, Lag: 3, HeldBack: 3, BlockedKeys: 1, LastActiveSeconds: 3600}
	if w := th.slotWarnings(&held); len(w) != 0 {
		t.Errorf("slot with only held-back events: warnings %q, want none", w)
	}
	behind := held
	behind.Lag = 4
	if w := th.slotWarnings(&behind); len(w) != 1 || !strings.Contains(w[0], "stuck") {
		t.Errorf("slot with an event behind its cursor: warnings %q, want stuck", w)
	}
}

// TestEnvelopeKeyNullOverridesFlag: an envelope's "key" overrides --key:
// a string is the key, null is no key, absent keeps --key; anything else is
// refused naming the line.
func TestEnvelopeKeyNullOverridesFlag(t *testing.T) {
	t.Parallel()
	in := `{"key":"a","payload":1}` + "\n" + `{"key":null,"payload":2}` + "\n" + `{"payload":3}` + "\n"
	evs, err := readEvents(strings.NewReader(in), "t", "flag", true)
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, e := range evs {
		keys = append(keys, e.PartitionKey)
	}
	if want := []string{"a", "", "flag"}; !slices.Equal(keys, want) {
		t.Errorf("keys %q, want %q", keys, want)
	}
	_, err = readEvents(strings.NewReader(`{"key":5,"payload":1}`+"\n"), "t", "", true)
	if err == nil || !strings.Contains(err.Error(), `stdin line 1: not an envelope object: "key" is neither a string nor null`) {
		t.Errorf("a numeric key: %v", err)
	}
}

// TestSendLineTooLong: a stdin line past the limit is refused naming the
// line and the limit, and nothing is sent.
func TestSendLineTooLong(t *testing.T) {
	t.Parallel()
	in := "{}\n\n\"" + strings.Repeat("x", maxLineBytes) + "\"\n"
	_, err := readEvents(strings.NewReader(in), "t", "", false)
	if err == nil || !strings.Contains(err.Error(), "stdin line 3 is longer than 64 MiB") {
		t.Errorf("a line of 64 MiB and more: %v", err)
	}
}

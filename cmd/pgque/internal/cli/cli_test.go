package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgque/pgque/internal/testing/pgtest"
	sqlfiles "github.com/pgque/pgque/sql"

	"github.com/pgque/pgque/cmd/pgque/internal/view"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// result is the outcome of one in-process run of the command line.
type result struct {
	code           int
	stdout, stderr string
}

func (r result) String() string {
	return fmt.Sprintf("exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
}

// cli runs commands against one database.
type cli struct {
	t   *testing.T
	dsn string
}

// setup returns a cli over a fresh, empty database.
func setup(t *testing.T) *cli {
	t.Helper()
	return &cli{t: t, dsn: pgtest.NewDB(t)}
}

// exec runs args (with --dsn appended) and stdin, bounded by a timeout.
func (c *cli) exec(stdin string, args ...string) result {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return execIn(ctx, nil, stdin, append(args, "--dsn", c.dsn)...)
}

// execIn runs args in-process; hook, when set, adjusts the demo options.
func execIn(ctx context.Context, hook func(*app), stdin string, args ...string) result {
	var out, errOut lockedBuffer
	return execTo(ctx, hook, stdin, &out, &errOut, args...)
}

// execTo is execIn writing to out and errOut, which a test may read while
// the command runs.
func execTo(ctx context.Context, hook func(*app), stdin string, out, errOut *lockedBuffer, args ...string) result {
	a := newApp(strings.NewReader(stdin), out, errOut)
	if hook != nil {
		hook(a)
	}
	code := a.run(ctx, args)
	return result{code: code, stdout: out.String(), stderr: errOut.String()}
}

// lockedBuffer is a bytes.Buffer safe to read while a command writes it.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// ok runs args and fails the test unless they exit 0.
func (c *cli) ok(stdin string, args ...string) string {
	c.t.Helper()
	start := time.Now()
	r := c.exec(stdin, args...)
	if d := time.Since(start); d > 500*time.Millisecond {
		c.t.Logf("pgque %s took %v", strings.Join(args, " "), d)
	}
	if r.code != 0 {
		c.t.Fatalf("pgque %s: %v", strings.Join(args, " "), r)
	}
	return r.stdout
}

// okJSON runs args and decodes stdout into v.
func (c *cli) okJSON(v any, args ...string) {
	c.t.Helper()
	out := c.ok("", args...)
	if err := json.Unmarshal([]byte(out), v); err != nil {
		c.t.Fatalf("pgque %s: decoding %q: %v", strings.Join(args, " "), out, err)
	}
}

// bg is a command running in the background.
type bg struct {
	t      *testing.T
	name   string
	cancel context.CancelFunc
	done   chan result
	stdout lockedBuffer // what the command has printed so far
}

// background starts a long-running command.
func (c *cli) background(args ...string) *bg {
	ctx, cancel := context.WithCancel(context.Background())
	b := &bg{t: c.t, name: strings.Join(args, " "), cancel: cancel, done: make(chan result, 1)}
	var errOut lockedBuffer
	go func() { b.done <- execTo(ctx, nil, "", &b.stdout, &errOut, append(args, "--dsn", c.dsn)...) }()
	c.t.Cleanup(cancel)
	return b
}

// wait waits for the command to exit by itself.
func (b *bg) wait() result {
	b.t.Helper()
	select {
	case r := <-b.done:
		return r
	case <-time.After(30 * time.Second):
		b.cancel()
		b.t.Fatalf("pgque %s did not exit within 30s; after cancelling: %v", b.name, <-b.done)
		return result{}
	}
}

// stop cancels the command's context (as SIGINT does) and waits for it.
func (b *bg) stop() result {
	b.t.Helper()
	b.cancel()
	return b.wait()
}

// conn returns a direct connection to the database.
func (c *cli) conn() *pgx.Conn {
	c.t.Helper()
	return pgtest.Conn(c.t, c.dsn)
}

// tailEvents decodes tail --json output.
func tailEvents(t *testing.T, out string) []tailEvent {
	t.Helper()
	var evs []tailEvent
	for line := range strings.Lines(out) {
		var ev tailEvent
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			t.Fatalf("tail --json printed %q: %v", line, err)
		}
		evs = append(evs, ev)
	}
	return evs
}

// evIDs parses send's output.
func evIDs(t *testing.T, out string) []int64 {
	t.Helper()
	var ids []int64
	for f := range strings.FieldsSeq(out) {
		id, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			t.Fatalf("send printed %q", out)
		}
		ids = append(ids, id)
	}
	return ids
}

// TestEndToEnd drives a fresh database through the whole life cycle with
// the command line alone (plus SQL to produce dead letters), a ticker
// command running in the background: install, upgrade, version; queue
// create and config; subscribe and slots subscribe; send from an argument,
// from stdin JSON lines and from envelopes, with keys; tail of a temporary
// subscription, of a named one (also --from-now) and of a slot (also
// --no-ack); status --json and --watch; the dead-letter commands;
// unsubscribing, dropping and uninstall.
func TestEndToEnd(t *testing.T) {
	t.Parallel()
	c := setup(t)

	// Install, upgrade, version.
	if out := c.ok("", "install"); !strings.Contains(out, "installed pgque "+sqlfiles.Version) {
		t.Errorf("install printed %q", out)
	}
	if out := c.ok("", "upgrade"); !strings.Contains(out, sqlfiles.Version+" → "+sqlfiles.Version) {
		t.Errorf("upgrade printed %q", out)
	}
	var ver map[string]string
	c.okJSON(&ver, "version", "--json")
	if ver["installed"] != sqlfiles.Version || ver["schema"] != sqlfiles.Version || ver["binary"] == "" {
		t.Errorf("version --json = %v", ver)
	}

	// Queues. A short idle period bounds how long an event can wait for a
	// tick when the tick before it saw its transaction's sequence value but
	// not its commit (ticker() then sees no new events until the idle
	// period passes; the default is 60 s).
	if out := c.ok("", "queue", "create", "files", "--set", "ticker_max_count=100"); out != "created queue files\n" {
		t.Errorf("queue create printed %q", out)
	}
	if out := c.ok("", "queue", "create", "files"); !strings.Contains(out, "already exists") {
		t.Errorf("second queue create printed %q", out)
	}
	var cfg view.QueueConfig
	c.okJSON(&cfg, "queue", "config", "files", "--set", "max_retries=3", "--set", "rotation_period=1h", "--json")
	if cfg.MaxRetries != 3 || cfg.TickerMaxCount != 100 || cfg.RotationPeriod != "01:00:00" {
		t.Errorf("queue config --json = %+v", cfg)
	}
	if out := c.ok("", "queue", "config", "files"); !strings.Contains(out, "max_retries") || !strings.Contains(out, "ticker_idle_period") {
		t.Errorf("queue config printed %q", out)
	}
	var queues []queueInfo
	c.okJSON(&queues, "queue", "list", "--json")
	if len(queues) != 1 || queues[0].Name != "files" {
		t.Errorf("queue list --json = %+v", queues)
	}

	// Subscriptions and slots.
	c.ok("", "subscribe", "files", "audit")
	if out := c.ok("", "slots", "subscribe", "files", "--consumer", "appliers", "--slots", "4"); !strings.Contains(out, "4 slots (4 new)") {
		t.Errorf("slots subscribe printed %q", out)
	}
	if out := c.ok("", "slots", "subscribe", "files", "--consumer", "appliers", "--slots", "4"); !strings.Contains(out, "(0 new)") {
		t.Errorf("second slots subscribe printed %q", out)
	}

	ticker := c.background("ticker", "--stats-interval", "0")

	// A temporary subscription: tail starts it; wait until it exists.
	tail := c.background("tail", "files", "--json", "--max", "3")
	pgtest.WaitFor(t, 20*time.Second, "tail's temporary subscription", func() bool {
		var st statusReport
		c.okJSON(&st, "status", "--json")
		for _, cons := range st.Consumers {
			if strings.HasPrefix(cons.Consumer, "tail.") {
				return true
			}
		}
		return false
	})

	// Send: an argument with a key, JSON lines on stdin with one key, and
	// envelopes with a key each.
	ids := evIDs(t, c.ok("", "send", "files", `{"file":"a","n":1}`, "--type", "FileCreated", "--key", "tenant-1"))
	ids = append(ids, evIDs(t, c.ok("{\"file\":\"a\",\"n\":2}\n\n{\"file\":\"b\",\"n\":3}\n", "send", "files", "--type", "FileOverwritten", "--key", "tenant-1"))...)
	var sent struct {
		EvIDs []int64 `json:"ev_ids"`
	}
	c.okJSON(&sent, "send", "files", "--envelope", "--json", "--type", "FileDeleted")
	// (no stdin lines: nothing sent)
	if len(sent.EvIDs) != 0 {
		t.Errorf("send with empty stdin sent %v", sent.EvIDs)
	}
	ids = append(ids, evIDs(t, c.ok(
		`{"key":"tenant-2","payload":{"file":"c","n":4}}`+"\n"+`{"key":"tenant-3","type":"FileCreated","payload":{"file":"d","n":5}}`+"\n",
		"send", "files", "--envelope", "--type", "FileDeleted"))...)
	if len(ids) != 5 {
		t.Fatalf("send printed %d ids, want 5: %v", len(ids), ids)
	}

	r := tail.wait()
	got := tailEvents(t, r.stdout)
	if r.code != 0 || len(got) != 3 || got[0].EvID != ids[0] || got[2].EvID != ids[2] || *got[0].Key != "tenant-1" ||
		got[1].Type != "FileOverwritten" || !sameJSON(got[2].Payload, `{"file":"b","n":3}`) {
		t.Errorf("temporary tail printed %+v, want the first 3 events %v", got, ids[:3])
	}
	var st statusReport
	c.okJSON(&st, "status", "--json")
	for _, cons := range st.Consumers {
		if strings.HasPrefix(cons.Consumer, "tail.") {
			t.Errorf("tail left its temporary subscription %s behind", cons.Consumer)
		}
	}

	// A named subscription, all five events, acknowledged: a second tail
	// finds nothing more.
	got = tailEvents(t, c.ok("", "tail", "files", "--consumer", "audit", "--json", "--max", "5", "--timeout", "30s"))
	if len(got) != 5 || got[3].Type != "FileDeleted" || *got[3].Key != "tenant-2" || got[4].Type != "FileCreated" || *got[4].Key != "tenant-3" {
		t.Errorf("tail --consumer audit printed %+v", got)
		dump(t, c)
	}
	if out := c.ok("", "tail", "files", "--consumer", "audit", "--timeout", "500ms"); out != "" {
		t.Errorf("tail after everything was acked printed %q", out)
	}

	// --from-now skips (and consumes) the backlog: only the event sent
	// after tail started is printed.
	auditPending := func() int64 {
		var st statusReport
		c.okJSON(&st, "status", "--json")
		for _, cons := range st.Consumers {
			if cons.Consumer == "audit" {
				return cons.Pending
			}
		}
		t.Fatalf("status --json has no consumer audit: %+v", st.Consumers)
		return 0
	}
	before := evIDs(t, c.ok("", "send", "files", `{"when":"before"}`, "--key", "tenant-4"))
	pgtest.WaitFor(t, 20*time.Second, "the event sent before tail to be ticked", func() bool { return auditPending() > 0 })
	tail = c.background("tail", "files", "--consumer", "audit", "--from-now", "--json", "--max", "1", "--timeout", "30s")
	// Tail has taken its start from the server's clock once it consumed
	// (and skipped) that backlog: only then is the next event "after".
	pgtest.WaitFor(t, 20*time.Second, "tail to skip the backlog", func() bool { return auditPending() == 0 })
	after := evIDs(t, c.ok("", "send", "files", `{"when":"after"}`, "--key", "tenant-4"))
	if r := tail.wait(); len(tailEvents(t, r.stdout)) != 1 || tailEvents(t, r.stdout)[0].EvID != after[0] {
		t.Errorf("tail --from-now (events %v before, %v after): %v", before, after, r)
	}
	ids = append(ids, before[0], after[0])

	// A slot: tenant-1's three events, in order, through a lease;
	// --no-ack first leaves them there.
	slot := c.slotOf("tenant-1", 4)
	slotArgs := []string{"tail", "files", "--consumer", "appliers", "--slot", fmt.Sprintf("%d/4", slot), "--worker", "w1", "--json", "--timeout", "30s"}
	peek := tailEvents(t, c.ok("", append(slotArgs, "--no-ack", "--max", "3")...))
	got = tailEvents(t, c.ok("", append(slotArgs, "--max", "3")...))
	if len(got) != 3 || len(peek) != 3 || got[0].EvID != ids[0] || got[1].EvID != ids[1] || got[2].EvID != ids[2] || peek[2].EvID != ids[2] || *got[2].Slot != slot {
		t.Errorf("tail --slot %d/4 printed %+v (after --no-ack printed %+v), want tenant-1's events %v", slot, got, peek, ids[:3])
	}

	// Status: the queue, the audit consumer (nothing pending), every slot.
	st = statusReport{}
	c.okJSON(&st, "status", "--json")
	if len(st.Queues) != 1 || st.Queues[0].Name != "files" || st.Queues[0].Config.MaxRetries != 3 || st.Queues[0].LastTickID == 0 {
		t.Errorf("status --json queues = %+v", st.Queues)
	}
	if len(st.Consumers) != 1 || st.Consumers[0].Consumer != "audit" || st.Consumers[0].Pending != 0 || st.Consumers[0].Warnings == nil {
		t.Errorf("status --json consumers = %+v", st.Consumers)
	}
	if len(st.Slots) != 4 {
		t.Fatalf("status --json has %d slots, want 4: %+v", len(st.Slots), st.Slots)
	}
	for _, sl := range st.Slots {
		if sl.Consumer != "appliers" || sl.NSlots != 4 || sl.Policy != "skip" {
			t.Errorf("status --json slot = %+v", sl)
		}
		if sl.Slot == slot && (sl.Owner != nil || sl.Epoch == 0 || sl.Lag != 0) {
			t.Errorf("slot %d after tail released it = %+v, want no owner, an epoch, no lag", slot, sl)
		}
	}
	if out := c.ok("", "status"); !strings.Contains(out, "QUEUES") || !strings.Contains(out, "SLOTS") || !strings.Contains(out, "appliers") {
		t.Errorf("status printed %q", out)
	}
	if out := c.ok("", "slots", "status", "files"); !strings.Contains(out, "appliers") {
		t.Errorf("slots status printed %q", out)
	}

	// status --watch refreshes until interrupted, one JSON document a line.
	// It must print a second document by itself; each one's time is a
	// refresh period (a second) or more after the one before.
	watch := c.background("status", "--watch", "--json")
	pgtest.WaitFor(t, 30*time.Second, "status --watch to print twice", func() bool {
		return strings.Count(watch.stdout.String(), "\n") >= 2
	})
	wr := watch.stop()
	type doc struct {
		Time time.Time `json:"time"`
	}
	var docs []doc
	for line := range strings.Lines(wr.stdout) {
		var d doc
		if err := json.Unmarshal([]byte(line), &d); err != nil {
			t.Fatalf("status --watch --json printed %q: %v", line, err)
		}
		docs = append(docs, d)
	}
	if wr.code != 0 || len(docs) < 2 || docs[1].Time.Sub(docs[0].Time) < 900*time.Millisecond {
		t.Errorf("status --watch --json: %v", wr)
	}

	testDeadLetters(t, c)

	// Unsubscribing and dropping.
	c.ok("", "unsubscribe", "files", "audit")
	if out := c.ok("", "slots", "unsubscribe", "files", "--consumer", "appliers", "--slots", "4"); !strings.Contains(out, "unsubscribed the 4 slots") {
		t.Errorf("slots unsubscribe printed %q", out)
	}
	st = statusReport{}
	c.okJSON(&st, "status", "files", "--json")
	if len(st.Consumers) != 0 || len(st.Slots) != 0 {
		t.Errorf("after unsubscribing: consumers %+v, slots %+v", st.Consumers, st.Slots)
	}
	c.ok("", "queue", "drop", "files", "--yes")
	c.ok("", "queue", "drop", "jobs", "--yes", "--force")
	queues = nil
	c.okJSON(&queues, "queue", "list", "--json")
	if len(queues) != 0 {
		t.Errorf("queues left after dropping: %+v", queues)
	}

	if r := ticker.stop(); r.code != 0 || !strings.Contains(r.stderr, "ticker stopped") {
		t.Errorf("ticker after its context ended: %v", r)
	}

	// Uninstall.
	if r := c.exec("", "uninstall"); r.code != ExitUsage {
		t.Errorf("uninstall without --yes: %v", r)
	}
	if out := c.ok("", "uninstall", "--yes"); !strings.Contains(out, "uninstalled pgque "+sqlfiles.Version) {
		t.Errorf("uninstall printed %q", out)
	}
	if out := c.ok("", "version"); !strings.Contains(out, "installed: none") {
		t.Errorf("version after uninstall printed %q", out)
	}
}

// testDeadLetters produces two dead letters (max_retries 0 and a nack),
// lists them, replays one — its consumer receives it again — and purges
// the other.
func testDeadLetters(t *testing.T, c *cli) {
	c.ok("", "queue", "create", "jobs", "--set", "max_retries=0")
	c.ok("", "subscribe", "jobs", "worker")
	ids := evIDs(t, c.ok("{\"job\":1}\n{\"job\":2}\n", "send", "jobs", "--type", "Job", "--key", "k"))
	nackAll(t, c.conn(), "jobs", "worker", len(ids))

	var dls []deadLetter
	c.okJSON(&dls, "dlq", "list", "jobs", "--json")
	if len(dls) != 2 || dls[0].EvID != ids[0] || dls[0].Consumer != "worker" || *dls[0].Reason != "boom" || *dls[0].Key != "k" {
		t.Fatalf("dlq list --json = %+v, want events %v dead for worker", dls, ids)
	}
	if out := c.ok("", "dlq", "list", "jobs"); !strings.Contains(out, "boom") {
		t.Errorf("dlq list printed %q", out)
	}
	if out := c.ok("", "dlq", "replay", "jobs", strconv.FormatInt(dls[0].ID, 10)); !strings.Contains(out, fmt.Sprintf("as event %d", ids[0])) {
		t.Errorf("dlq replay printed %q", out)
	}
	got := tailEvents(t, c.ok("", "tail", "jobs", "--consumer", "worker", "--json", "--max", "1", "--timeout", "30s"))
	if len(got) != 1 || got[0].EvID != ids[0] {
		t.Errorf("after replay, worker received %+v, want event %d", got, ids[0])
	}
	if r := c.exec("", "dlq", "purge", "jobs"); r.code != ExitUsage {
		t.Errorf("dlq purge without --yes: %v", r)
	}
	if out := c.ok("", "dlq", "purge", "jobs", "--yes"); out != "purged 1 dead letters from queue jobs\n" {
		t.Errorf("dlq purge printed %q", out)
	}
	dls = nil
	c.okJSON(&dls, "dlq", "list", "jobs", "--json")
	if len(dls) != 0 {
		t.Errorf("dead letters left after replay and purge: %+v", dls)
	}
}

// nackAll receives n events of the subscription (the ticker is running),
// nacks each with reason "boom" and acks the chunk.
func nackAll(t *testing.T, conn *pgx.Conn, queue, consumer string, n int) {
	t.Helper()
	ctx := context.Background()
	var batch int64
	var msgs []int64
	pgtest.WaitFor(t, 20*time.Second, "the events to be ticked", func() bool {
		rows, err := conn.Query(ctx, `select batch_id, msg_id from pgque.receive($1, $2, 100)`, queue, consumer)
		if err != nil {
			t.Fatal(err)
		}
		var m int64
		msgs = msgs[:0]
		if _, err := pgx.ForEachRow(rows, []any{&batch, &m}, func() error { msgs = append(msgs, m); return nil }); err != nil {
			t.Fatal(err)
		}
		return len(msgs) == n
	})
	for _, m := range msgs {
		if _, err := conn.Exec(ctx, `select pgque.nack($1, $2, '0', 'boom')`, batch, m); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := conn.Exec(ctx, `select pgque.ack($1)`, batch); err != nil {
		t.Fatal(err)
	}
}

// slotOf is the partition layer's routing function.
func (c *cli) slotOf(key string, n int) int {
	c.t.Helper()
	var slot int
	err := c.conn().QueryRow(context.Background(), `select ((hashtextextended($1, 0) % $2 + $2) % $2)::int`, key, n).Scan(&slot)
	if err != nil {
		c.t.Fatal(err)
	}
	return slot
}

// sameJSON reports whether got and want encode the same value.
func sameJSON(got json.RawMessage, want string) bool {
	var a, b any
	if json.Unmarshal(got, &a) != nil || json.Unmarshal([]byte(want), &b) != nil {
		return false
	}
	return fmt.Sprint(a) == fmt.Sprint(b)
}

// dump logs the engine's state (events, ticks, subscriptions, delivery
// progress), to diagnose an event that was not delivered.
func dump(t *testing.T, c *cli) {
	conn := c.conn()
	for _, q := range []string{
		"select ev_id, ev_txid::text, ev_part, coalesce(ev_owner,0), ev_time::text from pgque.event order by ev_id",
		"select tick_id, tick_time::text, tick_snapshot::text, tick_event_seq from pgque.tick order by tick_id",
		"select sub_id, sub_name, sub_last_tick from pgque.subscription",
		"select st_sub, st_seq, st_last_tick, coalesce(st_next_tick,0), coalesce(st_batch,0), coalesce(st_acked_to,0), coalesce(st_delivered_to,0), st_delivered_all from pgque.sub_state order by st_seq",
	} {
		rows, err := conn.Query(context.Background(), q)
		if err != nil {
			t.Log(err)
			continue
		}
		t.Log(q)
		for rows.Next() {
			v, _ := rows.Values()
			t.Log(v...)
		}
		rows.Close()
	}
}

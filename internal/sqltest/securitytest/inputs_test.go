package securitytest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgque/pgque"
)

// hostile are names and keys that would break a query built by string
// concatenation.
var hostile = []string{
	`'); drop table pgque.queue; --`,
	`x'; drop table pgque.queue; --`,
	`a'b`, `a"b`, `a;b`, `$$`, `$x$`, `$$; drop table pgque.queue; $$`,
	`\`, `\'`, `--`, `/*`, `*/`, `%s`, `%I`, `%L`, `{}`, `[]`, `(`, `)`,
	`E'\x41'`, `q#1/2`, `q/1`, ` q`, `q `, "q\tq", "q\nq", `ä`, `😀`,
	strings.Repeat("n", 63), strings.Repeat("n", 64), strings.Repeat("é", 32),
	`ev_extra1 is null or true`, `1 = 1`, `0) or (1=1`,
}

// code returns err's SQLSTATE, "" for nil.
func code(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	if err != nil {
		return "non-pg: " + err.Error()
	}
	return ""
}

// TestHostileNamesAndKeys: queue and consumer names are stored verbatim or
// rejected with PQ010; partition keys and worker ids are stored verbatim
// (keys) or rejected with a pgque SQLSTATE; nothing else happens (the
// tables survive, no syntax error).
func TestHostileNamesAndKeys(t *testing.T) {
	_, conn := setupDB(t)
	ctx := context.Background()
	for _, name := range hostile {
		// Queue names.
		var created int
		err := conn.QueryRow(ctx, `select pgque.create_queue($1)`, name).Scan(&created)
		switch c := code(err); c {
		case "":
			var stored string
			if err := conn.QueryRow(ctx, `select queue_name from pgque.queue where queue_name = $1`, name).Scan(&stored); err != nil || stored != name {
				t.Errorf("queue %q created but stored as %q (%v)", name, stored, err)
			}
			if _, err := conn.Exec(ctx, `select pgque.drop_queue($1, true)`, name); err != nil {
				t.Errorf("drop_queue(%q): %v", name, err)
			}
		case "PQ010":
		default:
			t.Errorf("create_queue(%q): SQLSTATE %s (%v), want success or PQ010", name, c, err)
		}
		// Consumer names.
		err = conn.QueryRow(ctx, `select pgque.subscribe('q1', $1)`, name).Scan(&created)
		switch c := code(err); c {
		case "":
			var n int
			_ = conn.QueryRow(ctx, `select count(*) from pgque.subscription where sub_name = $1`, name).Scan(&n)
			if n != 1 {
				t.Errorf("consumer %q subscribed but %d subscriptions carry the name", name, n)
			}
			if _, err := conn.Exec(ctx, `select pgque.unsubscribe('q1', $1)`, name); err != nil {
				t.Errorf("unsubscribe(%q): %v", name, err)
			}
		case "PQ010":
		default:
			t.Errorf("subscribe('q1', %q): SQLSTATE %s (%v), want success or PQ010", name, c, err)
		}
		// Partition keys: always accepted and stored verbatim.
		var id int64
		if err := conn.QueryRow(ctx, `select pgque.send('q1', 't', '{}', $1)`, name).Scan(&id); err != nil {
			t.Errorf("send with key %q: %v", name, err)
		} else {
			var stored string
			if err := conn.QueryRow(ctx, `select ev_extra1 from pgque.event where ev_id = $1`, id).Scan(&stored); err != nil || stored != name {
				t.Errorf("key %q stored as %q (%v)", name, stored, err)
			}
		}
		// Slot routing of such a key is computed from its hash only.
		var slot int
		if err := conn.QueryRow(ctx, `select pgque.slot_of($1, 7)`, name).Scan(&slot); err != nil || slot < 0 || slot >= 7 {
			t.Errorf("slot_of(%q, 7) = %d, %v", name, slot, err)
		}
		// Worker ids: verbatim in the lease, or PQ011 when too long.
		var token *string
		err = conn.QueryRow(ctx, `select token::text from pgque.claim_slot('q1', 'sc', 1, $1, '1 min')`, name).Scan(&token)
		switch c := code(err); c {
		case "":
			var owner string
			if err := conn.QueryRow(ctx, `select owner from pgque.partition_slot_status where consumer = 'sc' and slot = 1`).Scan(&owner); err != nil || owner != name {
				t.Errorf("worker %q holds the lease as %q (%v)", name, owner, err)
			}
			if _, err := conn.Exec(ctx, `select pgque.release_slot('q1', 'sc', 1, $1, $2::uuid)`, name, token); err != nil {
				t.Errorf("release_slot(%q): %v", name, err)
			}
		case "PQ011":
		default:
			t.Errorf("claim_slot(worker %q): SQLSTATE %s (%v)", name, c, err)
		}
		// Type and blocked-key lookups.
		if _, err := conn.Exec(ctx, `select pgque.insert_event('q1', $1, $1, $1, $1, $1, $1)`, name); err != nil {
			t.Errorf("insert_event with %q: %v", name, err)
		}
		if _, err := conn.Exec(ctx, `select pgque.unblock_key('q1', 'sc', $1)`, name); code(err) != "PQ036" {
			t.Errorf("unblock_key(key %q): %v, want PQ036", name, err)
		}
	}
	// Everything is still there.
	var n int
	if err := conn.QueryRow(ctx, `select count(*) from pgque.queue where queue_name = 'q1'`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("queue q1 gone: %d %v", n, err)
	}
}

// TestInvalidBytes: invalid UTF-8 and NUL bytes in any text argument are
// rejected by the server with 22021 before pgque sees them, and a JSON
// \u0000 (valid JSON that jsonb cannot store) is rejected with 22P05;
// nothing is written.
func TestInvalidBytes(t *testing.T) {
	dsn, conn := setupDB(t)
	ctx := context.Background()
	before := tableCounts(t, conn)
	bad := []string{"q\xff", "\xc3\x28", "\xed\xa0\x80", "a\x00b", "\x00"}
	stmts := []string{
		`select pgque.create_queue($1)`,
		`select pgque.subscribe('q1', $1)`,
		`select pgque.send('q1', 't', '{}', $1)`,
		`select pgque.send('q1', $1, '{}')`,
		`select pgque.claim_slot('q1', 'sc', 0, $1)`,
		`select pgque.send_batch('q1', 't', array['{}']::jsonb[], array[$1])`,
		`select pgque.insert_event('q1', 't', $1)`,
	}
	for _, s := range stmts {
		for _, b := range bad {
			_, err := conn.Exec(ctx, s, b)
			if c := code(err); c != "22021" {
				t.Errorf("%s with %q: SQLSTATE %q (%v), want 22021", s, b, c, err)
			}
		}
	}
	// Through convert_from on the server side, too.
	if _, err := conn.Exec(ctx, `select pgque.send('q1', 't', '{}', convert_from('\xff'::bytea, 'UTF8'))`); code(err) != "22021" {
		t.Errorf("convert_from of an invalid byte: %v, want 22021", err)
	}
	// Payloads: invalid UTF-8 inside JSON, and \u0000.
	if _, err := conn.Exec(ctx, `select pgque.send('q1', $1::text::jsonb)`, "\"\xff\""); code(err) != "22021" {
		t.Errorf("payload with an invalid byte: %v, want 22021", err)
	}
	if _, err := conn.Exec(ctx, `select pgque.send('q1', $1::jsonb)`, `{"a":"\u0000"}`); code(err) != "22P05" {
		t.Errorf(`payload with \u0000: %v, want 22P05`, err)
	}
	// The Go client: invalid JSON never reaches the server; \u0000 does
	// (it is valid JSON) and comes back as a server error.
	client, err := pgque.Connect(ctx, dsn, &pgque.Config{PollOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	if _, err := client.Send(ctx, "q1", pgque.Event{Payload: json.RawMessage(`{"a":`)}); !errors.Is(err, pgque.ErrInvalidPayload) {
		t.Errorf("Send of invalid JSON: %v, want ErrInvalidPayload", err)
	}
	if _, err := client.Send(ctx, "q1", pgque.Event{Payload: json.RawMessage(`"\u0000"`)}); code(err) != "22P05" {
		t.Errorf(`Send of "\u0000": %v, want SQLSTATE 22P05`, err)
	}
	if _, err := client.Send(ctx, "q1", pgque.Event{Payload: 1, PartitionKey: "k\x00"}); code(err) != "22021" {
		t.Errorf("Send with a NUL in the key: %v, want SQLSTATE 22021", err)
	}
	if after := tableCounts(t, conn); !maps.Equal(before, after) {
		t.Errorf("rejected input changed table counts: %v -> %v", before, after)
	}
}

// TestHugeInputs: a 10 MB payload and a 100k-event send_batch go through
// whole; a send_batch whose arrays disagree, or with one bad element,
// commits nothing.
func TestHugeInputs(t *testing.T) {
	if testing.Short() {
		t.Skip("huge inputs skipped in -short mode")
	}
	_, conn := setupDB(t)
	ctx := context.Background()

	big := `{"blob":"` + strings.Repeat("x", 10<<20) + `"}`
	var id int64
	if err := conn.QueryRow(ctx, `select pgque.send('q1', 'big', $1::jsonb, 'k')`, big).Scan(&id); err != nil {
		t.Fatal("10 MB payload:", err)
	}
	var size int
	if err := conn.QueryRow(ctx, `select octet_length(ev_data) from pgque.event where ev_id = $1`, id).Scan(&size); err != nil || size < 10<<20 {
		t.Errorf("10 MB payload stored as %d bytes (%v)", size, err)
	}

	const n = 100_000
	payloads := make([]string, n)
	keys := make([]string, n)
	for i := range payloads {
		payloads[i] = fmt.Sprintf(`{"i":%d}`, i)
		keys[i] = fmt.Sprintf("k%d", i%97)
	}
	var ids []int64
	if err := conn.QueryRow(ctx, `select pgque.send_batch('q1', 't', $1::jsonb[], $2::text[])`, payloads, keys).Scan(&ids); err != nil {
		t.Fatal("send_batch of 100k:", err)
	}
	if len(ids) != n {
		t.Fatalf("send_batch returned %d ids", len(ids))
	}
	for i := 1; i < n; i++ {
		if ids[i] <= ids[i-1] {
			t.Fatalf("ids not increasing at %d: %d after %d", i, ids[i], ids[i-1])
		}
	}

	before := tableCounts(t, conn)
	_, err := conn.Exec(ctx, `select pgque.send_batch('q1', 't', $1::jsonb[], $2::text[])`, payloads, keys[:n-1])
	if c := code(err); c != "PQ011" {
		t.Errorf("send_batch with %d payloads and %d keys: %v, want PQ011", n, n-1, err)
	}
	bad := append([]string(nil), payloads...)
	bad[n-1] = `{"i":`
	if _, err := conn.Exec(ctx, `select pgque.send_batch('q1', 't', $1::jsonb[], $2::text[])`, bad, keys); code(err) != "22P02" {
		t.Errorf("send_batch with one invalid payload: %v, want 22P02", err)
	}
	keys[n/2] = "k\x00"
	if _, err := conn.Exec(ctx, `select pgque.send_batch('q1', 't', $1::jsonb[], $2::text[])`, payloads, keys); code(err) != "22021" {
		t.Errorf("send_batch with one NUL key: %v, want 22021", err)
	}
	if after := tableCounts(t, conn); !maps.Equal(before, after) {
		t.Errorf("failed send_batch changed table counts: %v -> %v", before, after)
	}
}

// TestAbsurdNumbersThroughTheClient: the Go client turns absurd settings
// into ErrInvalidArgument before or at the server, never a half-done call.
func TestAbsurdNumbersThroughTheClient(t *testing.T) {
	dsn, conn := setupDB(t)
	ctx := context.Background()
	client, err := pgque.Connect(ctx, dsn, &pgque.Config{PollOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	h := func(context.Context, *pgque.Message) error { return nil }
	long := func(n int) string { return strings.Repeat("w", n) }
	for _, cfg := range []pgque.PartitionedConsumerConfig{
		{Queue: "q1", Consumer: "x", Slots: 0, Handler: h},
		{Queue: "q1", Consumer: "x", Slots: -1, Handler: h},
		{Queue: "q1", Consumer: "x", Slots: 2, LeaseTTL: 1, Handler: h},
		{Queue: "q1", Consumer: "x", Slots: 2, BatchSize: -1, Handler: h},
		{Queue: "q1", Consumer: "x", Slots: 2, MaxActiveSlots: -1, Handler: h},
		// Values the server would refuse on every call.
		{Queue: "q1", Consumer: "huge", Slots: 5000, Handler: h},
		{Queue: "q1", Consumer: "x", Slots: pgque.SlotsMax + 1, Handler: h},
		{Queue: "q1", Consumer: "x", Slots: 2, MaxActiveSlots: 3, Handler: h},
		{Queue: "q1", Consumer: "x", Slots: 2, BatchSize: pgque.BatchSizeMax + 1, Handler: h},
		{Queue: "q1", Consumer: "x", Slots: 2, BatchSize: 1 << 40, Handler: h},
		{Queue: "q1", Consumer: "x", Slots: 2, WorkerID: long(pgque.WorkerIDMaxBytes + 1), Handler: h},
		{Queue: "q1", Consumer: "x", Slots: 2, WorkerID: "w\x00id", Handler: h},
		{Queue: "q1", Consumer: "x", Slots: 2, WorkerID: "w\xffid", Handler: h},
		{Queue: "q1", Consumer: "x", Slots: 2, WorkerID: strings.Repeat("é", 101), Handler: h},
		{Queue: "q1", Consumer: "x", Slots: 2, LeaseTTL: pgque.LeaseTTLMax + time.Nanosecond, Handler: h},
		{Queue: "q1", Consumer: "x", Slots: 2, LeaseTTL: 1 << 62, Handler: h},
		{Queue: long(64), Consumer: "x", Slots: 2, Handler: h},
		{Queue: "q1", Consumer: long(64), Slots: 2, Handler: h},
		{Queue: "q\x00", Consumer: "x", Slots: 2, Handler: h},
		{Queue: "q1", Consumer: "\xc3", Slots: 2, Handler: h},
	} {
		if _, err := client.NewPartitionedConsumer(&cfg); !errors.Is(err, pgque.ErrInvalidArgument) {
			t.Errorf("%+v: %v, want ErrInvalidArgument", cfg, err)
		}
	}
	for _, cfg := range []pgque.ConsumerConfig{
		{Queue: "q1", Consumer: "x", BatchSize: pgque.BatchSizeMax + 1, Handler: h},
		{Queue: "q1", Consumer: "x", BatchSize: -5, Handler: h},
		{Queue: long(64), Consumer: "x", Handler: h},
		{Queue: "q1", Consumer: long(64), Handler: h},
		{Queue: "q1", Consumer: "c\x00", Handler: h},
		{Queue: "\xfe", Consumer: "x", Handler: h},
	} {
		if _, err := client.NewConsumer(&cfg); !errors.Is(err, pgque.ErrInvalidArgument) {
			t.Errorf("%+v: %v, want ErrInvalidArgument", cfg, err)
		}
	}
	for _, cfg := range []pgque.TickerConfig{
		{WorkerID: long(pgque.WorkerIDMaxBytes + 1)},
		{WorkerID: "t\x00"},
		{LeaseTTL: pgque.LeaseTTLMax + time.Second},
	} {
		if _, err := client.NewTicker(&cfg); !errors.Is(err, pgque.ErrInvalidArgument) {
			t.Errorf("%+v: %v, want ErrInvalidArgument", cfg, err)
		}
	}
	// The limits are the server's: a value at each limit is accepted there.
	if _, err := conn.Exec(ctx, `select pgque.ticker_lead($1, '1 day')`, long(pgque.WorkerIDMaxBytes)); err != nil {
		t.Errorf("ticker_lead at the worker id limit: %v", err)
	}
	if _, err := conn.Exec(ctx, `select pgque.ticker_lead($1, '1 day')`, long(pgque.WorkerIDMaxBytes+1)); err == nil {
		t.Error("ticker_lead accepted a worker id over the limit")
	}
	var n int
	if err := conn.QueryRow(ctx, `select count(*) from pgque.subscription where sub_name like 'huge#%'`).Scan(&n); err != nil || n != 0 {
		t.Errorf("%d slot subscriptions of a failed Start remain (%v)", n, err)
	}
}

// TestLongKeysSettle: a partition key too long for a btree entry (any
// text a writer sends, or a table source's writer writes) is blocked by
// the pause policy's nack and held by the lanes' hold like any other key.
// Spelled whole in key_block and deferred, whose indexes hold at most
// about 2.7 kB, it made both fail with 54000 at every attempt: the slot,
// with every other key in it, could never be settled.
func TestLongKeysSettle(t *testing.T) {
	_, conn := setupDB(t)
	ctx := context.Background()
	mustExec(t, conn,
		`select pgque.create_queue('lk')`,
		`select pgque.subscribe_slot('lk', 'p', 0, 1, 'pause')`,
		`select pgque.subscribe_slot('lk', 'h', 0, 1)`,
		// 3000 characters of 2 and 3 bytes that do not compress.
		`create table long_key as select string_agg(chr(256 + (i * 7919) % 20000), '') as k from generate_series(1, 3000) i`,
		`select pgque.send('lk', 't', '{"n":1}'::jsonb, (select k from long_key))`,
		`select pgque.send('lk', 't', '{"n":2}'::jsonb, (select k from long_key))`,
		`select pgque.send('lk', 't', '{"n":3}'::jsonb, 'short')`,
		`select pgque.force_next_tick('lk')`,
		`select pgque.ticker('lk')`)
	for _, consumer := range []string{"p", "h"} {
		var token string
		var epoch int64
		if err := conn.QueryRow(ctx, `select token::text, epoch from pgque.claim_slot('lk', $1, 0, 'w', '1 min')`, consumer).Scan(&token, &epoch); err != nil {
			t.Fatal(consumer, "claim:", err)
		}
		var head, batch int64
		if err := conn.QueryRow(ctx, `select min(msg_id), min(batch_id) from pgque.receive_partitioned('lk', $1, 0, 1, 'w', $2::uuid, 10)`,
			consumer, token).Scan(&head, &batch); err != nil {
			t.Fatal(consumer, "receive:", err)
		}
		var err error
		if consumer == "p" {
			_, err = conn.Exec(ctx, `select pgque.nack_partitioned('lk', 'p', 0, 1, 'w', $1::uuid, $2, $3, $4, '1 hour', 'boom')`,
				token, epoch, batch, head)
		} else {
			_, err = conn.Exec(ctx, `select pgque.hold_key_partitioned('lk', 'h', 0, 1, 'w', $1::uuid, $2, $3, (select k from long_key), $4)`,
				token, epoch, batch, head)
		}
		if err != nil {
			t.Fatalf("consumer %s: settling the head of a 3000-character key: %v", consumer, err)
		}
		if _, err := conn.Exec(ctx, `select pgque.ack_partitioned('lk', $1, 0, 1, 'w', $2::uuid, $3, $4, $5)`,
			consumer, token, epoch, batch, head); err != nil {
			t.Fatalf("consumer %s: ack: %v", consumer, err)
		}
		var state string
		var deferred int64
		if err := conn.QueryRow(ctx, `select b.state, b.deferred from pgque.blocked_keys('lk', $1) b where b.key = (select k from long_key)`,
			consumer).Scan(&state, &deferred); err != nil {
			t.Fatalf("consumer %s: blocked_keys: %v", consumer, err)
		}
		if want := map[string]string{"p": "blocked", "h": "held"}[consumer]; state != want || deferred < 1 {
			t.Errorf("consumer %s: the long key is %s with %d deferred, want %s with at least 1", consumer, state, deferred, want)
		}
	}
}

// TestUndeliverablePayloadsAreRefused: receive hands data out as jsonb,
// and data jsonb cannot parse as a JSON string of its text, but a jsonb
// string holds at most 268435455 bytes (_deliverable_bytes). A writer's
// longer payload that jsonb cannot parse (a JSON string that long, through
// the text forms of send and send_batch or through insert_event) was
// stored, and then every receive of its batch failed with 54000: the
// queue's consumers were stopped for good. Such data is refused when it is
// written. Writing 256 MB takes the better part of a minute, so the test
// lowers the bound in its own database to 1000 bytes and writes, beyond
// it, JSON that json accepts and jsonb refuses (a number out of numeric's
// range); the same JSON under the bound is still stored.
func TestUndeliverablePayloadsAreRefused(t *testing.T) {
	_, conn := setupDB(t)
	ctx := context.Background()
	mustExec(t, conn,
		`create or replace function pgque._deliverable_bytes() returns bigint language sql immutable as $$ select 1000::bigint $$`,
		`select pgque.create_queue('huge')`, `select pgque.subscribe('huge', 'c')`)
	long := `'[1e1000000, "' || repeat('x', 2000) || '"]'`
	short := `'[1e1000000, "x"]'`
	for _, stmt := range []string{
		`select pgque.send('huge', 't', %s::text, null)`,
		`select pgque.send_batch('huge', 't', array['{}', %s])`,
		`select pgque.insert_event('huge', 't', %s)`,
	} {
		if _, err := conn.Exec(ctx, fmt.Sprintf(stmt, long)); code(err) != "54000" {
			t.Errorf("%s: %v, want 54000", fmt.Sprintf(stmt, "<2 kB>"), err)
		}
		if _, err := conn.Exec(ctx, fmt.Sprintf(stmt, short)); err != nil {
			t.Errorf("%s: %v", fmt.Sprintf(stmt, short), err)
		}
	}
	mustExec(t, conn, `select pgque.force_next_tick('huge')`, `select pgque.ticker('huge')`)
	var n int
	if err := conn.QueryRow(ctx, `select count(*) from pgque.receive('huge', 'c', 10)`).Scan(&n); err != nil || n != 4 {
		t.Errorf("receive: %d events, %v; want 4", n, err)
	}
}

// TestUndeliverableFieldsAreRefused: receive and receive_partitioned
// hand a chunk out as one array of messages, and a single event goes alone
// however large, so an event whose type, key and extra fields (beside a
// payload of up to the jsonb limit) passed PostgreSQL's 1 GB per value
// made every receive of its batch fail, and the events behind it wait for
// good; past 1 GB the insert failed with XX000. Every writer now refuses
// fields over _deliverable_bytes() together with 54000 naming the event,
// stores nothing, and takes fields at the limit.
func TestUndeliverableFieldsAreRefused(t *testing.T) {
	_, conn := setupDB(t)
	ctx := context.Background()
	mustExec(t, conn,
		`create or replace function pgque._deliverable_bytes() returns bigint language sql immutable as $$ select 1000::bigint $$`,
		`select pgque.create_queue('wide')`, `select pgque.subscribe('wide', 'c')`)
	// %[1]s: a type of 500 bytes; %[2]s: a key that makes the two 1000
	// bytes (at the limit) or 1001 (over it).
	for _, stmt := range []string{
		`select pgque.send('wide', %[1]s, '{}'::jsonb, %[2]s)`,
		`select pgque.send('wide', %[1]s, '{}'::text, %[2]s)`,
		`select pgque.send('wide', %[1]s, '{}'::jsonb, %[2]s, 'd' || %[3]s)`,
		`select pgque.send_batch('wide', %[1]s, array['{}', '{}']::jsonb[], array['k', %[2]s])`,
		`select pgque.send_batch('wide', array['t', %[1]s], array['{}', '{}'], array['k', %[2]s])`,
		`select pgque.send_batch('wide', array['t', %[1]s], array['{}', '{}']::jsonb[], array['k', %[2]s], array['e', 'f' || %[3]s])`,
		`select pgque.insert_event('wide', %[1]s, '{}', %[2]s, null, null, null)`,
		`select pgque.insert_event('wide', 'u', '{}', null, repeat('x', 499), %[2]s, null)`,
	} {
		typ := `repeat('t', 500)`
		before := tableCounts(t, conn)
		over := fmt.Sprintf(stmt, typ, `repeat('k', 501)`, "'1'")
		_, err := conn.Exec(ctx, over)
		if code(err) != "54000" || !strings.Contains(err.Error(), "1001 bytes together") {
			t.Errorf("%s: %v, want 54000 naming 1001 bytes", fmt.Sprintf(stmt, "<500 B>", "<501 B>", "'1'"), err)
		}
		if after := tableCounts(t, conn); !maps.Equal(before, after) {
			t.Errorf("%s: a refused send changed table counts: %v -> %v", over, before, after)
		}
		if _, err := conn.Exec(ctx, fmt.Sprintf(stmt, typ, `repeat('k', 500)`, "'2'")); err != nil {
			t.Errorf("%s: %v", fmt.Sprintf(stmt, "<500 B>", "<500 B>", "'2'"), err)
		}
	}
	if _, err := conn.Exec(ctx, `select pgque.send_batch('wide', 't', array['{}', '{}', '{}']::jsonb[], array['k', 'k', repeat('k', 1000)])`); err == nil ||
		!strings.Contains(err.Error(), "event 3 of the batch") {
		t.Errorf("a batch's third event over the limit: %v, want an error naming event 3", err)
	}
	mustExec(t, conn, `select pgque.force_next_tick('wide')`, `select pgque.ticker('wide')`)
	var n int
	if err := conn.QueryRow(ctx, `select count(*) from pgque.receive('wide', 'c', 100)`).Scan(&n); err != nil || n != 11 {
		t.Errorf("receive: %d events, %v; want 11", n, err)
	}

	// The real limit, without the override: a 256 MB key is refused
	// before the insert (it used to be stored, and a larger one failed
	// there with XX000).
	if testing.Short() {
		return
	}
	mustExec(t, conn, `create or replace function pgque._deliverable_bytes() returns bigint language sql immutable as $$ select 268435455::bigint $$`)
	if _, err := conn.Exec(ctx, `select pgque.send('wide', 'ab', '{}'::jsonb, repeat('k', 268435454))`); code(err) != "54000" {
		t.Errorf("a 256 MB key with a 2-byte type: %v, want 54000", err)
	}
}

// TestLongKeysDoNotStopTheTicker: the tick's touched set (_tick_slots)
// collected the partition keys of up to 4·N + 1 of the batch's events in
// one array. A key is any text a writer sends, and an array holds at most
// 1 GB, so 4097 keys of 256 kB on a queue with a 1024-slot consumer made
// ticker() fail, and with it the tick of every other queue, for as long
// as those events were the next batch: the Go ticker and run_ticker call
// ticker(). The keys compress (they cost little to write); the tick reads
// them whole.
func TestLongKeysDoNotStopTheTicker(t *testing.T) {
	t.Parallel()
	dsn, conn := setupDB(t)
	ctx := context.Background()
	mustExec(t, conn,
		`select pgque.create_queue('lk')`,
		`select pgque.subscribe_slot('lk', 'p', s, 1024) from generate_series(0, 1023) s`,
		`select pgque.create_queue('bystander')`,
		`select pgque.subscribe('bystander', 'c')`)
	writer := asRole(t, dsn, roleWriter)
	mustExec(t, writer,
		`select count(pgque.send('lk', 't', '{}'::jsonb, repeat('x', 262200) || g)) from generate_series(1, 4097) g`,
		`select pgque.send('bystander', 't', '{"n":1}'::jsonb)`)
	mustExec(t, conn, `select pgque.force_next_tick('lk')`, `select pgque.force_next_tick('bystander')`)
	if _, err := conn.Exec(ctx, `select pgque.ticker()`); err != nil {
		t.Fatalf("ticker() with 4097 keys of 256 kB in a batch: %v", err)
	}
	var n int
	if err := conn.QueryRow(ctx, `select count(*) from pgque.receive('bystander', 'c', 10)`).Scan(&n); err != nil || n != 1 {
		t.Errorf("the other queue's consumer: %d events, %v; want its event ticked", n, err)
	}
}

// TestLongKeysDoNotStopReceiveOrKeyShares: 1000 events of 1.1 MB keys
// (cheap to write: they compress) broke two readers with arrays over
// PostgreSQL's 1 GB.
//   - A chunk's byte budget counted the events' data only, though a writer
//     chooses the type and the key as freely: the chunk of a receive of
//     1000, the Go client's default, failed with 54000 at every try, and
//     the queue's consumers, plain and partitioned, were stopped for good.
//     Every text an event is handed out with now counts against the budget.
//   - key_shares picked each slot's top key as the first of an array of
//     every key it scanned: the view (and the console's keys page) failed
//     for every reader of the queue. It also took a minute, comparing the
//     compressed keys over and over; they are grouped by their _kid now.
//
// One test for both: writing and reading 1 GB of keys is most of its time.
func TestLongKeysDoNotStopReceiveOrKeyShares(t *testing.T) {
	t.Parallel()
	dsn, conn := setupDB(t)
	ctx := context.Background()
	mustExec(t, conn,
		`select pgque.create_queue('lk')`,
		`select pgque.subscribe('lk', 'c')`,
		`select pgque.subscribe_slot('lk', 'p', 0, 1)`)
	writer := asRole(t, dsn, roleWriter)
	mustExec(t, writer,
		`select count(pgque.send('lk', 't', '{}'::jsonb, repeat('x', 1100000) || g)) from generate_series(1, 1000) g`,
		`select pgque.send('lk', 't', '{}'::jsonb, 'hot') from generate_series(1, 3)`)
	mustExec(t, conn, `select pgque.force_next_tick('lk')`, `select pgque.ticker('lk')`)

	reader := asRole(t, dsn, roleReader)
	var top string
	var pending, keys int64
	if err := reader.QueryRow(ctx, `select top_key, pending, keys from pgque.key_shares('lk', 'p')`).Scan(&top, &pending, &keys); err != nil {
		t.Fatalf("key_shares with 1000 keys of 1.1 MB: %v", err)
	}
	if top != "hot" || pending != 1003 || keys != 1001 {
		t.Errorf("key_shares: top key %.10q, %d pending, %d keys; want \"hot\", 1003, 1001", top, pending, keys)
	}

	var n int
	if err := conn.QueryRow(ctx, `select count(*) from pgque.receive('lk', 'c', 1000)`).Scan(&n); err != nil || n < 1 {
		t.Errorf("receive of 1000 events with 1.1 MB keys: %d events, %v; want a chunk", n, err)
	}
	var token string
	if err := conn.QueryRow(ctx, `select token::text from pgque.claim_slot('lk', 'p', 0, 'w', '1 min')`).Scan(&token); err != nil {
		t.Fatal("claim:", err)
	}
	if err := conn.QueryRow(ctx, `select count(*) from pgque.receive_partitioned('lk', 'p', 0, 1, 'w', $1::uuid, 1000)`,
		token).Scan(&n); err != nil || n < 1 {
		t.Errorf("receive_partitioned of 1000 events with 1.1 MB keys: %d events, %v; want a chunk", n, err)
	}
}

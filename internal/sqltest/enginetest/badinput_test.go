package enginetest

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"strings"
	"testing"
)

// setupBadInput gives a bad-input test a database with queue "q", consumer
// "c" subscribed through the api, and a pool on it.
func setupBadInput(t *testing.T) beginner {
	t.Helper()
	return setupAPI(t, "c")
}

// snapshot is the state bad input must leave alone.
type snapshot struct {
	Queues, Subs, Events, Retries, Tables int64
	Config                                string
}

func takeSnapshot(t testing.TB, q db) snapshot {
	t.Helper()
	var s snapshot
	err := q.QueryRow(context.Background(), `select
		(select count(*) from pgque.queue), (select count(*) from pgque.subscription),
		(select count(*) from pgque.event), (select count(*) from pgque.retry_queue),
		(select count(*) from pg_catalog.pg_class where relnamespace = 'pgque'::regnamespace),
		(select string_agg(format('%s %s %s %s %s %s', queue_name, queue_ticker_max_count, queue_ticker_max_lag,
		                          queue_ticker_idle_period, queue_rotation_period, queue_max_retries), '; ' order by queue_id)
		   from pgque.queue)`).Scan(&s.Queues, &s.Subs, &s.Events, &s.Retries, &s.Tables, &s.Config)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// badCall is one call that must fail with code and change nothing; the
// message must mention each of mention.
type badCall struct {
	name    string
	sql     string
	args    []any
	code    string
	mention []string
}

func checkBadCalls(t *testing.T, pool db, calls []badCall) {
	t.Helper()
	for _, c := range calls {
		before := takeSnapshot(t, pool)
		err := queryErr(pool, c.sql, c.args...)
		if err == nil {
			t.Errorf("%s: %s succeeded, want SQLSTATE %s", c.name, c.sql, c.code)
			continue
		}
		wantCode(t, c.name, err, c.code, c.mention...)
		if after := takeSnapshot(t, pool); after != before {
			t.Errorf("%s: the failed call changed state: %+v, was %+v", c.name, after, before)
		}
	}
}

// TestBadNames: unknown queues and consumers, NULL, empty, quoted,
// semicolon-laden and over-long names get the documented SQLSTATE, a
// message naming the value, and create nothing.
func TestBadNames(t *testing.T) {
	t.Parallel()
	pool := setupBadInput(t)
	long := strings.Repeat("n", 64)
	multibyte := strings.Repeat("é", 32) // 32 characters, 64 bytes
	calls := []badCall{
		// Unknown queue.
		{"send to unknown queue", "select pgque.send('nope', '{}'::jsonb)", nil, "PQ001", []string{"nope"}},
		{"send_batch to unknown queue", "select pgque.send_batch('nope', 't', array['{}'::jsonb])", nil, "PQ001", []string{"nope"}},
		{"insert_event into unknown queue", "select pgque.insert_event('nope', 't', 'd')", nil, "PQ001", []string{"nope"}},
		{"receive from unknown queue", "select * from pgque.receive('nope', 'c')", nil, "PQ001", []string{"nope"}},
		{"subscribe to unknown queue", "select pgque.subscribe('nope', 'c')", nil, "PQ001", []string{"nope"}},
		{"register on unknown queue", "select pgque.register_consumer('nope', 'c')", nil, "PQ001", []string{"nope"}},
		{"next_batch on unknown queue", "select pgque.next_batch('nope', 'c')", nil, "PQ001", []string{"nope"}},
		{"ticker of unknown queue", "select pgque.ticker('nope')", nil, "PQ001", []string{"nope"}},
		{"force_next_tick of unknown queue", "select pgque.force_next_tick('nope')", nil, "PQ001", []string{"nope"}},
		{"set_queue_config of unknown queue", "select pgque.set_queue_config('nope', 'max_retries', '1')", nil, "PQ001", []string{"nope"}},
		{"drop unknown queue", "select pgque.drop_queue('nope')", nil, "PQ001", []string{"nope"}},
		{"get_queue_info of unknown queue", "select * from pgque.get_queue_info('nope')", nil, "PQ001", []string{"nope"}},
		{"dlq_list of unknown queue", "select * from pgque.dlq_list('nope')", nil, "PQ001", []string{"nope"}},
		// Unknown consumer.
		{"receive as unknown consumer", "select * from pgque.receive('q', 'ghost')", nil, "PQ002", []string{"ghost", "q"}},
		{"next_batch of unknown consumer", "select pgque.next_batch('q', 'ghost')", nil, "PQ002", []string{"ghost"}},
		{"unregister unknown consumer", "select pgque.unregister_consumer('q', 'ghost')", nil, "PQ002", []string{"ghost"}},
		// NULL names.
		{"create_queue(NULL)", "select pgque.create_queue(NULL)", nil, "22004", []string{"queue"}},
		{"send to NULL queue", "select pgque.send(NULL, '{}'::jsonb)", nil, "22004", []string{"queue"}},
		{"receive from NULL queue", "select * from pgque.receive(NULL, 'c')", nil, "22004", []string{"queue"}},
		{"receive as NULL consumer", "select * from pgque.receive('q', NULL)", nil, "22004", []string{"consumer"}},
		{"subscribe NULL consumer", "select pgque.subscribe('q', NULL)", nil, "22004", []string{"consumer"}},
		{"register NULL consumer", "select pgque.register_consumer('q', NULL)", nil, "22004", []string{"consumer"}},
		{"next_batch of NULL consumer", "select pgque.next_batch('q', NULL)", nil, "22004", []string{"consumer"}},
		// Empty names.
		{"create_queue('')", "select pgque.create_queue('')", nil, "PQ010", []string{"empty"}},
		{"subscribe ''", "select pgque.subscribe('q', '')", nil, "PQ010", []string{"empty"}},
		{"register ''", "select pgque.register_consumer('q', '')", nil, "PQ010", []string{"empty"}},
		// Quotes, semicolons, whitespace, reserved characters.
		{"queue name with a quote", "select pgque.create_queue($1)", []any{"it's"}, "PQ010", []string{"it''s"}},
		{"queue name with a double quote", "select pgque.create_queue($1)", []any{`a"b`}, "PQ010", []string{`a"b`}},
		{"queue name with a semicolon", "select pgque.create_queue($1)", []any{"q; drop table pgque.queue"}, "PQ010", []string{"q; drop table pgque.queue"}},
		{"queue name with a space", "select pgque.create_queue($1)", []any{"a b"}, "PQ010", []string{"a b"}},
		{"queue name with a newline", "select pgque.create_queue($1)", []any{"ab\n"}, "PQ010", []string{"ab"}},
		{"queue name with #", "select pgque.create_queue($1)", []any{"a#1/2"}, "PQ010", []string{"a#1/2"}},
		{"consumer name with a quote", "select pgque.subscribe('q', $1)", []any{"o'neil"}, "PQ010", []string{"o''neil"}},
		{"consumer name with a semicolon", "select pgque.subscribe('q', $1)", []any{"c;select 1"}, "PQ010", []string{"c;select 1"}},
		{"plain consumer with a slot name", "select pgque.subscribe('q', $1)", []any{"c#0/2"}, "PQ010", []string{"c#0/2"}},
		{"consumer name starting with -", "select pgque.subscribe('q', $1)", []any{"-c"}, "PQ010", []string{"-c"}},
		// Over 63 bytes.
		{"64-byte queue name", "select pgque.create_queue($1)", []any{long}, "PQ010", []string{long[:40], "64 bytes"}},
		{"64-byte multibyte queue name", "select pgque.create_queue($1)", []any{multibyte}, "PQ010", []string{"64 bytes"}},
		{"64-byte consumer name", "select pgque.subscribe('q', $1)", []any{long}, "PQ010", []string{long[:40], "64 bytes"}},
		// NUL bytes never reach a function: PostgreSQL text cannot hold them.
		{"queue name with a NUL byte", "select pgque.create_queue($1)", []any{"a\x00b"}, "22021", nil},
		{"insert_event data with a NUL byte", "select pgque.insert_event('q', 't', $1)", []any{"x\x00y"}, "22021", nil},
	}
	checkBadCalls(t, pool, calls)

	// The longest valid names work, and the quoted semicolon did nothing.
	max := strings.Repeat("m", 63)
	if n := scalar[int32](t, pool, "select pgque.create_queue($1)", max); n != 1 {
		t.Errorf("create_queue with a 63-byte name = %d, want 1", n)
	}
	if n := scalar[int32](t, pool, "select pgque.subscribe($1, $1)", max); n != 1 {
		t.Errorf("subscribe with a 63-byte name = %d, want 1", n)
	}
	if n := scalar[int32](t, pool, "select pgque.create_queue('q')"); n != 0 {
		t.Errorf("create_queue of an existing queue = %d, want 0", n)
	}
	if n := scalar[int32](t, pool, "select pgque.unsubscribe('q', 'ghost')"); n != 0 {
		t.Errorf("unsubscribe of an unknown consumer = %d, want 0", n)
	}
	if n := scalar[int64](t, pool, "select count(*) from pgque.queue"); n != 2 {
		t.Errorf("%d queues exist, want 2", n)
	}
}

// TestBadPayloads: invalid JSON and NUL bytes fail with their SQLSTATE and
// commit nothing; send_batch with a NULL element inserts nothing; a 10 MB
// payload round-trips intact.
func TestBadPayloads(t *testing.T) {
	t.Parallel()
	pool := setupBadInput(t)
	calls := []badCall{
		{"invalid JSON", "select pgque.send('q', 't', $1::text::jsonb)", []any{`{"a": `}, "22P02", []string{"json"}},
		{"invalid JSON in send_batch", "select pgque.send_batch('q', 't', $1::text[]::jsonb[])", []any{[]string{`{}`, `nope`}}, "22P02", []string{"json"}},
		{"NUL escape in JSON", "select pgque.send('q', 't', $1::text::jsonb)", []any{`{"a": "x\u0000y"}`}, "22P05", nil},
		{"NUL byte in a JSON string", "select pgque.send('q', 't', $1::text::jsonb)", []any{"{\"a\": \"x\x00y\"}"}, "22021", nil},
		{"NUL byte in the type", "select pgque.send('q', $1, '{}'::jsonb)", []any{"t\x00"}, "22021", nil},
		{"NUL byte in the partition key", "select pgque.send('q', 't', '{}'::jsonb, $1)", []any{"k\x00"}, "22021", nil},
		{"NULL payload", "select pgque.send('q', NULL::jsonb)", nil, "22004", []string{"payload"}},
		{"NULL type", "select pgque.send('q', NULL, '{}'::jsonb)", nil, "22004", []string{"type"}},
		{"send_batch with a NULL element", "select pgque.send_batch('q', 't', array['{}', NULL, '{}']::jsonb[])", nil, "22004", []string{"payload 2"}},
		{"send_batch with NULL payloads", "select pgque.send_batch('q', 't', NULL::jsonb[])", nil, "22004", []string{"payloads"}},
		{"send_batch with NULL text payloads", "select pgque.send_batch('q', 't', NULL::text[])", nil, "22004", []string{"payloads"}},
		{"send_batch with an invalid text payload", `select pgque.send_batch('q', 't', array['{}', '{"a":'])`, nil, "22P02", []string{"json"}},
		{"send_batch with a NUL escape in a text payload", `select pgque.send_batch('q', 't', array['{}', '"\u0000"'])`, nil, "22P05", nil},
		{"send with an invalid text payload", `select pgque.send('q', 't', '{"a": }'::text, 'k')`, nil, "22P02", []string{"json"}},
		{"send with a NUL escape in a text payload", `select pgque.send('q', 't', '{"a": "\u0000"}'::text, 'k')`, nil, "22P05", nil},
		// Escapes that json_in takes and jsonb refuses: the text forms refuse
		// them too, or jsonb readers would get the payload as a JSON string.
		{"send with a lone high surrogate in a text payload", `select pgque.send('q', 't', '{"a": "\ud83d"}'::text, 'k')`, nil, "22P02", []string{"json"}},
		{"send with a lone low surrogate in a text payload", `select pgque.send('q', 't', '["\uDE00x"]'::text, NULL)`, nil, "22P02", []string{"json"}},
		{"send_batch with a lone surrogate in a text payload", `select pgque.send_batch('q', 't', array['{}', '"\udbff"'])`, nil, "22P02", []string{"json"}},
		{"mixed send_batch with a lone surrogate in a text payload", `select pgque.send_batch('q', array['a', 'b'], array['"\ud800"', '{}'])`, nil, "22P02", []string{"json"}},
		{"send_batch with too few keys", "select pgque.send_batch('q', 't', array['{}', '{}', '{}']::jsonb[], array['a', 'b'])", nil, "PQ011", []string{"2 partition keys for 3 payloads"}},
		{"send_batch with 2-D payloads", "select pgque.send_batch('q', 't', array[['{}'], ['{}']]::jsonb[])", nil, "PQ011", []string{"one-dimensional"}},
		{"mixed send_batch with too few types", "select pgque.send_batch('q', array['a', 'b'], array['{}', '{}', '{}']::jsonb[])", nil, "PQ011", []string{"2 types for 3 payloads"}},
		{"mixed send_batch with too many types", `select pgque.send_batch('q', array['a', 'b'], array['{}'])`, nil, "PQ011", []string{"2 types for 1 payloads"}},
		{"mixed send_batch with a NULL type", `select pgque.send_batch('q', array['a', NULL, 'c'], array['{}', '{}', '{}'])`, nil, "22004", []string{"type 2"}},
		{"mixed send_batch with NULL types", "select pgque.send_batch('q', NULL::text[], array['{}']::jsonb[])", nil, "22004", []string{"type"}},
		{"mixed send_batch with 2-D types", "select pgque.send_batch('q', array[['a'], ['b']], array['{}', '{}']::jsonb[])", nil, "PQ011", []string{"one-dimensional"}},
		{"mixed send_batch with an invalid text payload", `select pgque.send_batch('q', array['a', 'b'], array['{}', '{"a":'])`, nil, "22P02", []string{"json"}},
		{"mixed send_batch with too few keys", `select pgque.send_batch('q', array['a', 'b'], array['{}', '{}'], array['k'])`, nil, "PQ011", []string{"1 partition keys for 2 payloads"}},
	}
	// Each failing call runs inside a transaction that first sends a good
	// event, as an application would: the error rolls the whole transaction
	// back, so nothing is committed.
	for _, c := range calls {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			before := takeSnapshot(t, pool)
			tx, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(ctx)
			exec(t, tx, "select pgque.send('q', '{\"ok\": true}'::jsonb)")
			err = queryErr(tx, c.sql, c.args...)
			if err == nil {
				t.Fatalf("%s succeeded, want SQLSTATE %s", c.sql, c.code)
			}
			wantCode(t, c.name, err, c.code, c.mention...)
			if err := tx.Commit(ctx); err == nil {
				t.Errorf("COMMIT after the failed call succeeded")
			}
			if after := takeSnapshot(t, pool); after != before {
				t.Errorf("state changed: %+v, was %+v", after, before)
			}
		})
	}
	// And alone, in autocommit: nothing inserted either.
	checkBadCalls(t, pool, calls)
	tick(t, pool, "q")
	if ms := mustReceive(t, pool, "q", "c", 100); len(ms) != 0 {
		t.Errorf("after only failed sends, c received %v", msgIDs(ms))
	}

	// Valid edge cases work: empty batch, NULL keys, 10 MB payloads.
	if ids := scalar[[]int64](t, pool, "select pgque.send_batch('q', 't', '{}'::jsonb[])"); len(ids) != 0 {
		t.Errorf("empty send_batch returned %v", ids)
	}
	// JSON with every kind of escape round-trips as the same JSON value.
	tricky := map[string]string{"quote": `"'`, "backslash": `\\`, "ctl": "\t\n\u0001", "uni": "é€😀", "html": "<&>"}
	trickyJSON, err := json.Marshal(tricky)
	if err != nil {
		t.Fatal(err)
	}
	trickyID := scalar[int64](t, pool, "select pgque.send('q', 'tricky', $1::text::jsonb)", string(trickyJSON))

	// 10 MB: random hex inside a JSON object (sent through send), and as
	// raw data (insert_event), both compared byte for byte.
	raw := make([]byte, 5<<20)
	rand.NewChaCha8([32]byte{1, 2, 3}).Read(raw)
	big := hex.EncodeToString(raw)
	bigID := scalar[int64](t, pool, "select pgque.send('q', 'big', jsonb_build_object('blob', $1::text), 'k')", big)
	rawID := scalar[int64](t, pool, "select pgque.insert_event('q', 'raw', $1)", big)
	tick(t, pool, "q")
	ms := mustReceive(t, pool, "q", "c", 10)
	if len(ms) != 3 || ms[0].MsgID != trickyID || ms[1].MsgID != bigID || ms[2].MsgID != rawID {
		t.Fatalf("received %v, want [%d %d %d]", msgIDs(ms), trickyID, bigID, rawID)
	}
	var trickyGot map[string]string
	if err := json.Unmarshal([]byte(ms[0].Payload), &trickyGot); err != nil || !maps.Equal(trickyGot, tricky) {
		t.Errorf("payload with escapes came back as %s (%v), want %s", ms[0].Payload, err, trickyJSON)
	}
	if want := `{"blob": "` + big + `"}`; ms[1].Payload != want {
		t.Errorf("the 10 MB JSON payload did not round-trip intact: got %d bytes, want %d", len(ms[1].Payload), len(want))
	}
	if len(ms[1].Payload) < 10<<20 {
		t.Errorf("the big payload is only %d bytes", len(ms[1].Payload))
	}
	// Data that is not JSON (written by insert_event) comes back as a JSON string.
	if want := `"` + big + `"`; ms[2].Payload != want {
		t.Errorf("the 10 MB insert_event data did not round-trip intact: got %d bytes, want %d", len(ms[2].Payload), len(want))
	}
	if a := ack(t, pool, ms[0].BatchID); a != 1 {
		t.Errorf("ack = %d", a)
	}
}

// TestBadArguments: negative delays are PQ011 and zero delays work; unknown
// configuration parameters are PQ012 and bad values PQ011, and a refused
// setting changes nothing; bad batch ids and event ids are PQ020/PQ022.
func TestBadArguments(t *testing.T) {
	t.Parallel()
	pool := setupBadInput(t)
	sent := sendN(t, pool, 3, "args")
	tick(t, pool, "q")
	ms := mustReceive(t, pool, "q", "c", 10)
	if len(ms) != 3 {
		t.Fatalf("received %v", msgIDs(ms))
	}
	b := ms[0].BatchID
	const unknownBatch = 987654321
	calls := []badCall{
		{"nack with a negative delay", "select pgque.nack($1, $2, '-1 second', 'r')", []any{b, sent[0]}, "PQ011", []string{"-00:00:01"}},
		{"event_retry with negative seconds", "select pgque.event_retry($1, $2, -5)", []any{b, sent[0]}, "PQ011", []string{"-00:00:05"}},
		{"nack of an event not in the batch", "select pgque.nack($1, 424242, '0', 'r')", []any{b}, "PQ022", []string{"424242", fmt.Sprint(b)}},
		{"nack of an unknown batch", "select pgque.nack($1, $2, '0', 'r')", []any{unknownBatch, sent[0]}, "PQ020", []string{fmt.Sprint(unknownBatch)}},
		{"ack of an unknown batch", "select pgque.ack($1)", []any{unknownBatch}, "PQ020", []string{fmt.Sprint(unknownBatch)}},
		{"ack of NULL", "select pgque.ack(NULL)", nil, "22004", []string{"batch"}},
		{"get_batch_events of an unknown batch", "select * from pgque.get_batch_events($1)", []any{unknownBatch}, "PQ020", []string{fmt.Sprint(unknownBatch)}},
		{"finish_batch of an unknown batch", "select pgque.finish_batch($1)", []any{unknownBatch}, "PQ020", []string{fmt.Sprint(unknownBatch)}},
		{"receive with max 0", "select * from pgque.receive('q', 'c', 0)", nil, "PQ011", []string{"not 0"}},
		{"receive with max -3", "select * from pgque.receive('q', 'c', -3)", nil, "PQ011", []string{"-3"}},
		{"receive with max NULL", "select * from pgque.receive('q', 'c', NULL)", nil, "22004", []string{"max"}},
		{"dlq_replay of an unknown dead letter", "select pgque.dlq_replay('q', 555)", nil, "PQ040", []string{"555"}},
		{"dlq_purge with a negative age", "select pgque.dlq_purge('q', NULL, '-1 day')", nil, "PQ011", []string{"-1 days"}},
		{"dlq_list with a negative max", "select * from pgque.dlq_list('q', NULL, -1)", nil, "PQ011", []string{"-1"}},
		// Configuration.
		{"unknown parameter", "select pgque.set_queue_config('q', 'ticker_speed', '1')", nil, "PQ012", []string{"ticker_speed"}},
		{"empty parameter", "select pgque.set_queue_config('q', '', '1')", nil, "PQ012", nil},
		{"NULL parameter", "select pgque.set_queue_config('q', NULL, '1')", nil, "22004", []string{"parameter"}},
		{"NULL value", "select pgque.set_queue_config('q', 'max_retries', NULL)", nil, "22004", []string{"value"}},
		{"ticker_max_count 0", "select pgque.set_queue_config('q', 'ticker_max_count', '0')", nil, "PQ011", []string{"ticker_max_count", "not 0"}},
		{"ticker_max_count not a number", "select pgque.set_queue_config('q', 'ticker_max_count', 'lots')", nil, "PQ011", []string{"lots"}},
		{"ticker_max_count too big", "select pgque.set_queue_config('q', 'ticker_max_count', '99999999999')", nil, "PQ011", []string{"99999999999"}},
		{"max_retries negative", "select pgque.set_queue_config('q', 'max_retries', '-1')", nil, "PQ011", []string{"max_retries", "-1"}},
		{"max_retries fractional", "select pgque.set_queue_config('q', 'queue_max_retries', '1.5')", nil, "PQ011", []string{"1.5"}},
		{"ticker_max_lag negative", "select pgque.set_queue_config('q', 'ticker_max_lag', '-1 s')", nil, "PQ011", []string{"-1 s"}},
		{"ticker_idle_period zero", "select pgque.set_queue_config('q', 'ticker_idle_period', '0')", nil, "PQ011", []string{"ticker_idle_period"}},
		{"rotation_period not an interval", "select pgque.set_queue_config('q', 'rotation_period', 'soon')", nil, "PQ011", []string{"soon"}},
		{"rotation_period with an injection", "select pgque.set_queue_config('q', 'rotation_period', $1)", []any{"1 hour'; drop table pgque.queue; --"}, "PQ011", []string{"drop table"}},
	}
	checkBadCalls(t, pool, calls)

	// Zero delay works; the batch is intact after all the refused calls.
	if n := scalar[int32](t, pool, "select pgque.nack($1, $2, '0', 'zero delay')", b, sent[0]); n != 1 {
		t.Errorf("nack with zero delay = %d, want 1", n)
	}
	if n := scalar[int32](t, pool, "select pgque.event_retry($1, $2, 0)", b, sent[1]); n != 1 {
		t.Errorf("event_retry with zero seconds = %d, want 1", n)
	}
	// A NULL delay dead-letters at once, on the first failure.
	if n := scalar[int32](t, pool, "select pgque.nack($1, $2, NULL, 'dead now')", b, sent[2]); n != 0 {
		t.Errorf("nack with a NULL delay = %d, want 0 (dead-lettered)", n)
	}
	if n := scalar[int64](t, pool, "select count(*) from pgque.dlq_list('q') where ev_id = $1 and reason = 'dead now' and ev_retry = 0", sent[2]); n != 1 {
		t.Errorf("dead letters of the NULL-delay nack = %d, want 1", n)
	}
	if a := ack(t, pool, b); a != 1 {
		t.Errorf("ack = %d, want 1", a)
	}
	if n := scalar[int32](t, pool, "select pgque.maint_retry_events()"); n != 2 {
		t.Errorf("maint_retry_events = %d, want 2 (zero delays are due at once)", n)
	}
	tick(t, pool, "q")
	if got := mustReceive(t, pool, "q", "c", 10); len(got) != 2 || got[0].MsgID != sent[0] || got[1].MsgID != sent[1] ||
		got[0].RetryCount != 1 {
		t.Errorf("after zero-delay retries received %+v", got)
	}

	// Good values apply, with or without the queue_ prefix.
	for _, set := range [][2]string{
		{"ticker_max_count", "7"}, {"queue_ticker_max_lag", "0"}, {"ticker_idle_period", "5 minutes"},
		{"rotation_period", "1 ms"}, {"max_retries", "0"},
	} {
		if n := scalar[int32](t, pool, "select pgque.set_queue_config('q', $1, $2)", set[0], set[1]); n != 1 {
			t.Errorf("set_queue_config(%s, %s) = %d", set[0], set[1], n)
		}
	}
	if got := takeSnapshot(t, pool).Config; got != "q 7 00:00:00 00:05:00 00:00:00.001 0" {
		t.Errorf("config after valid settings = %q", got)
	}
}

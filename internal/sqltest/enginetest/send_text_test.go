package enginetest

import (
	"context"
	"fmt"
	"strings"
	"testing"
)

// TestSendTextForms: the text forms of send and send_batch store the JSON
// text as given and deliver the same payload, key and order as the jsonb
// forms; an untyped literal payload picks the text form, a jsonb one the
// jsonb form; a keyed text send is deduplicated like a keyed jsonb send.
func TestSendTextForms(t *testing.T) {
	t.Parallel()
	_, pool := setupEngine(t)
	const doc = `{"b": 1,  "a": [true, null]}`

	idText := scalar[int64](t, pool, `select pgque.send('q', 't', $1::text, 'k1')`, doc)
	idJSONB := scalar[int64](t, pool, `select pgque.send('q', 't', $1::jsonb, 'k1')`, doc)
	idLiteral := scalar[int64](t, pool, `select pgque.send('q', 't', '{"b": 1,  "a": [true, null]}', 'k2')`)
	ids := scalar[[]int64](t, pool, `select pgque.send_batch('q', 'u', $1::text[], array['k3', null])`,
		[]string{`[1,2]`, ` "s" `})
	dup := scalar[int64](t, pool, `select pgque.send('q', 't', '{}'::text, 'k1', 'req-1')`)
	again := scalar[int64](t, pool, `select pgque.send('q', 't', '{"other": 1}'::text, 'k1', 'req-1')`)
	again2 := scalar[int64](t, pool, `select pgque.send('q', 't', '{"other": 2}'::jsonb, 'k1', 'req-1')`)
	if again != dup || again2 != dup {
		t.Errorf("keyed text send returned %d and %d for a key first sent as %d", again, again2, dup)
	}
	if len(ids) != 2 || ids[0] <= idLiteral || ids[1] <= ids[0] {
		t.Fatalf("send_batch text ids %v after %d", ids, idLiteral)
	}

	// Stored: the text form as given, the jsonb form as jsonb prints it.
	stored := column[string](t, pool, `select ev_data from pgque.event where ev_id = any($1) order by ev_id`,
		[]int64{idText, idJSONB, idLiteral, ids[0], ids[1], dup})
	want := []string{doc, `{"a": [true, null], "b": 1}`, doc, `[1,2]`, ` "s" `, `{}`}
	for i := range want {
		if i >= len(stored) || stored[i] != want[i] {
			t.Fatalf("stored ev_data = %q, want %q", stored, want)
		}
	}

	// Delivered: the same jsonb whichever form sent it.
	tick(t, pool, "q")
	ms := mustReceive(t, pool, "q", "c", 100)
	if len(ms) != 6 {
		t.Fatalf("received %d messages, want 6: %+v", len(ms), ms)
	}
	if ms[0].Payload != ms[1].Payload || ms[1].Payload != ms[2].Payload || ms[0].Payload != `{"a": [true, null], "b": 1}` {
		t.Errorf("payloads of the text, jsonb and literal sends: %q, %q, %q", ms[0].Payload, ms[1].Payload, ms[2].Payload)
	}
	if ms[3].Payload != `[1, 2]` || ms[4].Payload != `"s"` || ms[3].Type != "u" {
		t.Errorf("send_batch text payloads delivered as %q, %q (type %q)", ms[3].Payload, ms[4].Payload, ms[3].Type)
	}
	if k := ms[3].PartitionKey; k == nil || *k != "k3" || ms[4].PartitionKey != nil {
		t.Errorf("send_batch text keys delivered as %v, %v", ms[3].PartitionKey, ms[4].PartitionKey)
	}
	ack(t, pool, ms[0].BatchID)
}

// TestEventPartitionsHaveNoCheck: event partitions carry no CHECK
// constraint (every INSERT would parse and plan it); their partition bound
// alone keeps ev_part right, and a row for another queue is refused.
func TestEventPartitionsHaveNoCheck(t *testing.T) {
	t.Parallel()
	_, pool := setupEngine(t)
	n := scalar[int64](t, pool, `select count(*) from pg_catalog.pg_constraint c
		join pg_catalog.pg_inherits i on i.inhrelid = c.conrelid
		where i.inhparent = 'pgque.event'::regclass and c.contype = 'c'`)
	if n != 0 {
		t.Errorf("%d CHECK constraints on event partitions, want 0", n)
	}
	tables := eventTables(t, pool, "q")
	err := queryErr(pool, `insert into `+tables[0]+` (ev_id, ev_part) values (1, -1)`)
	wantCode(t, "a row outside the partition's bound", err, "23514")
}

// TestSendBatchIDsPairWithPayloads: the i-th ev_id send_batch returns is
// the event made from the i-th payload and key, in the text, jsonb and
// keyed (dedup) forms, while another session takes ids from the same
// sequence; a batch with one payload that is not JSON, or that holds a
// \u0000 escape, stores nothing and takes no id.
func TestSendBatchIDsPairWithPayloads(t *testing.T) {
	t.Parallel()
	_, pool := setupEngine(t)
	ctx := context.Background()
	const n = 200
	payloads := make([]string, n)
	keys := make([]string, n)
	dedups := make([]string, n)
	for i := range payloads {
		payloads[i] = fmt.Sprintf(`{"i": %d, "pad": "%s"}`, i, strings.Repeat("x", i%7))
		keys[i] = fmt.Sprintf("k%d", i%13)
		dedups[i] = fmt.Sprintf("d%d", i)
	}
	payloads[7] = ` {"b\\u0000": 1} ` // an escaped backslash: JSON, and stored as given

	// A sender on another connection interleaves its ids with the batches'.
	stop := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		for {
			select {
			case <-stop:
				done <- nil
				return
			default:
			}
			if _, err := pool.Exec(ctx, `select pgque.send('q', 't', '{}'::text, 'other')`); err != nil {
				done <- err
				return
			}
		}
	}()
	forms := []struct{ name, sql string }{
		{"text", `select pgque.send_batch('q', 't', $1::text[], $2::text[])`},
		{"jsonb", `select pgque.send_batch('q', 't', $1::text[]::jsonb[], $2::text[])`},
		{"keyed", `select pgque.send_batch('q', 't', $1::text[], $2::text[], $3::text[])`},
	}
	for _, f := range forms {
		args := []any{payloads, keys}
		if f.name == "keyed" {
			args = append(args, dedups)
		}
		ids := scalar[[]int64](t, pool, f.sql, args...)
		if len(ids) != n {
			t.Fatalf("%s: %d ids for %d payloads", f.name, len(ids), n)
		}
		for i, id := range ids {
			var data, key string
			if err := pool.QueryRow(ctx, `select ev_data::jsonb::text, ev_extra1 from pgque.event where ev_id = $1`, id).Scan(&data, &key); err != nil {
				t.Fatalf("%s: event %d of payload %d: %v", f.name, id, i, err)
			}
			want := scalar[string](t, pool, `select $1::jsonb::text`, payloads[i])
			if data != want || key != keys[i] {
				t.Fatalf("%s: ids[%d] = %d holds %s (key %s), want %s (key %s)", f.name, i, id, data, key, want, keys[i])
			}
		}
		if f.name == "text" {
			stored := scalar[string](t, pool, `select ev_data from pgque.event where ev_id = $1`, ids[7])
			if stored != payloads[7] {
				t.Errorf("text: payload with an escaped backslash stored as %q, want %q", stored, payloads[7])
			}
		}
	}
	close(stop)
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	seq := scalar[string](t, pool, `select queue_event_seq::text from pgque.queue where queue_name = 'q'`)
	lastID := func() int64 { return scalar[int64](t, pool, `select last_value from `+seq) }
	before, beforeID := scalar[int64](t, pool, `select count(*) from pgque.event where ev_type = 'bad'`), lastID()
	for _, c := range []struct{ bad, code string }{{`{"i": 1`, "22P02"}, {`"\u0000"`, "22P05"}} {
		bad := append([]string(nil), payloads...)
		bad[n/2] = c.bad
		err := queryErr(pool, `select pgque.send_batch('q', 'bad', $1::text[], $2::text[])`, bad, keys)
		wantCode(t, fmt.Sprintf("a batch with payload %q", c.bad), err, c.code)
	}
	if after := scalar[int64](t, pool, `select count(*) from pgque.event where ev_type = 'bad'`); after != before {
		t.Errorf("refused batches stored %d events", after-before)
	}
	// The check runs before any id is taken: the sequence, which counts
	// unticked events, did not move.
	if id := lastID(); id != beforeID {
		t.Errorf("refused batches took ids %d..%d", beforeID+1, id)
	}
}

// TestSendTextTakesWhatJSONBTakes: the JSON that the text forms of send
// parse as jsonb besides json (_jsonb_may_refuse) is still sent when jsonb
// takes it: a surrogate pair, a Hangul escape, Go's escape of "<". Each is
// stored as given and read by receive as the JSON value it is, not as a
// string, like a number of 5 exponent digits and a payload over 4 kB.
func TestSendTextTakesWhatJSONBTakes(t *testing.T) {
	t.Parallel()
	_, pool := setupEngine(t)
	payloads := []string{
		`{"s": "\ud83d\ude00"}`,
		`["\uD55C", "\u003c"]`,
		`{"n": 1e99999, "m": 2E-16000}`,
		`{"pad": "` + strings.Repeat("y", 5000) + `", "n": 12345}`,
	}
	var ids []int64
	for _, p := range payloads {
		ids = append(ids, scalar[int64](t, pool, `select pgque.send('q', 't', $1::text, 'k')`, p))
	}
	ids = append(ids, scalar[[]int64](t, pool, `select pgque.send_batch('q', 't', $1::text[])`, payloads)...)
	tick(t, pool, "q")
	got := mustReceive(t, pool, "q", "c", 100)
	if len(got) != 2*len(payloads) {
		t.Fatalf("received %v, want %v", msgIDs(got), ids)
	}
	for i, m := range got {
		p := payloads[i%len(payloads)]
		if m.MsgID != ids[i] {
			t.Fatalf("received %v, want %v", msgIDs(got), ids)
		}
		if kind := scalar[string](t, pool, `select jsonb_typeof($1::jsonb)`, m.Payload); kind == "string" {
			t.Errorf("event %d (%.40s…) came back as a JSON string", m.MsgID, p)
		}
		if same := scalar[bool](t, pool, `select $1::jsonb = $2::jsonb`, m.Payload, p); !same {
			t.Errorf("event %d came back as %.60s…, want %.60s…", m.MsgID, m.Payload, p)
		}
		if stored := scalar[string](t, pool, `select ev_data from pgque.event where ev_id = $1`, m.MsgID); stored != p {
			t.Errorf("event %d is stored as %.60s…, want the text as given", m.MsgID, stored)
		}
	}
}

package partitiontest

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
)

// received is one row of receive or receive_partitioned, payload as text.
type received struct {
	ID      int64
	Batch   int64
	Payload *string
}

func receiveText(t *testing.T, q querier, sql string, args ...any) []received {
	t.Helper()
	rows, err := q.Query(context.Background(), sql, args...)
	if err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	defer rows.Close()
	var out []received
	for rows.Next() {
		var r received
		if err := rows.Scan(&r.ID, &r.Batch, &r.Payload); err != nil {
			t.Fatal(err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return out
}

// T-hostile-data: data written through insert_event that jsonb cannot hold
// (not JSON, or JSON jsonb refuses: \u0000, numbers out of range, nesting
// past the stack limit) never makes receive or receive_partitioned fail: it
// is delivered in order, as a JSON string of the stored text, and the
// events around it arrive unharmed.
func TestHostileDataIsDelivered(t *testing.T) {
	t.Parallel()
	d := setup(t)
	d.createQueue("q")
	d.exec("select pgque.subscribe('q', 'p')")
	d.subscribeSlots("q", "c", 1)
	slot := slotRef{q: "q", c: "c", slot: 0, n: 1, worker: "w", max: 100}
	epoch := mustClaim(t, d.pool, "q", "c", 0, "w", "1 hour")

	deep := strings.Repeat("[", 200000) + strings.Repeat("]", 200000)
	cases := []struct{ name, data string }{
		{"escaped NUL", `"\u0000"`},
		{"escaped NUL in an object", `{"a": "x\u0000y"}`},
		{"huge exponent", `1e1000000`},
		{"huge negative exponent", `-1e1000000`},
		{"tiny exponent", `1e-1000000`},
		{"200 000 digits", strings.Repeat("7", 200000)},
		{"200 000-deep array", deep},
		{"200 000-deep object", strings.Repeat(`{"a":`, 200000) + "1" + strings.Repeat("}", 200000)},
		{"lone surrogate", `"\ud800"`},
		{"bad escape", `"\uZZZZ"`},
		{"garbage", `not json at all`},
		{"truncated", `{"a":`},
		{"empty", ``},
		{"NaN", `NaN`},
		{"trailing garbage", `{} {}`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := one[int64](t, d.pool, "select pgque.insert_event('q', 't', '{\"ok\":1}', 'k', null, null, null)")
			bad := one[int64](t, d.pool, "select pgque.insert_event('q', 't', $1, 'k', null, null, null)", c.data)
			after := one[int64](t, d.pool, "select pgque.insert_event('q', 't', '{\"ok\":2}', 'k', null, null, null)")
			d.tick("q")
			check := func(path string, got []received) {
				t.Helper()
				if len(got) != 3 || got[0].ID != before || got[1].ID != bad || got[2].ID != after {
					t.Fatalf("%s received %d rows, want events %d %d %d", path, len(got), before, bad, after)
				}
				p := got[1].Payload
				if p == nil || !json.Valid([]byte(*p)) {
					t.Fatalf("%s: the payload is not JSON", path)
				}
				var s string
				if err := json.Unmarshal([]byte(*p), &s); err == nil {
					if s != c.data {
						t.Errorf("%s: delivered as a JSON string of %d bytes, not the stored %d bytes", path, len(s), len(c.data))
					}
				} else if compact(t, *p) != compact(t, c.data) {
					t.Errorf("%s: delivered as other JSON than the stored data", path)
				}
			}
			for range 2 { // redelivery reads the chunk again
				check("receive", receiveText(t, d.pool, "select msg_id, batch_id, payload::text from pgque.receive('q', 'p', 100)"))
			}
			if one[int32](t, d.pool, "select pgque.ack($1)", one[int64](t, d.pool, "select current_batch from pgque.get_consumer_info('q', 'p')")) != 1 {
				t.Fatal("ack did not finish the batch")
			}
			got := receiveText(t, d.pool,
				"select msg_id, batch_id, payload::text from pgque.receive_partitioned('q', 'c', 0, 1, 'w', $1::uuid, 100)", tokenFor(t, d.pool, "q", "c", 0, "w"))
			check("receive_partitioned", got)
			if n, err := fencedAck(context.Background(), d.pool, slot, epoch, got[0].Batch, got[0].ID); err != nil || n != 1 {
				t.Fatalf("ack_partitioned = %d, %v; want the batch finished", n, err)
			}
		})
	}
}

func compact(t *testing.T, s string) string {
	t.Helper()
	var v any
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		return s
	}
	b, _ := json.Marshal(v)
	return string(b)
}

// T-chunk-bytes: a chunk is bounded by the bytes of its events' data as
// well as by count: 40 events of 1.1 MB with max 1000 come in several
// chunks of at most 32 MB, each event exactly once; an event larger than
// the budget is delivered alone.
func TestChunkByteBudget(t *testing.T) {
	t.Parallel()
	d := setup(t)
	d.createQueue("q")
	d.exec("select pgque.subscribe('q', 'p')")
	blob := `{"b":"` + strings.Repeat("x", 1100*1024) + `"}`
	var sent []int64
	for range 40 {
		sent = append(sent, one[int64](t, d.pool, "select pgque.send('q', 't', $1::jsonb)", blob))
	}
	huge := `{"b":"` + strings.Repeat("y", 33<<20) + `"}`
	sent = append(sent, one[int64](t, d.pool, "select pgque.send('q', 't', $1::jsonb)", huge))
	sent = append(sent, one[int64](t, d.pool, "select pgque.send('q', 't', '{}'::jsonb)"))
	d.tick("q")
	var got []int64
	var chunks []int
	for i := 0; i < 100 && len(got) < len(sent); i++ {
		rows := receiveText(t, d.pool, "select msg_id, batch_id, payload::text from pgque.receive('q', 'p', 1000)")
		if len(rows) == 0 {
			t.Fatalf("nothing received after %d of %d events", len(got), len(sent))
		}
		var bytes int
		for _, r := range rows {
			got = append(got, r.ID)
			bytes += len(*r.Payload)
		}
		if len(rows) > 1 && bytes > 32<<20 {
			t.Errorf("a chunk of %d events holds %d bytes", len(rows), bytes)
		}
		chunks = append(chunks, len(rows))
		one[int32](t, d.pool, "select pgque.ack($1)", rows[0].Batch)
	}
	if len(got) != len(sent) {
		t.Fatalf("received %d events, sent %d", len(got), len(sent))
	}
	for i := range sent {
		if got[i] != sent[i] {
			t.Fatalf("event %d: received %d, want %d (order or duplicates)", i, got[i], sent[i])
		}
	}
	if len(chunks) < 3 {
		t.Errorf("chunks %v: the byte budget did not split 40 MB of events and a 33 MB one", chunks)
	}
	t.Logf("chunk sizes: %v", chunks)
}

package enginetest

import (
	"fmt"
	"testing"
)

// TestSendBatchMixedTypes: the mixed-type forms of send_batch store each
// payload with its own type, key and dedup key, in input order, in the
// text and jsonb forms; the ids come back in input order and delivery
// follows them.
func TestSendBatchMixedTypes(t *testing.T) {
	t.Parallel()
	_, pool := setupEngine(t)
	types := []string{"FileCreated", "FileOverwritten", "FileCreated", "FileDeleted"}
	payloads := []string{`{"n": 0}`, `{"n": 1}`, `{"n": 2}`, `{"n": 3}`}
	keys := []*string{ptr("t1"), ptr("t2"), nil, ptr("t1")}

	text := scalar[[]int64](t, pool, `select pgque.send_batch('q', $1::text[], $2::text[], $3::text[])`, types, payloads, keys)
	jsonb := scalar[[]int64](t, pool, `select pgque.send_batch('q', $1::text[], $2::text[]::jsonb[], $3::text[])`, types, payloads, keys)
	// Dedup: element 3 repeats element 1's key, so it gets element 1's id
	// and stores nothing; a NULL dedup key means no dedup.
	dedups := []*string{ptr("d1"), nil, ptr("d1"), ptr("d4")}
	keyed := scalar[[]int64](t, pool, `select pgque.send_batch('q', $1::text[], $2::text[], $3::text[], $4::text[])`,
		types, payloads, keys, dedups)
	if keyed[2] != keyed[0] {
		t.Errorf("keyed mixed batch: element 3 (dedup key of element 1) got id %d, want %d", keyed[2], keyed[0])
	}
	all := append(append(append([]int64{}, text...), jsonb...), keyed[0], keyed[1], keyed[3])
	for i := 1; i < len(all); i++ {
		if all[i] <= all[i-1] {
			t.Fatalf("ids not in input order: %v", all)
		}
	}

	tick(t, pool, "q")
	ms := mustReceive(t, pool, "q", "c", 100)
	if len(ms) != 11 {
		t.Fatalf("received %d events, want 11: %+v", len(ms), ms)
	}
	wantType := append(append(append([]string{}, types...), types...), types[0], types[1], types[3])
	wantPayload := append(append(append([]string{}, payloads...), payloads...), payloads[0], payloads[1], payloads[3])
	wantKey := append(append(append([]*string{}, keys...), keys...), keys[0], keys[1], keys[3])
	for i, m := range ms {
		if m.MsgID != all[i] || m.Type != wantType[i] || m.Payload != wantPayload[i] || fmt.Sprint(deref(m.PartitionKey)) != fmt.Sprint(deref(wantKey[i])) {
			t.Errorf("event %d: id %d type %q payload %s key %v, want id %d type %q payload %s key %v",
				i, m.MsgID, m.Type, m.Payload, deref(m.PartitionKey), all[i], wantType[i], wantPayload[i], deref(wantKey[i]))
		}
	}
	ack(t, pool, ms[0].BatchID)
}

// TestSendBatchOverloads: the calls written for the single-type form
// before the mixed form existed still resolve to it (an untyped literal
// type, named arguments, a text parameter, an untyped parameter the
// server infers), and an array of types resolves to the mixed form.
func TestSendBatchOverloads(t *testing.T) {
	t.Parallel()
	_, pool := setupEngine(t)
	calls := []struct {
		name, sql string
		args      []any
		want      []string
	}{
		{"literal type, literal payloads", `select pgque.send_batch('q', 'T1', array['{}', '{}'])`, nil, []string{"T1", "T1"}},
		{"literal type, jsonb payloads", `select pgque.send_batch('q', 'T2', array['{}']::jsonb[], array['k'])`, nil, []string{"T2"}},
		{"named arguments", `select pgque.send_batch(queue => 'q', type => 'T3', payloads => array['{}'], partition_keys => array['k'])`, nil, []string{"T3"}},
		{"typed parameters", `select pgque.send_batch($1::text, $2::text, $3::text[])`, []any{"q", "T4", []string{`{}`}}, []string{"T4"}},
		{"untyped type parameter", `select pgque.send_batch($1, $2, $3::text[])`, []any{"q", "T5", []string{`{}`}}, []string{"T5"}},
		{"literal type array", `select pgque.send_batch('q', array['M1', 'M2'], array['{}', '{}'])`, nil, []string{"M1", "M2"}},
		{"named types", `select pgque.send_batch(queue => 'q', types => array['M3', 'M4'], payloads => array['{}', '{}']::jsonb[])`, nil, []string{"M3", "M4"}},
		{"typed types parameter", `select pgque.send_batch($1::text, $2::text[], $3::text[])`, []any{"q", []string{"M5", "M6"}, []string{`{}`, `{}`}}, []string{"M5", "M6"}},
	}
	for _, c := range calls {
		ids := scalar[[]int64](t, pool, c.sql, c.args...)
		got := column[string](t, pool, `select ev_type from pgque.event where ev_id = any($1) order by ev_id`, ids)
		if fmt.Sprint(got) != fmt.Sprint(c.want) {
			t.Errorf("%s: stored types %v, want %v", c.name, got, c.want)
		}
	}
}

func ptr(s string) *string { return &s }

func deref(s *string) any {
	if s == nil {
		return nil
	}
	return *s
}

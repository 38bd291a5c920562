package pgque_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgque/pgque"
)

// storedEvent is an event as insert_event stores it (any text, NULL type
// or data) and what a handler must get for it.
type storedEvent struct {
	typ, data, key *string
	wantType       string
	wantPayload    string // compact JSON
	wantKey        pgque.KeyRef
}

func sp(s string) *string { return &s }

// storedEvents covers every shape a chunk's row can have: the NULL type
// and data insert_event accepts, text that is not JSON, a type repeated
// from the row before and one that is not, the empty and the NULL key, and
// a payload too large to share its chunk's allocation.
func storedEvents() []storedEvent {
	big := `{"b":"` + strings.Repeat("x", 40<<10) + `"}`
	return []storedEvent{
		{typ: sp("a"), data: sp(`{"n":1}`), key: sp("k"), wantType: "a", wantPayload: `{"n":1}`, wantKey: pgque.KeyOf("k")},
		{typ: nil, data: sp(`{"n":2}`), key: sp("k"), wantType: "", wantPayload: `{"n":2}`, wantKey: pgque.KeyOf("k")},
		{typ: sp("a"), data: sp(`not json`), key: nil, wantType: "a", wantPayload: `"not json"`, wantKey: pgque.NullKey},
		{typ: sp("a"), data: nil, key: sp(""), wantType: "a", wantPayload: `null`, wantKey: pgque.KeyOf("")},
		{typ: sp("b"), data: sp(big), key: sp("k"), wantType: "b", wantPayload: big, wantKey: pgque.KeyOf("k")},
		{typ: sp("b"), data: sp(`[1, 2]`), key: sp("k2"), wantType: "b", wantPayload: `[1,2]`, wantKey: pgque.KeyOf("k2")},
	}
}

// insertStored stores evs with insert_event, ticks, and returns their ids.
func insertStored(t *testing.T, pool *pgxpool.Pool, queue string, evs []storedEvent) []int64 {
	t.Helper()
	ctx := context.Background()
	ids := make([]int64, len(evs))
	for i, e := range evs {
		if err := pool.QueryRow(ctx, "select pgque.insert_event($1, $2, $3, $4, null, null, null)",
			queue, e.typ, e.data, e.key).Scan(&ids[i]); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := pool.Exec(ctx, "select pgque.force_next_tick($1), pgque.ticker($1)", queue); err != nil {
		t.Fatal(err)
	}
	return ids
}

func checkStored(t *testing.T, path string, got []pgque.Message, ids []int64, evs []storedEvent) {
	t.Helper()
	if len(got) != len(evs) {
		t.Fatalf("%s: %d messages, want %d", path, len(got), len(evs))
	}
	for i, m := range got {
		e := evs[i]
		if m.ID != ids[i] || m.Type != e.wantType || m.Key() != e.wantKey || m.CreatedAt.IsZero() || time.Since(m.CreatedAt) > time.Hour {
			t.Errorf("%s: message %d is id %d type %q key %v created %v; want id %d type %q key %v",
				path, i, m.ID, m.Type, m.Key(), m.CreatedAt, ids[i], e.wantType, e.wantKey)
		}
		if !json.Valid(m.Payload) {
			t.Errorf("%s: message %d: payload is not JSON", path, i)
			continue
		}
		if compactJSON(t, m.Payload) != compactJSON(t, []byte(e.wantPayload)) {
			t.Errorf("%s: message %d: payload of %d bytes, want %.40s…", path, i, len(m.Payload), e.wantPayload)
		}
	}
}

func compactJSON(t *testing.T, b []byte) string {
	t.Helper()
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("not JSON: %.40s", b)
	}
	out, _ := json.Marshal(v)
	return string(out)
}

// Whatever insert_event stored reaches every reader, as the same messages,
// over the extended protocol (whose rows are decoded in place) and over
// the simple protocol (text rows, scanned): a NULL type is the empty type,
// data that is not JSON a JSON string, NULL data the JSON null. A row the
// client could not read would stop its consumer for good, since the chunk
// is redelivered until it is acknowledged.
func TestReadersTakeWhatInsertEventStored(t *testing.T) {
	t.Parallel()
	env := setup(t)
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(env.dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	simplePool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(simplePool.Close)
	evs := storedEvents()
	for _, pc := range []struct {
		name string
		pool *pgxpool.Pool
	}{{"extended", env.pool}, {"simple", simplePool}} {
		t.Run(pc.name, func(t *testing.T) {
			client := newClient(t, pc.pool)
			queue := "stored_" + pc.name
			if _, err := client.CreateQueue(ctx, queue); err != nil {
				t.Fatal(err)
			}
			if _, err := client.Subscribe(ctx, queue, "r"); err != nil {
				t.Fatal(err)
			}
			if _, err := client.SubscribeSlots(ctx, queue, "s", 1, 0); err != nil {
				t.Fatal(err)
			}
			c := &collector{}
			startConsumer(t, &testEnv{dsn: env.dsn, pool: pc.pool, client: client, queue: queue},
				&pgque.ConsumerConfig{Queue: queue, Consumer: "c", Handler: c.handle, PollInterval: 20 * time.Millisecond})
			ids := insertStored(t, env.pool, queue, evs)

			r := client.Receiver(nil)
			msgs, err := r.Receive(ctx, queue, "r", 100)
			if err != nil {
				t.Fatal("Receive:", err)
			}
			checkStored(t, "Receive", deref(msgs), ids, evs)

			lease, ok, err := r.ClaimSlot(ctx, queue, "s", 0, "w", time.Minute)
			if err != nil || !ok {
				t.Fatalf("ClaimSlot = %v, %v", ok, err)
			}
			msgs, err = r.ReceiveSlot(ctx, lease, 1, 100)
			if err != nil {
				t.Fatal("ReceiveSlot:", err)
			}
			checkStored(t, "ReceiveSlot", deref(msgs), ids, evs)

			checkStored(t, "Consumer", c.wait(t, len(evs)), ids, evs)
		})
	}
}

func deref(msgs []*pgque.Message) []pgque.Message {
	out := make([]pgque.Message, len(msgs))
	for i, m := range msgs {
		out[i] = *m
	}
	return out
}

package pgque_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgque/pgque"
	"github.com/pgque/pgque/internal/jsonsyntax"
)

func TestSendReturnsIncreasingIDs(t *testing.T) {
	t.Parallel()
	env := setup(t)
	ctx := context.Background()
	a, err := env.client.Send(ctx, env.queue, pgque.Event{Type: "t", Payload: map[string]int{"n": 1}, PartitionKey: "k"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := env.client.Send(ctx, env.queue, pgque.Event{Payload: json.RawMessage(`{"n":2}`)})
	if err != nil {
		t.Fatal(err)
	}
	if b <= a {
		t.Fatalf("ids not increasing: %d then %d", a, b)
	}
}

func TestSendInvalidPayloadFailsBeforeTheDatabase(t *testing.T) {
	t.Parallel()
	env := setup(t)
	ctx := context.Background()
	_, err := env.client.Send(ctx, "no-such-queue", pgque.Event{Payload: json.RawMessage(`{oops`)})
	if !errors.Is(err, pgque.ErrInvalidPayload) {
		t.Fatalf("got %v, want ErrInvalidPayload", err)
	}
	_, err = env.client.SendBatch(ctx, "no-such-queue", []pgque.Event{{Payload: 1}, {Payload: make(chan int)}})
	if !errors.Is(err, pgque.ErrInvalidPayload) {
		t.Fatalf("got %v, want ErrInvalidPayload", err)
	}
}

// TestSendBatchNamesTheEventTheServerRefused: the server refuses a batch
// in one statement and names no event; SendBatch finds the one it refused
// and names its index: a NUL (json.Marshal escapes it as \u0000), a lone
// surrogate escape in a json.RawMessage. Nothing of the batch is stored.
// (Nesting is not among them: the server took 5 000 levels here, and the
// client's own JSON check refuses more than 10 000; refusedEvent's rule
// for it serves a server with a smaller max_stack_depth.)
func TestSendBatchNamesTheEventTheServerRefused(t *testing.T) {
	t.Parallel()
	env := setup(t)
	ctx := context.Background()
	for _, c := range []struct {
		what   string
		events []pgque.Event
		at     int
	}{
		{"a NUL", []pgque.Event{{Payload: 1}, {Payload: 2}, {Payload: map[string]string{"s": "a\x00b"}}}, 2},
		{"a lone surrogate", []pgque.Event{{Payload: json.RawMessage(`["\ud83d\ude00"]`)}, {Payload: json.RawMessage(`["\ud83d"]`)}}, 1},
	} {
		_, err := env.client.SendBatch(ctx, env.queue, c.events)
		if !errors.Is(err, pgque.ErrInvalidPayload) {
			t.Errorf("%s: got %v, want ErrInvalidPayload", c.what, err)
			continue
		}
		if want := fmt.Sprintf("sending batch to queue %q: event %d: ", env.queue, c.at); !strings.HasPrefix(err.Error(), want) {
			t.Errorf("%s: %q does not start with %q", c.what, err, want)
		}
	}
	var n int64
	if err := env.pool.QueryRow(ctx, "select count(*) from pgque.event").Scan(&n); err != nil || n != 0 {
		t.Errorf("%d events stored (%v), want none", n, err)
	}
}

// TestNumericOverflowAgreesWithTheServer: the numbers the client's rule
// (jsonsyntax.NumericOverflow) says numeric cannot hold are those jsonb
// refuses with 22003, near each limit (digits before and after the point,
// the exponent), on the server the test runs on. Send and SendBatch refuse
// a payload holding one before the database, naming the number and, in a
// batch, the event: the server would store it and hand it to consumers as
// a JSON string.
func TestNumericOverflowAgreesWithTheServer(t *testing.T) {
	t.Parallel()
	env := setup(t)
	ctx := context.Background()
	zeros := strings.Repeat("0", 16382)
	for _, n := range []string{
		"0", "-0.0", "1e1001", "1e-1001", "0e200000", "-12.5e3", "1E+5", "2.5E-3",
		"1" + strings.Repeat("0", 131071), "1" + strings.Repeat("0", 131072),
		"1e131071", "1e131072", "-0.5e131072", "0.5e131073", "0.05e131073", "12e131069", "12e131070",
		"1e-16383", "1e-16384", "0e-16383", "0e-16384", "0.0e-16383",
		"0." + zeros + "1", "0." + zeros + "01", "0." + zeros + "01e1", "12.5e-16382", "0.00e-16382",
		"1e1073741823", "1e-1073741823", "0e1073741824", "0e-2147483648", "1e99999999999999999999",
	} {
		doc := `{"n": "1e131072", "1e131072": [true, ` + n + `, "x"]}`
		var code string
		if _, err := env.pool.Exec(ctx, "select $1::text::jsonb", doc); err != nil {
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) {
				t.Fatal(err)
			}
			code = pgErr.Code
		}
		short := n
		if len(short) > 24 {
			short = fmt.Sprintf("%s... (%d bytes)", short[:16], len(short))
		}
		bad := jsonsyntax.NumericOverflow([]byte(doc))
		if (bad != nil) != (code == "22003") {
			t.Errorf("NumericOverflow(%s) = %q; the server says %q", short, bad, code)
			continue
		}
		if bad == nil {
			continue
		}
		if string(bad) != n {
			t.Errorf("NumericOverflow(%s) returned %q, not the number", short, bad)
		}
		_, err := env.client.Send(ctx, env.queue, pgque.Event{Payload: json.RawMessage(doc)})
		if !errors.Is(err, pgque.ErrInvalidPayload) || !strings.Contains(err.Error(), "numeric") {
			t.Errorf("Send of %s: %v, want ErrInvalidPayload naming numeric", short, err)
		}
		_, err = env.client.SendBatch(ctx, env.queue, []pgque.Event{{Payload: 1}, {Payload: json.RawMessage(doc)}})
		if !errors.Is(err, pgque.ErrInvalidPayload) || !strings.Contains(err.Error(), "event 1: ") {
			t.Errorf("SendBatch with %s: %v, want ErrInvalidPayload naming event 1", short, err)
		}
	}
	var stored int64
	if err := env.pool.QueryRow(ctx, "select count(*) from pgque.event").Scan(&stored); err != nil || stored != 0 {
		t.Errorf("%d events stored (%v), want none", stored, err)
	}
}

func TestSendUnknownQueue(t *testing.T) {
	t.Parallel()
	env := setup(t)
	_, err := env.client.Send(context.Background(), "missing", pgque.Event{Payload: 1})
	if !errors.Is(err, pgque.ErrQueueNotFound) {
		t.Fatalf("got %v, want ErrQueueNotFound", err)
	}
	var pe *pgque.Error
	if !errors.As(err, &pe) || pe.Code != "PQ001" {
		t.Fatalf("got %#v, want *pgque.Error with PQ001", err)
	}
}

// TestSendBatchKeepsOrderAcrossTypes: a batch of several types goes in one
// statement (SendBatch and SendBatchTx), and its events are stored with
// their own types, keys and payloads in input order.
func TestSendBatchKeepsOrderAcrossTypes(t *testing.T) {
	t.Parallel()
	env := setup(t)
	ctx := context.Background()
	tr := &statementCounter{}
	cfg, err := pgxpool.ParseConfig(env.dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.Tracer = tr
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	client := newClient(t, pool)
	events := []pgque.Event{
		{Type: "a", Payload: 1, PartitionKey: "k"},
		{Type: "a", Payload: 2},
		{Type: "b", Payload: 3, PartitionKey: "k"},
		{Type: "a", Payload: 4, PartitionKey: "k"},
		{Type: "c", Payload: 5, PartitionKey: "k"},
	}
	ids, err := client.SendBatch(ctx, env.queue, events)
	if err != nil {
		t.Fatal(err)
	}
	if n := tr.count.Load(); n != 1 {
		t.Errorf("SendBatch of 3 types ran %d statements, want 1", n)
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		tr.count.Store(0)
		more, err := client.SendBatchTx(ctx, tx, env.queue, events)
		ids = append(ids, more...)
		if n := tr.count.Load(); n != 1 {
			t.Errorf("SendBatchTx of 3 types ran %d statements, want 1", n)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(ids) != 2*len(events) {
		t.Fatalf("got %d ids, want %d", len(ids), 2*len(events))
	}
	rows, err := env.pool.Query(ctx, `select ev_id, ev_type, ev_data, ev_extra1 from pgque.event where ev_id = any($1) order by ev_id`, ids)
	if err != nil {
		t.Fatal(err)
	}
	type stored struct {
		ID   int64
		Type string
		Data string
		Key  *string
	}
	got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[stored])
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(ids) {
		t.Fatalf("%d events stored, want %d", len(got), len(ids))
	}
	for i, g := range got {
		ev := events[i%len(events)]
		key := ""
		if g.Key != nil {
			key = *g.Key
		}
		if g.ID != ids[i] || g.Type != ev.Type || g.Data != fmt.Sprint(ev.Payload) || key != ev.PartitionKey {
			t.Errorf("event %d: stored %+v (key %q), want id %d type %q payload %v key %q", i, g, key, ids[i], ev.Type, ev.Payload, ev.PartitionKey)
		}
	}
}

// statementCounter counts the statements run through a pool.
type statementCounter struct{ count atomic.Int64 }

func (c *statementCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.count.Add(1)
	return ctx
}

func (c *statementCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func TestSendTxRollsBack(t *testing.T) {
	t.Parallel()
	env := setup(t)
	ctx := context.Background()
	consumed := collect(t, env, "c")
	tx, err := env.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := env.client.SendTx(ctx, tx, env.queue, pgque.Event{Payload: "rolled back"}); err != nil {
		t.Fatal(err)
	}
	if _, err := env.client.SendBatchTx(ctx, tx, env.queue, []pgque.Event{{Payload: "also rolled back"}}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	err = pgx.BeginFunc(ctx, env.pool, func(tx pgx.Tx) error {
		_, err := env.client.SendTx(ctx, tx, env.queue, pgque.Event{Payload: "committed"})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	got := consumed.wait(t, 1)
	if string(got[0].Payload) != `"committed"` {
		t.Fatalf("consumed %s, want the committed event only", got[0].Payload)
	}
}

// TestSendDedupKey: Send, SendTx and SendBatch with a DedupKey return the
// first event's id for a key seen within the window and store nothing
// more; an empty key is no dedup; an over-long key is ErrInvalidArgument.
func TestSendDedupKey(t *testing.T) {
	t.Parallel()
	env := setup(t)
	ctx := context.Background()
	ev := pgque.Event{Type: "t", Payload: map[string]int{"n": 1}, PartitionKey: "k", DedupKey: "req-1"}
	a, err := env.client.Send(ctx, env.queue, ev)
	if err != nil {
		t.Fatal(err)
	}
	b, err := env.client.Send(ctx, env.queue, ev)
	if err != nil || b != a {
		t.Fatalf("retried Send = %d, %v; want %d", b, err, a)
	}
	tx, err := env.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c, err := env.client.SendTx(ctx, tx, env.queue, ev)
	if err != nil || c != a {
		t.Fatalf("SendTx = %d, %v; want %d", c, err, a)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	ids, err := env.client.SendBatch(ctx, env.queue, []pgque.Event{
		{Payload: 1, DedupKey: "req-2"}, {Payload: 2, DedupKey: "req-1"}, {Payload: 3, DedupKey: "req-2"}, {Payload: 4}, {Type: "u", Payload: 5, DedupKey: "req-2"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(ids) != 5 || ids[1] != a || ids[2] != ids[0] || ids[4] != ids[0] || ids[3] == ids[0] {
		t.Fatalf("SendBatch ids %v (first event %d)", ids, a)
	}
	var n int
	if err := env.pool.QueryRow(ctx, `select count(*) from pgque.event e join pgque.queue q on e.ev_part / 16 = q.queue_id where q.queue_name = $1`, env.queue).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 3 {
		t.Fatalf("%d events stored, want 3 (req-1, req-2, one without a key)", n)
	}
	_, err = env.client.Send(ctx, env.queue, pgque.Event{Payload: 1, DedupKey: strings.Repeat("x", 513)})
	if !errors.Is(err, pgque.ErrInvalidArgument) {
		t.Fatalf("over-long dedup key: %v, want ErrInvalidArgument", err)
	}
}

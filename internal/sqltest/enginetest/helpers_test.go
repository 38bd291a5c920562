// Package enginetest proves the engine and api layers' guarantees (the
// ones docs/design.md states: ordering, at-least-once delivery, rotation,
// retries, dead letters) by calling pgque's SQL directly against a real
// PostgreSQL. Every test gets its own database from pgtest.
package enginetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgque/pgque/internal/testing/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// db is what the helpers run SQL on: *pgx.Conn, *pgxpool.Pool, pgx.Tx.
type db interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// beginner opens transactions: *pgx.Conn, *pgxpool.Pool.
type beginner interface {
	db
	Begin(ctx context.Context) (pgx.Tx, error)
}

// exec runs statements, failing the test on error.
func exec(t testing.TB, q db, sql string, args ...any) {
	t.Helper()
	if _, err := q.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// scalar runs a one-row, one-column query, failing the test on error.
func scalar[T any](t testing.TB, q db, sql string, args ...any) T {
	t.Helper()
	var v T
	if err := q.QueryRow(context.Background(), sql, args...).Scan(&v); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return v
}

// column runs a one-column query, failing the test on error.
func column[T any](t testing.TB, q db, sql string, args ...any) []T {
	t.Helper()
	rows, _ := q.Query(context.Background(), sql, args...)
	vs, err := pgx.CollectRows(rows, pgx.RowTo[T])
	if err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return vs
}

// queryErr runs sql and returns its error (nil when it succeeded), reading
// every row so that errors raised while producing rows surface too.
func queryErr(q db, sql string, args ...any) error {
	rows, err := q.Query(context.Background(), sql, args...)
	if err != nil {
		return err
	}
	for rows.Next() {
	}
	rows.Close()
	return rows.Err()
}

// pgCode is the SQLSTATE of err, "" when err is not a server error.
func pgCode(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}

// wantCode checks that err is a server error with SQLSTATE code whose
// message mentions each of mention.
func wantCode(t testing.TB, what string, err error, code string, mention ...string) {
	t.Helper()
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		t.Errorf("%s: got error %v, want SQLSTATE %s", what, err, code)
		return
	}
	if pe.Code != code {
		t.Errorf("%s: got SQLSTATE %s (%s), want %s", what, pe.Code, pe.Message, code)
	}
	for _, m := range mention {
		if !strings.Contains(pe.Message, m) {
			t.Errorf("%s: message %q does not mention %q", what, pe.Message, m)
		}
	}
}

// setupDB gives a test a fresh database with pgque installed and a pool.
func setupDB(t *testing.T) (dsn string, pool beginner) {
	t.Helper()
	dsn = pgtest.NewInstalledDB(t)
	return dsn, pgtest.Pool(t, dsn)
}

// newQueue creates queue and subscribes each consumer (engine
// register_consumer), failing the test on error.
func newQueue(t testing.TB, q db, queue string, consumers ...string) {
	t.Helper()
	if n := scalar[int32](t, q, "select pgque.create_queue($1)", queue); n != 1 {
		t.Fatalf("create_queue(%s) = %d, want 1", queue, n)
	}
	for _, c := range consumers {
		if n := scalar[int32](t, q, "select pgque.register_consumer($1, $2)", queue, c); n != 1 {
			t.Fatalf("register_consumer(%s, %s) = %d, want 1", queue, c, n)
		}
	}
}

// queueID returns the numeric id of queue.
func queueID(t testing.TB, q db, queue string) int32 {
	t.Helper()
	return scalar[int32](t, q, "select queue_id from pgque.queue where queue_name = $1", queue)
}

// eventTables returns the qualified names of queue's event partitions,
// pgque.event_<id>_<n>, in n order, checking that they are what the design
// says: three partitions of pgque.event.
func eventTables(t testing.TB, q db, queue string) []string {
	t.Helper()
	id := queueID(t, q, queue)
	names := column[string](t, q, `select c.oid::regclass::text
		  from pg_catalog.pg_inherits i join pg_catalog.pg_class c on c.oid = i.inhrelid
		 where i.inhparent = 'pgque.event'::regclass and c.relname like $1
		 order by c.relname`, fmt.Sprintf("event\\_%d\\_%%", id))
	want := []string{}
	for n := range 3 {
		want = append(want, fmt.Sprintf("pgque.event_%d_%d", id, n))
	}
	if !slices.Equal(names, want) {
		t.Fatalf("event partitions of queue %s = %v, want %v", queue, names, want)
	}
	return names
}

// tick makes queue tick now (force_next_tick then ticker, in one
// transaction) and returns the new tick id; it fails the test when no tick
// was made.
func tick(t testing.TB, q beginner, queue string) int64 {
	t.Helper()
	id, err := tryTick(q, queue)
	if err != nil {
		t.Fatalf("ticking %s: %v", queue, err)
	}
	return id
}

// tryTick is tick returning its error, for goroutines.
func tryTick(q beginner, queue string) (int64, error) {
	ctx := context.Background()
	tx, err := q.Begin(ctx)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, "select pgque.force_next_tick($1)", queue); err != nil {
		return 0, err
	}
	var id *int64
	if err := tx.QueryRow(ctx, "select pgque.ticker($1)", queue).Scan(&id); err != nil {
		return 0, err
	}
	if id == nil {
		return 0, fmt.Errorf("ticker(%s) after force_next_tick returned NULL", queue)
	}
	return *id, tx.Commit(ctx)
}

// event is a row of get_batch_events.
type event struct {
	ID     int64
	Time   any
	Txid   int64
	Retry  *int32
	Type   *string
	Data   *string
	Extra1 *string
	Extra2 *string
	Extra3 *string
	Extra4 *string
}

// str shows a nullable text value.
func str(p *string) string {
	if p == nil {
		return "<NULL>"
	}
	return *p
}

// retry shows a nullable ev_retry.
func retry(p *int32) string {
	if p == nil {
		return "<NULL>"
	}
	return fmt.Sprint(*p)
}

func (e event) data() string {
	if e.Data == nil {
		return "<NULL>"
	}
	return *e.Data
}

// nextBatch calls next_batch; 0 means NULL (no batch).
func nextBatch(q db, queue, consumer string) (int64, error) {
	var b *int64
	if err := q.QueryRow(context.Background(), "select pgque.next_batch($1, $2)", queue, consumer).Scan(&b); err != nil {
		return 0, err
	}
	if b == nil {
		return 0, nil
	}
	return *b, nil
}

// batchEvents returns get_batch_events(batch).
func batchEvents(q db, batch int64) ([]event, error) {
	rows, _ := q.Query(context.Background(), "select * from pgque.get_batch_events($1)", batch)
	return pgx.CollectRows(rows, pgx.RowToStructByPos[event])
}

// consumeBatch opens the next batch of consumer, reads it and finishes it.
// ok is false when there was no batch.
func consumeBatch(q db, queue, consumer string) (evs []event, ok bool, err error) {
	b, err := nextBatch(q, queue, consumer)
	if err != nil || b == 0 {
		return nil, false, err
	}
	if evs, err = batchEvents(q, b); err != nil {
		return nil, false, err
	}
	if _, err := q.Exec(context.Background(), "select pgque.finish_batch($1)", b); err != nil {
		return nil, false, err
	}
	return evs, true, nil
}

// drainBatches consumes every batch consumer can open now, returning them in
// order (empty batches included).
func drainBatches(t testing.TB, q db, queue, consumer string) [][]event {
	t.Helper()
	var out [][]event
	for {
		evs, ok, err := consumeBatch(q, queue, consumer)
		if err != nil {
			t.Fatalf("consuming %s/%s: %v", queue, consumer, err)
		}
		if !ok {
			return out
		}
		out = append(out, evs)
	}
}

// checkOrdered reports a batch whose events are not in strictly increasing
// ev_id order.
func checkOrdered(t testing.TB, what string, evs []event) {
	t.Helper()
	for i := 1; i < len(evs); i++ {
		if evs[i].ID <= evs[i-1].ID {
			t.Errorf("%s: ev_id %d follows %d: batch not in ev_id order", what, evs[i].ID, evs[i-1].ID)
			return
		}
	}
}

// message is a row of pgque.receive.
type message struct {
	MsgID        int64
	BatchID      int64
	Type         string
	Payload      string
	RetryCount   int32
	CreatedAt    any
	PartitionKey *string
	Extra2       *string
	Extra3       *string
	Extra4       *string
}

// receive calls pgque.receive(queue, consumer, max).
func receive(q db, queue, consumer string, max int) ([]message, error) {
	rows, _ := q.Query(context.Background(),
		"select msg_id, batch_id, type, payload::text, retry_count, created_at, partition_key, extra2, extra3, extra4 from pgque.receive($1, $2, $3)",
		queue, consumer, max)
	return pgx.CollectRows(rows, pgx.RowToStructByPos[message])
}

// mustReceive is receive failing the test on error; it also checks that a
// chunk comes from one batch, in ev_id order.
func mustReceive(t testing.TB, q db, queue, consumer string, max int) []message {
	t.Helper()
	ms, err := receive(q, queue, consumer, max)
	if err != nil {
		t.Fatalf("receive(%s, %s, %d): %v", queue, consumer, max, err)
	}
	if len(ms) > max {
		t.Errorf("receive(%s, %s, %d) returned %d rows", queue, consumer, max, len(ms))
	}
	for i := 1; i < len(ms); i++ {
		if ms[i].BatchID != ms[0].BatchID {
			t.Errorf("receive returned rows of batches %d and %d in one chunk", ms[0].BatchID, ms[i].BatchID)
		}
		if ms[i].MsgID <= ms[i-1].MsgID {
			t.Errorf("receive returned msg_id %d after %d: not in ev_id order", ms[i].MsgID, ms[i-1].MsgID)
		}
	}
	return ms
}

// ack calls pgque.ack(batch), failing the test on error.
func ack(t testing.TB, q db, batch int64) int32 {
	t.Helper()
	return scalar[int32](t, q, "select pgque.ack($1)", batch)
}

func msgIDs(ms []message) []int64 {
	ids := make([]int64, len(ms))
	for i, m := range ms {
		ids[i] = m.MsgID
	}
	return ids
}

func evIDs(evs []event) []int64 {
	ids := make([]int64, len(evs))
	for i, e := range evs {
		ids[i] = e.ID
	}
	return ids
}

// consumerInfo is the cursor state of a subscription; CurrentBatch and
// NextTick are 0 when no batch is open.
type consumerInfo struct {
	LastTick     int64
	CurrentBatch int64
	NextTick     int64
	RetryPending int64
}

func getConsumerInfo(t testing.TB, q db, queue, consumer string) consumerInfo {
	t.Helper()
	var ci consumerInfo
	err := q.QueryRow(context.Background(),
		"select last_tick, coalesce(current_batch, 0), coalesce(next_tick, 0), retry_pending from pgque.get_consumer_info($1, $2)",
		queue, consumer).Scan(&ci.LastTick, &ci.CurrentBatch, &ci.NextTick, &ci.RetryPending)
	if err != nil {
		t.Fatalf("get_consumer_info(%s, %s): %v", queue, consumer, err)
	}
	return ci
}

// countEvents counts the rows of queue's event tables.
func countEvents(t testing.TB, q db, queue string) int64 {
	t.Helper()
	id := queueID(t, q, queue)
	return scalar[int64](t, q, "select count(*) from pgque.event where ev_part >= $1 and ev_part < $1 + 16", id*16)
}

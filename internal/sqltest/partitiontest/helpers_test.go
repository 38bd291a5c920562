package partitiontest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgque/pgque/internal/testing/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// db is a fresh database with pgque installed, private to one test. Every
// helper fails the test on an unexpected error, so the tests read as the
// protocol they exercise.
type db struct {
	t    *testing.T
	dsn  string
	pool *pgxpool.Pool
}

// setup gives the test its own installed database. The tests only use SQL:
// they pin the contract of the SQL functions, not of a Go wrapper.
func setup(t *testing.T) *db {
	t.Helper()
	dsn := pgtest.NewInstalledDB(t)
	return &db{t: t, dsn: dsn, pool: pgtest.Pool(t, dsn)}
}

// querier is what the helpers run SQL on: the pool, one connection or a
// transaction.
type querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// one runs a query returning one value.
func one[T any](t testing.TB, q querier, sql string, args ...any) T {
	t.Helper()
	var v T
	if err := q.QueryRow(context.Background(), sql, args...).Scan(&v); err != nil {
		t.Fatalf("%s %v: %v", sql, args, err)
	}
	return v
}

// exec runs statements, failing the test on error.
func (d *db) exec(sql string, args ...any) {
	d.t.Helper()
	if _, err := d.pool.Exec(context.Background(), sql, args...); err != nil {
		d.t.Fatalf("%s %v: %v", sql, args, err)
	}
}

// createQueue creates queue q.
func (d *db) createQueue(q string) {
	d.t.Helper()
	if n := one[int32](d.t, d.pool, "select pgque.create_queue($1)", q); n != 1 {
		d.t.Fatalf("create_queue(%q) = %d, want 1", q, n)
	}
}

// tick makes a tick of q now: force_next_tick followed by ticker in one
// transaction always ticks. It returns the tick id.
func tick(t testing.TB, q querier, queue string) int64 {
	t.Helper()
	ctx := context.Background()
	var id *int64
	err := pgx.BeginFunc(ctx, beginner(t, q), func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "select pgque.force_next_tick($1)", queue); err != nil {
			return err
		}
		return tx.QueryRow(ctx, "select pgque.ticker($1)", queue).Scan(&id)
	})
	if err != nil {
		t.Fatalf("ticking %s: %v", queue, err)
	}
	if id == nil {
		t.Fatalf("force_next_tick + ticker(%s) in one transaction made no tick", queue)
	}
	return *id
}

// beginner returns q as something that can open a transaction.
func beginner(t testing.TB, q querier) interface {
	Begin(context.Context) (pgx.Tx, error)
} {
	b, ok := q.(interface {
		Begin(context.Context) (pgx.Tx, error)
	})
	if !ok {
		t.Fatalf("%T cannot begin a transaction", q)
	}
	return b
}

func (d *db) tick(q string) int64 {
	d.t.Helper()
	return tick(d.t, d.pool, q)
}

// send sends one event with partition key key (nil: NULL) and returns its ev_id.
func send(t testing.TB, q querier, queue string, key *string) int64 {
	t.Helper()
	return one[int64](t, q, "select pgque.send($1, 'test', $2::jsonb, $3)", queue, `{"k":1}`, key)
}

func (d *db) send(q string, key *string) int64 {
	d.t.Helper()
	return send(d.t, d.pool, q, key)
}

// sendBatch sends one event per key in one INSERT and returns the ev_ids.
func (d *db) sendBatch(q string, keys []*string) []int64 {
	d.t.Helper()
	payloads := make([]string, len(keys))
	for i := range payloads {
		payloads[i] = fmt.Sprintf(`{"i":%d}`, i)
	}
	return one[[]int64](d.t, d.pool, "select pgque.send_batch($1, 'test', $2::jsonb[], $3::text[])", q, payloads, keys)
}

// subscribeSlots subscribes every slot of consumer c with n slots.
func (d *db) subscribeSlots(q, c string, n int) {
	d.t.Helper()
	for k := range n {
		if got := one[int32](d.t, d.pool, "select pgque.subscribe_slot($1, $2, $3, $4)", q, c, k, n); got != 1 {
			d.t.Fatalf("subscribe_slot(%s, %s, %d, %d) = %d, want 1", q, c, k, n, got)
		}
	}
}

// claim claims a slot and returns the epoch, nil when another owner holds
// it. It presents the token worker was last given for the slot (so a claim
// by the holder renews), and remembers the token the claim returns: the
// helpers below present it for worker, as a real worker would, and a
// worker whose lease changed hands keeps presenting its stale one.
func claim(t testing.TB, q querier, queue, c string, slot int, worker, ttl string) *int64 {
	t.Helper()
	return claimBound(t, q, queue, c, slot, worker, ttl, nil)
}

// claimBound is claim binding the lease to session (nil: unbound).
func claimBound(t testing.TB, q querier, queue, c string, slot int, worker, ttl string, session *int32) *int64 {
	t.Helper()
	ctx := context.Background()
	key, err := leaseKey(ctx, q, queue, c, slot, worker)
	if err != nil {
		t.Fatalf("claim_slot(%s, %s, %d, %s): %v", queue, c, slot, worker, err)
	}
	var epoch *int64
	var token *string
	if err := q.QueryRow(ctx, "select epoch, token::text from pgque.claim_slot($1, $2, $3, $4, $5::interval, $6::uuid, $7::int)",
		queue, c, slot, worker, ttl, tokenOf(key), session).Scan(&epoch, &token); err != nil {
		t.Fatalf("claim_slot(%s, %s, %d, %s): %v", queue, c, slot, worker, err)
	}
	if token != nil {
		leases.Lock()
		leases.tokens[key] = *token
		leases.Unlock()
	}
	return epoch
}

// release calls release_slot as worker with its token and reports
// whether the lease was released; a refusal (PQ085) is false.
func release(t testing.TB, q querier, queue, c string, slot int, worker string) bool {
	t.Helper()
	var ok bool
	err := q.QueryRow(context.Background(), "select pgque.release_slot($1, $2, $3, $4, $5::uuid)",
		queue, c, slot, worker, tokenFor(t, q, queue, c, slot, worker)).Scan(&ok)
	switch sqlState(err) {
	case "":
		return ok
	case "PQ085", "22004":
		return false
	}
	t.Fatalf("release_slot(%s, %s, %d, %s): %v", queue, c, slot, worker, err)
	return false
}

// leases is what the test workers know: the token each was given per
// slot, and the chunk each token received last (tokens are unique, so
// that map needs no other key).
var leases = struct {
	sync.Mutex
	tokens map[slotKey]string
	last   map[string]chunkProof
	dbs    map[querier]string
}{tokens: map[slotKey]string{}, last: map[string]chunkProof{}, dbs: map[querier]string{}}

// slotKey names one worker's view of one slot of one test database.
type slotKey struct {
	db, q, c string
	slot     int
	worker   string
}

// chunkProof is what the fenced ack presents: the epoch and batch the
// chunk was received under and one of its events.
type chunkProof struct{ epoch, batch, msg int64 }

// leaseKey is the key of (queue, c, slot, worker) in q's database.
func leaseKey(ctx context.Context, q querier, queue, c string, slot int, worker string) (slotKey, error) {
	leases.Lock()
	db, ok := leases.dbs[q]
	leases.Unlock()
	if !ok {
		if err := q.QueryRow(ctx, "select pg_catalog.current_database()::text").Scan(&db); err != nil {
			return slotKey{}, err
		}
		leases.Lock()
		leases.dbs[q] = db
		leases.Unlock()
	}
	return slotKey{db: db, q: queue, c: c, slot: slot, worker: worker}, nil
}

// tokenOf is the token the worker of key was last given, nil when none.
func tokenOf(key slotKey) *string {
	leases.Lock()
	defer leases.Unlock()
	if tk, ok := leases.tokens[key]; ok {
		return &tk
	}
	return nil
}

// noToken is what a worker that was never given a token presents: a
// well-formed token no claim returned.
const noToken = "00000000-0000-4000-8000-000000000000"

// holderToken is the token s.worker presents for s: the one it was last
// given, noToken when it was never given one.
func holderToken(ctx context.Context, q querier, s slotRef) (*string, error) {
	key, err := leaseKey(ctx, q, s.q, s.c, s.slot, s.worker)
	if err != nil {
		return nil, err
	}
	if tk := tokenOf(key); tk != nil {
		return tk, nil
	}
	tk := noToken
	return &tk, nil
}

// tokenFor is holderToken failing the test on error, for statements a
// test writes out.
func tokenFor(t testing.TB, q querier, queue, c string, slot int, worker string) *string {
	t.Helper()
	tk, err := holderToken(context.Background(), q, slotRef{q: queue, c: c, slot: slot, worker: worker})
	if err != nil {
		t.Fatal(err)
	}
	return tk
}

// mustClaim claims a slot that must be free, returning the epoch.
func mustClaim(t testing.TB, q querier, queue, c string, slot int, worker, ttl string) int64 {
	t.Helper()
	e := claim(t, q, queue, c, slot, worker, ttl)
	if e == nil {
		t.Fatalf("claim_slot(%s, %s, %d, %s) = NULL, want an epoch", queue, c, slot, worker)
	}
	return *e
}

// msg is one row of receive_partitioned.
type msg struct {
	ID    int64
	Batch int64
	Retry int32
	Key   *string
	Epoch int64
	Slot  int // the slot it was delivered on (set by the caller)
}

func (m msg) String() string {
	return fmt.Sprintf("{id %d batch %d retry %d key %s epoch %d slot %d}", m.ID, m.Batch, m.Retry, keyString(m.Key), m.Epoch, m.Slot)
}

// slotRef names one slot of one consumer group.
type slotRef struct {
	q, c    string
	slot, n int
	worker  string
	max     int
}

func (s slotRef) String() string { return fmt.Sprintf("%s#%d/%d", s.c, s.slot, s.n) }

// receive calls receive_partitioned as s.worker with its token.
func receive(ctx context.Context, q querier, s slotRef) ([]msg, error) {
	token, err := holderToken(ctx, q, s)
	if err != nil {
		return nil, err
	}
	rows, err := q.Query(ctx, `select msg_id, batch_id, retry_count, partition_key, epoch
		from pgque.receive_partitioned($1, $2, $3, $4, $5, $6::uuid, $7)`, s.q, s.c, s.slot, s.n, s.worker, token, s.max)
	if err != nil {
		return nil, err
	}
	ms, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (msg, error) {
		var m msg
		err := r.Scan(&m.ID, &m.Batch, &m.Retry, &m.Key, &m.Epoch)
		m.Slot = s.slot
		return m, err
	})
	if err == nil && len(ms) > 0 {
		leases.Lock()
		leases.last[*token] = chunkProof{epoch: ms[0].Epoch, batch: ms[0].Batch, msg: ms[0].ID}
		leases.Unlock()
	}
	return ms, err
}

// ack calls the fenced ack_partitioned for the chunk s.worker received
// last with its token.
func ack(ctx context.Context, q querier, s slotRef) (int32, error) {
	token, err := holderToken(ctx, q, s)
	if err != nil {
		return 0, err
	}
	var p chunkProof
	leases.Lock()
	p = leases.last[*token]
	leases.Unlock()
	var n int32
	err = q.QueryRow(ctx, "select pgque.ack_partitioned($1, $2, $3, $4, $5, $6::uuid, $7, $8, $9)",
		s.q, s.c, s.slot, s.n, s.worker, token, p.epoch, p.batch, p.msg).Scan(&n)
	return n, err
}

// nack calls nack_partitioned as s.worker with its token.
func nack(ctx context.Context, q querier, s slotRef, id int64, after string) (int32, error) {
	token, err := holderToken(ctx, q, s)
	if err != nil {
		return 0, err
	}
	var n int32
	err = q.QueryRow(ctx, "select pgque.nack_partitioned($1, $2, $3, $4, $5, $6::uuid, $7, $8::interval, 'test')",
		s.q, s.c, s.slot, s.n, s.worker, token, id, after).Scan(&n)
	return n, err
}

// mustReceive is receive failing the test on error.
func mustReceive(t testing.TB, q querier, s slotRef) []msg {
	t.Helper()
	ms, err := receive(context.Background(), q, s)
	if err != nil {
		t.Fatalf("receive_partitioned(%s, worker %s): %v", s, s.worker, err)
	}
	return ms
}

// mustAck is ack failing the test on error.
func mustAck(t testing.TB, q querier, s slotRef) int32 {
	t.Helper()
	n, err := ack(context.Background(), q, s)
	if err != nil {
		t.Fatalf("ack_partitioned(%s, worker %s): %v", s, s.worker, err)
	}
	return n
}

// caughtUp reports whether the slot's subscription has no open batch and its
// cursor is at the queue's last tick.
func caughtUp(t testing.TB, q querier, s slotRef) bool {
	t.Helper()
	var open *int64
	var last, queueLast int64
	err := q.QueryRow(context.Background(), `select c.current_batch, c.last_tick, qi.last_tick_id
		  from pgque.get_consumer_info($1, $2) c, pgque.get_queue_info($1) qi`,
		s.q, fmt.Sprintf("%s#%d/%d", s.c, s.slot, s.n)).Scan(&open, &last, &queueLast)
	if err != nil {
		t.Fatalf("consumer info of %s: %v", s, err)
	}
	return open == nil && last == queueLast
}

// drainStats counts what a drain did.
type drainStats struct {
	receives, partialAcks, finishingAcks int
}

// drain receives and acks a slot until its cursor is at the queue's last
// tick, returning every delivered row in delivery order. The worker must
// hold the slot's lease.
func drain(t testing.TB, q querier, s slotRef) ([]msg, drainStats) {
	t.Helper()
	var all []msg
	var st drainStats
	for i := 0; ; i++ {
		if i > 100000 {
			t.Fatalf("draining %s does not end", s)
		}
		ms := mustReceive(t, q, s)
		st.receives++
		if len(ms) == 0 {
			if caughtUp(t, q, s) {
				return all, st
			}
			continue
		}
		all = append(all, ms...)
		if mustAck(t, q, s) == 1 {
			st.finishingAcks++
		} else {
			st.partialAcks++
		}
	}
}

// sqlState returns the SQLSTATE of err, "" when it has none.
func sqlState(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}

// wantState fails the test unless err carries SQLSTATE code.
func wantState(t testing.TB, err error, code, what string) {
	t.Helper()
	if got := sqlState(err); got != code {
		t.Errorf("%s: got error %v (SQLSTATE %q), want SQLSTATE %s", what, err, got, code)
	}
}

// wantOneOf fails the test unless err carries one of the SQLSTATEs.
func wantOneOf(t testing.TB, err error, what string, codes ...string) {
	t.Helper()
	if !slices.Contains(codes, sqlState(err)) {
		t.Errorf("%s: got error %v (SQLSTATE %q), want one of %v", what, err, sqlState(err), codes)
	}
}

// ptr returns a pointer to s.
func ptr(s string) *string { return &s }

// keyString prints a nullable key.
func keyString(k *string) string {
	if k == nil {
		return "NULL"
	}
	return fmt.Sprintf("%q", *k)
}

// ids returns the msg ids of ms.
func ids(ms []msg) []int64 {
	out := make([]int64, len(ms))
	for i, m := range ms {
		out[i] = m.ID
	}
	return out
}

// expectedSlot computes (hashtextextended(key, 0) % n + n) % n with
// PostgreSQL's built-in hash alone, without calling anything of pgque: the
// design's routing formula, as an oracle independent of slot_of and of the
// routing predicate the partition layer builds.
func expectedSlot(t testing.TB, q querier, key *string, n int) int {
	t.Helper()
	if key == nil {
		return 0
	}
	return int(one[int64](t, q, "select (pg_catalog.hashtextextended($1, 0) % $2 + $2) % $2", *key, int64(n)))
}

// drainRoundRobin consumes several slots in turn, one receive (and its ack)
// per slot per round, until every slot is caught up; it returns the rows in
// delivery order. Interleaving the slots shows that they do not disturb each
// other's cursors.
func drainRoundRobin(t testing.TB, q querier, slots []slotRef) []msg {
	t.Helper()
	var all []msg
	done := make([]bool, len(slots))
	for round := 0; ; round++ {
		if round > 100000 {
			t.Fatal("round-robin drain does not end")
		}
		left := 0
		for i, s := range slots {
			if done[i] {
				continue
			}
			ms := mustReceive(t, q, s)
			if len(ms) == 0 {
				done[i] = caughtUp(t, q, s)
			} else {
				all = append(all, ms...)
				mustAck(t, q, s)
			}
			if !done[i] {
				left++
			}
		}
		if left == 0 {
			return all
		}
	}
}

// claimAll claims every slot of a group for worker and returns the refs.
func (d *db) claimAll(q, c string, n int, worker string, max int) []slotRef {
	d.t.Helper()
	refs := make([]slotRef, n)
	for k := range n {
		mustClaim(d.t, d.pool, q, c, k, worker, "1 hour")
		refs[k] = slotRef{q: q, c: c, slot: k, n: n, worker: worker, max: max}
	}
	return refs
}

// waitLeaseExpired waits until the lease of slot of consumer c on queue q
// has run out by the server's clock, the one the lease functions read.
func waitLeaseExpired(t *testing.T, d *db, q, c string, slot int) {
	t.Helper()
	pgtest.WaitFor(t, 30*time.Second, fmt.Sprintf("the lease of slot %d to expire", slot), func() bool {
		return one[bool](t, d.pool, `select coalesce(lease_until < clock_timestamp(), false) from pgque.partition_slot_status
			where queue = $1 and consumer = $2 and slot = $3`, q, c, slot)
	})
}

// waitServerClock waits until the server's clock, the one the SQL under
// test reads, has moved on by at least age: what was stamped before the
// call is then that old.
func waitServerClock(t *testing.T, d *db, age time.Duration) {
	t.Helper()
	from := one[time.Time](t, d.pool, "select clock_timestamp()")
	pgtest.WaitFor(t, 30*time.Second, fmt.Sprintf("the server's clock to move on by %v", age), func() bool {
		return one[bool](t, d.pool, "select clock_timestamp() >= $1::timestamptz + $2::interval", from, age)
	})
}

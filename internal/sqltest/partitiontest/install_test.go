package partitiontest

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgque/pgque/internal/install"
	"github.com/pgque/pgque/internal/pgcluster"
	"github.com/pgque/pgque/internal/testing/pgtest"
	sqlfiles "github.com/pgque/pgque/sql"
)

// stateDump prints pgque's whole runtime state (everything but the version
// row's install time) one fact per line, sorted.
func stateDump(t *testing.T, d *db) []string {
	t.Helper()
	dump := one[string](t, d.pool, `
		select string_agg(x, E'\n' order by x) from (
		    select 'queue ' || q::text from pgque.queue q
		    union all select 'tick ' || k::text from pgque.tick k
		    union all select 'subscription ' || s::text from pgque.subscription s
		    union all select 'state ' || p::text from pgque.sub_state p
		    union all select 'slot_group ' || g::text from pgque.slot_group g
		    union all select 'slot_lease ' || l::text from pgque.slot_lease l
		    union all select 'retry ' || r::text from pgque.retry_queue r
		    union all select 'dead ' || dl::text from pgque.dead_letter dl
		    union all select 'event ' || e::text from pgque.event e
		    union all select 'index ' || pg_catalog.pg_get_indexdef(i.indexrelid)
		      from pg_catalog.pg_index i join pg_catalog.pg_inherits h on h.inhrelid = i.indrelid
		     where h.inhparent = 'pgque.event'::regclass
		) s(x)`)
	return strings.Split(dump, "\n")
}

// T-idempotent-install: re-running install.Install over live state keeps it
// all: subscriptions and cursors, slot groups, held leases (same owners,
// epochs and expiry), open batches with their progress, pending retries,
// events and routing indexes; and everything stays deliverable to the same
// lease holders afterwards.
func TestIdempotentInstall(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := setup(t)
	d.createQueue("ii")
	d.subscribeSlots("ii", "c", 2)
	k0, k1 := ptr("tenant-3"), ptr("tenant-1") // pinned: slots 0 and 1 of 2
	var sent []int64
	for range 5 {
		sent = append(sent, d.send("ii", k0), d.send("ii", k1))
	}
	d.tick("ii")
	s0 := slotRef{q: "ii", c: "c", slot: 0, n: 2, worker: "w0", max: 2}
	s1 := slotRef{q: "ii", c: "c", slot: 1, n: 2, worker: "w1", max: 100}
	mustClaim(t, d.pool, "ii", "c", 0, "w0", "1 hour")
	mustClaim(t, d.pool, "ii", "c", 1, "w1", "1 hour")

	// Slot 0: a batch open in its second chunk.
	delivered := map[int64]int{}
	for _, m := range mustReceive(t, d.pool, s0) {
		delivered[m.ID]++
	}
	if n := mustAck(t, d.pool, s0); n != 0 {
		t.Fatalf("ack of the first chunk = %d, want 0 (more to come)", n)
	}
	open := mustReceive(t, d.pool, s0)
	if len(open) == 0 {
		t.Fatal("slot 0 has no second chunk")
	}
	// Slot 1: one event nacked for an hour, the batch finished.
	got1 := mustReceive(t, d.pool, s1)
	retried := got1[0].ID
	if n, err := nack(ctx, d.pool, s1, retried, "1 hour"); err != nil || n != 1 {
		t.Fatalf("nack = %d, %v", n, err)
	}
	mustAck(t, d.pool, s1)
	for _, m := range got1 {
		delivered[m.ID]++
	}
	before := stateDump(t, d)
	if !slices.ContainsFunc(before, func(s string) bool { return strings.HasPrefix(s, "retry ") }) {
		t.Fatal("no pending retry before the reinstall")
	}

	res, err := install.Install(ctx, pgtest.Conn(t, d.dsn))
	if err != nil {
		t.Fatalf("re-running install: %v", err)
	}
	if res.Fresh() || res.Previous != sqlfiles.Version || res.Version != sqlfiles.Version {
		t.Errorf("reinstall = %+v, want an in-place upgrade from %s", res, sqlfiles.Version)
	}
	after := stateDump(t, d)
	if !slices.Equal(before, after) {
		for _, l := range before {
			if !slices.Contains(after, l) {
				t.Errorf("lost by the reinstall: %s", l)
			}
		}
		for _, l := range after {
			if !slices.Contains(before, l) {
				t.Errorf("appeared with the reinstall: %s", l)
			}
		}
	}

	// The same workers carry on: slot 0 gets its open chunk again, with
	// the same batch and epoch, and finishes; slot 1 gets its retry.
	again := mustReceive(t, d.pool, s0)
	if !slices.Equal(ids(again), ids(open)) || again[0].Batch != open[0].Batch || again[0].Epoch != open[0].Epoch {
		t.Errorf("after the reinstall slot 0 redelivered %+v, want the open chunk %+v", again, open)
	}
	mustAck(t, d.pool, s0)
	rest, _ := drain(t, d.pool, s0)
	for _, m := range append(again, rest...) {
		delivered[m.ID]++
	}
	d.exec("update pgque.retry_queue set ev_retry_after = now() where ev_id = $1", retried)
	if n := one[int32](t, d.pool, "select pgque.maint_retry_events()"); n != 1 {
		t.Fatalf("maint_retry_events = %d, want 1", n)
	}
	d.tick("ii")
	ms, _ := drain(t, d.pool, s1)
	if len(ms) != 1 || ms[0].ID != retried || ms[0].Retry != 1 {
		t.Errorf("slot 1 after the reinstall received %+v, want the retried event %d with retry_count 1", ms, retried)
	}
	for _, id := range sent {
		if delivered[id] != 1 {
			t.Errorf("event %d delivered (and acked) %d times across the reinstall, want once", id, delivered[id])
		}
	}
}

// Installing pgque into two databases of one cluster at the same time (two
// applications starting on a fresh server) works: the cluster-wide roles
// are created by whichever installer comes first, and the other one, which
// checked for them before they were committed, goes on instead of failing on
// the duplicate role name. The install lock cannot serialize the two, as
// advisory locks are per database. The roles are cluster-wide, so this runs
// on a private cluster where they do not exist yet.
func TestConcurrentInstallsCreateRolesOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := pgtest.NewCluster(t, pgcluster.Options{})
	su := pgtest.Conn(t, c.DSN("postgres"))
	for _, stmt := range []string{"create database a", "create database b"} {
		if _, err := su.Exec(ctx, stmt); err != nil {
			t.Fatal(err)
		}
	}
	if n := one[int64](t, su, "select count(*) from pg_roles where rolname like 'pgque\\_%'"); n != 0 {
		t.Fatalf("the private cluster already has %d pgque roles", n)
	}
	ca, cb := pgtest.Conn(t, c.DSN("a")), pgtest.Conn(t, c.DSN("b"))
	txA, err := ca.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer txA.Rollback(ctx)
	if _, err := install.Install(ctx, txA); err != nil {
		t.Fatalf("install into a: %v", err)
	}
	pidB := one[int32](t, cb, "select pg_backend_pid()")
	done := make(chan error, 1)
	go func() {
		_, err := install.Install(ctx, cb)
		done <- err
	}()
	// b's installer waits for a's uncommitted roles...
	pgtest.WaitFor(t, 30*time.Second, "install into b to wait on a's roles", func() bool {
		select {
		case err := <-done:
			t.Fatalf("install into b finished (%v) while a's install was uncommitted; expected it to wait on a's roles", err)
		default:
		}
		return one[bool](t, su, "select coalesce(bool_or(wait_event_type = 'Lock'), false) from pg_stat_activity where pid = $1", pidB)
	})
	// ...and carries on once they are committed.
	if err := txA.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Errorf("install into b, racing a's install on the cluster-wide roles: %v", err)
	}
	if n := one[int64](t, su, "select count(*) from pg_roles where rolname in ('pgque_reader', 'pgque_writer', 'pgque_admin')"); n != 3 {
		t.Errorf("%d pgque roles exist, want 3", n)
	}
}

// TestMaintWidensOldRoutingIndexes: a routing index made by an earlier
// version, ((route), ev_txid), is built again as (ev_txid, ev_id, (route))
// by maint_route_indexes once its table is nearly empty, under the same
// name, and the table's (ev_txid, ev_id) index, which the install gave it,
// goes.
func TestMaintWidensOldRoutingIndexes(t *testing.T) {
	t.Parallel()
	d := setup(t)
	d.createQueue("q")
	d.subscribeSlots("q", "c", 4)
	d.exec("select pgque.maint_route_indexes()")
	names := one[[]string](t, d.pool, `select array_agg(c.relname::text order by c.relname) from pg_catalog.pg_class c
		join pg_catalog.pg_namespace ns on ns.oid = c.relnamespace
		where ns.nspname = 'pgque' and c.relkind = 'i' and c.relname ~ '^event_[0-9]+_[0-9]+_route4$'`)
	if len(names) != 3 {
		t.Fatalf("routing indexes for N=4: %v, want 3", names)
	}
	for _, ix := range names {
		table := strings.TrimSuffix(ix, "_route4")
		d.exec(fmt.Sprintf("drop index pgque.%s", ix))
		d.exec(fmt.Sprintf(`create index %s on pgque.%s
			((case when ev_extra1 is null then 0 else (pg_catalog.hashtextextended(ev_extra1, 0) %% 4 + 4) %% 4 end), ev_txid)`, ix, table))
		// What the install of this version gives such a table.
		d.exec(fmt.Sprintf("create index %s_txid on pgque.%s (ev_txid, ev_id)", table, table))
	}
	if n := one[int32](t, d.pool, "select pgque.maint_route_indexes()"); n != 3 {
		t.Errorf("maint_route_indexes() = %d, want 3 rebuilt", n)
	}
	cols := one[[]int32](t, d.pool, `select array_agg(i.indnatts::int order by c.relname) from pg_catalog.pg_index i
		join pg_catalog.pg_class c on c.oid = i.indexrelid where c.relname = any($1)`, names)
	if !slices.Equal(cols, []int32{3, 3, 3}) {
		t.Errorf("columns of %v after maint_route_indexes: %v, want 3 each", names, cols)
	}
	if n := one[int32](t, d.pool, "select pgque.maint_route_indexes()"); n != 0 {
		t.Errorf("a second maint_route_indexes() = %d, want 0", n)
	}
	var want []string
	for _, ix := range names {
		want = append(want, ix+" (ev_txid, ev_id, route)")
	}
	if got := eventIndexes(t, d.pool, "q"); !slices.Equal(got, want) {
		t.Errorf("indexes after maint_route_indexes: %q, want %q", got, want)
	}
}

// eventIndexes lists the non-unique indexes of the queue's event tables as
// "name (columns)", an expression column as "route" (the test of the
// planner below says that it is _slot_filter's).
func eventIndexes(t testing.TB, q querier, queue string) []string {
	t.Helper()
	return one[[]string](t, q, `select coalesce(array_agg(c.relname || ' (' || (
		         select string_agg(case when i.indkey[k - 1] = 0 then 'route' else pg_catalog.pg_get_indexdef(i.indexrelid, k, true) end,
		                           ', ' order by k)
		           from generate_series(1, i.indnatts) k) || ')'
		       order by c.relname), '{}')
		  from pg_catalog.pg_index i join pg_catalog.pg_class c on c.oid = i.indexrelid
		  join pg_catalog.pg_inherits h on h.inhrelid = i.indrelid and h.inhparent = 'pgque.event'::regclass
		  join pgque.queue q on q.queue_name = $1
		 where not i.indisunique and c.relname like 'event\_' || q.queue_id || '\_%'`, queue)
}

// engineIndexes is what eventIndexes lists for a queue whose tables have
// the engine's (ev_txid, ev_id) index alone.
func engineIndexes(t testing.TB, q querier, queue string) []string {
	t.Helper()
	id := one[int32](t, q, "select queue_id from pgque.queue where queue_name = $1", queue)
	var want []string
	for n := range 3 {
		want = append(want, fmt.Sprintf("event_%d_%d_txid (ev_txid, ev_id)", id, n))
	}
	return want
}

// TestRoutingIndexReplacesTheTxidIndex: an event table has one index that
// leads with (ev_txid, ev_id): the engine's, until a slot group's routing
// index, (ev_txid, ev_id, route), takes its place (one index entry per
// send instead of two). A slot's routing predicate is a condition of that
// index. The subscribe leaves the indexes to maint_route_indexes; when the
// engine's index cannot be dropped at once (its table in use), a later
// call drops it; and when the last routing index of a table goes, the
// engine's index comes back first.
func TestRoutingIndexReplacesTheTxidIndex(t *testing.T) {
	t.Parallel()
	d := setup(t)
	ctx := context.Background()
	d.createQueue("q")
	txid := engineIndexes(t, d.pool, "q")
	var route4 []string
	for _, ix := range txid {
		route4 = append(route4, strings.Replace(ix, "_txid (ev_txid, ev_id)", "_route4 (ev_txid, ev_id, route)", 1))
	}
	if got := eventIndexes(t, d.pool, "q"); !slices.Equal(got, txid) {
		t.Fatalf("indexes of a new queue: %q, want %q", got, txid)
	}

	// A reader of the current table holds up the drop of its engine index
	// (the lock waits 20 ms), not the routing index.
	cur := one[string](t, d.pool, "select pgque._event_table(queue_id, queue_cur_table) from pgque.queue where queue_name = 'q'")
	hold, err := d.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Rollback(ctx)
	if _, err := hold.Exec(ctx, "select count(*) from "+cur); err != nil {
		t.Fatal(err)
	}
	d.subscribeSlots("q", "c", 4)
	if got := eventIndexes(t, d.pool, "q"); !slices.Equal(got, txid) {
		t.Fatalf("indexes once the slots are subscribed: %q, want %q until maint_route_indexes", got, txid)
	}
	if n := one[int32](t, d.pool, "select pgque.maint_route_indexes()"); n != 3 {
		t.Errorf("maint_route_indexes() = %d, want 3 (the routing indexes built)", n)
	}
	got := eventIndexes(t, d.pool, "q")
	if len(got) != 4 || !slices.Contains(got, strings.Replace(txid[0], "_0_", "_"+cur[len(cur)-1:]+"_", 1)) {
		t.Fatalf("indexes with %s in use: %q, want the routing indexes and %s's engine index", cur, got, cur)
	}
	if err := hold.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if n := one[int32](t, d.pool, "select pgque.maint_route_indexes()"); n != 1 {
		t.Errorf("maint_route_indexes() = %d, want 1 (the engine index left behind)", n)
	}
	if got := eventIndexes(t, d.pool, "q"); !slices.Equal(got, route4) {
		t.Fatalf("indexes of a queue with 4 slots: %q, want %q", got, route4)
	}

	// Slot 2's predicate is a condition of the routing index.
	tx, err := d.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	plan := one[string](t, tx, `select pgque._slot_filter(2, 4)`)
	if _, err := tx.Exec(ctx, "set local enable_seqscan = off; set local enable_bitmapscan = off"); err != nil {
		t.Fatal(err)
	}
	var lines []string
	rows, err := tx.Query(ctx, "explain select ev_id from "+cur+" where ev_txid >= '1' and ev_txid < '100' and "+plan+" order by ev_id")
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var l string
		if err := rows.Scan(&l); err != nil {
			t.Fatal(err)
		}
		lines = append(lines, l)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	text := strings.Join(lines, "\n")
	if !strings.Contains(text, "_route4") || !regexp.MustCompile(`Index Cond: .*hashtextextended.* = 2\)`).MatchString(text) {
		t.Errorf("slot 2's read is not an index condition on the routing index:\n%s", text)
	}
	tx.Rollback(ctx)

	// Events sent meanwhile reach the slots and a plain consumer alike.
	d.exec("select pgque.subscribe('q', 'plain')")
	k := "tenant-1"
	ids := []int64{d.send("q", &k), d.send("q", nil), d.send("q", &k)}
	d.tick("q")
	if got := one[[]int64](t, d.pool, "select array_agg(msg_id) from pgque.receive('q', 'plain', 100)"); !slices.Equal(got, ids) {
		t.Errorf("the plain consumer received %v, want %v", got, ids)
	}
	var slotted []int64
	refs := d.claimAll("q", "c", 4, "w", 100)
	for _, r := range refs {
		for _, m := range mustReceive(t, d.pool, r) {
			slotted = append(slotted, m.ID)
		}
	}
	slices.Sort(slotted)
	if !slices.Equal(slotted, ids) {
		t.Errorf("the slots received %v, want %v", slotted, ids)
	}

	// The last slot goes: its routing indexes go, after the engine's is back.
	for s := range 4 {
		release(t, d.pool, "q", "c", s, "w")
		d.exec("select pgque.unsubscribe_slot('q', 'c', $1, 4)", s)
	}
	if got := eventIndexes(t, d.pool, "q"); !slices.Equal(got, route4) {
		t.Errorf("indexes once the slots are gone: %q, want %q until maint_route_indexes", got, route4)
	}
	d.exec("select pgque.maint_route_indexes()")
	if got := eventIndexes(t, d.pool, "q"); !slices.Equal(got, txid) {
		t.Errorf("indexes once maint_route_indexes ran: %q, want %q", got, txid)
	}
}

// TestInvalidRoutingIndexLeavesTheTxidIndex: a table too full for its
// routing index keeps the engine's (ev_txid, ev_id) index, and an invalid
// routing index on it (a CREATE INDEX CONCURRENTLY that failed, as
// docs/operations.md has an operator run) does not count as its
// replacement: maint_route_indexes leaves the engine's index alone.
func TestInvalidRoutingIndexLeavesTheTxidIndex(t *testing.T) {
	t.Parallel()
	d := setup(t)
	d.createQueue("q")
	keys := make([]*string, 1001)
	for i := range keys {
		keys[i] = ptr(fmt.Sprintf("tenant-%d", i))
	}
	d.sendBatch("q", keys)
	cur := one[string](t, d.pool, "select queue_id || '_' || queue_cur_table from pgque.queue where queue_name = 'q'")
	d.subscribeSlots("q", "c", 4)
	got := eventIndexes(t, d.pool, "q")
	if !slices.Contains(got, "event_"+cur+"_txid (ev_txid, ev_id)") || slices.Contains(got, "event_"+cur+"_route4 (ev_txid, ev_id, route)") {
		t.Fatalf("indexes with event_%s full: %q, want its engine index and no routing index", cur, got)
	}
	d.exec(fmt.Sprintf(`create index event_%s_route4 on pgque.event_%s
		(ev_txid, ev_id, (case when ev_extra1 is null then 0 else (pg_catalog.hashtextextended(ev_extra1, 0) %% 4 + 4) %% 4 end))`, cur, cur))
	d.exec(fmt.Sprintf("update pg_catalog.pg_index set indisvalid = false where indexrelid = 'pgque.event_%s_route4'::regclass", cur))
	d.exec("select pgque.maint_route_indexes()")
	if got := eventIndexes(t, d.pool, "q"); !slices.Contains(got, "event_"+cur+"_txid (ev_txid, ev_id)") {
		t.Errorf("indexes after maint_route_indexes: %q, want event_%s's engine index kept beside its invalid routing index", got, cur)
	}
}

// txidLedMissing returns the queue's event tables that have no valid index
// leading with (ev_txid, ev_id).
func txidLedMissing(t testing.TB, q querier, queue string) []string {
	t.Helper()
	return one[[]string](t, q, `select coalesce(array_agg(c.relname::text order by c.relname), '{}')
		  from pg_catalog.pg_inherits h join pg_catalog.pg_class c on c.oid = h.inhrelid
		  join pgque.queue q on q.queue_name = $1
		 where h.inhparent = 'pgque.event'::regclass and c.relname like 'event\_' || q.queue_id || '\_%'
		   and cardinality(pgque._txid_indexes(c.oid::regclass)) = 0`, queue)
}

// TestRouteIndexDropsKeepATxidIndex: two slot groups of different N leave
// each table two routing indexes and no engine index. Once both groups
// are gone, maint_route_indexes drops both, building the engine's index
// first, so a table never has neither (it did when two drops each read
// the catalog before the other's). A second call beside the first's open
// transaction waits for nothing and does nothing (_index_ddl_lock). A
// reader holding a table holds the drop up 20 ms at most, and its routing
// index stays until a later call.
func TestRouteIndexDropsKeepATxidIndex(t *testing.T) {
	t.Parallel()
	d := setup(t)
	ctx := context.Background()
	d.createQueue("q")
	d.subscribeSlots("q", "g16", 16)
	d.subscribeSlots("q", "g8", 8)
	d.exec("select pgque.maint_route_indexes()")
	if n := len(eventIndexes(t, d.pool, "q")); n != 6 {
		t.Fatalf("indexes of the two groups: %q, want route16 and route8 on each table", eventIndexes(t, d.pool, "q"))
	}
	for s := range 16 {
		d.exec("select pgque.unsubscribe_slot('q', 'g16', $1, 16)", s)
	}
	for s := range 8 {
		d.exec("select pgque.unsubscribe_slot('q', 'g8', $1, 8)", s)
	}

	s1, err := d.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer s1.Rollback(ctx)
	if n := one[int32](t, s1, "select pgque.maint_route_indexes()"); n != 6 {
		t.Errorf("maint_route_indexes() once both groups are gone = %d, want 6 dropped", n)
	}
	s2 := pgtest.Conn(t, d.dsn)
	done := make(chan error, 1)
	go func() {
		var n int32
		err := s2.QueryRow(ctx, "select pgque.maint_route_indexes()").Scan(&n)
		if err == nil && n != 0 {
			err = fmt.Errorf("it returned %d, want 0", n)
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal("maint_route_indexes beside another's open transaction:", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("maint_route_indexes waited 10 s for another's open transaction")
	}
	if err := s1.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if got, want := eventIndexes(t, d.pool, "q"), engineIndexes(t, d.pool, "q"); !slices.Equal(got, want) {
		t.Fatalf("indexes once both groups are gone: %q, want %q", got, want)
	}

	// A reader holds a table; the drop does not wait for it.
	d.subscribeSlots("q", "g4", 4)
	d.exec("select pgque.maint_route_indexes()")
	for s := range 4 {
		d.exec("select pgque.unsubscribe_slot('q', 'g4', $1, 4)", s)
	}
	cur := one[string](t, d.pool, "select pgque._event_table(queue_id, queue_cur_table) from pgque.queue where queue_name = 'q'")
	reader, err := d.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Rollback(ctx)
	if _, err := reader.Exec(ctx, "select count(*) from "+cur); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if n := one[int32](t, d.pool, "select pgque.maint_route_indexes()"); n != 2 {
		t.Errorf("maint_route_indexes() behind a reader of %s = %d, want the 2 other tables' routing indexes dropped", cur, n)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("maint_route_indexes took %v behind a reader", took)
	}
	if missing := txidLedMissing(t, d.pool, "q"); len(missing) != 0 {
		t.Fatalf("tables with no (ev_txid, ev_id) index: %v", missing)
	}
	if err := reader.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	d.exec("select pgque.maint_route_indexes()")
	want := engineIndexes(t, d.pool, "q")
	if got := eventIndexes(t, d.pool, "q"); !slices.Equal(got, want) {
		t.Errorf("indexes once no group is left: %q, want %q", got, want)
	}
	// A table left with none (by hand here) gets the engine's back.
	d.exec("drop index pgque." + strings.Fields(want[1])[0])
	d.exec("select pgque.maint_route_indexes()")
	if got := eventIndexes(t, d.pool, "q"); !slices.Equal(got, want) {
		t.Errorf("indexes after maint_route_indexes repaired a table: %q, want %q", got, want)
	}
}

// TestRouteIndexBuildDoesNotUpgradeItsLock: maint_route_indexes never
// waits for a table's exclusive lock while it holds the SHARE lock of the
// index it just built there. PostgreSQL refuses a wait behind such a lock
// upgrade at once, as a deadlock (40P01), to whichever of the two asks
// last: here the build, and, in the other order, a transaction that had
// read the table and then wrote to it (an ack that puts a paused key's
// events back), whose chunk was then delivered again. An event trigger
// stops the build right after its CREATE INDEX, until the writer waits
// behind the build's SHARE lock; without it the window is the build's
// 20 ms wait for the exclusive lock.
func TestRouteIndexBuildDoesNotUpgradeItsLock(t *testing.T) {
	t.Parallel()
	d := setup(t)
	ctx := context.Background()
	d.createQueue("q")
	d.subscribeSlots("q", "c", 4)
	first := one[string](t, d.pool, "select pgque._event_table(queue_id, 0) from pgque.queue where queue_name = 'q'")
	if cur := one[string](t, d.pool, "select pgque._event_table(queue_id, queue_cur_table) from pgque.queue where queue_name = 'q'"); cur != first {
		t.Fatalf("a new queue sends to %s, want %s (the table maint_route_indexes builds on first)", cur, first)
	}
	// lock_timeout = 0: the build runs under maint_route_indexes' 100 ms
	// lock_timeout, which would otherwise end the wait on the gate (and
	// the build with it) before the send had queued behind it.
	d.exec(`create function public.stop_after_index() returns event_trigger language plpgsql
		set lock_timeout = 0 as $$
		begin
		    if current_setting('application_name') = 'maint under test' then
		        perform pg_catalog.pg_advisory_xact_lock(4242);
		    end if;
		end $$`)
	d.exec("create event trigger stop_after_index on ddl_command_end when tag in ('CREATE INDEX') execute function public.stop_after_index()")

	gate := pgtest.Conn(t, d.dsn)
	if _, err := gate.Exec(ctx, "select pg_advisory_lock(4242)"); err != nil {
		t.Fatal(err)
	}
	writer, err := d.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer writer.Rollback(ctx)
	writerPID := one[int32](t, writer, "select pg_backend_pid()")
	if _, err := writer.Exec(ctx, "select count(*) from "+first); err != nil {
		t.Fatal(err)
	}

	maint := pgtest.Conn(t, d.dsn)
	if _, err := maint.Exec(ctx, "set application_name = 'maint under test'"); err != nil {
		t.Fatal(err)
	}
	maintPID := one[int32](t, maint, "select pg_backend_pid()")
	built := make(chan error, 1)
	go func() {
		var n int32
		err := maint.QueryRow(ctx, "select pgque.maint_route_indexes()").Scan(&n)
		if err == nil && n != 3 {
			err = fmt.Errorf("it returned %d, want the 3 routing indexes built", n)
		}
		built <- err
	}()
	waitForLockWait(t, d, maintPID, "maint_route_indexes, stopped after its first CREATE INDEX")
	sent := make(chan error, 1)
	go func() {
		_, err := writer.Exec(ctx, "select pgque.send('q', 'k', '{}')")
		sent <- err
	}()
	waitForLockWait(t, d, writerPID, "the send, behind the build's SHARE lock")
	if _, err := gate.Exec(ctx, "select pg_advisory_unlock(4242)"); err != nil {
		t.Fatal(err)
	}
	if err := <-built; err != nil {
		t.Fatal("maint_route_indexes beside a reader that writes:", err)
	}
	if err := <-sent; err != nil {
		t.Fatal("a send after reading the table, beside maint_route_indexes:", err)
	}
	if err := writer.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	d.exec("drop event trigger stop_after_index")
	if n := one[int32](t, d.pool, "select pgque.maint_route_indexes()"); n != 1 {
		t.Errorf("maint_route_indexes() once the writer committed = %d, want 1 (the engine index of %s)", n, first)
	}
	if missing := txidLedMissing(t, d.pool, "q"); len(missing) != 0 {
		t.Fatalf("tables with no (ev_txid, ev_id) index: %v", missing)
	}
	if got := eventIndexes(t, d.pool, "q"); len(got) != 3 || slices.ContainsFunc(got, func(ix string) bool { return !strings.HasSuffix(ix, "_route4 (ev_txid, ev_id, route)") }) {
		t.Errorf("indexes once the engine's are retired: %q, want the 3 routing indexes alone", got)
	}
}

// TestIndexesUnderATransactionSnapshot: unsubscribes in REPEATABLE READ
// read the catalog in their snapshot, which misses what the other one
// dropped, and two of them left every table with no (ev_txid, ev_id)
// index. Under a transaction snapshot the indexes are now left to
// maint_route_indexes, which refuses anything but READ COMMITTED (PQ011).
func TestIndexesUnderATransactionSnapshot(t *testing.T) {
	t.Parallel()
	d := setup(t)
	ctx := context.Background()
	d.createQueue("rq")
	d.subscribeSlots("rq", "a", 2)
	d.subscribeSlots("rq", "b", 4)
	a, b := pgtest.Conn(t, d.dsn), pgtest.Conn(t, d.dsn)
	for _, c := range []*pgx.Conn{a, b} {
		if _, err := c.Exec(ctx, "begin isolation level repeatable read; select count(*) from pgque.queue"); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := a.Exec(ctx, "select pgque.unsubscribe_slot('rq', 'a', 0, 2), pgque.unsubscribe_slot('rq', 'a', 1, 2); commit"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Exec(ctx, "select count(pgque.unsubscribe_slot('rq', 'b', k, 4)) from generate_series(0, 3) k; commit"); err != nil {
		t.Fatal(err)
	}
	if missing := txidLedMissing(t, d.pool, "rq"); len(missing) != 0 {
		t.Fatalf("tables with no (ev_txid, ev_id) index: %v (indexes: %q)", missing, eventIndexes(t, d.pool, "rq"))
	}
	if _, err := b.Exec(ctx, "begin isolation level repeatable read"); err != nil {
		t.Fatal(err)
	}
	_, err := b.Exec(ctx, "select pgque.maint_route_indexes()")
	wantState(t, err, "PQ011", "maint_route_indexes under REPEATABLE READ")
	if _, err := b.Exec(ctx, "rollback"); err != nil {
		t.Fatal(err)
	}
	d.exec("select pgque.maint_route_indexes()")
	if got, want := eventIndexes(t, d.pool, "rq"), engineIndexes(t, d.pool, "rq"); !slices.Equal(got, want) {
		t.Errorf("indexes once maint_route_indexes ran: %q, want %q", got, want)
	}
}

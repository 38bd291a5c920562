package partitiontest

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

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
// version, ((route), ev_txid), is built again with ev_id by
// maint_route_indexes once its table is nearly empty, under the same name.
func TestMaintWidensOldRoutingIndexes(t *testing.T) {
	t.Parallel()
	d := setup(t)
	d.createQueue("q")
	d.subscribeSlots("q", "c", 4)
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
}

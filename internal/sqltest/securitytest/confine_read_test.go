package securitytest

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgque/pgque/internal/install"
	"github.com/pgque/pgque/internal/testing/pgtest"
)

// Logins of the confined-read fixture: the tenant that owns queue q1 (its
// reader, and its writer, which is granted 'consume' too so that it may
// read the key views of its own queue), two strangers that hold the same
// cluster-wide pgque roles but no grant on q1, and an admin.
const (
	tenantReader   = "t_reader"
	tenantWriter   = "t_writer"
	strangerReader = "s_reader"
	strangerWriter = "s_writer"
	readAdmin      = "r_admin"
)

// listings are the calls and views that list several queues at once: a
// confined queue's rows must be left out for a login that may not read
// it. Each statement counts the rows of the queue named by %s.
// TestConfinedStrangerReadsNothing fails when a view or a set-returning
// function that can list every queue (no queue argument, or one that may
// be left NULL) is granted to pgque_reader or pgque_writer without an
// entry here.
var listings = map[string]string{
	"pgque.get_queue_info(text)":         `select count(*) from pgque.get_queue_info(null) where queue_name = '%s'`,
	"pgque.get_consumer_info(text,text)": `select count(*) from pgque.get_consumer_info(null, null) where queue_name = '%s'`,
	"pgque.resize_status(text)":          `select count(*) from pgque.resize_status(null) where queue = '%s'`,
	"pgque.partition_slot_status":        `select count(*) from pgque.partition_slot_status where queue = '%s'`,
	"pgque.partition_slot_leases":        `select count(*) from pgque.partition_slot_leases where queue = '%s'`,
	"pgque.partition_slot_stalls":        `select count(*) from pgque.partition_slot_stalls where queue = '%s'`,
}

// queueArgs are the argument names that tie a call to one queue: the
// queue itself, a subscription, or a batch (whose subscription's queue).
var queueArgs = []string{"i_queue", "i_sub", "i_batch_id"}

// confinedReadDB starts a private cluster with the securitytest fixture
// (queue q1 ..., see functions_test.go) installed by a non-superuser owner,
// confines q1 to the tenant for both actions, adds an unconfined queue q2
// with the same consumers, a dead letter and a resize on each, and returns
// a superuser connection to that database and a connector for the logins above.
func confinedReadDB(t *testing.T) (*pgx.Conn, func(role string) *pgx.Conn) {
	t.Helper()
	ctx := context.Background()
	_, super, newDB := installerCluster(t)
	dsn := newDB("readviews")
	owner := pgtest.Conn(t, pgtest.DSNWith(dsn, "user", "pgque_owner"))
	if _, err := install.Install(ctx, owner); err != nil {
		t.Fatal(err)
	}
	mustExec(t, super, `create role `+tenantReader+` login`, `create role `+tenantWriter+` login`,
		`create role `+strangerReader+` login`, `create role `+strangerWriter+` login`, `create role `+readAdmin+` login`)
	mustExec(t, owner, `grant pgque_reader to `+tenantReader+`, `+strangerReader,
		`grant pgque_writer to `+tenantWriter+`, `+strangerWriter, `grant pgque_admin to `+readAdmin)
	db := pgtest.Conn(t, dsn)
	if _, err := db.Exec(ctx, fixture); err != nil {
		t.Fatal("fixture:", err)
	}
	mustExec(t, db,
		`select pgque.create_queue('q2')`, `select pgque.subscribe('q2', 'c1')`,
		`select pgque.subscribe_slot('q2', 'sc', s, 2) from generate_series(0, 1) s`,
	)
	for _, q := range []string{"q1", "q2"} {
		mustExec(t, db,
			// The fixture ran as one transaction, which its own tick could
			// not see: a batch of events for c1.
			`select pgque.send('`+q+`', 't', '{"card":"4111"}'::jsonb, 'k1')`, `select pgque.force_next_tick('`+q+`')`, `select pgque.ticker('`+q+`')`,
			// A dead letter: c1 receives and nacks with no retry.
			`select pgque.nack(r.batch_id, r.msg_id, null, 'card 4111-SECRET') from (select * from pgque.receive('`+q+`', 'c1', 1)) r`,
			`select pgque.subscribe_slot('`+q+`', 'rz', s, 2) from generate_series(0, 1) s`,
			`select pgque.resize_slots('`+q+`', 'rz', 4)`)
	}
	mustExec(t, db,
		`select pgque.grant_queue('q1', '`+tenantReader+`', 'consume')`,
		`select pgque.grant_queue('q1', '`+tenantWriter+`', 'consume')`,
		`select pgque.grant_queue('q1', '`+tenantWriter+`', 'produce')`)
	return db, func(role string) *pgx.Conn { return pgtest.Conn(t, pgtest.DSNWith(dsn, "user", role)) }
}

// queueCalls lists the functions granted to pgque_reader or pgque_writer
// that take a queue (or a subscription or batch of one), each with whether
// the reader and the writer may execute it.
func queueCalls(t *testing.T, conn *pgx.Conn) map[string][2]bool {
	t.Helper()
	rows, err := conn.Query(context.Background(), `
		select p.oid::regprocedure::text, has_function_privilege('pgque_reader', p.oid, 'execute'),
		       has_function_privilege('pgque_writer', p.oid, 'execute')
		  from pg_proc p
		 where p.pronamespace = 'pgque'::regnamespace and p.proargnames && $1::text[]
		   and (has_function_privilege('pgque_reader', p.oid, 'execute')
		     or has_function_privilege('pgque_writer', p.oid, 'execute'))`, queueArgs)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][2]bool{}
	var sig string
	var r, w bool
	if _, err := pgx.ForEachRow(rows, []any{&sig, &r, &w}, func() error { out[sig] = [2]bool{r, w}; return nil }); err != nil {
		t.Fatal(err)
	}
	return out
}

// possibleListings lists what could show several queues to pgque_reader
// or pgque_writer: relations they may SELECT, and set-returning functions
// granted to them whose queue argument is absent or has a default.
func possibleListings(t *testing.T, conn *pgx.Conn) []string {
	t.Helper()
	return queryNames(t, conn, `
		select 'pgque.' || c.relname from pg_class c
		 where c.relnamespace = 'pgque'::regnamespace
		   and (has_table_privilege('pgque_reader', c.oid, 'select') or has_table_privilege('pgque_writer', c.oid, 'select'))
		union all
		select p.oid::regprocedure::text from pg_proc p
		 where p.pronamespace = 'pgque'::regnamespace and p.proretset
		   and (has_function_privilege('pgque_reader', p.oid, 'execute')
		     or has_function_privilege('pgque_writer', p.oid, 'execute'))
		   and coalesce(array_position(p.proargnames, 'i_queue') > p.pronargs - p.pronargdefaults, true)
		 order by 1`)
}

// TestConfinedStrangerReadsNothing: on a queue confined to one tenant,
// every function granted to pgque_reader or pgque_writer that names the
// queue (taken from the catalog, called with the arguments of the
// functions table) refuses a stranger holding the same pgque role with
// 42501 and the confinement message, while the tenant is not refused; and
// every view or listing leaves the confined queue's rows out for the
// stranger but shows them to the tenant and the admin, and shows the
// unconfined queue to everyone. A new function or view granted to those
// roles without the read check fails here.
func TestConfinedStrangerReadsNothing(t *testing.T) {
	super, as := confinedReadDB(t)
	conns := map[string]*pgx.Conn{}
	for _, r := range []string{tenantReader, tenantWriter, strangerReader, strangerWriter, readAdmin} {
		conns[r] = as(r)
	}
	calls := queueCalls(t, super)
	for _, sig := range slices.Sorted(maps.Keys(calls)) {
		spec, ok := functions[sig]
		if !ok {
			t.Errorf("%s takes a queue and is granted to pgque_reader/pgque_writer but has no entry in the functions table (functions_test.go): add one with valid arguments against the fixture", sig)
			continue
		}
		stmt := call(sig, spec.args)
		for i, pair := range [][2]string{{strangerReader, tenantReader}, {strangerWriter, tenantWriter}} {
			if !calls[sig][i] {
				continue
			}
			stranger, tenant := pair[0], pair[1]
			code, msg := sqlstate(t, conns[stranger], "", stmt)
			if code != "42501" || !strings.Contains(msg, "confined") {
				t.Errorf("%s as %s (no grant on the confined q1): SQLSTATE %q (%s), want 42501 from the queue check: call pgque._authorize_read (or _authorize) first",
					stmt, stranger, code, msg)
			}
			if code, msg := sqlstate(t, conns[tenant], "", stmt); code == "42501" {
				t.Errorf("%s as the tenant %s: refused (%s)", stmt, tenant, msg)
			}
		}
	}
	for _, name := range possibleListings(t, super) {
		tmpl, ok := listings[name]
		if !ok {
			t.Errorf("%s can list every queue to pgque_reader/pgque_writer but has no entry in listings (confine_read_test.go): leave out the queues the caller may not read (pgque._may_read) and add a statement counting one queue's rows", name)
			continue
		}
		count := func(role, q string) int64 {
			t.Helper()
			var n int64
			if err := conns[role].QueryRow(context.Background(), fmt.Sprintf(tmpl, q)).Scan(&n); err != nil {
				t.Fatalf("%s as %s: %v", fmt.Sprintf(tmpl, q), role, err)
			}
			return n
		}
		for _, r := range []string{strangerReader, strangerWriter} {
			if n := count(r, "q1"); n != 0 {
				t.Errorf("%s as %s: %d rows of the confined q1, want none", name, r, n)
			}
			if n := count(r, "q2"); n == 0 {
				t.Errorf("%s as %s: no row of the unconfined q2", name, r)
			}
		}
		for _, r := range []string{tenantReader, tenantWriter, readAdmin} {
			if n := count(r, "q1"); n == 0 {
				t.Errorf("%s as %s: no row of q1, which it may read", name, r)
			}
		}
	}
	// What the admin and the tenant see: the dead letter with its payload
	// and reason, and the keys.
	for _, r := range []string{tenantReader, readAdmin} {
		var reason string
		if err := conns[r].QueryRow(context.Background(), `select reason from pgque.dlq_list('q1')`).Scan(&reason); err != nil || reason != "card 4111-SECRET" {
			t.Errorf("dlq_list('q1') as %s: %q, %v; want the dead letter", r, reason, err)
		}
		var keys int64
		if err := conns[r].QueryRow(context.Background(), `select count(*) from pgque.key_heads('q1', 'sc')`).Scan(&keys); err != nil || keys == 0 {
			t.Errorf("key_heads('q1', 'sc') as %s: %d rows, %v; want the keys", r, keys, err)
		}
	}
}

// TestConfinedViewsLeakNothingToCheapQuals: the views that list several
// queues are security barriers. A stranger's own function in the WHERE
// clause, declared cheaper than the view's _may_read filter, would
// otherwise run first, on every row, and could pass the confined queue's
// consumers, slots and epochs out (a NOTICE here) before the filter drops
// the rows.
func TestConfinedViewsLeakNothingToCheapQuals(t *testing.T) {
	ctx := context.Background()
	db, _ := confinedReadDB(t)
	// Consumers only the confined queue has, and their twin on q2.
	mustExec(t, db, `select pgque.subscribe_slot('q1', 'secretcons', s, 2) from generate_series(0, 1) s`,
		`select pgque.subscribe_slot('q2', 'opencons', s, 2) from generate_series(0, 1) s`)
	cfg := db.Config().Copy()
	cfg.User = strangerReader
	cfg.Password = ""
	var notices []string
	cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) { notices = append(notices, n.Message) }
	stranger, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer stranger.Close(ctx)
	// Of the slot's own columns (the lease's), so that it may be pushed down
	// to the scan that _may_read filters.
	if _, err := stranger.Exec(ctx, `create function pg_temp.leak(c text, s integer) returns boolean
		language plpgsql cost 0.0000001 as $$ begin raise notice 'saw %/%', c, s; return true; end $$`); err != nil {
		t.Fatal(err)
	}
	views := 0
	for _, name := range possibleListings(t, db) {
		if !strings.HasPrefix(name, "pgque.partition_slot_") {
			continue
		}
		views++
		notices = notices[:0]
		var n int
		if err := stranger.QueryRow(ctx, `select count(*) from `+name+` where pg_temp.leak(consumer, slot)`).Scan(&n); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		for _, m := range notices {
			if strings.HasPrefix(m, "saw secretcons/") {
				t.Errorf("%s passed a row of the confined queue to the stranger's function: %s", name, m)
			}
		}
		if !slices.ContainsFunc(notices, func(m string) bool { return strings.HasPrefix(m, "saw opencons/") }) {
			t.Errorf("%s: the stranger's function saw no row of q2 (%v): the check proves nothing", name, notices)
		}
	}
	if views != 3 {
		t.Errorf("found %d partition_slot_ views among the listings, want 3", views)
	}
}

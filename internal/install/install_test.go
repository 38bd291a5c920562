package install_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgque/pgque/internal/install"
	"github.com/pgque/pgque/internal/testing/pgtest"
	sqlfiles "github.com/pgque/pgque/sql"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// setup returns a connection to a fresh, empty database.
func setup(t *testing.T) (context.Context, *pgx.Conn) {
	t.Helper()
	return context.Background(), pgtest.Conn(t, pgtest.NewDB(t))
}

// version reads InstalledVersion, failing the test on error.
func version(t *testing.T, ctx context.Context, q install.Querier) string {
	t.Helper()
	v, err := install.InstalledVersion(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// schemaFingerprint counts the objects in schema pgque, so two installs can
// be compared.
func schemaFingerprint(t *testing.T, ctx context.Context, conn *pgx.Conn) [3]int {
	t.Helper()
	var f [3]int
	err := conn.QueryRow(ctx, `select
		(select count(*) from pg_catalog.pg_proc where pronamespace = 'pgque'::regnamespace),
		(select count(*) from pg_catalog.pg_class where relnamespace = 'pgque'::regnamespace),
		(select count(*) from pg_catalog.pg_type where typnamespace = 'pgque'::regnamespace)`).
		Scan(&f[0], &f[1], &f[2])
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func TestInstallFresh(t *testing.T) {
	t.Parallel()
	ctx, conn := setup(t)
	if v := version(t, ctx, conn); v != "" {
		t.Fatalf("InstalledVersion on an empty database = %q, want \"\"", v)
	}
	res, err := install.Install(ctx, conn)
	if err != nil {
		t.Fatal(err)
	}
	if !res.Fresh() || res.Version != sqlfiles.Version {
		t.Errorf("Install = %+v, want a fresh install of %s", res, sqlfiles.Version)
	}
	if v := version(t, ctx, conn); v != sqlfiles.Version {
		t.Errorf("InstalledVersion = %q, want %q", v, sqlfiles.Version)
	}
}

func TestInstallTwiceIsIdempotent(t *testing.T) {
	t.Parallel()
	ctx, conn := setup(t)
	if _, err := install.Install(ctx, conn); err != nil {
		t.Fatal(err)
	}
	before := schemaFingerprint(t, ctx, conn)
	res, err := install.Install(ctx, conn)
	if err != nil {
		t.Fatalf("second Install: %v", err)
	}
	if res.Previous != sqlfiles.Version || res.Version != sqlfiles.Version || res.Fresh() {
		t.Errorf("second Install = %+v, want an upgrade from %s to itself", res, sqlfiles.Version)
	}
	if after := schemaFingerprint(t, ctx, conn); after != before {
		t.Errorf("objects in schema pgque (functions, relations, types): %v after the first install, %v after the second", before, after)
	}
}

func TestConcurrentInstallsSerialize(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, pgtest.NewDB(t))
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Go(func() { _, errs[i] = install.Install(ctx, pool) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("installer %d: %v", i, err)
		}
	}
	if v := version(t, ctx, pool); v != sqlfiles.Version {
		t.Errorf("InstalledVersion = %q, want %q", v, sqlfiles.Version)
	}
}

func TestInstallInCallersTransaction(t *testing.T) {
	t.Parallel()
	ctx, conn := setup(t)
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := install.Install(ctx, tx); err != nil {
		t.Fatal(err)
	}
	if v := version(t, ctx, tx); v != sqlfiles.Version {
		t.Errorf("InstalledVersion inside the transaction = %q, want %q", v, sqlfiles.Version)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if v := version(t, ctx, conn); v != "" {
		t.Errorf("InstalledVersion after rolling back the caller's transaction = %q, want \"\"", v)
	}
}

func TestUninstall(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn := pgtest.Conn(t, pgtest.NewInstalledDB(t))
	for i := range 2 { // the second run finds nothing to drop
		if err := install.Uninstall(ctx, conn, false); err != nil {
			t.Fatalf("Uninstall #%d: %v", i+1, err)
		}
		if v := version(t, ctx, conn); v != "" {
			t.Errorf("InstalledVersion after Uninstall = %q, want \"\"", v)
		}
	}
	var roles int
	if err := conn.QueryRow(ctx, "select count(*) from pg_catalog.pg_roles where rolname = any ($1)",
		install.Roles).Scan(&roles); err != nil {
		t.Fatal(err)
	}
	if roles != len(install.Roles) {
		t.Errorf("%d of the pgque roles exist after Uninstall without dropRoles, want all %d", roles, len(install.Roles))
	}
	if _, err := install.Install(ctx, conn); err != nil {
		t.Fatalf("reinstalling after Uninstall: %v", err)
	}
}

// A re-install runs while workers and producers hold locks on pgque's
// tables: it must not wait for them. A second session holds ROW EXCLUSIVE
// (what every insert, update and delete takes) on every table of schema
// pgque but pgque.version, which the install lock is, in an open
// transaction; the re-install, with a 3-second lock_timeout, still
// completes. An ADD COLUMN IF NOT EXISTS or CREATE INDEX IF NOT EXISTS that
// locks before it looks would time out here (55P03).
func TestReinstallTakesNoLockOfTablesInUse(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewDB(t)
	ctx := context.Background()
	conn := pgtest.Conn(t, dsn)
	if _, err := install.Install(ctx, conn); err != nil {
		t.Fatal(err)
	}
	holder := pgtest.Conn(t, dsn)
	tx, err := holder.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	rows, err := tx.Query(ctx, `select c.oid::regclass::text from pg_catalog.pg_class c
		 where c.relnamespace = 'pgque'::regnamespace and c.relkind in ('r', 'p') and c.relname <> 'version'`)
	if err != nil {
		t.Fatal(err)
	}
	tables, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	for _, tbl := range tables {
		if _, err := tx.Exec(ctx, "lock table "+pgx.Identifier{"pgque", tbl[len("pgque."):]}.Sanitize()+" in row exclusive mode"); err != nil {
			t.Fatalf("locking %s: %v", tbl, err)
		}
	}
	if len(tables) < 20 {
		t.Fatalf("locked %d tables of schema pgque, want all of them", len(tables))
	}
	if _, err := conn.Exec(ctx, "set lock_timeout = '3s'"); err != nil {
		t.Fatal(err)
	}
	if _, err := install.Install(ctx, conn); err != nil {
		t.Fatalf("re-install while every table is in use: %v", err)
	}
}

// A re-install of an unchanged version rewrites no catalog row of a pgque
// relation and takes no ACCESS EXCLUSIVE lock. A rewritten pg_class row
// (what GRANT and REVOKE on a table do) stays locked to the end of the
// install, and maint's TRUNCATE of an event table needs that row: it waits
// for the install while holding the table, readers queue behind it, and an
// install that then waits for one of those readers (an ACCESS EXCLUSIVE
// lock, which CREATE OR REPLACE VIEW takes) deadlocks.
func TestReinstallRewritesNoRelationAndLocksNoneExclusively(t *testing.T) {
	t.Parallel()
	ctx, conn := setup(t)
	if _, err := install.Install(ctx, conn); err != nil {
		t.Fatal(err)
	}
	// Every kind of relation: a queue's event tables and sequence, the
	// partition layer's tables, the views.
	if _, err := conn.Exec(ctx, `select pgque.create_queue('q'); select pgque.subscribe_slot('q', 'c', 0, 4)`); err != nil {
		t.Fatal(err)
	}
	catalogRows := func() map[string]string {
		rows, err := conn.Query(ctx, `select c.oid::regclass::text, c.xmin::text || ' ' || c.ctid::text
			from pg_catalog.pg_class c where c.relnamespace = 'pgque'::regnamespace`)
		if err != nil {
			t.Fatal(err)
		}
		m := map[string]string{}
		for rows.Next() {
			var rel, ver string
			if err := rows.Scan(&rel, &ver); err != nil {
				t.Fatal(err)
			}
			m[rel] = ver
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		return m
	}
	before := catalogRows()
	if len(before) < 40 {
		t.Fatalf("schema pgque has %d relations, want every kind of them", len(before))
	}

	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := install.Install(ctx, tx); err != nil {
		t.Fatal(err)
	}
	rows, err := tx.Query(ctx, `select l.relation::regclass::text from pg_catalog.pg_locks l
		where l.pid = pg_catalog.pg_backend_pid() and l.locktype = 'relation' and l.mode = 'AccessExclusiveLock'`)
	if err != nil {
		t.Fatal(err)
	}
	exclusive, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if len(exclusive) > 0 {
		t.Errorf("the re-install holds ACCESS EXCLUSIVE locks on %v", exclusive)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	after := catalogRows()
	for rel, ver := range before {
		if after[rel] != ver {
			t.Errorf("the re-install rewrote the pg_class row of %s", rel)
		}
	}
}

// An install over one made before the read path was generated loses the
// functions that path no longer has: the text-predicate delivery and its
// helper, the acknowledgement's unused predicate form (and the slot's), and
// the body the install used to cut entry points from. The queue's data and
// its reader stay, and the reader is made again from the installed
// statement: its body is that statement with the queue id in.
func TestReinstallDropsRemovedReadPathFunctions(t *testing.T) {
	t.Parallel()
	ctx, conn := setup(t)
	if _, err := install.Install(ctx, conn); err != nil {
		t.Fatal(err)
	}
	var qid int
	if err := conn.QueryRow(ctx, `select pgque.create_queue('q')`).Scan(new(any)); err != nil {
		t.Fatal(err)
	}
	if err := conn.QueryRow(ctx, `select queue_id from pgque.queue where queue_name = 'q'`).Scan(&qid); err != nil {
		t.Fatal(err)
	}
	// What the earlier install left: the functions by their signatures (the
	// bodies do not matter), and a reader whose body is out of date.
	removed := []string{
		"pgque._deliver(text, text, integer, text, bigint)",
		"pgque._and(text, bigint)",
		"pgque._ack(bigint, text)",
		"pgque._ack_slot(pgque.slot_lease, integer, integer)",
		"pgque._deliver_raw_body()",
	}
	for _, f := range removed {
		var exists bool
		if err := conn.QueryRow(ctx, `select to_regprocedure($1) is not null`, f).Scan(&exists); err != nil {
			t.Fatal(err)
		}
		if exists { // an install of the version that had it
			continue
		}
		ret := "integer"
		if strings.Contains(f, "_and") || strings.Contains(f, "_body") {
			ret = "text"
		}
		if _, err := conn.Exec(ctx, "create function "+f+" returns "+ret+" language sql as 'select null::"+ret+"'"); err != nil {
			t.Fatalf("creating %s: %v", f, err)
		}
	}
	if _, err := conn.Exec(ctx, `select pgque.subscribe('q', 'c'); select pgque.send('q', 't', '{}'::jsonb, 'k')`); err != nil {
		t.Fatal(err)
	}
	reader := fmt.Sprintf("pgque._read_%d_1", qid)
	if _, err := conn.Exec(ctx, fmt.Sprintf(`create or replace function %s(st pgque.sub_state, v_prev pg_snapshot, v_cur pg_snapshot,
		v_xip xid8[], v_sub integer, i_slot integer, i_max integer, v_budget bigint)
		returns table (msg_id bigint, batch_id bigint, type text, payload text, retry_count integer,
		created_at timestamptz, partition_key text, extra2 text, extra3 text, extra4 text)
		language plpgsql as 'begin end'`, reader)); err != nil {
		t.Fatal(err)
	}

	if _, err := install.Install(ctx, conn); err != nil {
		t.Fatalf("reinstall: %v", err)
	}
	for _, f := range removed {
		var left bool
		if err := conn.QueryRow(ctx, `select to_regprocedure($1) is not null`, f).Scan(&left); err != nil {
			t.Fatal(err)
		}
		if left {
			t.Errorf("%s is still there after the reinstall", f)
		}
	}
	var src, want string
	if err := conn.QueryRow(ctx, `select p.prosrc, format(pgque._reader_src(), $2::int, 1)
		  from pg_proc p where p.oid = to_regproc($1)`, reader, qid).Scan(&src, &want); err != nil {
		t.Fatal(err)
	}
	if src != want || !strings.Contains(src, fmt.Sprintf("ev.ev_part >= %d * 16 and", qid)) {
		t.Errorf("reader %s after the reinstall:\n%s\nwant the installed statement for queue %d", reader, src, qid)
	}
	var n int
	if err := conn.QueryRow(ctx, `select count(*) from pgque.event ev where ev.ev_part >= pgque._part_lo($1) and ev.ev_part < pgque._part_hi($1)`, qid).Scan(&n); err != nil || n != 1 {
		t.Errorf("events of the queue after the reinstall: %d (%v), want 1", n, err)
	}
}

package enginetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgque/pgque/internal/install"
	"github.com/pgque/pgque/internal/testing/pgtest"
	sqlfiles "github.com/pgque/pgque/sql"
)

// Roles are cluster-wide and the cluster is shared by the whole test
// binary, so every login role made here has a random name and is dropped
// when its test ends.

const rolePassword = "pgque-test-pw"

// newLoginRole creates a login role (with extra attributes) named after
// prefix, over a superuser connection to adminDSN, and returns its name. The
// role is dropped when the test ends, after the cleanups registered later
// (its connections, databases it owns) have run; its privileges in the
// databases dropOwnedIn are dropped first.
func newLoginRole(t *testing.T, adminDSN, prefix, attrs string, dropOwnedIn ...string) string {
	t.Helper()
	var salt [4]byte
	_, _ = rand.Read(salt[:])
	name := prefix + "_" + hex.EncodeToString(salt[:])
	exec(t, pgtest.Conn(t, adminDSN), fmt.Sprintf("create role %s login %s password '%s'", name, attrs, rolePassword))
	t.Cleanup(func() {
		ctx := context.Background()
		for _, dsn := range dropOwnedIn {
			if conn, err := pgx.Connect(ctx, dsn); err == nil {
				if _, err := conn.Exec(ctx, "drop owned by "+name); err != nil {
					t.Errorf("drop owned by %s: %v", name, err)
				}
				conn.Close(ctx)
			}
		}
		conn, err := pgx.Connect(ctx, adminDSN)
		if err != nil {
			t.Errorf("dropping role %s: %v", name, err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "drop role "+name); err != nil {
			t.Errorf("dropping role %s: %v", name, err)
		}
	})
	return name
}

// connAs connects to dsn as role.
func connAs(t *testing.T, dsn, role string) *pgx.Conn {
	t.Helper()
	return pgtest.Conn(t, pgtest.DSNWith(pgtest.DSNWith(dsn, "user", role), "password", rolePassword))
}

// setupSecurity gives a security test a database with queue "q" (one event
// ticked into it) and login roles that are members of pgque_writer only,
// pgque_reader only, and of no pgque role at all.
func setupSecurity(t *testing.T) (dsn string, admin beginner, writer, reader, nobody *pgx.Conn) {
	t.Helper()
	dsn, admin = setupDB(t)
	w := newLoginRole(t, dsn, "w", "", dsn)
	r := newLoginRole(t, dsn, "r", "", dsn)
	n := newLoginRole(t, dsn, "n", "", dsn)
	exec(t, admin, fmt.Sprintf("grant pgque_writer to %s", w))
	exec(t, admin, fmt.Sprintf("grant pgque_reader to %s", r))
	exec(t, admin, "select pgque.create_queue('q')")
	return dsn, admin, connAs(t, dsn, w), connAs(t, dsn, r), connAs(t, dsn, n)
}

func wantDenied(t *testing.T, who string, q db, sql string, args ...any) {
	t.Helper()
	err := queryErr(q, sql, args...)
	if err == nil {
		t.Errorf("%s: %s succeeded, want 42501", who, sql)
		return
	}
	wantCode(t, who+": "+sql, err, "42501")
}

func wantAllowed(t *testing.T, who string, q db, sql string, args ...any) {
	t.Helper()
	if err := queryErr(q, sql, args...); err != nil {
		t.Errorf("%s: %s: %v", who, sql, err)
	}
}

// TestRolesWriterReaderNobody: pgque_writer may produce but not consume,
// pgque_reader may consume but not produce nor reach get_batch_cursor, and a
// role with no pgque role may do nothing.
func TestRolesWriterReaderNobody(t *testing.T) {
	t.Parallel()
	_, admin, writer, reader, nobody := setupSecurity(t)

	// Writer.
	wantAllowed(t, "writer", writer, `select pgque.send('q', '{"by": "writer"}'::jsonb)`)
	wantAllowed(t, "writer", writer, `select pgque.send('q', 't', '{}'::jsonb, 'key')`)
	wantAllowed(t, "writer", writer, `select pgque.send_batch('q', 't', array['{}', '{}']::jsonb[])`)
	wantAllowed(t, "writer", writer, `select pgque.insert_event('q', 't', 'd')`)
	wantAllowed(t, "writer", writer, `select * from pgque.get_queue_info('q')`)
	for _, sql := range []string{
		"select * from pgque.receive('q', 'c')",
		"select pgque.subscribe('q', 'w')",
		"select pgque.register_consumer('q', 'w')",
		"select pgque.next_batch('q', 'c')",
		"select pgque.ack(1)",
		"select pgque.create_queue('w')",
		"select pgque.ticker('q')",
		"select pgque.maint()",
		"select * from pgque.get_batch_cursor(1, 'x', 1, 'true')",
		"select count(*) from pgque.event",
		"insert into pgque.event (ev_id, ev_part) values (1, 16)",
		"select * from pgque.subscription",
	} {
		wantDenied(t, "writer", writer, sql)
	}

	// Reader: subscribe (after a tick covering the writer's events) and
	// consume what is sent later.
	tick(t, admin, "q")
	wantAllowed(t, "reader", reader, "select pgque.subscribe('q', 'c')")
	exec(t, admin, `select pgque.send('q', '{"n": 1}'::jsonb)`)
	tick(t, admin, "q")
	ms, err := receive(reader, "q", "c", 10)
	if err != nil || len(ms) != 1 {
		t.Fatalf("reader: receive = %v, %v; want the one event sent after subscribing", msgIDs(ms), err)
	}
	wantDenied(t, "reader", reader, "select * from pgque.get_batch_cursor($1, 'x', 10, 'true')", ms[0].BatchID)
	wantDenied(t, "reader", reader, "select * from pgque.get_batch_cursor($1, 'x', 10, null)", ms[0].BatchID)
	// The engine's consume calls work on any subscription with no lease
	// check: admin only; readers go through receive/ack/nack.
	for _, sql := range []string{
		"select pgque.next_batch('q', 'c')",
		"select * from pgque.get_batch_events($1)",
		"select pgque.finish_batch($1)",
		"select pgque.event_retry($1, 1, 0)",
		"select pgque.register_consumer('q', 'r2')",
		"select pgque.unregister_consumer('q', 'c')",
	} {
		if strings.Contains(sql, "$1") {
			wantDenied(t, "reader", reader, sql, ms[0].BatchID)
		} else {
			wantDenied(t, "reader", reader, sql)
		}
	}
	wantAllowed(t, "reader", reader, "select pgque.nack($1, $2, '1 hour', 'r')", ms[0].BatchID, ms[0].MsgID)
	if n := scalar[int32](t, reader, "select pgque.ack($1)", ms[0].BatchID); n != 1 {
		t.Errorf("reader: ack = %d", n)
	}
	wantAllowed(t, "reader", reader, "select * from pgque.get_consumer_info('q')")
	wantAllowed(t, "reader", reader, "select * from pgque.dlq_list('q')")
	for _, sql := range []string{
		`select pgque.send('q', '{}'::jsonb)`,
		`select pgque.send('q', 't', '{}'::jsonb, 'k')`,
		`select pgque.send_batch('q', 't', array['{}']::jsonb[])`,
		`select pgque.insert_event('q', 't', 'd')`,
		"select pgque.create_queue('r')",
		"select pgque.drop_queue('q', true)",
		"select pgque.ticker()",
		"select pgque.force_next_tick('q')",
		"select pgque.maint()",
		"select pgque.maint_retry_events()",
		"select pgque.set_queue_config('q', 'max_retries', '1')",
		"select pgque.dlq_replay('q', 1)",
		"select pgque.dlq_purge('q')",
		"select count(*) from pgque.event",
		"select * from pgque.retry_queue",
		"update pgque.subscription set sub_last_tick = 0",
	} {
		wantDenied(t, "reader", reader, sql)
	}

	// Nobody: every function of the schema, whatever its arguments.
	funcs := column[string](t, admin, `select format('%s %s(%s)', case p.prokind when 'p' then 'call' else 'select' end, p.oid::regproc::text,
			coalesce((select string_agg('null::' || case when a.t = 'anyelement'::regtype then 'text' else a.t::regtype::text end, ', ' order by a.n)
			            from unnest(p.proargtypes::oid[]) with ordinality a(t, n)), ''))
		  from pg_catalog.pg_proc p where p.pronamespace = 'pgque'::regnamespace order by 1`)
	if len(funcs) < 50 {
		t.Fatalf("found only %d functions in schema pgque", len(funcs))
	}
	for _, sql := range funcs {
		wantDenied(t, "nobody", nobody, sql)
	}
	tables := column[string](t, admin, `select format('select * from %s', c.oid::regclass)
		  from pg_catalog.pg_class c where c.relnamespace = 'pgque'::regnamespace and c.relkind in ('r', 'p', 'v', 'S')`)
	for _, sql := range tables {
		wantDenied(t, "nobody", nobody, sql)
	}
	// Even given USAGE on the schema, the functions themselves are not
	// executable by PUBLIC.
	exec(t, admin, "grant usage on schema pgque to public")
	defer exec(t, admin, "revoke usage on schema pgque from public")
	for _, sql := range funcs {
		wantDenied(t, "nobody with schema usage", nobody, sql)
	}
}

// TestNoPublicExecuteAndPinnedSearchPath: no function in schema pgque is
// executable by PUBLIC, and every SECURITY DEFINER function pins
// search_path to pg_catalog, pg_temp.
func TestNoPublicExecuteAndPinnedSearchPath(t *testing.T) {
	t.Parallel()
	_, pool := setupDB(t)
	all := scalar[int64](t, pool, "select count(*) from pg_catalog.pg_proc where pronamespace = 'pgque'::regnamespace")
	if all < 50 {
		t.Fatalf("only %d functions in schema pgque", all)
	}
	public := column[string](t, pool, `select p.oid::regprocedure::text from pg_catalog.pg_proc p
		 where p.pronamespace = 'pgque'::regnamespace
		   and (p.proacl is null -- default privileges include EXECUTE for PUBLIC
		        or exists (select 1 from pg_catalog.aclexplode(p.proacl) a
		                    where a.grantee = 0 and a.privilege_type = 'EXECUTE'))`)
	if len(public) > 0 {
		t.Errorf("functions executable by PUBLIC: %s", strings.Join(public, ", "))
	}
	definers := scalar[int64](t, pool, "select count(*) from pg_catalog.pg_proc where pronamespace = 'pgque'::regnamespace and prosecdef")
	if definers < 30 {
		t.Errorf("only %d SECURITY DEFINER functions", definers)
	}
	unpinned := column[string](t, pool, `select p.oid::regprocedure::text || ' ' || coalesce(array_to_string(p.proconfig, ','), '<no config>')
		  from pg_catalog.pg_proc p
		 where p.pronamespace = 'pgque'::regnamespace and p.prosecdef
		   and not coalesce(p.proconfig @> array['search_path=pg_catalog, pg_temp'], false)`)
	if len(unpinned) > 0 {
		t.Errorf("SECURITY DEFINER functions without search_path=pg_catalog, pg_temp: %s", strings.Join(unpinned, "; "))
	}
	// Tables and sequences are not reachable by PUBLIC either.
	open := column[string](t, pool, `select c.oid::regclass::text from pg_catalog.pg_class c
		 where c.relnamespace = 'pgque'::regnamespace and c.relkind in ('r', 'p', 'v', 'S')
		   and exists (select 1 from pg_catalog.aclexplode(c.relacl) a where a.grantee = 0)`)
	if len(open) > 0 {
		t.Errorf("relations with PUBLIC privileges: %v", open)
	}
	if ok := scalar[bool](t, pool, "select not has_schema_privilege('public', 'pgque', 'usage')"); !ok {
		t.Error("PUBLIC has USAGE on schema pgque")
	}
}

// TestInstallByNonSuperuserOwner: a role with LOGIN CREATEROLE and no
// SUPERUSER that owns the database installs pgque, and can then use
// everything.
func TestInstallByNonSuperuserOwner(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	adminDSN := pgtest.NewDB(t) // for creating and dropping the role
	admin := pgtest.Conn(t, adminDSN)
	owner := newLoginRole(t, adminDSN, "own", "createrole nosuperuser")
	dsn := pgtest.NewDB(t) // dropped before the role
	exec(t, admin, fmt.Sprintf("alter database %s owner to %s",
		pgx.Identifier{scalar[string](t, pgtest.Conn(t, dsn), "select current_database()")}.Sanitize(), owner))

	conn := connAs(t, dsn, owner)
	if su := scalar[bool](t, conn, "select rolsuper from pg_catalog.pg_roles where rolname = current_user"); su {
		t.Fatal("the owner role is a superuser")
	}
	for i := range 2 {
		res, err := install.Install(ctx, conn)
		if err != nil {
			t.Fatalf("install #%d as %s: %v", i+1, owner, err)
		}
		if res.Version != sqlfiles.Version || res.Fresh() != (i == 0) {
			t.Errorf("install #%d = %+v", i+1, res)
		}
	}
	if o := scalar[string](t, conn, "select nspowner::regrole::text from pg_catalog.pg_namespace where nspname = 'pgque'"); o != owner {
		t.Errorf("schema pgque is owned by %s, want %s", o, owner)
	}

	// Everything works for the owner: engine, api, partition, maintenance.
	for _, sql := range []string{
		"select pgque.create_queue('q')",
		"select pgque.set_queue_config('q', 'rotation_period', '1 ms')",
		"select pgque.subscribe('q', 'c')",
		"select pgque.register_consumer('q', 'e')",
		"select pgque.subscribe_slot('q', 's', 0, 2)",
		"select pgque.subscribe_slot('q', 's', 1, 2)",
		`select pgque.send('q', 'job', '{"n": 1}'::jsonb, 'tenant-1')`,
		`select pgque.send_batch('q', 'job', array['{"n": 2}', '{"n": 3}']::jsonb[], array['tenant-2', 'tenant-3'])`,
		"select pgque.insert_event('q', 'raw', 'x')",
		"select pgque.force_next_tick('q')",
		"select pgque.ticker('q')",
		"select pgque.ticker()",
		"select * from pgque.get_queue_info()",
		"select * from pgque.get_consumer_info()",
		"select * from pgque.partition_slot_status",
	} {
		if err := queryErr(conn, sql); err != nil {
			t.Fatalf("owner: %s: %v", sql, err)
		}
	}
	tick(t, conn, "q")
	ms := mustReceive(t, conn, "q", "c", 10)
	if len(ms) != 4 {
		t.Fatalf("owner: receive = %v, want 4 events", msgIDs(ms))
	}
	exec(t, conn, "select pgque.nack($1, $2, '0', 'r')", ms[0].BatchID, ms[0].MsgID)
	if ack(t, conn, ms[0].BatchID) != 1 {
		t.Error("owner: ack did not finish the batch")
	}
	b := scalar[int64](t, conn, "select pgque.next_batch('q', 'e')")
	if n := len(column[int64](t, conn, "select ev_id from pgque.get_batch_cursor($1, 'cur', 100, 'ev_extra1 is not null')", b)); n != 3 {
		t.Errorf("owner: get_batch_cursor with extra_where = %d rows, want 3", n)
	}
	exec(t, conn, "select pgque.event_retry($1, $2, 0)", b, ms[1].MsgID)
	exec(t, conn, "select pgque.finish_batch($1)", b)
	var slotRows int
	for slot := range 2 {
		token := scalar[*string](t, conn, "select token::text from pgque.claim_slot('q', 's', $1, 'w1')", slot)
		if token == nil {
			t.Fatalf("owner: claim_slot(%d) = NULL", slot)
		}
		rows := column[string](t, conn, "select epoch || ', ' || batch_id || ', ' || msg_id from pgque.receive_partitioned('q', 's', $1, 2, 'w1', $2::uuid, 100)", slot, *token)
		slotRows += len(rows)
		if len(rows) > 0 {
			// The fenced ack names the chunk by (epoch, batch_id, msg_id) of one of its rows.
			exec(t, conn, "select pgque.ack_partitioned('q', 's', $1, 2, 'w1', $2::uuid, "+rows[0]+")", slot, *token)
		}
		exec(t, conn, "select pgque.release_slot('q', 's', $1, 'w1', $2::uuid)", slot, *token)
	}
	if slotRows != 4 {
		t.Errorf("owner: the two slots received %d events, want 4", slotRows)
	}
	if n := scalar[int32](t, conn, "select pgque.maint_retry_events()"); n != 2 {
		t.Errorf("owner: maint_retry_events = %d, want 2", n)
	}
	for _, sql := range []string{
		"select pgque.maint()",
		"select * from pgque.dlq_list('q')",
		"select pgque.dlq_purge('q')",
		"select pgque.unsubscribe('q', 'c')",
		"select pgque.ticker_lead('w1', '10 seconds')",
		"select pgque.ticker_resign('w1')",
		"select pgque.drop_queue('q', true)",
	} {
		if err := queryErr(conn, sql); err != nil {
			t.Errorf("owner: %s: %v", sql, err)
		}
	}
}

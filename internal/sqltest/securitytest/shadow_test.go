package securitytest

import (
	"context"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgque/pgque/internal/install"
	"github.com/pgque/pgque/internal/pgcluster"
	"github.com/pgque/pgque/internal/testing/pgtest"
)

// shadows are objects an attacker with CREATE on schema public plants to
// hijack unqualified calls: each logs its call into public.shadow_calls
// (and then behaves like the real thing, so a hijack is silent).
var shadows = []string{
	`create table public.shadow_calls (what text, by_user text, at timestamptz default pg_catalog.clock_timestamp())`,
	`grant insert, select on public.shadow_calls to public`,
	`create function public.shadow_log(w text) returns void language sql security invoker
	   as $$ insert into public.shadow_calls (what, by_user) values (w, pg_catalog.current_user()) $$`,
	`grant execute on function public.shadow_log(text) to public`,
	`create function public.hashtextextended(t text, s bigint) returns bigint language plpgsql as
	   $$ begin perform public.shadow_log('hashtextextended'); return pg_catalog.hashtextextended(t, s); end $$`,
	`create function public.pg_visible_in_snapshot(x xid8, s pg_snapshot) returns boolean language plpgsql as
	   $$ begin perform public.shadow_log('pg_visible_in_snapshot'); return pg_catalog.pg_visible_in_snapshot(x, s); end $$`,
	`create function public.pg_current_snapshot() returns pg_snapshot language plpgsql as
	   $$ begin perform public.shadow_log('pg_current_snapshot'); return pg_catalog.pg_current_snapshot(); end $$`,
	`create function public.pg_current_xact_id() returns xid8 language plpgsql as
	   $$ begin perform public.shadow_log('pg_current_xact_id'); return pg_catalog.pg_current_xact_id(); end $$`,
	`create function public.now() returns timestamptz language plpgsql as
	   $$ begin perform public.shadow_log('now'); return pg_catalog.now(); end $$`,
	`create function public.clock_timestamp() returns timestamptz language plpgsql as
	   $$ begin perform public.shadow_log('clock_timestamp'); return pg_catalog.clock_timestamp(); end $$`,
	`create function public.lower(t text) returns text language plpgsql as
	   $$ begin perform public.shadow_log('lower'); return pg_catalog.lower(t); end $$`,
	`create function public.quote_literal(t text) returns text language plpgsql as
	   $$ begin perform public.shadow_log('quote_literal'); return pg_catalog.quote_literal(t); end $$`,
	`create function public.pg_notify(c text, p text) returns void language plpgsql as
	   $$ begin perform public.shadow_log('pg_notify'); perform pg_catalog.pg_notify(c, p); end $$`,
	`create function public.nextval(s regclass) returns bigint language plpgsql as
	   $$ begin perform public.shadow_log('nextval'); return pg_catalog.nextval(s); end $$`,
	`create function public.octet_length(t text) returns integer language plpgsql as
	   $$ begin perform public.shadow_log('octet_length'); return pg_catalog.octet_length(t); end $$`,
	`create function public.shadow_eq(a text, b text) returns boolean language plpgsql as
	   $$ begin perform public.shadow_log('=(text,text)'); return a operator(pg_catalog.=) b; end $$`,
	`create operator public.= (leftarg = text, rightarg = text, function = public.shadow_eq)`,
	`create function public.shadow_mod(a bigint, b integer) returns bigint language plpgsql as
	   $$ begin perform public.shadow_log('%(bigint,integer)'); return a operator(pg_catalog.%) b; end $$`,
	`create operator public.% (leftarg = bigint, rightarg = integer, function = public.shadow_mod)`,
	`create function public.shadow_lt(a bigint, b bigint) returns boolean language plpgsql as
	   $$ begin perform public.shadow_log('<(bigint,bigint)'); return a operator(pg_catalog.<) b; end $$`,
	`create operator public.< (leftarg = bigint, rightarg = bigint, function = public.shadow_lt)`,
	// What run_ticker (a procedure, whose search_path cannot be pinned)
	// and the Go client's own statements would otherwise resolve through
	// the caller's search_path.
	`create function public.shadow_tlt(a timestamptz, b timestamptz) returns boolean language plpgsql as
	   $$ begin perform public.shadow_log('<(timestamptz,timestamptz)'); return a operator(pg_catalog.<) b; end $$`,
	`create operator public.< (leftarg = timestamptz, rightarg = timestamptz, function = public.shadow_tlt)`,
	`create function public.shadow_tgt(a timestamptz, b timestamptz) returns boolean language plpgsql as
	   $$ begin perform public.shadow_log('>(timestamptz,timestamptz)'); return a operator(pg_catalog.>) b; end $$`,
	`create operator public.> (leftarg = timestamptz, rightarg = timestamptz, function = public.shadow_tgt)`,
	`create function public.shadow_tge(a timestamptz, b timestamptz) returns boolean language plpgsql as
	   $$ begin perform public.shadow_log('>=(timestamptz,timestamptz)'); return a operator(pg_catalog.>=) b; end $$`,
	`create operator public.>= (leftarg = timestamptz, rightarg = timestamptz, function = public.shadow_tge)`,
	`create function public.shadow_tplus(a timestamptz, b interval) returns timestamptz language plpgsql as
	   $$ begin perform public.shadow_log('+(timestamptz,interval)'); return a operator(pg_catalog.+) b; end $$`,
	`create operator public.+ (leftarg = timestamptz, rightarg = interval, function = public.shadow_tplus)`,
	`create function public.shadow_ilt(a integer, b integer) returns boolean language plpgsql as
	   $$ begin perform public.shadow_log('<(integer,integer)'); return a operator(pg_catalog.<) b; end $$`,
	`create operator public.< (leftarg = integer, rightarg = integer, function = public.shadow_ilt)`,
	`create function public.shadow_igt(a integer, b integer) returns boolean language plpgsql as
	   $$ begin perform public.shadow_log('>(integer,integer)'); return a operator(pg_catalog.>) b; end $$`,
	`create operator public.> (leftarg = integer, rightarg = integer, function = public.shadow_igt)`,
	`create function public.shadow_check(w text) returns boolean language plpgsql as
	   $$ begin perform public.shadow_log(w); return true; end $$`,
	`create domain public.timestamptz as pg_catalog.timestamptz check (public.shadow_check('domain timestamptz'))`,
	`create domain public.text as pg_catalog.text check (public.shadow_check('domain text'))`,
	`create domain public.jsonb as pg_catalog.jsonb check (public.shadow_check('domain jsonb'))`,
	`create domain public.bool as pg_catalog.bool check (public.shadow_check('domain bool'))`,
}

// TestNonSuperuserInstallAndShadowedPublic installs pgque as a
// non-superuser owner into a database where an attacker already planted
// shadows of the functions and operators pgque uses, with public first on
// every search_path, then runs every kind of call as the app roles: no
// shadow may ever run, at install or at call time.
func TestNonSuperuserInstallAndShadowedPublic(t *testing.T) {
	c := pgtest.NewCluster(t, pgcluster.Options{})
	ctx := context.Background()
	super := pgtest.Conn(t, c.DSN("postgres"))
	for _, s := range []string{
		`create role pgque_owner login createrole`,
		`create role attacker login`,
		`create role app_admin login`, `create role app_writer login`, `create role app_reader login`,
		`create database app owner pgque_owner`,
	} {
		if _, err := super.Exec(ctx, s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	app := pgtest.Conn(t, c.DSN("app"))
	for _, s := range []string{
		`grant create on schema public to attacker`,
	} {
		if _, err := app.Exec(ctx, s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	attacker := pgtest.Conn(t, pgtest.DSNWith(c.DSN("app"), "user", "attacker"))
	for _, s := range shadows {
		if _, err := attacker.Exec(ctx, s); err != nil {
			t.Fatalf("attacker: %s: %v", s, err)
		}
	}
	// Public first everywhere: at install and for every app role.
	for _, r := range []string{"pgque_owner", "app_admin", "app_writer", "app_reader"} {
		if _, err := super.Exec(ctx, `alter role `+r+` set search_path = public, pg_catalog, pgque`); err != nil {
			t.Fatal(err)
		}
	}

	owner := pgtest.Conn(t, pgtest.DSNWith(c.DSN("app"), "user", "pgque_owner"))
	if _, err := install.Install(ctx, owner); err != nil {
		t.Fatal("install as a non-superuser owner:", err)
	}
	var nspOwner string
	var superOwned int
	if err := app.QueryRow(ctx, `select nspowner::regrole::text from pg_namespace where nspname = 'pgque'`).Scan(&nspOwner); err != nil || nspOwner != "pgque_owner" {
		t.Errorf("schema pgque owned by %q (%v), want pgque_owner", nspOwner, err)
	}
	if err := app.QueryRow(ctx, `select count(*) from pg_proc p join pg_roles r on r.oid = p.proowner
		where p.pronamespace = 'pgque'::regnamespace and r.rolsuper`).Scan(&superOwned); err != nil || superOwned != 0 {
		t.Errorf("%d pgque functions owned by a superuser (%v)", superOwned, err)
	}
	assertNoShadowCalls(t, app, "install")

	for _, s := range []string{`grant pgque_admin to app_admin`, `grant pgque_writer to app_writer`, `grant pgque_reader to app_reader`} {
		if _, err := owner.Exec(ctx, s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	as := func(role string) *pgx.Conn {
		return pgtest.Conn(t, pgtest.DSNWith(c.DSN("app"), "user", role))
	}
	admin, writer, reader := as("app_admin"), as("app_writer"), as("app_reader")
	var sp string
	if err := reader.QueryRow(ctx, `show search_path`).Scan(&sp); err != nil || sp != "public, pg_catalog, pgque" {
		t.Fatalf("reader search_path %q (%v)", sp, err)
	}
	run := func(conn *pgx.Conn, who string, stmts ...string) {
		t.Helper()
		for _, s := range stmts {
			rows, err := conn.Query(ctx, s)
			if err == nil {
				for rows.Next() {
				}
				rows.Close()
				err = rows.Err()
			}
			if err != nil {
				t.Fatalf("%s: %s: %v", who, s, err)
			}
		}
	}
	run(admin, "admin",
		`select pgque.create_queue('q')`,
		`select pgque.set_queue_config('q', 'max_retries', '1')`,
		`select pgque.subscribe_slot('q', 'c', s, 2) from generate_series(0, 1) s`,
		`select pgque.set_failure_policy('q', 'c', 'pause')`,
		`select pgque.subscribe('q', 'plain')`,
		`select pgque.ticker_lead('t1', '10 s')`,
	)
	run(writer, "writer",
		`select pgque.send('q', '{"a":1}')`,
		`select pgque.send('q', 't', '{"a":2}', 'k1')`,
		`select pgque.send('q', 't', '{"a":3}', 'k1')`,
		`select pgque.send('q', 't', '{"a":4}', 'k2')`,
		`select pgque.send_batch('q', 't', array['{"b":1}', '{"b":2}']::pg_catalog.jsonb[], array['k1', 'k3'])`,
		`select pgque.insert_event('q', 't', 'd', 'k4', null, null, null)`,
		`select * from pgque.get_queue_info('q')`,
	)
	run(admin, "admin",
		`select pgque.force_next_tick('q')`, `select pgque.ticker('q')`, `select pgque.ticker()`,
		`select pgque.maint()`, `select pgque.maint_retry_events()`,
		`select * from pgque.get_consumer_info('q')`,
	)
	// Work both slots: nack the first event of each chunk (pause blocks
	// its key and defers the rest), ack, then retry and unblock.
	tokens := make([]string, 2)
	// recv receives a chunk of slot as w1 and returns its event ids and the
	// proof of the chunk for the fenced ack ("epoch, batch, first id").
	recv := func(slot int) ([]int64, string) {
		rows, err := reader.Query(ctx, `select msg_id, batch_id, epoch from pgque.receive_partitioned('q', 'c', $1, 2, 'w1', $2::pg_catalog.uuid, 100)`, slot, tokens[slot])
		if err != nil {
			t.Fatal(err)
		}
		var ids []int64
		var proof string
		var id, batch, epoch int64
		if _, err := pgx.ForEachRow(rows, []any{&id, &batch, &epoch}, func() error {
			if ids == nil {
				proof = itoa64(epoch) + ", " + itoa64(batch) + ", " + itoa64(id)
			}
			ids = append(ids, id)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		return ids, proof
	}
	holder := func(slot int) string { return `'w1', '` + tokens[slot] + `'` }
	for slot := range 2 {
		var token *string
		if err := reader.QueryRow(ctx, `select token::pg_catalog.text from pgque.claim_slot('q', 'c', $1, 'w1', '30 s')`, slot).Scan(&token); err != nil || token == nil {
			t.Fatalf("claim_slot %d: %v %v", slot, token, err)
		}
		tokens[slot] = *token
		ids, proof := recv(slot)
		if len(ids) > 0 {
			run(reader, "reader", `select pgque.nack_partitioned('q', 'c', `+itoa(slot)+`, 2, `+holder(slot)+`, `+itoa64(ids[0])+`, '0', 'boom')`)
		}
		run(reader, "reader",
			`select pgque.ack_partitioned('q', 'c', `+itoa(slot)+`, 2, `+holder(slot)+`, `+proof+`)`,
			`select * from pgque.partition_slot_status`,
			`select * from pgque.blocked_keys('q', 'c')`,
			`select pgque.slot_of('k1', 2)`,
		)
	}
	run(admin, "admin", `select pgque.maint_retry_events()`, `select pgque.force_next_tick('q')`, `select pgque.ticker('q')`)
	// The blocked heads come back: fail them again for an hour, so that
	// the operator functions have something to act on.
	for slot := range 2 {
		ids, proof := recv(slot)
		if len(ids) > 0 {
			run(reader, "reader", `select pgque.nack_partitioned('q', 'c', `+itoa(slot)+`, 2, `+holder(slot)+`, `+itoa64(ids[0])+`, '1 hour', 'boom')`)
		}
		run(reader, "reader", `select pgque.ack_partitioned('q', 'c', `+itoa(slot)+`, 2, `+holder(slot)+`, `+proof+`)`)
	}
	run(reader, "reader",
		`select pgque.release_slot('q', 'c', 0, `+holder(0)+`)`,
		`select * from pgque.receive('q', 'plain', 100)`,
		`select * from pgque.dlq_list('q')`,
	)
	run(admin, "admin",
		`select pgque.retry_key_now('q', 'c', key) from pgque.blocked_keys('q', 'c') where slot = 1`,
		`select pgque.unblock_key('q', 'c', key) from pgque.blocked_keys('q', 'c') where state = 'blocked' and slot = 0`,
		`select pgque.dlq_replay('q', dl_id) from pgque.dlq_list('q')`,
		`select pgque.dlq_purge('q')`,
		`select pgque.ticker_resign('t1')`,
		`call pgque.run_ticker(1, 'rt')`,
		`select pgque.drop_queue('q', true)`,
	)
	assertNoShadowCalls(t, app, "calls as the app roles")
}

func assertNoShadowCalls(t *testing.T, conn *pgx.Conn, when string) {
	t.Helper()
	rows, err := conn.Query(context.Background(), `select what || ' by ' || by_user from public.shadow_calls order by at`)
	if err != nil {
		t.Fatal(err)
	}
	calls, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if len(calls) > 0 {
		t.Errorf("%s ran the attacker's shadows in public: %v", when, calls)
	}
}

func itoa(i int) string     { return strconv.Itoa(i) }
func itoa64(i int64) string { return strconv.FormatInt(i, 10) }

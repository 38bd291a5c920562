package securitytest

import (
	"context"
	_ "embed"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgque/pgque/internal/install"
	"github.com/pgque/pgque/internal/testing/pgtest"
)

// A table owner with no pgque grant attacks the queue its table is
// attached to: through its table's and columns' names (run by whoever
// attaches the table or re-installs pgque) and through casts of its own
// types (run by whoever converts its rows). Each test checks that the
// attacker gained nothing and that the events still come out right.

// tsRoles creates login-less roles with no pgque grant, named after the
// test's database (roles are cluster-wide), able to create tables in
// schema public, and drops them after the test. It returns their names in
// the order of prefixes.
func tsRoles(t *testing.T, conn *pgx.Conn, prefixes ...string) []string {
	t.Helper()
	ctx := context.Background()
	suffix := scalarOf[string](t, conn, `select left(md5(current_database()), 8)`)
	var names []string
	for _, p := range prefixes {
		name := p + "_" + suffix
		mustExec(t, conn, `create role `+name, `grant create, usage on schema public to `+name)
		t.Cleanup(func() {
			_, _ = conn.Exec(ctx, `drop owned by `+name)
			_, _ = conn.Exec(ctx, `drop role if exists `+name)
		})
		names = append(names, name)
	}
	return names
}

// asUser runs stmts as role in one transaction on conn.
func asUser(t *testing.T, conn *pgx.Conn, role string, stmts ...string) {
	t.Helper()
	ctx := context.Background()
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `set local role `+role); err != nil {
		t.Fatal(err)
	}
	for _, s := range stmts {
		if _, err := tx.Exec(ctx, s); err != nil {
			t.Fatalf("as %s: %s: %v", role, s, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}

// wantNoEscalation fails the test when one of roles became a member of a
// pgque role or of a predefined role (pg_*).
func wantNoEscalation(t *testing.T, conn *pgx.Conn, when string, roles ...string) {
	t.Helper()
	for _, r := range roles {
		got := scalarOf[string](t, conn, `select coalesce(string_agg(g.rolname, ', '), '') from pg_roles g
			 where (g.rolname like 'pgque%' or g.rolname like 'pg\_%') and pg_has_role($1, g.oid, 'member')`, r)
		if got != "" {
			t.Errorf("%s: %s became a member of %s", when, r, got)
		}
	}
}

// identQuote quotes an SQL identifier.
func identQuote(s string) string { return pgx.Identifier{s}.Sanitize() }

// tsEvent is one event of queue q1 written by a table source.
type tsEvent struct {
	Type, Data string
	Key, Table *string
}

// tsEvents returns the events of q1 whose ev_extra2 is table, in order.
func tsEvents(t *testing.T, conn *pgx.Conn, table string) []tsEvent {
	t.Helper()
	rows, err := conn.Query(context.Background(), `select e.ev_type, e.ev_data, e.ev_extra1, e.ev_extra2
		  from pgque.event e where e.ev_part / 16 = (select queue_id from pgque.queue where queue_name = 'q1')
		   and e.ev_extra2 = $1 order by e.ev_id`, table)
	if err != nil {
		t.Fatal(err)
	}
	evs, err := pgx.CollectRows(rows, pgx.RowToStructByPos[tsEvent])
	if err != nil {
		t.Fatal(err)
	}
	return evs
}

func strOr(p *string) string {
	if p == nil {
		return "<nil>"
	}
	return *p
}

// payloadField decodes an event's payload and returns one field.
func payloadField(t *testing.T, e tsEvent, field string) any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(e.Data), &m); err != nil {
		t.Fatalf("payload %q: %v", e.Data, err)
	}
	return m[field]
}

// TestTableSourceNamesInjectNothing: the owner of an attached table, with
// no pgque grant, renames it (or names a column) so that SQL text built
// from the name would grant it pgque_admin. Neither re-installing pgque
// nor attaching the table again runs it, and the table's events name it
// as it is.
func TestTableSourceNamesInjectNothing(t *testing.T) {
	dsn, conn := setupDB(t)
	own := tsRoles(t, conn, "ti")[0]
	grant := "grant pgque_admin to " + own
	names := []string{
		"\nbegin end$fn$;" + grant + ";select $fn$",
		"x'); " + grant + "; --",
		"$body$;" + grant + ";select $body$",
		`x"; ` + grant + `; --`,
	}
	for i, name := range names {
		tbl := "ts_inj_" + string(rune('a'+i))
		asUser(t, conn, own, `create table public.`+tbl+` (id integer primary key, k text, `+identQuote(name)+` text)`)
		mustExec(t, conn, `select pgque.attach_table('q1', 'public.`+tbl+`', 'k')`)
		asUser(t, conn, own, `alter table public.`+tbl+` rename to `+identQuote(name))
	}
	pgtest.Install(t, dsn)
	wantNoEscalation(t, conn, "re-install over renamed attached tables", own)
	for _, name := range names {
		reg := "public." + identQuote(name)
		// The owner's column of the same hostile name as the key, and the
		// table under its hostile name, attached again by an admin.
		mustExec(t, conn, `select pgque.attach_table('q1', '`+strings.ReplaceAll(reg, "'", "''")+`', '`+strings.ReplaceAll(name, "'", "''")+`')`)
		wantNoEscalation(t, conn, "attaching "+reg, own)
		asUser(t, conn, own, `insert into `+reg+` values (1, 'k1', 'v1')`)
		evs := tsEvents(t, conn, reg)
		if len(evs) != 1 || evs[0].Type != "insert" || strOr(evs[0].Key) != "v1" || payloadField(t, evs[0], "k") != "k1" {
			t.Errorf("events of %s: %+v", reg, evs)
		}
	}
	pgtest.Install(t, dsn)
	wantNoEscalation(t, conn, "second re-install", own)
}

// castFixture creates, as owner, an enum type with a cast function that
// records the role it runs as in public.cast_log, tries to grant owner
// pgque_admin and pg_execute_server_program (ignoring refusal), and
// returns prefix || the label; then a cast from the type to target with it.
func castFixture(owner, writer, target, prefix string) []string {
	return []string{
		`create type public.mood as enum ('calm', 'happy')`,
		`create table public.cast_log (fn text, who text)`,
		`grant insert on public.cast_log to ` + writer,
		`create function public.mood_cast(m public.mood) returns ` + target + ` language plpgsql as $c$
		begin
			insert into public.cast_log values ('` + target + `', current_user);
			begin
				execute 'grant pgque_admin, pg_execute_server_program to ` + owner + `';
			exception when others then null;
			end;
			return ` + map[string]string{"json": "to_json('" + prefix + "' || format('%s', m))", "text": "'" + prefix + "' || format('%s', m)"}[target] + `;
		end $c$`,
		`create cast (public.mood as ` + target + `) with function public.mood_cast(public.mood)`,
	}
}

// TestTableSourceCastsRunAsTheWriter: the owner of an attached table adds
// a column of its own enum type with its own cast to json, or makes the
// key column such a type with its own cast to text; each cast tries to
// grant the owner pgque_admin. A writer with no pgque grant inserts a
// row: the casts run as that writer (so the grant is refused), and the
// event carries what the casts returned.
func TestTableSourceCastsRunAsTheWriter(t *testing.T) {
	for _, c := range []struct {
		name, target, key string
	}{
		{"payload column cast to json", "json", "k"},
		{"key column cast to text", "text", "m"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, conn := setupDB(t)
			roles := tsRoles(t, conn, "ts_cown", "ts_cwr")
			own, wr := roles[0], roles[1]
			stmts := append(castFixture(own, wr, c.target, "cast:"),
				`create table public.ts_cast (id integer primary key, k text, m public.mood)`,
				`grant insert, update, delete on public.ts_cast to `+wr)
			asUser(t, conn, own, stmts...)
			mustExec(t, conn, `select pgque.attach_table('q1', 'public.ts_cast', '`+c.key+`')`)
			asUser(t, conn, wr, `insert into public.ts_cast values (1, 'A', 'happy')`,
				`update public.ts_cast set m = 'calm'`, `delete from public.ts_cast`)
			wantNoEscalation(t, conn, "writes through the owner's cast", own, wr)
			who := scalarOf[string](t, conn, `select coalesce(string_agg(distinct who, ','), '') from public.cast_log`)
			if who != wr {
				t.Errorf("the owner's cast ran as %q, want only as the writer %s", who, wr)
			}
			evs := tsEvents(t, conn, "public.ts_cast")
			if c.target == "json" {
				if len(evs) != 3 || payloadField(t, evs[0], "m") != "cast:happy" || payloadField(t, evs[1], "m") != "cast:calm" ||
					strOr(evs[0].Key) != "A" || evs[1].Type != "update" || evs[2].Type != "delete" {
					t.Errorf("events: %+v", evs)
				}
				return
			}
			// The key changes with m: the update is a move (delete + insert).
			if len(evs) != 4 || strOr(evs[0].Key) != "cast:happy" || evs[1].Type != "delete" || strOr(evs[1].Key) != "cast:happy" ||
				evs[2].Type != "insert" || strOr(evs[2].Key) != "cast:calm" || payloadField(t, evs[0], "m") != "happy" {
				t.Errorf("events: %+v", evs)
			}
		})
	}
}

// TestTableSourceWriterCannotForgeEvents: what the capture trigger hands
// over to the writing trigger passes through a setting any role can set.
// A writer with no pgque grant presets it with a forged event and writes
// a row the attachment's WHEN condition filters out, then one it keeps:
// no forged event comes out, only the real row. The writer cannot call
// the writing function, nor put it on a table of its own.
func TestTableSourceWriterCannotForgeEvents(t *testing.T) {
	_, conn := setupDB(t)
	roles := tsRoles(t, conn, "ts_fown", "ts_fwr")
	own, wr := roles[0], roles[1]
	asUser(t, conn, own, `create table public.ts_forge (id integer primary key, k text)`,
		`grant insert on public.ts_forge to `+wr)
	mustExec(t, conn, `select pgque.attach_table('q1', 'public.ts_forge', 'k', operations => array['insert'], when_condition => 'new.id > 10')`)
	qid := scalarOf[string](t, conn, `select queue_id::text from pgque.queue where queue_name = 'q1'`)
	forged := `{"r": "` + scalarOf[string](t, conn, `select 'public.ts_forge'::regclass::oid::text`) +
		`", "o": "INSERT", "e": [{"t": "insert", "k": "forged", "d": {"forged": true}}]}`
	setForged := `select set_config('pgque.src_` + qid + `', '` + forged + `', %s)`
	asUser(t, conn, wr, fmt.Sprintf(setForged, "false"), `insert into public.ts_forge values (1, 'x')`)
	asUser(t, conn, wr, fmt.Sprintf(setForged, "true"), `insert into public.ts_forge values (2, 'x')`)
	asUser(t, conn, wr, fmt.Sprintf(setForged, "false"), `insert into public.ts_forge values (11, 'real')`)
	evs := tsEvents(t, conn, "public.ts_forge")
	if len(evs) != 1 || strOr(evs[0].Key) != "real" || payloadField(t, evs[0], "id") != 11.0 {
		t.Errorf("events: %+v, want only the real row 11", evs)
	}
	asUser(t, conn, wr, `create table public.ts_mine (id integer)`)
	for _, stmt := range []string{
		`select pgque._table_source_emit()`,
		`create trigger w after insert on public.ts_mine for each row execute function pgque._table_source_emit('` + qid + `')`,
	} {
		if code, msg := sqlstate(t, conn, wr, stmt); code != "42501" {
			t.Errorf("writer: %s: SQLSTATE %q (%s), want 42501", stmt, code, msg)
		}
	}
}

//go:embed testdata/legacy_table_source.sql
var legacyTableSource string

// TestTableSourceLegacyUpgrade: an install of an earlier version, whose
// attachments each have a generated SECURITY DEFINER trigger function, is
// upgraded: one attached table renamed by its owner to a name that would
// inject SQL, one with a WHEN condition and a column left out, one
// partitioned. The install replaces their triggers with the generic ones
// (keeping the condition and options), drops the generated functions, runs
// nothing built from a name, and the tables' writes still emit their
// events.
func TestTableSourceLegacyUpgrade(t *testing.T) {
	dsn, conn := setupDB(t)
	own := tsRoles(t, conn, "tl")[0]
	inj := "\nbegin end$fn$;grant pgque_admin to " + own + ";select $fn$"
	// What the earlier version's structure and functions left.
	mustExec(t, conn, `alter table pgque.table_source add column ts_function regprocedure`, legacyTableSource)
	asUser(t, conn, own,
		`create table public.lg_a (id integer primary key, k text, secret text)`,
		`create table public.lg_p (id integer, k text not null, primary key (k, id)) partition by list (k)`,
		`create table public.lg_p1 partition of public.lg_p for values in ('A')`,
		`create table public.lg_p2 partition of public.lg_p for values in ('B')`)
	mustExec(t, conn,
		`select pgque.attach_table('q1', 'public.lg_a', 'k', exclude_columns => array['secret'],
			operations => array['insert', 'update'], when_condition => 'new.id > 10')`,
		`select pgque.attach_table('q1', 'public.lg_p', 'k', operations => array['insert', 'truncate'])`)
	if n := scalarOf[int64](t, conn, `select count(*) from pg_proc where pronamespace = 'pgque'::regnamespace and proname like '\_src\_%'`); n < 3 {
		t.Fatalf("the earlier version generated %d functions, want one per attachment", n)
	}
	asUser(t, conn, own, `alter table public.lg_a rename to `+identQuote(inj))

	pgtest.Install(t, dsn)
	wantNoEscalation(t, conn, "upgrade over a renamed attached table", own)
	if n := scalarOf[int64](t, conn, `select count(*) from pg_proc where pronamespace = 'pgque'::regnamespace and proname like '\_src\_%'`); n != 0 {
		t.Errorf("%d generated functions left after the upgrade", n)
	}
	if n := scalarOf[int64](t, conn, `select count(*) from pg_attribute where attrelid = 'pgque.table_source'::regclass
		 and attname = 'ts_function' and not attisdropped`); n != 0 {
		t.Error("table_source still has ts_function")
	}
	a := "public." + identQuote(inj)
	trgs := scalarOf[string](t, conn, `select string_agg(tgname || ':' || tgfoid::regproc::text, ' ' order by tgname)
		  from pg_trigger where tgrelid = $1::regclass`, a)
	if want := "pgque_q1:pgque._table_source_capture pgque_q1_emit:pgque._table_source_emit pgque_q1_truncate:pgque._table_source_emit"; trgs != want {
		t.Errorf("triggers of the upgraded table: %s, want %s", trgs, want)
	}
	asUser(t, conn, own, `insert into `+a+` values (5, 'k5', 's'), (11, 'k11', 's')`,
		`insert into public.lg_p values (1, 'A'), (2, 'B')`, `truncate public.lg_p`)
	evs := tsEvents(t, conn, a)
	if len(evs) != 1 || strOr(evs[0].Key) != "k11" || payloadField(t, evs[0], "secret") != nil || payloadField(t, evs[0], "id") != 11.0 {
		t.Errorf("events of the upgraded table with a WHEN condition: %+v, want only row 11 without secret", evs)
	}
	if evs := tsEvents(t, conn, "public.lg_p"); len(evs) != 3 || evs[0].Type != "insert" || evs[2].Type != "truncate" {
		t.Errorf("events of the upgraded partitioned table: %+v", evs)
	}
	// Detaching works on the upgraded attachments; a second upgrade finds
	// nothing to do.
	mustExec(t, conn, `select pgque.detach_table('q1', 'public.lg_p')`)
	pgtest.Install(t, dsn)
	wantNoEscalation(t, conn, "second install", own)
}

// TestTableSourceLegacyUpgradeNeedsTheTablesOwner: pgque installed by a
// non-superuser owner, an attachment of the earlier version on a table of
// another role (renamed by it to a name that would inject SQL). Replacing
// the table's triggers needs its ownership: the upgrade stops with 42501
// naming the table and its owner, having run nothing of the name; once
// the installing role is a member of the table's owner, it goes through
// and the table's writes emit their events.
func TestTableSourceLegacyUpgradeNeedsTheTablesOwner(t *testing.T) {
	_, super, newDB := installerCluster(t)
	ctx := context.Background()
	dsn := newDB("legacyown")
	owner := pgtest.Conn(t, pgtest.DSNWith(dsn, "user", "pgque_owner"))
	if _, err := install.Install(ctx, owner); err != nil {
		t.Fatal(err)
	}
	mustExec(t, owner, `select pgque.create_queue('q1')`,
		`alter table pgque.table_source add column ts_function regprocedure`, legacyTableSource)
	attacker := pgtest.Conn(t, pgtest.DSNWith(dsn, "user", "attacker"))
	inj := "\nbegin end$fn$;grant pgque_admin to attacker;select $fn$"
	mustExec(t, attacker, `create table public.lg (id integer primary key, k text)`,
		`grant trigger on public.lg to pgque_owner`)
	mustExec(t, owner, `select pgque.attach_table('q1', 'public.lg', 'k')`)
	mustExec(t, attacker, `alter table public.lg rename to `+identQuote(inj))

	_, err := install.Install(ctx, owner)
	if codeOf(err) != "42501" || !strings.Contains(err.Error(), "owner attacker") {
		t.Fatalf("upgrade by a role not owning an attached table: %v, want 42501 naming the table's owner", err)
	}
	wantNoEscalation(t, super, "refused upgrade", "attacker")
	mustExec(t, super, `grant attacker to pgque_owner`)
	if _, err := install.Install(ctx, owner); err != nil {
		t.Fatalf("upgrade by a member of the table's owner: %v", err)
	}
	wantNoEscalation(t, super, "upgrade", "attacker")
	if n := scalarOf[int64](t, owner, `select count(*) from pg_proc where pronamespace = 'pgque'::regnamespace and proname like '\_src\_%'`); n != 0 {
		t.Errorf("%d generated functions left after the upgrade", n)
	}
	mustExec(t, attacker, `insert into public.`+identQuote(inj)+` values (1, 'k1')`)
	if evs := tsEvents(t, owner, "public."+identQuote(inj)); len(evs) != 1 || strOr(evs[0].Key) != "k1" {
		t.Errorf("events after the upgrade: %+v", evs)
	}
}

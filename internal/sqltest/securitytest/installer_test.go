package securitytest

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgque/pgque"
	"github.com/pgque/pgque/internal/install"
	"github.com/pgque/pgque/internal/pgcluster"
	"github.com/pgque/pgque/internal/testing/pgtest"
	sqlfiles "github.com/pgque/pgque/sql"
)

// installerCluster starts a private cluster with an installing role
// (pgque_owner, CREATEROLE), a role with CREATE on the database
// (attacker) and a role with no grant at all (stranger), and returns a
// function that creates a fresh database owned by pgque_owner where the
// attacker may create schemas.
func installerCluster(t *testing.T) (c *pgcluster.Cluster, super *pgx.Conn, newDB func(name string) string) {
	t.Helper()
	c = pgtest.NewCluster(t, pgcluster.Options{})
	super = pgtest.Conn(t, c.DSN("postgres"))
	mustExec(t, super,
		`create role pgque_owner login createrole`,
		`create role attacker login`,
		`create role stranger login`,
	)
	return c, super, func(name string) string {
		mustExec(t, super, `create database `+name+` owner pgque_owner`)
		db := pgtest.Conn(t, c.DSN(name))
		mustExec(t, db, `grant create on database `+name+` to attacker`, `grant create on schema public to attacker`)
		return c.DSN(name)
	}
}

func mustExec(t *testing.T, conn *pgx.Conn, stmts ...string) {
	t.Helper()
	for _, s := range stmts {
		if _, err := conn.Exec(context.Background(), s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
}

func codeOf(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// TestInstallRefusesAPreparedSchema prepares schema pgque in many ways a
// role with CREATE on the database (or a CREATE grant on the schema) could,
// each with code that would run as the installer, and checks that install
// refuses with 42501 naming what is wrong, before running any of it.
func TestInstallRefusesAPreparedSchema(t *testing.T) {
	c, _, newDB := installerCluster(t)
	ctx := context.Background()
	trap := []string{
		`create function public.pwn() returns trigger language plpgsql as $$ begin raise exception 'attacker code ran as %', current_user; end $$`,
	}
	cases := []struct {
		name     string
		owner    []string // as pgque_owner, first (may be empty)
		attacker []string // as attacker, then
		preInst  bool     // install pgque as the owner before owner/attacker steps
		want     string   // in the error message
	}{
		{name: "attacker schema with trigger on version", attacker: append(trap,
			`create schema pgque`,
			`create table pgque.version (singleton boolean primary key default true, version text not null, installed_at timestamptz default now())`,
			`create trigger t before insert or update on pgque.version for each row execute function public.pwn()`),
			want: "owned by role attacker"},
		{name: "attacker empty schema", attacker: []string{`create schema pgque`}, want: "owned by role attacker"},
		// The installer reads the version before the script: it must not
		// call a version function it does not own.
		{name: "attacker schema with version function", attacker: []string{
			`create schema pgque`,
			`create table pgque.version (singleton boolean primary key default true, version text not null, installed_at timestamptz default now())`,
			`insert into pgque.version (version) values ('0.0.1')`,
			`create function pgque.version() returns text language plpgsql as $$ begin raise exception 'attacker code ran as %', current_user; end $$`},
			want: "owned by role attacker"},
		{name: "attacker schema opened to public", attacker: []string{`create schema pgque`, `grant all on schema pgque to public`},
			want: "owned by role attacker"},
		{name: "owner schema, attacker function", owner: []string{`create schema pgque`, `grant create, usage on schema pgque to attacker`},
			attacker: []string{`create function pgque.send(i_queue text, i_type text, i_payload jsonb, i_key text) returns bigint language sql as 'select 1::bigint'`},
			want:     "function pgque.send"},
		{name: "owner schema, attacker table", owner: []string{`create schema pgque`, `grant create, usage on schema pgque to attacker`},
			attacker: []string{`create table pgque.queue (queue_id integer)`}, want: "relation pgque.queue (owner attacker)"},
		{name: "owner schema, attacker type", owner: []string{`create schema pgque`, `grant create, usage on schema pgque to attacker`},
			attacker: []string{`create type pgque.message as (x int)`}, want: "type pgque.message"},
		{name: "owner schema, attacker operator", owner: []string{`create schema pgque`, `grant create, usage on schema pgque to attacker`},
			attacker: []string{`create function public.f(a text, b text) returns boolean language sql as 'select true'`,
				`create operator pgque.= (leftarg = text, rightarg = text, function = public.f)`}, want: "operator pgque.="},
		{name: "owner schema, CREATE granted", owner: []string{`create schema pgque`, `grant create on schema pgque to attacker`},
			want: "CREATE on schema pgque granted to attacker"},
		{name: "owner schema, CREATE granted to public", owner: []string{`create schema pgque`, `grant create on schema pgque to public`},
			want: "granted to PUBLIC"},
		{name: "installed, then attacker view", preInst: true,
			owner:    []string{`grant create, usage on schema pgque to attacker`},
			attacker: []string{`create view pgque.queue_info as select 1 as x`}, want: "relation pgque.queue_info (owner attacker)"},
		{name: "installed, owner trigger on version", preInst: true,
			owner: append(trap, `create trigger t before update on pgque.version for each row execute function public.pwn()`),
			want:  "trigger t on pgque.version"},
		{name: "installed, rule on a table", preInst: true,
			owner: []string{`create rule r as on update to pgque.version do also select 1`},
			want:  "rule r on pgque.version"},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dsn := newDB("prep" + itoa(i))
			owner := pgtest.Conn(t, pgtest.DSNWith(dsn, "user", "pgque_owner"))
			attacker := pgtest.Conn(t, pgtest.DSNWith(dsn, "user", "attacker"))
			if tc.preInst {
				if _, err := install.Install(ctx, owner); err != nil {
					t.Fatal(err)
				}
			}
			mustExec(t, owner, tc.owner...)
			mustExec(t, attacker, tc.attacker...)
			_, err := install.Install(ctx, owner)
			if err == nil {
				t.Fatal("install went ahead into a prepared schema")
			}
			if codeOf(err) != "42501" || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "attacker code ran") {
				t.Fatalf("install error = %v (SQLSTATE %s), want 42501 naming %q", err, codeOf(err), tc.want)
			}
			// The superuser is refused the same way, and runs nothing; nor
			// does reading the version (pgque version, uninstall) run it.
			super := pgtest.Conn(t, c.DSN("prep"+itoa(i)))
			if _, err := install.Install(ctx, super); codeOf(err) != "42501" || strings.Contains(err.Error(), "attacker code ran") {
				t.Fatalf("superuser install error = %v, want 42501", err)
			}
			// Every schema here is a non-superuser's: the superuser's
			// client refuses it before calling anything.
			if _, err := install.InstalledVersion(ctx, super); codeOf(err) != "42501" || strings.Contains(err.Error(), "attacker code ran") {
				t.Fatalf("the superuser reading the version: %v, want 42501", err)
			}
		})
	}
}

// TestClientsRunNoCodeOfALesserSchemaOwner: a role with CREATE on the
// database prepares schema pgque with a version() that makes its owner a
// superuser when a superuser calls it: as an invoker function, and as
// SECURITY DEFINER with a pinned search_path that points the caller's
// session at the attacker's operators (set_config outlives the call). A
// superuser's Client, services and version reads refuse the schema with
// ErrPermissionDenied before calling anything; the attacker stays a plain
// role, and the superuser's search_path is untouched. The schema's owner
// itself, and a superuser's session as the owner, are trusted.
func TestClientsRunNoCodeOfALesserSchemaOwner(t *testing.T) {
	c, super, newDB := installerCluster(t)
	ctx := context.Background()
	escalate := `begin
		if (select rolsuper from pg_catalog.pg_roles where rolname = current_user) then
			execute 'alter role attacker superuser';
		end if;
		perform pg_catalog.set_config('search_path', 'evil, pg_catalog', false);
		return '` + sqlfiles.Version + `';
	end`
	for i, fn := range []string{
		`create function pgque.version() returns text language plpgsql as $$` + escalate + `$$`,
		`create function pgque.version() returns text language plpgsql security definer set search_path = pg_catalog as $$` + escalate + `$$`,
	} {
		name := "lesser" + itoa(i)
		dsn := newDB(name)
		attacker := pgtest.Conn(t, pgtest.DSNWith(dsn, "user", "attacker"))
		mustExec(t, attacker, `create schema pgque`, `create schema evil`, `grant usage on schema pgque, evil to public`,
			`create table pgque.version (singleton boolean primary key default true, version text not null, installed_at timestamptz default now())`,
			`insert into pgque.version (version) values ('`+sqlfiles.Version+`')`,
			`grant select on pgque.version to public`, fn, `grant execute on function pgque.version() to public`)

		superDSN := c.DSN(name)
		if _, err := pgque.Connect(ctx, superDSN, &pgque.Config{PollOnly: true}); !errors.Is(err, pgque.ErrPermissionDenied) ||
			!strings.Contains(err.Error(), "owned by role attacker, which lacks SUPERUSER") {
			t.Errorf("case %d: a superuser's Connect: %v, want ErrPermissionDenied naming the owner", i, err)
		}
		sc := pgtest.Conn(t, superDSN)
		if _, err := install.InstalledVersion(ctx, sc); codeOf(err) != "42501" {
			t.Errorf("case %d: a superuser's InstalledVersion: %v, want 42501", i, err)
		}
		var path string
		if err := sc.QueryRow(ctx, `show search_path`).Scan(&path); err != nil || strings.Contains(path, "evil") {
			t.Errorf("case %d: the superuser's search_path is %q (%v)", i, path, err)
		}
		var isSuper bool
		if err := super.QueryRow(ctx, `select rolsuper from pg_roles where rolname = 'attacker'`).Scan(&isSuper); err != nil || isSuper {
			t.Fatalf("case %d: the attacker is a superuser now (%v)", i, err)
		}
		// The schema's owner runs its own code: nothing to gain.
		if v, err := install.InstalledVersion(ctx, attacker); err != nil || v != sqlfiles.Version {
			t.Errorf("case %d: the owner's InstalledVersion = %q, %v", i, v, err)
		}
	}

	// A legitimate install by a CREATEROLE owner: its logins and a plain
	// login pass; a superuser passes as the owner, and is refused as itself.
	dsn := newDB("lesserok")
	owner := pgtest.Conn(t, pgtest.DSNWith(dsn, "user", "pgque_owner"))
	if _, err := install.Install(ctx, owner); err != nil {
		t.Fatal(err)
	}
	mustExec(t, owner, `create role lesser_app login in role pgque_reader, pgque_writer`)
	for _, d := range []string{pgtest.DSNWith(dsn, "user", "lesser_app"), pgtest.DSNWith(c.DSN("lesserok"), "options", "-c role=pgque_owner")} {
		client, err := pgque.Connect(ctx, d, &pgque.Config{PollOnly: true})
		if err != nil {
			t.Fatalf("Connect(%s): %v", d, err)
		}
		client.Close()
	}
	if err := install.TrustSchema(ctx, pgtest.Conn(t, c.DSN("lesserok"))); codeOf(err) != "42501" {
		t.Errorf("a superuser over pgque_owner's schema: %v, want 42501", err)
	}
	// A CREATEROLE login is refused over a schema whose owner lacks it.
	mustExec(t, super, `create role lesser_admin login createrole in role pgque_reader`, `alter role pgque_owner nocreaterole`)
	defer mustExec(t, super, `alter role pgque_owner createrole`)
	if err := install.TrustSchema(ctx, pgtest.Conn(t, pgtest.DSNWith(dsn, "user", "lesser_admin"))); codeOf(err) != "42501" ||
		!strings.Contains(err.Error(), "lacks CREATEROLE") {
		t.Errorf("a CREATEROLE login over a NOCREATEROLE owner's schema: %v, want 42501 naming CREATEROLE", err)
	}
}

// aclSnapshot lists every pgque object with its owner and privileges.
func aclSnapshot(t *testing.T, conn *pgx.Conn) []string {
	t.Helper()
	rows, err := conn.Query(context.Background(), `
		select 'f ' || p.oid::regprocedure::text || ' ' || p.proowner::regrole::text || ' ' || coalesce(p.proacl::text, '') || ' ' || p.prosecdef::text
		  from pg_proc p where p.pronamespace = 'pgque'::regnamespace
		union all
		select 'r ' || c.oid::regclass::text || ' ' || c.relowner::regrole::text || ' ' || coalesce(c.relacl::text, '')
		  from pg_class c where c.relnamespace = 'pgque'::regnamespace
		union all
		select 'n ' || nspowner::regrole::text || ' ' || coalesce(nspacl::text, '') from pg_namespace where nspname = 'pgque'
		order by 1`)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestSuperuserReinstallKeepsOwnersAndGrants installs as a non-superuser
// owner and adds grants of its own. A superuser's re-install is refused
// (the schema is another role's, and the superuser has not said it trusts
// that role); as the owner, by options '-c role=pgque_owner' on its
// connection, it upgrades, and so does the owner: every object keeps its
// owner and every privilege stays.
func TestSuperuserReinstallKeepsOwnersAndGrants(t *testing.T) {
	c, _, newDB := installerCluster(t)
	ctx := context.Background()
	dsn := newDB("reinst")
	owner := pgtest.Conn(t, pgtest.DSNWith(dsn, "user", "pgque_owner"))
	if _, err := install.Install(ctx, owner); err != nil {
		t.Fatal(err)
	}
	mustExec(t, owner, `create role app_w`, `grant pgque_writer to app_w`,
		`grant execute on function pgque.send(text, text, jsonb, text, text) to app_w`,
		`select pgque.create_queue('q')`)
	before := aclSnapshot(t, owner)
	super := pgtest.Conn(t, c.DSN("reinst"))
	_, err := install.Install(ctx, super)
	if codeOf(err) != "42501" || !strings.Contains(err.Error(), "owned by role pgque_owner") {
		t.Fatalf("a superuser's re-install over pgque_owner's schema: %v, want 42501 naming the owner", err)
	}
	if pe := (*pgconn.PgError)(nil); !errors.As(err, &pe) || !strings.Contains(pe.Hint, "options='-c role=pgque_owner'") {
		t.Errorf("the refusal (%v) has no hint saying how to install as the owner", err)
	}
	superAsOwner := pgtest.Conn(t, pgtest.DSNWith(c.DSN("reinst"), "options", "-c role=pgque_owner"))
	for _, who := range []struct {
		name string
		conn *pgx.Conn
	}{{"superuser as the owner", superAsOwner}, {"owner", owner}, {"superuser as the owner again", superAsOwner}} {
		if _, err := install.Install(ctx, who.conn); err != nil {
			t.Fatalf("re-install as %s: %v", who.name, err)
		}
		// Re-granting what grants.sql grants anyway may add privileges to
		// objects that lacked them; nothing may be lost or change owner.
		after := map[string]bool{}
		for _, a := range aclSnapshot(t, owner) {
			after[a] = true
		}
		for _, b := range before {
			if !after[b] && !grantsGrew(b, after) {
				t.Errorf("re-install as %s lost or changed: %s", who.name, b)
			}
		}
	}
	// Every pgque role can read the installed version (the CLI checks it
	// before each command); a role with no grant sees no pgque.
	mustExec(t, owner, `create role app_r login`, `create role app_nobody login`, `alter role app_w login`, `grant pgque_reader to app_r`)
	for _, r := range []struct{ role, want string }{{"app_r", sqlfiles.Version}, {"app_w", sqlfiles.Version}, {"app_nobody", ""}} {
		v, err := install.InstalledVersion(ctx, pgtest.Conn(t, pgtest.DSNWith(dsn, "user", r.role)))
		if err != nil || v != r.want {
			t.Errorf("InstalledVersion as %s = %q, %v; want %q", r.role, v, err, r.want)
		}
	}
	var cur string
	if err := super.QueryRow(ctx, `select current_user`).Scan(&cur); err != nil || strings.HasPrefix(cur, "pgque") {
		t.Fatalf("the superuser's session stayed as %q after install (%v)", cur, err)
	}
}

// TestStrangerLocksDoNotStallInstallOrCreateQueue: a role with no pgque
// grant holds every advisory lock key pgque ever used; install (fresh and
// upgrade) and create_queue still finish promptly.
func TestStrangerLocksDoNotStallInstallOrCreateQueue(t *testing.T) {
	t.Parallel() // its own cluster; the fresh install waits out FreshLockWait
	_, _, newDB := installerCluster(t)
	dsn := newDB("locks")
	stranger := pgtest.Conn(t, pgtest.DSNWith(dsn, "user", "stranger"))
	mustExec(t, stranger,
		`select pg_advisory_lock(hashtext('pgque.create_queue'))`,
		`select pg_advisory_lock(`+itoa64(install.LockKey)+`)`,
		`select pg_advisory_lock_shared(`+itoa64(install.LockKey)+`)`,
	)
	owner := pgtest.Conn(t, pgtest.DSNWith(dsn, "user", "pgque_owner"))
	for _, step := range []struct {
		name  string
		bound time.Duration
		run   func(ctx context.Context) error
	}{
		{"fresh install", install.FreshLockWait + 20*time.Second, func(ctx context.Context) error { _, err := install.Install(ctx, owner); return err }},
		{"upgrade", 20 * time.Second, func(ctx context.Context) error { _, err := install.Install(ctx, owner); return err }},
		{"create_queue", 10 * time.Second, func(ctx context.Context) error {
			_, err := owner.Exec(ctx, `select pgque.create_queue('q1')`)
			return err
		}},
		{"uninstall", 20 * time.Second, func(ctx context.Context) error { return install.Uninstall(ctx, owner, false) }},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), step.bound)
		err := step.run(ctx)
		cancel()
		if err != nil {
			t.Fatalf("%s with a stranger holding the advisory locks: %v", step.name, err)
		}
	}
	// The stranger cannot take the lock that serialises installs now.
	if _, err := install.Install(context.Background(), owner); err != nil {
		t.Fatal(err)
	}
	tx, err := stranger.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	_, err = tx.Exec(context.Background(), `lock table pgque.version in access share mode`)
	if codeOf(err) != "42501" {
		t.Fatalf("stranger lock table pgque.version: %v, want 42501", err)
	}
}

// grantsGrew reports whether a snapshot line whose ACL was replaced by a
// longer one (same object, same owner, every old entry still present) is in
// after.
func grantsGrew(line string, after map[string]bool) bool {
	f := strings.Fields(line)
	if len(f) < 3 {
		return false
	}
	prefix := f[0] + " " + f[1] + " " + f[2] + " "
	old := ""
	if len(f) > 3 && strings.HasPrefix(f[3], "{") {
		old = strings.Trim(f[3], "{}")
	}
	for a := range after {
		if !strings.HasPrefix(a, prefix) {
			continue
		}
		g := strings.Fields(a)
		if len(g) < 4 || (len(f) > 4) != (len(g) > 4) || len(f) > 4 && f[4] != g[4] {
			continue
		}
		have := strings.Trim(g[3], "{}")
		ok := true
		for _, e := range strings.Split(old, ",") {
			if e != "" && !strings.Contains(","+have+",", ","+e+",") {
				ok = false
			}
		}
		if ok {
			return true
		}
	}
	return false
}

// TestHeldVersionLockFailsUpgradeClearly: a pgque role can hold a lock on
// pgque.version without the right to change it (PREPARE of an UPDATE locks
// the table and runs nothing). An upgrade waits for it at most
// install.FreshLockWait, then fails naming the session, and goes through
// once that session ends.
func TestHeldVersionLockFailsUpgradeClearly(t *testing.T) {
	t.Parallel() // its own cluster; it waits out a lock timeout
	ctx := context.Background()
	_, super, newDB := installerCluster(t)
	dsn := newDB("heldversion")
	owner := pgtest.Conn(t, pgtest.DSNWith(dsn, "user", "pgque_owner"))
	if _, err := install.Install(ctx, owner); err != nil {
		t.Fatal(err)
	}
	mustExec(t, super, `create role hv_reader login`)
	mustExec(t, owner, `grant pgque_reader to hv_reader`)
	reader := pgtest.Conn(t, pgtest.DSNWith(dsn, "user", "hv_reader"))
	tx, err := reader.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `prepare p as update pgque.version set version = version`); err != nil {
		t.Fatal(err)
	}
	var pid int32
	if err := tx.QueryRow(ctx, `select pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	bounded, cancel := context.WithTimeout(ctx, install.FreshLockWait+20*time.Second)
	_, err = install.Install(bounded, owner)
	cancel()
	if err == nil || !strings.Contains(err.Error(), "pid "+itoa(int(pid))+" (role hv_reader)") {
		t.Fatalf("upgrade with pgque.version held by a reader: %v, want an error naming pid %d", err, pid)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := install.Install(ctx, owner); err != nil {
		t.Fatalf("upgrade after the reader let go: %v", err)
	}
}

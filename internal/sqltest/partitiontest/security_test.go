package partitiontest

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
)

// secDB is a database whose pgque was installed by a non-superuser owner,
// with a bare login role that is a member of pgque_reader and nothing else.
type secDB struct {
	owner, reader         *pgx.Conn
	ownerName, readerName string
}

// setupSecurity creates the owner role (LOGIN CREATEROLE, no SUPERUSER), hands
// it a fresh database, installs pgque as that owner, and creates the reader.
// Roles are cluster-wide, so their names are unique to the test; they are
// dropped, together with the database, when the test ends.
func setupSecurity(t *testing.T) *secDB {
	t.Helper()
	ctx := context.Background()
	dsn := pgtest.NewDB(t)
	su := pgtest.Conn(t, dsn)
	dbname := su.Config().Database
	var salt [4]byte
	_, _ = rand.Read(salt[:])
	s := &secDB{ownerName: "pq_owner_" + hex.EncodeToString(salt[:]), readerName: "pq_reader_" + hex.EncodeToString(salt[:])}
	ident := func(n string) string { return pgx.Identifier{n}.Sanitize() }
	for _, stmt := range []string{
		"create role " + ident(s.ownerName) + " login createrole nosuperuser",
		"alter database " + ident(dbname) + " owner to " + ident(s.ownerName),
		"create role " + ident(s.readerName) + " login nosuperuser",
	} {
		if _, err := su.Exec(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	t.Cleanup(func() {
		// The roles own the database and what is in it: drop it first (the
		// harness's own drop that runs afterwards is then a no-op).
		admin, err := pgx.Connect(ctx, pgtest.DSNWith(dsn, "dbname", "postgres"))
		if err != nil {
			t.Error(err)
			return
		}
		defer admin.Close(ctx)
		for _, stmt := range []string{
			"drop database if exists " + ident(dbname) + " with (force)",
			"drop role if exists " + ident(s.readerName),
			"drop role if exists " + ident(s.ownerName),
		} {
			if _, err := admin.Exec(ctx, stmt); err != nil {
				t.Errorf("%s: %v", stmt, err)
			}
		}
	})

	s.owner = pgtest.Conn(t, pgtest.DSNWith(dsn, "user", s.ownerName))
	if one[bool](t, s.owner, "select rolsuper from pg_catalog.pg_roles where rolname = current_user") {
		t.Fatal("the installing owner is a superuser")
	}
	res, err := install.Install(ctx, s.owner)
	if err != nil {
		t.Fatalf("install by non-superuser owner %s: %v", s.ownerName, err)
	}
	if !res.Fresh() {
		t.Fatalf("install by the owner = %+v, want a fresh install", res)
	}
	if got := one[string](t, s.owner, "select nspowner::regrole::text from pg_catalog.pg_namespace where nspname = 'pgque'"); got != s.ownerName {
		t.Fatalf("schema pgque is owned by %s, want the installing owner %s", got, s.ownerName)
	}
	if _, err := su.Exec(ctx, "grant pgque_reader to "+ident(s.readerName)); err != nil {
		t.Fatal(err)
	}
	s.reader = pgtest.Conn(t, pgtest.DSNWith(dsn, "user", s.readerName))
	return s
}

// T-security, end to end: a bare login role granted only pgque_reader
// subscribes, claims, receives, nacks and acks on slots and reads
// partition_slot_status, on a pgque installed by a non-superuser owner; it may
// not call get_batch_cursor (the SQL sink) or read pgque's tables.
func TestSecurityReaderEndToEnd(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := setupSecurity(t)
	o, r := s.owner, s.reader

	if one[int32](t, o, "select pgque.create_queue('sec')") != 1 {
		t.Fatal("create_queue by the owner failed")
	}
	for k := range 2 {
		if got := one[int32](t, r, "select pgque.subscribe_slot('sec', 'c', $1, 2)", k); got != 1 {
			t.Fatalf("reader's subscribe_slot(%d) = %d, want 1", k, got)
		}
	}
	if e := mustClaim(t, r, "sec", "c", 0, "r1", "1 hour"); e != 1 {
		t.Errorf("reader's claim_slot = %d, want epoch 1", e)
	}
	key := ptr("tenant-3") // pinned: slot 0 of 2
	first, second := send(t, o, "sec", key), send(t, o, "sec", key)
	tick(t, o, "sec")

	sl := slotRef{q: "sec", c: "c", slot: 0, n: 2, worker: "r1", max: 100}
	ms := mustReceive(t, r, sl)
	if got := ids(ms); len(got) != 2 || got[0] != first || got[1] != second {
		t.Fatalf("reader received %v, want [%d %d]", got, first, second)
	}
	if n, err := nack(ctx, r, sl, first, "0 seconds"); err != nil || n != 1 {
		t.Fatalf("reader's nack_partitioned = %d, %v; want 1", n, err)
	}
	if n := mustAck(t, r, sl); n != 1 {
		t.Fatalf("reader's ack_partitioned = %d, want 1", n)
	}
	if one[int32](t, o, "select pgque.maint_retry_events()") != 1 {
		t.Fatal("maint_retry_events moved nothing")
	}
	tick(t, o, "sec")
	ms = mustReceive(t, r, sl)
	if len(ms) != 1 || ms[0].ID != first || ms[0].Retry != 1 {
		t.Fatalf("reader's redelivery = %+v, want event %d with retry_count 1", ms, first)
	}
	mustAck(t, r, sl)

	var owner string
	var slots int64
	if err := r.QueryRow(ctx, `select count(*), max(owner) from pgque.partition_slot_status
		where queue = 'sec' and consumer = 'c'`).Scan(&slots, &owner); err != nil {
		t.Fatalf("reader reading partition_slot_status: %v", err)
	}
	if slots != 2 || owner != "r1" {
		t.Errorf("partition_slot_status as reader: %d slots, owner %s; want 2 and r1", slots, owner)
	}

	for _, q := range []string{
		"select * from pgque.get_batch_cursor(1, 'c', 10, 'true')",
		"select * from pgque.get_batch_cursor(1, 'c', 10, null)",
		"select pgque.create_queue('x')",
		"select pgque.ticker('sec')",
		"select pgque.maint_retry_events()",
		"select * from pgque.slot_lease",
		"select * from pgque.event",
		"update pgque.slot_lease set sl_owner = 'me'",
	} {
		_, err := r.Exec(ctx, q)
		wantState(t, err, "42501", "reader: "+q)
	}
	if got := one[bool](t, o, "select sl_owner = 'r1' from pgque.slot_lease where sl_slot = 0"); !got {
		t.Error("the reader changed slot_lease directly")
	}
}

// T-security, input validation: a slot or slot count that is not an integer
// is a type error (22P02) before any of pgque runs, and out-of-range values
// are refused with PQ011 (NULL: 22004), as the reader, on every function
// that takes them.
func TestSecuritySlotArguments(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := setupSecurity(t)
	o, r := s.owner, s.reader
	if one[int32](t, o, "select pgque.create_queue('sec')") != 1 {
		t.Fatal("create_queue failed")
	}
	if _, err := o.Exec(ctx, "create table public.x (id int)"); err != nil {
		t.Fatal(err)
	}
	for k := range 2 {
		one[int32](t, r, "select pgque.subscribe_slot('sec', 'c', $1, 2)", k)
	}
	mustClaim(t, r, "sec", "c", 0, "r1", "1 hour")

	// Each call takes the slot as $1 and, when nslots, the slot count as $2.
	calls := []struct {
		name, sql string
		nslots    bool
	}{
		{"subscribe_slot", "select pgque.subscribe_slot('sec', 'c', $1, $2)", true},
		{"unsubscribe_slot", "select pgque.unsubscribe_slot('sec', 'c', $1, $2)", true},
		{"receive_partitioned", "select * from pgque.receive_partitioned('sec', 'c', $1, $2, 'r1', '" + noToken + "', 10)", true},
		{"ack_partitioned", "select pgque.ack_partitioned('sec', 'c', $1, $2, 'r1', '" + noToken + "', 1, 1, 1)", true},
		{"nack_partitioned", "select pgque.nack_partitioned('sec', 'c', $1, $2, 'r1', '" + noToken + "', 1, '0 s', 'x')", true},
		// claim_slot and release_slot take no slot count; the persisted N
		// bounds the slot.
		{"claim_slot", "select epoch from pgque.claim_slot('sec', 'c', $1, 'r1', '1 hour')", false},
		{"release_slot", "select pgque.release_slot('sec', 'c', $1, 'r1', '" + noToken + "')", false},
	}
	cases := []struct {
		slot, nslots any
		want         string
	}{
		{-1, 2, "PQ011"},
		{2, 2, "PQ011"},
		{1000, 2, "PQ011"},
		{nil, 2, "22004"},
	}
	nslotCases := []struct {
		slot, nslots any
		want         string
	}{
		{0, 0, "PQ011"},
		{0, -2, "PQ011"},
		{0, 5000, "PQ011"},
		{0, nil, "22004"},
	}
	for _, c := range calls {
		all := cases
		if c.nslots {
			all = append(all, nslotCases...)
		}
		for _, tc := range all {
			args := []any{tc.slot}
			if c.nslots {
				args = append(args, tc.nslots)
			}
			_, err := r.Exec(ctx, c.sql, args...)
			wantState(t, err, tc.want, fmt.Sprintf("%s(slot %v, nslots %v)", c.name, tc.slot, tc.nslots))
		}
		// Text that is not an integer, sent as a literal: the type system
		// refuses it; nothing of it runs.
		injected := strings.Replace(strings.Replace(c.sql, "$1", "'1; drop table public.x'", 1), "$2", "2", 1)
		_, err := r.Exec(ctx, injected, pgx.QueryExecModeSimpleProtocol)
		wantState(t, err, "22P02", c.name+" with slot '1; drop table public.x'")
		if c.nslots {
			injected = strings.Replace(strings.Replace(c.sql, "$1", "0", 1), "$2", "'2; drop table public.x'", 1)
			_, err = r.Exec(ctx, injected, pgx.QueryExecModeSimpleProtocol)
			wantState(t, err, "22P02", c.name+" with nslots '2; drop table public.x'")
		}
	}
	if !one[bool](t, o, "select to_regclass('public.x') is not null") {
		t.Error("table public.x was dropped")
	}
	// Nothing was changed by the refused calls.
	if got := one[int64](t, o, "select count(*) from pgque.slot_lease"); got != 2 {
		t.Errorf("%d slots after refused calls, want 2", got)
	}
	if got := one[string](t, o, "select sl_owner from pgque.slot_lease where sl_slot = 0"); got != "r1" {
		t.Errorf("slot 0 owned by %s after refused calls, want r1", got)
	}
}

// T-security, privileges: no function of schema pgque is executable by
// PUBLIC, and every SECURITY DEFINER function pins search_path, both when a
// superuser installed pgque (the harness template) and when a non-superuser
// owner did.
func TestSecurityPrivileges(t *testing.T) {
	t.Parallel()
	s := setupSecurity(t)
	su := pgtest.Conn(t, pgtest.NewInstalledDB(t))
	for _, c := range []struct {
		name string
		conn *pgx.Conn
	}{{"non-superuser install", s.owner}, {"superuser install", su}} {
		if n := one[int64](t, c.conn, "select count(*) from pg_catalog.pg_proc where pronamespace = 'pgque'::regnamespace"); n < 20 {
			t.Fatalf("%s: only %d functions in schema pgque", c.name, n)
		}
		public := one[[]string](t, c.conn, `select coalesce(array_agg(p.oid::regprocedure::text order by 1), '{}')
			  from pg_catalog.pg_proc p
			 where p.pronamespace = 'pgque'::regnamespace
			   and (p.proacl is null -- default privileges: EXECUTE for PUBLIC
			        or exists (select 1 from pg_catalog.aclexplode(p.proacl) a
			                    where a.grantee = 0 and a.privilege_type = 'EXECUTE'))`)
		if len(public) > 0 {
			t.Errorf("%s: functions executable by PUBLIC: %v", c.name, public)
		}
		unpinned := one[[]string](t, c.conn, `select coalesce(array_agg(p.oid::regprocedure::text order by 1), '{}')
			  from pg_catalog.pg_proc p
			 where p.pronamespace = 'pgque'::regnamespace and p.prosecdef
			   and not exists (select 1 from unnest(p.proconfig) c where c like 'search_path=%')`)
		if len(unpinned) > 0 {
			t.Errorf("%s: SECURITY DEFINER functions without a pinned search_path: %v", c.name, unpinned)
		}
		readerSink := one[bool](t, c.conn, `select pg_catalog.has_function_privilege('pgque_reader',
			'pgque.get_batch_cursor(bigint, text, integer, text)', 'EXECUTE')`)
		if readerSink {
			t.Errorf("%s: pgque_reader may execute get_batch_cursor", c.name)
		}
	}
}

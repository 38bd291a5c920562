package securitytest

import (
	"context"
	"testing"

	"github.com/pgque/pgque/internal/testing/pgtest"
)

// TestBatchCursorExtraWhereIsTheOwners: get_batch_cursor's extra_where is
// SQL run with pgque's owner's rights. A login that holds pgque_admin but is
// not the owner puts a call of its own function there; the function must
// not run (as the owner or at all), the call is refused with 42501, and the
// same login still reads the batch without a predicate. The owner may
// still pass one.
func TestBatchCursorExtraWhereIsTheOwners(t *testing.T) {
	dsn, conn := setupDB(t)
	ctx := context.Background()
	mustExec(t, conn,
		`do $$ begin
			if not exists (select 1 from pg_roles where rolname = 'gbc_admin') then
				create role gbc_admin login in role pgque_admin;
			end if;
		exception when unique_violation or duplicate_object then null; end $$`,
		`create table public.gbc_seen (who text)`,
		`grant insert, select on public.gbc_seen to public`,
		`grant create on schema public to gbc_admin`,
		`select pgque.create_queue('gbc')`,
		`select pgque.subscribe('gbc', 'c')`,
		`select pgque.send('gbc', 't', '{}'::jsonb)`,
		`select pgque.force_next_tick('gbc')`,
		`select pgque.ticker('gbc')`)
	admin := pgtest.Conn(t, pgtest.DSNWith(dsn, "user", "gbc_admin"))
	mustExec(t, admin, `create function public.gbc_whoami() returns boolean language plpgsql as $$
		begin insert into public.gbc_seen values (current_user); return true; end $$`)
	var batch int64
	if err := admin.QueryRow(ctx, `select pgque.next_batch('gbc', 'c')`).Scan(&batch); err != nil || batch == 0 {
		t.Fatalf("next_batch: %d, %v", batch, err)
	}

	tx, err := admin.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_, err = tx.Exec(ctx, `select * from pgque.get_batch_cursor($1, 'c1', 10, 'public.gbc_whoami()')`, batch)
	_ = tx.Rollback(ctx)
	if codeOf(err) != "42501" {
		t.Errorf("admin's extra_where: err %v, want 42501", err)
	}
	var seen []string
	seen = queryNames(t, conn, `select who from public.gbc_seen`)
	if len(seen) != 0 {
		t.Fatalf("the admin's function ran as %v", seen)
	}

	tx, err = admin.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var n int
	err = tx.QueryRow(ctx, `select count(*) from pgque.get_batch_cursor($1, 'c2', 10, null)`, batch).Scan(&n)
	_ = tx.Rollback(ctx)
	if err != nil || n != 1 {
		t.Errorf("admin without a predicate: %d rows, %v; want 1", n, err)
	}

	// The owner (here the superuser that installed pgque) keeps the
	// predicate.
	tx, err = conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	err = tx.QueryRow(ctx, `select count(*) from pgque.get_batch_cursor($1, 'c3', 10, 'ev_type = ''t''')`, batch).Scan(&n)
	_ = tx.Rollback(ctx)
	if err != nil || n != 1 {
		t.Errorf("owner with a predicate: %d rows, %v; want 1", n, err)
	}
}

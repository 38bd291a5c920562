package enginetest

import (
	"context"
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/pgque/pgque/internal/testing/pgtest"
)

// srcEvent is one event emitted by an attached table.
type srcEvent struct {
	ID      int64
	Type    string
	Payload map[string]any
	Key     *string
	Table   *string
	Extra3  *string
}

// srcEvents returns every event of queue q in ev_id order.
func srcEvents(t testing.TB, q db) []srcEvent {
	t.Helper()
	rows, err := q.Query(context.Background(), `select e.ev_id, e.ev_type, e.ev_data, e.ev_extra1, e.ev_extra2, e.ev_extra3
		  from pgque.event e join pgque.queue qu on e.ev_part / 16 = qu.queue_id
		 where qu.queue_name = 'q' order by e.ev_id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var evs []srcEvent
	for rows.Next() {
		var e srcEvent
		var data string
		if err := rows.Scan(&e.ID, &e.Type, &data, &e.Key, &e.Table, &e.Extra3); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal([]byte(data), &e.Payload); err != nil {
			t.Fatalf("payload %q: %v", data, err)
		}
		evs = append(evs, e)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return evs
}

func sp(p *string) string {
	if p == nil {
		return "<nil>"
	}
	return *p
}

// wantEvent checks one event's type, key, table, extra3 and payload.
func wantEvent(t testing.TB, e srcEvent, typ, key, table, extra3 string, payload map[string]any) {
	t.Helper()
	if e.Type != typ || sp(e.Key) != key || sp(e.Table) != table || sp(e.Extra3) != extra3 {
		t.Errorf("event %d: type %s key %s table %s extra3 %s; want %s %s %s %s",
			e.ID, e.Type, sp(e.Key), sp(e.Table), sp(e.Extra3), typ, key, table, extra3)
	}
	if payload != nil && !reflect.DeepEqual(e.Payload, payload) {
		t.Errorf("event %d (%s) payload %v, want %v", e.ID, typ, e.Payload, payload)
	}
}

func setupFiles(t *testing.T) (string, beginner) {
	t.Helper()
	dsn, pool := setupEngine(t)
	exec(t, pool, `create table public.files (id integer primary key, tenant text, name text, size integer)`)
	return dsn, pool
}

// TestAttachTableOperations: each operation emits its event in the writing
// transaction (a rollback emits nothing); update carries the new row and
// the changed columns; an update that changes nothing emits nothing;
// TRUNCATE is refused; a NULL key column gives the NULL key.
func TestAttachTableOperations(t *testing.T) {
	ctx := context.Background()
	_, pool := setupFiles(t)
	exec(t, pool, `select pgque.attach_table('q', 'public.files', 'tenant')`)

	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	exec(t, tx, `insert into public.files values (1, 'A', 'a.pdf', 10)`)
	if n := len(srcEvents(t, tx)); n != 1 {
		t.Fatalf("%d events inside the writing transaction, want 1", n)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if n := len(srcEvents(t, pool)); n != 0 {
		t.Fatalf("%d events after rollback, want 0", n)
	}

	exec(t, pool, `insert into public.files values (1, 'A', 'a.pdf', 10), (2, null, 'b.pdf', 20)`)
	exec(t, pool, `update public.files set size = 11 where id = 1`)
	exec(t, pool, `update public.files set size = 11 where id = 1`) // changes nothing
	exec(t, pool, `delete from public.files where id = 1`)
	evs := srcEvents(t, pool)
	if len(evs) != 4 {
		t.Fatalf("%d events, want 4: %+v", len(evs), evs)
	}
	row := func(id float64, tenant any, name string, size float64) map[string]any {
		return map[string]any{"id": id, "tenant": tenant, "name": name, "size": size}
	}
	wantEvent(t, evs[0], "insert", "A", "public.files", "<nil>", row(1, "A", "a.pdf", 10))
	wantEvent(t, evs[1], "insert", "<nil>", "public.files", "<nil>", row(2, nil, "b.pdf", 20))
	wantEvent(t, evs[2], "update", "A", "public.files", `["size"]`, row(1, "A", "a.pdf", 11))
	wantEvent(t, evs[3], "delete", "A", "public.files", "<nil>", row(1, "A", "a.pdf", 11))

	wantCode(t, "truncate of an attached table", queryErr(pool, `truncate public.files`), "PQ060", "public.files", "detach")
	if n := scalar[int64](t, pool, `select count(*) from public.files`); n != 1 {
		t.Fatalf("refused truncate removed rows: %d left", n)
	}
	if got := column[string](t, pool, `select source_table || ':' || key_column || ':' || array_to_string(operations, ',') from pgque.attached_tables()`); len(got) != 1 || got[0] != "public.files:tenant:delete,insert,update" {
		t.Fatalf("attached_tables: %v", got)
	}
}

// TestAttachTableTenantMove: an update that changes the key emits a delete
// of the old row on the old key, then an insert of the new row on the new
// key, so each tenant's stream is consistent alone.
func TestAttachTableTenantMove(t *testing.T) {
	_, pool := setupFiles(t)
	exec(t, pool, `select pgque.attach_table('q', 'public.files', 'tenant')`)
	exec(t, pool, `insert into public.files values (1, 'A', 'a.pdf', 10)`)
	exec(t, pool, `update public.files set tenant = 'B', size = 12 where id = 1`)
	evs := srcEvents(t, pool)
	if len(evs) != 3 {
		t.Fatalf("%d events, want 3", len(evs))
	}
	wantEvent(t, evs[1], "delete", "A", "public.files", "moved",
		map[string]any{"id": 1.0, "tenant": "A", "name": "a.pdf", "size": 10.0})
	wantEvent(t, evs[2], "insert", "B", "public.files", "moved",
		map[string]any{"id": 1.0, "tenant": "B", "name": "a.pdf", "size": 12.0})
}

// TestAttachTableReadsThroughSlots: trigger events are consumed through
// receive_partitioned like sent ones: each key arrives on its slot, with
// its payload, type and table.
func TestAttachTableReadsThroughSlots(t *testing.T) {
	_, pool := setupFiles(t)
	exec(t, pool, `select pgque.subscribe_slot('q', 'g', s, 4) from generate_series(0, 3) s`)
	exec(t, pool, `select pgque.attach_table('q', 'public.files', 'tenant')`)
	exec(t, pool, `insert into public.files select i, 'tenant-' || (i % 7), 'f' || i, i from generate_series(1, 40) i`)
	tick(t, pool, "q")
	seen := 0
	for slot := 0; slot < 4; slot++ {
		token := scalar[string](t, pool, `select token::text from pgque.claim_slot('q', 'g', $1, 'w')`, slot)
		rows, err := pool.Query(context.Background(), `select type, payload, partition_key, extra2, pgque.slot_of(partition_key, 4),
			  epoch || ', ' || batch_id || ', ' || msg_id
			  from pgque.receive_partitioned('q', 'g', $1, 4, 'w', $2::uuid, 1000)`, slot, token)
		if err != nil {
			t.Fatal(err)
		}
		// proof names the chunk for the fenced ack: epoch, batch id, msg id.
		var proof string
		for rows.Next() {
			var typ, key, table string
			var payload map[string]any
			var at int32
			if err := rows.Scan(&typ, &payload, &key, &table, &at, &proof); err != nil {
				t.Fatal(err)
			}
			if typ != "insert" || table != "public.files" || payload["tenant"] != key || int(at) != slot {
				t.Errorf("slot %d got %s %s key %s (slot %d) payload %v", slot, typ, table, key, at, payload)
			}
			seen++
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		if proof != "" {
			exec(t, pool, `select pgque.ack_partitioned('q', 'g', $1, 4, 'w', $2::uuid, `+proof+`)`, slot, token)
		}
	}
	if seen != 40 {
		t.Fatalf("received %d events over the slots, want 40", seen)
	}
}

// TestAttachTableOptions: keep and exclude column lists, a WHEN filter,
// chosen operations, skip_unchanged off, TRUNCATE as an event, awkward
// names and types, a dropped column, re-attach and detach.
func TestAttachTableOptions(t *testing.T) {
	_, pool := setupEngine(t)
	exec(t, pool, `create schema "odd schema"`)
	exec(t, pool, `create table "odd schema"."My ""Files"" Table" (
		id integer primary key, "Tenant Id" text, doc jsonb, blob bytea, tags text[], "we""ird col" numeric, gone text)`)
	tbl := `'"odd schema"."My ""Files"" Table"'`
	tname := `"odd schema"."My ""Files"" Table"`
	exec(t, pool, `select pgque.attach_table('q', `+tbl+`, 'Tenant Id', exclude_columns => array['blob'])`)
	exec(t, pool, `insert into `+tname+` values (1, 't 1', '{"x": [1, 2]}', '\xdead', array['a', 'b''c'], 1.5, 'bye')`)
	exec(t, pool, `alter table `+tname+` drop column gone`)
	exec(t, pool, `update `+tname+` set blob = '\xbeef' where id = 1`) // only an excluded column changed
	exec(t, pool, `update `+tname+` set tags = array['z'] where id = 1`)
	evs := srcEvents(t, pool)
	if len(evs) != 2 {
		t.Fatalf("%d events, want 2: %+v", len(evs), evs)
	}
	wantEvent(t, evs[0], "insert", "t 1", tname, "<nil>", map[string]any{
		"id": 1.0, "Tenant Id": "t 1", "doc": map[string]any{"x": []any{1.0, 2.0}},
		"tags": []any{"a", "b'c"}, `we"ird col`: 1.5, "gone": "bye"})
	wantEvent(t, evs[1], "update", "t 1", tname, `["tags"]`, map[string]any{
		"id": 1.0, "Tenant Id": "t 1", "doc": map[string]any{"x": []any{1.0, 2.0}},
		"tags": []any{"z"}, `we"ird col`: 1.5})

	// Keep only some columns, inserts only, a WHEN filter; bytea shows as
	// its hex text.
	exec(t, pool, `select pgque.attach_table('q', `+tbl+`, 'Tenant Id', operations => array['INSERT'],
		columns => array['id', 'blob'], when_condition => 'new.id > 10')`)
	exec(t, pool, `insert into `+tname+` (id, "Tenant Id", blob) values (5, 'x', '\x01'), (11, 'y', '\x02')`)
	exec(t, pool, `delete from `+tname+` where id = 11`)
	evs = srcEvents(t, pool)
	if len(evs) != 3 {
		t.Fatalf("%d events after re-attach, want 3", len(evs))
	}
	wantEvent(t, evs[2], "insert", "y", tname, "<nil>", map[string]any{"id": 11.0, "blob": `\x02`})

	// skip_unchanged off: a no-op update is an event; truncate emits one.
	exec(t, pool, `select pgque.attach_table('q', `+tbl+`, 'Tenant Id', operations => array['update', 'truncate'], skip_unchanged => false)`)
	exec(t, pool, `update `+tname+` set id = id where id = 1`)
	exec(t, pool, `truncate `+tname)
	evs = srcEvents(t, pool)
	if len(evs) != 5 {
		t.Fatalf("%d events, want 5", len(evs))
	}
	wantEvent(t, evs[3], "update", "t 1", tname, "[]", nil)
	wantEvent(t, evs[4], "truncate", "<nil>", tname, "<nil>", map[string]any{"table": tname})

	// Detached: writes emit nothing, the function is gone, a second detach
	// is an error.
	exec(t, pool, `select pgque.detach_table('q', `+tbl+`)`)
	exec(t, pool, `insert into `+tname+` (id) values (100)`)
	exec(t, pool, `truncate `+tname)
	if n := len(srcEvents(t, pool)); n != 5 {
		t.Fatalf("%d events after detach, want 5", n)
	}
	if n := scalar[int64](t, pool, `select count(*) from pg_catalog.pg_proc where proname like '\_src\_%'`); n != 0 {
		t.Fatalf("%d generated functions left after detach", n)
	}
	wantCode(t, "second detach", queryErr(pool, `select pgque.detach_table('q', `+tbl+`)`), "PQ061", "not attached")
}

// TestAttachTableBadInput: unknown columns, tables and operations are
// refused with their SQLSTATEs; a queue with an attached table cannot be
// dropped; a dropped table's attachment is cleaned up by maint().
func TestAttachTableBadInput(t *testing.T) {
	_, pool := setupFiles(t)
	for _, c := range []struct{ sql, code, mention string }{
		{`select pgque.attach_table('q', 'public.files', 'nope')`, "42703", "nope"},
		{`select pgque.attach_table('q', 'public.files', 'tenant', columns => array['id', 'x'])`, "42703", "x"},
		{`select pgque.attach_table('q', 'public.files', 'tenant', columns => array['id'], exclude_columns => array['name'])`, "PQ011", "not both"},
		{`select pgque.attach_table('q', 'public.files', 'tenant', operations => array['upsert'])`, "PQ011", "operations"},
		{`select pgque.attach_table('q', 'public.files', 'tenant', operations => '{}')`, "PQ011", "operations"},
		{`select pgque.attach_table('q', 'public.files', 'tenant', when_condition => ' ')`, "PQ011", "when_condition"},
		{`select pgque.attach_table('nope', 'public.files', 'tenant')`, "PQ001", "nope"},
		{`select pgque.attach_table('q', 'pgque.queue', 'queue_name')`, "PQ011", "own tables"},
		{`select pgque.attach_table('q', 'public.files', null)`, "22004", "NULL"},
		{`select pgque.detach_table('q', 'public.files')`, "PQ061", "not attached"},
	} {
		wantCode(t, c.sql, queryErr(pool, c.sql), c.code, c.mention)
	}
	if n := scalar[int64](t, pool, `select count(*) from pg_catalog.pg_trigger where tgrelid = 'public.files'::regclass`); n != 0 {
		t.Fatalf("refused attaches left %d triggers", n)
	}
	exec(t, pool, `select pgque.attach_table('q', 'public.files', 'tenant')`)
	wantCode(t, "drop_queue with an attached table", queryErr(pool, `select pgque.drop_queue('q', true)`), "PQ062", "public.files")
	exec(t, pool, `drop table public.files`)
	exec(t, pool, `select pgque.maint()`)
	if n := scalar[int64](t, pool, `select count(*) from pgque.table_source`); n != 0 {
		t.Fatalf("%d attachments of a dropped table left after maint()", n)
	}
	exec(t, pool, `select pgque.drop_queue('q', true)`)
}

// TestAttachTableWriterRoles: a non-superuser table owner holding
// pgque_admin attaches its table; a writer role with no pgque grant at all
// (only INSERT/UPDATE on the table) emits events through the trigger; it
// cannot use the generated function on a table of its own.
func TestAttachTableWriterRoles(t *testing.T) {
	ctx := context.Background()
	dsn, pool := setupEngine(t)
	for _, s := range []string{
		`create role st_owner`, `grant pgque_admin to st_owner`, `grant create, usage on schema public to st_owner`,
		`create role st_writer`, `grant usage on schema public to st_writer`,
		`set role st_owner`,
		`create table public.files (id integer primary key, tenant text)`,
		`grant insert, update on public.files to st_writer`,
		`select pgque.attach_table('q', 'public.files', 'tenant')`,
		`reset role`,
	} {
		exec(t, pool, s)
	}
	_ = dsn
	conn, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	exec(t, conn, `set local role st_writer`)
	if err := queryErr(conn, `select pgque.send('q', 't', '{}', 'k')`); pgCode(err) != "42501" {
		t.Fatalf("writer without a pgque grant could send: %v", err)
	}
	if err := conn.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	exec(t, tx, `set local role st_writer`)
	exec(t, tx, `insert into public.files values (1, 'A')`)
	exec(t, tx, `update public.files set tenant = 'B'`)
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	evs := srcEvents(t, pool)
	if len(evs) != 3 || evs[0].Type != "insert" || evs[2].Type != "insert" || sp(evs[2].Key) != "B" {
		t.Fatalf("writer's events: %+v", evs)
	}
	// The trigger functions write only for attached tables: the same
	// triggers on another table are refused.
	qid := scalar[string](t, pool, `select ts_queue::text from pgque.table_source`)
	exec(t, pool, `create table public.mine (id integer primary key, tenant text)`)
	exec(t, pool, `create trigger steal after insert on public.mine for each row
		execute function pgque._table_source_capture('`+qid+`', 'tenant', 'true', 'all')`)
	exec(t, pool, `create trigger steal_emit after insert on public.mine for each row
		execute function pgque._table_source_emit('`+qid+`')`)
	err = queryErr(pool, `insert into public.mine values (1, 'A')`)
	wantCode(t, "pgque's trigger functions on another table", err, "42501", "not attached")

	// With the capture trigger disabled by the table's owner, writes are
	// refused rather than sent without their row.
	exec(t, pool, `alter table public.files disable trigger pgque_q`+qid)
	wantCode(t, "write with the capture trigger disabled",
		queryErr(pool, `insert into public.files values (2, 'C')`), "PQ064", "public.files", "attach the table again")
	exec(t, pool, `alter table public.files enable trigger pgque_q`+qid)
	exec(t, pool, `insert into public.files values (2, 'C')`)
	if evs := srcEvents(t, pool); len(evs) != 4 || sp(evs[3].Key) != "C" {
		t.Fatalf("events after enabling the capture trigger again: %+v", evs)
	}
}

// TestAttachTableNonSuperuserLogin: a table owner that logs in as itself (no
// superuser anywhere in the session) and holds pgque_admin attaches and
// detaches its own table; it cannot attach a table it does not own.
func TestAttachTableNonSuperuserLogin(t *testing.T) {
	ctx := context.Background()
	dsn, pool := setupEngine(t)
	// Roles are cluster-wide: name it after this test's database.
	role := "owner_" + scalar[string](t, pool, "select md5(current_database())")[:16]
	for _, s := range []string{
		`create role ` + quoteIdent(role) + ` login`,
		`grant pgque_admin to ` + quoteIdent(role),
		`grant create, usage on schema public to ` + quoteIdent(role),
		`create table public.not_mine (id integer primary key, tenant text)`,
	} {
		exec(t, pool, s)
	}
	t.Cleanup(func() {
		_, _ = pool.Exec(ctx, `drop table if exists public.own`)
		_, _ = pool.Exec(ctx, `drop owned by `+quoteIdent(role))
		_, _ = pool.Exec(ctx, `drop role if exists `+quoteIdent(role))
	})
	owner := pgtest.Conn(t, pgtest.DSNWith(dsn, "user", role))
	if su := scalar[bool](t, owner, `select rolsuper from pg_roles where rolname = session_user`); su {
		t.Fatal("the owner session is a superuser")
	}
	exec(t, owner, `create table public.own (id integer primary key, tenant text)`)
	exec(t, owner, `select pgque.attach_table('q', 'public.own', 'tenant')`)
	exec(t, owner, `insert into public.own values (1, 'A')`)
	if evs := srcEvents(t, pool); len(evs) != 1 || sp(evs[0].Key) != "A" || sp(evs[0].Table) != "public.own" {
		t.Fatalf("events: %+v", evs)
	}
	wantCode(t, "attaching a table the role does not own",
		queryErr(owner, `select pgque.attach_table('q', 'public.not_mine', 'tenant')`), "42501", "not_mine")
	exec(t, owner, `select pgque.detach_table('q', 'public.own')`)
	exec(t, owner, `insert into public.own values (2, 'B')`)
	if n := len(srcEvents(t, pool)); n != 1 {
		t.Fatalf("%d events after detach, want 1", n)
	}
}

// quoteIdent quotes an SQL identifier.
func quoteIdent(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }

// TestAttachPartitionedTable: a partitioned table can be attached; rows
// written into any partition emit events naming the partitioned table.
func TestAttachPartitionedTable(t *testing.T) {
	_, pool := setupEngine(t)
	exec(t, pool, `create table public.pfiles (id integer, tenant text not null, primary key (tenant, id)) partition by list (tenant)`)
	exec(t, pool, `create table public.pfiles_a partition of public.pfiles for values in ('A')`)
	exec(t, pool, `create table public.pfiles_b partition of public.pfiles for values in ('B')`)
	exec(t, pool, `select pgque.attach_table('q', 'public.pfiles', 'tenant')`)
	exec(t, pool, `insert into public.pfiles values (1, 'A'), (2, 'B')`)
	exec(t, pool, `update public.pfiles set tenant = 'B' where id = 1`) // moves the row to the other partition
	evs := srcEvents(t, pool)
	if len(evs) != 4 {
		t.Fatalf("%d events, want 4: %+v", len(evs), evs)
	}
	for _, e := range evs {
		if sp(e.Table) != "public.pfiles" {
			t.Errorf("event %d names table %s", e.ID, sp(e.Table))
		}
	}
	// Moving a row between partitions is a DELETE and an INSERT for
	// PostgreSQL: the tenant's streams see a delete on A and an insert on B.
	wantEvent(t, evs[2], "delete", "A", "public.pfiles", "<nil>", nil)
	wantEvent(t, evs[3], "insert", "B", "public.pfiles", "<nil>", nil)
	wantCode(t, "truncate of an attached partitioned table", queryErr(pool, `truncate public.pfiles`), "PQ060")
}

// TestAttachTableReinstall: re-applying the install keeps attachments
// working with their options, follows a renamed table's name, and an
// attachment that no longer validates (its key column renamed) makes
// neither the install nor other tables fail.
func TestAttachTableReinstall(t *testing.T) {
	dsn, pool := setupFiles(t)
	exec(t, pool, `create table public.renamed (id integer primary key, tenant text)`)
	exec(t, pool, `select pgque.attach_table('q', 'public.files', 'tenant', exclude_columns => array['size'])`)
	exec(t, pool, `select pgque.attach_table('q', 'public.renamed', 'tenant')`)
	exec(t, pool, `alter table public.renamed rename column tenant to owner`)
	exec(t, pool, `alter table public.files rename to "Files 2"`)
	pgtest.Install(t, dsn)
	exec(t, pool, `insert into public."Files 2" values (1, 'A', 'a.pdf', 10)`)
	evs := srcEvents(t, pool)
	if len(evs) != 1 {
		t.Fatalf("%d events after reinstall, want 1", len(evs))
	}
	wantEvent(t, evs[0], "insert", "A", `public."Files 2"`, "<nil>", map[string]any{"id": 1.0, "tenant": "A", "name": "a.pdf"})
	wantCode(t, "write to a table whose key column was renamed",
		queryErr(pool, `insert into public.renamed values (1, 'B')`), "42703", "tenant")
	exec(t, pool, `select pgque.attach_table('q', 'public.renamed', 'owner')`)
	exec(t, pool, `insert into public.renamed values (1, 'B')`)
	if evs := srcEvents(t, pool); len(evs) != 2 || sp(evs[1].Key) != "B" {
		t.Fatalf("events after re-attaching with the new key column: %+v", evs)
	}
}

// TestAttachTableToTwoQueues: one table attached to two queues, one of
// them with an id of two digits (so the two attachments' triggers
// interleave in name order: pgque_q1, pgque_q10, pgque_q10_emit,
// pgque_q1_emit): every row of a multi-row write reaches both queues, each
// with its own options.
func TestAttachTableToTwoQueues(t *testing.T) {
	_, pool := setupFiles(t)
	exec(t, pool, `select pgque.create_queue('x' || i) from generate_series(2, 10) i`)
	q10 := scalar[string](t, pool, `select queue_name from pgque.queue where queue_id = 10`)
	exec(t, pool, `select pgque.attach_table('q', 'public.files', 'tenant')`)
	exec(t, pool, `select pgque.attach_table($1, 'public.files', 'name', columns => array['id'])`, q10)
	exec(t, pool, `insert into public.files values (1, 'A', 'a.pdf', 10), (2, 'B', 'b.pdf', 20)`)
	exec(t, pool, `update public.files set size = size + 1`)
	evs := srcEvents(t, pool)
	if len(evs) != 4 {
		t.Fatalf("%d events in q, want 4: %+v", len(evs), evs)
	}
	wantEvent(t, evs[1], "insert", "B", "public.files", "<nil>", map[string]any{"id": 2.0, "tenant": "B", "name": "b.pdf", "size": 20.0})
	got := column[string](t, pool, `select e.ev_type || ' ' || e.ev_extra1 || ' ' || e.ev_data from pgque.event e
		 where e.ev_part / 16 = 10 order by e.ev_id`)
	want := []string{`insert a.pdf {"id": 1}`, `insert b.pdf {"id": 2}`}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("events in %s: %q, want %q (the update changes no kept column)", q10, got, want)
	}
}

package cli

import (
	"context"
	"strings"
	"testing"

	"github.com/pgque/pgque/cmd/pgque/internal/view"
)

// TestSendDedupKeyCLI: --dedup-key and the envelope's dedup_key make a
// retried send print the first event's id and store nothing; --dedup-key
// with several stdin lines is a usage error.
func TestSendDedupKeyCLI(t *testing.T) {
	t.Parallel()
	c := setup(t)
	c.ok("", "install")
	c.ok("", "queue", "create", "q")
	var cfg view.QueueConfig
	c.okJSON(&cfg, "queue", "config", "q", "--json")
	if cfg.DedupWindow != "00:05:00" {
		t.Errorf("queue config: default dedup_window %q, want 00:05:00", cfg.DedupWindow)
	}
	c.okJSON(&cfg, "queue", "config", "q", "--set", "dedup_window=10 minutes", "--json")
	if cfg.DedupWindow != "00:10:00" {
		t.Errorf("queue config --set dedup_window: %+v", cfg)
	}
	first := evIDs(t, c.ok("", "send", "q", `{"n": 1}`, "--dedup-key", "req-1"))
	again := evIDs(t, c.ok("", "send", "q", `{"n": 1}`, "--dedup-key", "req-1"))
	if len(first) != 1 || len(again) != 1 || first[0] != again[0] {
		t.Fatalf("retried send printed %v, first %v", again, first)
	}
	env := evIDs(t, c.ok(`{"dedup_key": "req-1", "payload": {"n": 1}}
{"dedup_key": "req-2", "payload": {"n": 2}}
{"dedup_key": "req-2", "payload": {"n": 2}}
`, "send", "q", "--envelope"))
	if len(env) != 3 || env[0] != first[0] || env[1] != env[2] || env[1] == first[0] {
		t.Fatalf("envelope sends printed %v (first %d)", env, first[0])
	}
	if r := c.exec("{}\n{}\n", "send", "q", "--dedup-key", "x"); r.code == 0 || !strings.Contains(r.stderr, "--dedup-key names one event") {
		t.Fatalf("--dedup-key with two lines: %v", r)
	}
	var n int
	if err := c.conn().QueryRow(context.Background(), `select count(*) from pgque.event`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 2 {
		t.Fatalf("%d events stored, want 2", n)
	}
}

// TestTableCommands: table attach makes the table's writes emit events,
// list shows the attachment, detach removes it, and a bad column is a
// clear error.
func TestTableCommands(t *testing.T) {
	t.Parallel()
	c := setup(t)
	c.ok("", "install")
	c.ok("", "queue", "create", "files")
	conn := c.conn()
	ctx := context.Background()
	if _, err := conn.Exec(ctx, `create table public.files (id integer primary key, tenant text, secret text)`); err != nil {
		t.Fatal(err)
	}
	if r := c.exec("", "table", "attach", "files", "public.files", "nope"); r.code == 0 || !strings.Contains(r.stderr, "column nope does not exist") {
		t.Fatalf("attach with an unknown key column: %v", r)
	}
	if out := c.ok("", "table", "attach", "files", "public.files", "tenant", "--exclude", "secret", "--ops", "insert,delete"); !strings.Contains(out, "attached public.files to queue files") {
		t.Errorf("attach printed %q", out)
	}
	if _, err := conn.Exec(ctx, `insert into public.files values (1, 'A', 's'); update public.files set tenant = 'A2' where id = 1; delete from public.files`); err != nil {
		t.Fatal(err)
	}
	var got string
	if err := conn.QueryRow(ctx, `select string_agg(ev_type || ':' || ev_extra1 || ':' || ev_data, ' ' order by ev_id) from pgque.event`).Scan(&got); err != nil {
		t.Fatal(err)
	}
	// Updates are not among the operations: the update emits nothing, not
	// even for the key change.
	want := `insert:A:{"id": 1, "tenant": "A"} delete:A2:{"id": 1, "tenant": "A2"}`
	if got != want {
		t.Errorf("events\n got %s\nwant %s", got, want)
	}
	var list []attachedTable
	c.okJSON(&list, "table", "list", "--json")
	if len(list) != 1 || list[0].Queue != "files" || list[0].Table == nil || *list[0].Table != "public.files" ||
		list[0].KeyColumn != "tenant" || strings.Join(list[0].ExcludeColumns, ",") != "secret" || strings.Join(list[0].Operations, ",") != "delete,insert" {
		t.Errorf("table list --json = %+v", list)
	}
	if out := c.ok("", "table", "list"); !strings.Contains(out, "all but secret") {
		t.Errorf("table list printed %q", out)
	}
	c.ok("", "table", "detach", "files", "public.files")
	if r := c.exec("", "table", "detach", "files", "public.files"); r.code == 0 || !strings.Contains(r.stderr, "PQ061") {
		t.Fatalf("second detach: %v", r)
	}
	c.okJSON(&list, "table", "list", "--json")
	if len(list) != 0 {
		t.Errorf("after detach: %+v", list)
	}
}

package partitiontest

import (
	"context"
	"io/fs"
	"maps"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgque/pgque/internal/testing/pgtest"
	sqlfiles "github.com/pgque/pgque/sql"
)

// engineOnlyDB applies the install script's files up to and including
// engine/grants.sql, in one transaction, to a fresh database.
func engineOnlyDB(t *testing.T) *pgx.Conn {
	t.Helper()
	ctx := context.Background()
	files, err := sqlfiles.Files()
	if err != nil {
		t.Fatal(err)
	}
	end := slices.IndexFunc(files, func(f sqlfiles.File) bool { return f.Name == "engine/grants.sql" })
	if end < 0 {
		t.Fatal("install.list does not list engine/grants.sql")
	}
	for _, f := range files[:end+1] {
		if !strings.HasPrefix(f.Name, "engine/") {
			t.Fatalf("install.list applies %s before engine/grants.sql: the engine prefix is not the engine alone", f.Name)
		}
	}
	conn := pgtest.Conn(t, pgtest.NewDB(t))
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		for _, f := range files[:end+1] {
			if _, err := tx.Exec(ctx, f.Body); err != nil {
				t.Fatalf("applying %s: %v", f.Name, err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return conn
}

// catalog returns name → definition of schema pgque's functions and of the
// shape of its tables, as PostgreSQL prints them. NOT NULL shows in the
// column list only: PostgreSQL 18 also records it as a constraint (contype
// 'n') whose generated name is no part of the table's shape, and earlier
// versions have no such row.
func catalog(t *testing.T, conn *pgx.Conn) map[string]string {
	t.Helper()
	rows, err := conn.Query(context.Background(), `
		select 'function ' || p.oid::regprocedure::text,
		       pg_catalog.pg_get_functiondef(p.oid) || E'\nacl: ' || coalesce(p.proacl::text, '(default)')
		  from pg_catalog.pg_proc p
		 where p.pronamespace = 'pgque'::regnamespace and p.prokind <> 'a'
		union all
		select 'table ' || c.relname,
		       'kind ' || c.relkind::text || ' options ' || coalesce(c.reloptions::text, '') || ' acl ' || coalesce(c.relacl::text, '')
		       || E'\ncolumns: ' || coalesce((select string_agg(a.attname || ' ' || pg_catalog.format_type(a.atttypid, a.atttypmod)
		                                         || case when a.attnotnull then ' not null' else '' end
		                                         || coalesce(' default ' || pg_catalog.pg_get_expr(d.adbin, d.adrelid), ''), ', ' order by a.attnum)
		                                     from pg_catalog.pg_attribute a
		                                     left join pg_catalog.pg_attrdef d on d.adrelid = a.attrelid and d.adnum = a.attnum
		                                    where a.attrelid = c.oid and a.attnum > 0 and not a.attisdropped), '')
		       || E'\nconstraints: ' || coalesce((select string_agg(pg_catalog.pg_get_constraintdef(k.oid), '; ' order by k.conname)
		                                         from pg_catalog.pg_constraint k where k.conrelid = c.oid and k.contype <> 'n'), '')
		       || E'\nindexes: ' || coalesce((select string_agg(pg_catalog.pg_get_indexdef(i.indexrelid), '; ' order by pg_catalog.pg_get_indexdef(i.indexrelid))
		                                     from pg_catalog.pg_index i where i.indrelid = c.oid), '')
		       || E'\ntriggers: ' || coalesce((select string_agg(pg_catalog.pg_get_triggerdef(g.oid), '; ' order by g.tgname)
		                                      from pg_catalog.pg_trigger g where g.tgrelid = c.oid and not g.tgisinternal), '')
		       || E'\npolicies: ' || coalesce((select string_agg(o.polname, ', ' order by o.polname)
		                                      from pg_catalog.pg_policy o where o.polrelid = c.oid), '')
		       || E'\nrules: ' || coalesce((select string_agg(r.rulename, ', ' order by r.rulename)
		                                   from pg_catalog.pg_rewrite r where r.ev_class = c.oid), '')
		  from pg_catalog.pg_class c
		 where c.relnamespace = 'pgque'::regnamespace and c.relkind in ('r', 'p')`)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for rows.Next() {
		var name, def string
		if err := rows.Scan(&name, &def); err != nil {
			t.Fatal(err)
		}
		out[name] = def
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// T-engine-untouched, in the catalog: installing the api and partition
// layers changes no engine function (definition and privileges, as
// pg_get_functiondef and proacl show them) and no engine table's shape.
func TestEngineUntouchedCatalog(t *testing.T) {
	t.Parallel()
	engine := catalog(t, engineOnlyDB(t))
	full := catalog(t, pgtest.Conn(t, pgtest.NewInstalledDB(t)))
	functions := 0
	for _, name := range slices.Sorted(maps.Keys(engine)) {
		if strings.HasPrefix(name, "function ") {
			functions++
		}
		got, ok := full[name]
		switch {
		case !ok:
			t.Errorf("%s, defined by the engine, is gone after the full install", name)
		case got != engine[name]:
			t.Errorf("the full install changed %s:\n--- engine only ---\n%s\n--- full install ---\n%s", name, engine[name], got)
		}
	}
	if functions < 20 {
		t.Fatalf("only %d engine functions found; the engine-only install is incomplete", functions)
	}
	t.Logf("%d engine functions and %d engine tables compared", functions, len(engine)-functions)
}

// Rule for the text check below. The engine may not know the partition
// layer: no routing hash, no partition key, no slots, no slot leases, no
// name of anything the partition layer defines. Precisely:
//
//   - Comments (-- and /* */) are ignored: they are prose for readers and
//     may say how the layers above use the engine. Everything else counts,
//     string literals included (error messages are behaviour).
//   - The remaining text is split into words ([A-Za-z0-9_]+, case-folded).
//     A word is forbidden if it contains "slot", "hashtextextended",
//     "partition_key" or "partitioned"; if it contains "lease" and is not
//     part of the engine's own ticker lease ("ticker_lease", "lease_until",
//     or "lease" right after "ticker"); or if it is the name of a function,
//     table, view or index that sql/partition/** creates.
//   - The word "partition" is allowed only as PostgreSQL's DDL for the
//     list-partitioned event table: "partition by", "partition of",
//     "attach partition", "detach partition".
//
// engineViolations applies the rule to code whose comments were already
// stripped (stripComments).
func engineViolations(code string, partitionNames map[string]bool) []string {
	var out []string
	words := wordRE.FindAllString(strings.ToLower(code), -1)
	for i, w := range words {
		prev, next := "", ""
		if i > 0 {
			prev = words[i-1]
		}
		if i+1 < len(words) {
			next = words[i+1]
		}
		bad := false
		switch {
		case strings.Contains(w, "slot"), strings.Contains(w, "hashtextextended"),
			strings.Contains(w, "partition_key"), strings.Contains(w, "partitioned"):
			bad = true
		case strings.Contains(w, "lease"):
			bad = !(w == "ticker_lease" || w == "lease_until" || (w == "lease" && prev == "ticker"))
		case w == "partition":
			bad = !(prev == "attach" || prev == "detach" || next == "by" || next == "of")
		case partitionNames[w]:
			bad = true
		}
		if bad {
			out = append(out, w)
		}
	}
	return out
}

var (
	wordRE       = regexp.MustCompile(`[a-z0-9_]+`)
	createNameRE = regexp.MustCompile(`(?i)create\s+(?:or\s+replace\s+)?(?:unique\s+)?(?:function|procedure|table|view|index)\s+(?:if\s+not\s+exists\s+)?(?:pgque\.)?"?([a-z0-9_]+)`)
)

// stripComments removes -- and /* */ comments from SQL, leaving string
// literals (where "--" is text) alone. Dollar-quoted bodies are SQL too and
// are scanned like the rest.
func stripComments(sql string) string {
	var b strings.Builder
	for i := 0; i < len(sql); i++ {
		switch {
		case sql[i] == '\'':
			j := i + 1
			for j < len(sql) {
				if sql[j] == '\'' {
					if j+1 < len(sql) && sql[j+1] == '\'' {
						j += 2
						continue
					}
					break
				}
				j++
			}
			b.WriteString(sql[i:min(j+1, len(sql))])
			i = j
		case strings.HasPrefix(sql[i:], "--"):
			for i < len(sql) && sql[i] != '\n' {
				i++
			}
			b.WriteByte('\n')
		case strings.HasPrefix(sql[i:], "/*"):
			end := strings.Index(sql[i+2:], "*/")
			if end < 0 {
				end = len(sql) - i - 2
			}
			// Keep the comment's line breaks, so line numbers stay right.
			b.WriteString(" " + strings.Repeat("\n", strings.Count(sql[i:i+2+end], "\n")))
			i += end + 3
		default:
			b.WriteByte(sql[i])
		}
	}
	return b.String()
}

// T-engine-untouched, in the source: no file under sql/engine mentions the
// partition layer (see engineViolations for the exact rule).
func TestEngineUntouchedSource(t *testing.T) {
	t.Parallel()
	root := os.DirFS("../../../sql")
	partitionNames := map[string]bool{}
	err := fs.WalkDir(root, "partition", func(path string, e fs.DirEntry, err error) error {
		if err != nil || e.IsDir() || !strings.HasSuffix(path, ".sql") {
			return err
		}
		body, err := fs.ReadFile(root, path)
		for _, m := range createNameRE.FindAllStringSubmatch(string(body), -1) {
			if name := strings.ToLower(m[1]); name != "if" { // "create index if not exists %I" in a format string
				partitionNames[name] = true
			}
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if !partitionNames["claim_slot"] || !partitionNames["slot_lease"] {
		t.Fatalf("did not find the partition layer's objects in sql/partition: %v", partitionNames)
	}
	files := 0
	err = fs.WalkDir(root, "engine", func(path string, e fs.DirEntry, err error) error {
		if err != nil || e.IsDir() || !strings.HasSuffix(path, ".sql") {
			return err
		}
		files++
		body, err := fs.ReadFile(root, path)
		if err != nil {
			return err
		}
		for n, line := range strings.Split(stripComments(string(body)), "\n") {
			if v := engineViolations(line, partitionNames); len(v) > 0 {
				t.Errorf("sql/%s:%d mentions the partition layer (%s): %s", path, n+1, strings.Join(v, ", "), strings.TrimSpace(line))
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 10 {
		t.Fatalf("only %d engine files found", files)
	}
	if t.Failed() {
		t.Log("the engine must stay PgQ: keep slot, lease and routing knowledge (names, rules, messages) in sql/api or sql/partition")
	}
}

// TestEngineRuleCatchesMentions shows the rule bites on what it must catch
// and passes what it must allow, so a clean engine is a real result.
func TestEngineRuleCatchesMentions(t *testing.T) {
	t.Parallel()
	names := map[string]bool{"claim_slot": true, "key_block": true}
	check := func(s string) []string { return engineViolations(stripComments(s), names) }
	for _, s := range []string{
		"select pg_catalog.hashtextextended(ev_extra1, 0)",
		"select 1 from pgque.key_block",
		"perform pgque.claim_slot(q, c, 0, w)",
		"i_allow_slot boolean",
		"update pgque.slot_lease set sl_owner = null",
		"raise notice 'lease taken over'",
		"i_partition_key text",
		"alter table pgque.event add partition x",
	} {
		if len(check(s)) == 0 {
			t.Errorf("rule passes %q", s)
		}
	}
	for _, s := range []string{
		") partition by list (ev_part);",
		"execute format('alter table pgque.event attach partition %s for values in (%s)', v_tbl, 1)",
		"-- the partition layer calls this with slot filters",
		"/* slots */ select 1",
		"select * from pgque.ticker_lease where lease_until < now()",
		"message = 'ticker lease ttl must be positive'",
		"select 'a--b', 1 -- slot",
	} {
		if v := check(s); len(v) > 0 {
			t.Errorf("rule flags %q: %v", s, v)
		}
	}
	// A string literal is text, not a comment: its words count.
	if len(check("select '-- slot' as x")) == 0 {
		t.Error("rule ignores a string literal that looks like a comment")
	}
}

package securitytest

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
)

// securityDoc is the document whose role matrices TestSecurityDocMatrix
// holds to the catalog.
const securityDoc = "../../../docs/security.md"

// docRoles are the matrix columns after the first, in order: PUBLIC is
// the pseudo-role itself (has_*_privilege accepts 'public').
var docRoles = []string{"public", roleReader, roleWriter, roleAdmin}

// docMatrix reads the table under the heading that starts with heading:
// first cell (names in backticks, several for one row) to the other cells.
// A function's name is the regprocedure text without the schema; a note
// after the backticks, such as "(SECURITY INVOKER)", is ignored.
func docMatrix(t *testing.T, heading string) map[string][]string {
	t.Helper()
	f, err := os.Open(securityDoc)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	names := regexp.MustCompile("`([^`]+)`")
	out := map[string][]string{}
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "## ") {
			in = strings.HasPrefix(line, "## "+heading)
			continue
		}
		if !in || !strings.HasPrefix(line, "| `") {
			continue
		}
		cells := strings.Split(strings.Trim(line, "| "), " | ")
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		for _, m := range names.FindAllStringSubmatch(cells[0], -1) {
			out[m[1]] = cells[1:]
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(out) == 0 {
		t.Fatalf("%s has no table under \"## %s\"", securityDoc, heading)
	}
	return out
}

// docRow spells a matrix row the way docs/security.md does.
func docRow(name string, cells []string) string {
	return "| `" + name + "` | " + strings.Join(cells, " | ") + " |"
}

// TestSecurityDocMatrix holds the role matrices of docs/security.md to
// the catalog: every function of schema pgque that PUBLIC or a pgque role
// may execute has a row whose cells say exactly who may (✓) and who gets
// 42501, and every relation of the schema has a row whose cells say who
// may SELECT it (no role holds any other privilege, which
// TestRoleMatrixRelations checks). A failure names the row to add, fix or
// remove, spelled as the document spells it.
func TestSecurityDocMatrix(t *testing.T) {
	_, conn := setupDB(t)
	ctx := context.Background()

	doc := docMatrix(t, "Role matrix: functions")
	rows, err := conn.Query(ctx, `
		select substr(p.oid::regprocedure::text, 7),
		       array[has_function_privilege('public', p.oid, 'execute'), has_function_privilege('pgque_reader', p.oid, 'execute'),
		             has_function_privilege('pgque_writer', p.oid, 'execute'), has_function_privilege('pgque_admin', p.oid, 'execute')]
		  from pg_proc p
		 where p.pronamespace = 'pgque'::regnamespace
		   and not (p.proname like '\_src\_%' and p.prorettype = 'trigger'::regtype)
		 order by 1`)
	if err != nil {
		t.Fatal(err)
	}
	type priv struct {
		Name string
		Has  []bool
	}
	fns, err := pgx.CollectRows(rows, pgx.RowToStructByPos[priv])
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, f := range fns {
		want := make([]string, len(f.Has))
		for i, h := range f.Has {
			want[i] = map[bool]string{true: "✓", false: "42501"}[h]
		}
		got, ok := doc[f.Name]
		if !ok {
			if slices.Contains(f.Has, true) {
				t.Errorf("%s, \"Role matrix: functions\": add the row\n%s", securityDoc, docRow(f.Name, want))
			}
			continue
		}
		seen[f.Name] = true
		if !slices.Equal(got, want) {
			t.Errorf("%s, \"Role matrix: functions\": the row of `%s` says %v; the catalog says\n%s", securityDoc, f.Name, got, docRow(f.Name, want))
		}
	}
	for name := range doc {
		if !seen[name] {
			t.Errorf("%s, \"Role matrix: functions\": remove the row of `%s`: no such function is granted to anyone", securityDoc, name)
		}
	}

	docRel := docMatrix(t, "Role matrix: tables")
	rows, err = conn.Query(ctx, `
		select c.relname, array[`+selectPrivs+`]
		  from pg_class c
		 where c.relnamespace = 'pgque'::regnamespace and c.relkind in ('r', 'p', 'v', 'm', 'S', 'f')
		 order by 1`)
	if err != nil {
		t.Fatal(err)
	}
	rels, err := pgx.CollectRows(rows, pgx.RowToStructByPos[priv])
	if err != nil {
		t.Fatal(err)
	}
	seen = map[string]bool{}
	for _, r := range rels {
		name := r.Name
		switch {
		case eventTable.MatchString(name):
			name = "event_<queue>_<n>"
		case eventSeq.MatchString(name):
			name = "event_seq_<queue>"
		}
		want := make([]string, len(r.Has))
		for i, h := range r.Has {
			want[i] = map[bool]string{true: "SELECT", false: "—"}[h]
		}
		got, ok := docRel[name]
		if !ok {
			t.Errorf("%s, \"Role matrix: tables, views, sequences\": add the row\n%s", securityDoc, docRow(name, want))
			seen[name] = true
			continue
		}
		seen[name] = true
		if !slices.Equal(got, want) {
			t.Errorf("%s, \"Role matrix: tables, views, sequences\": the row of `%s` says %v; the catalog says (relation %s)\n%s",
				securityDoc, name, got, r.Name, docRow(name, want))
		}
	}
	for name := range docRel {
		if !seen[name] {
			t.Errorf("%s, \"Role matrix: tables, views, sequences\": remove `%s`: no such relation", securityDoc, name)
		}
	}
}

// selectPrivs is the SELECT privilege of each of docRoles on relation
// c, in SQL.
var selectPrivs = func() string {
	parts := make([]string, len(docRoles))
	for i, r := range docRoles {
		parts[i] = fmt.Sprintf("has_table_privilege('%s', c.oid, 'select')", r)
	}
	return strings.Join(parts, ", ")
}()

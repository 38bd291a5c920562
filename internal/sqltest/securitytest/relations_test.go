package securitytest

import (
	"context"
	"regexp"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgque/pgque/internal/install"
)

// relations is the expected privilege matrix of every table, view and
// sequence in schema pgque: for each, the roles (r reader, w writer, a
// admin) with SELECT. No role has any other privilege (INSERT, UPDATE,
// DELETE, TRUNCATE, REFERENCES, TRIGGER; USAGE or UPDATE on sequences):
// app roles work through SECURITY DEFINER functions only. docs/security.md
// carries the same table. A new relation without an entry fails the test.
var relations = map[string]string{
	"batch_id_seq":          "",
	"dead_letter":           "a",
	"dead_letter_dl_id_seq": "",
	"dedup_0":               "", // records of reused dedup keys: no direct access, like event tables
	"dedup_1":               "",
	"dedup_state":           "a",
	"deferred":              "a",
	"event":                 "a", // the partitioned parent: the admin reads every queue's events through it
	"event_<queue>_<n>":     "",  // a queue's event tables: no direct access
	"event_seq_<queue>":     "",
	"key_block":             "",
	"lease_orphan":          "", // claim_slot's record of a dead holder's session: through claim_slot only
	"layer_hook":            "a",
	"partition_slot_status": "rwa",
	"partition_slot_leases": "rwa",
	"partition_slot_stalls": "rwa",
	"queue":                 "a",
	"queue_grant":           "a",
	"queue_id_seq":          "",
	"retry_queue":           "a",
	"slot_group":            "",
	"slot_lease":            "",
	"rotation":              "a",
	"state_gen_seq":         "",
	"ticker_beat_seq":       "",
	"sub_state":             "a",
	"sub_state_0":           "a",
	"sub_state_1":           "a",
	"sub_state_seq":         "",
	"subscription":          "a",
	"subscription_id_seq":   "",
	"table_source":          "a",
	"tick":                  "a",
	"tick_0":                "a",
	"tick_1":                "a",
	"tick_gen_seq":          "",
	"tick_id_seq":           "",
	"ticker_lease":          "a",
	"version":               "a",
	"worker_presence":       "", // through announce_worker only
	"worker_presence_0":     "",
	"worker_presence_1":     "",
	"presence_gen_seq":      "",
	"presence_rotation":     "",
	"event_done":            "", // through complete_in_tx and complete_partitioned_in_tx only
	"event_done_0":          "",
	"event_done_1":          "",
	"done_gen_seq":          "",
	"done_rotation":         "",
	"index_ddl":             "", // its row lock serialises index changes: no role may take it
}

var (
	eventTable = regexp.MustCompile(`^event_[0-9]+_[0-9]+$`)
	eventSeq   = regexp.MustCompile(`^event_seq_[0-9]+$`)
)

func TestRoleMatrixRelations(t *testing.T) {
	_, conn := setupDB(t)
	ctx := context.Background()
	// Checked after a re-install, which must grant exactly what the first
	// install did: nothing more on tables created since (a queue's event
	// tables, the layers' tables), nothing less.
	if _, err := install.Install(ctx, conn); err != nil {
		t.Fatal(err)
	}
	rows, err := conn.Query(ctx, `select c.relname, c.relkind::text from pg_class c
		where c.relnamespace = 'pgque'::regnamespace and c.relkind in ('r', 'p', 'v', 'm', 'S', 'f') order by 1`)
	if err != nil {
		t.Fatal(err)
	}
	type rel struct{ Name, Kind string }
	rels, err := pgx.CollectRows(rows, pgx.RowToStructByPos[rel])
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	letter := map[string]string{roleReader: "r", roleWriter: "w", roleAdmin: "a"}
	for _, r := range rels {
		key := r.Name
		switch {
		case eventTable.MatchString(r.Name):
			key = "event_<queue>_<n>"
		case eventSeq.MatchString(r.Name):
			key = "event_seq_<queue>"
		}
		want, ok := relations[key]
		if !ok {
			t.Errorf("relation pgque.%s (kind %s) has no entry in the relations matrix of securitytest", r.Name, r.Kind)
			continue
		}
		seen[key] = true
		privs := []string{"select", "insert", "update", "delete", "truncate", "references", "trigger"}
		fn := "has_table_privilege"
		if r.Kind == "S" {
			privs, fn = []string{"usage", "select", "update"}, "has_sequence_privilege"
		}
		for _, role := range matrixRoles {
			for _, p := range privs {
				var has bool
				if err := conn.QueryRow(ctx, `select `+fn+`($1, $2, $3)`, role, "pgque."+r.Name, p).Scan(&has); err != nil {
					t.Fatal(err)
				}
				allowed := p == "select" && r.Kind != "S" && letter[role] != "" && strings.Contains(want, letter[role])
				if has != allowed {
					t.Errorf("%s on pgque.%s for %s = %v, want %v", p, r.Name, role, has, allowed)
				}
			}
			if r.Kind == "S" {
				continue
			}
			// And in practice: SELECT as the role.
			code, msg := sqlstate(t, conn, role, "select * from pgque."+r.Name+" limit 1")
			allowed := letter[role] != "" && strings.Contains(want, letter[role])
			if allowed != (code == "") || (!allowed && code != "42501") {
				t.Errorf("select from pgque.%s as %s: SQLSTATE %q (%s), allowed %v", r.Name, role, code, msg, allowed)
			}
			// Writing is refused to every role, the admin included.
			if r.Kind == "r" || r.Kind == "p" {
				if code, _ := sqlstate(t, conn, role, "delete from pgque."+r.Name); code != "42501" {
					t.Errorf("delete from pgque.%s as %s: SQLSTATE %q, want 42501", r.Name, role, code)
				}
			}
		}
	}
	for name := range relations {
		if !seen[name] {
			t.Errorf("relations matrix names pgque.%s, which does not exist", name)
		}
	}
}

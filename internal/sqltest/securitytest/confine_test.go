package securitytest

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgque/pgque/internal/install"
	"github.com/pgque/pgque/internal/testing/pgtest"
)

// TestConfinedQueues runs two applications' login roles (readers and
// writers of app a and app b, all members of the cluster-wide pgque roles)
// against queues confined to each app, an unconfined queue, and a second
// database: every consume and produce entry point refuses the other app
// with 42501 and works for the own app; the unconfined queue works for
// everyone (existing installs keep working); a revoke takes effect at once;
// unconfine lifts it.
func TestConfinedQueues(t *testing.T) {
	c, super, newDB := installerCluster(t)
	ctx := context.Background()
	dsn := newDB("tenants")
	owner := pgtest.Conn(t, pgtest.DSNWith(dsn, "user", "pgque_owner"))
	if _, err := install.Install(ctx, owner); err != nil {
		t.Fatal(err)
	}
	mustExec(t, super,
		`create role a_reader login`, `create role b_reader login`, `create role a_writer login`, `create role b_writer login`,
		`create role app_admin login`)
	mustExec(t, owner,
		`grant pgque_reader to a_reader, b_reader`, `grant pgque_writer to a_writer, b_writer`, `grant pgque_admin to app_admin`)
	admin := pgtest.Conn(t, pgtest.DSNWith(dsn, "user", "app_admin"))
	for _, q := range []string{"qa", "qb", "qc"} {
		mustExec(t, admin,
			`select pgque.create_queue('`+q+`')`,
			`select pgque.subscribe('`+q+`', 'c')`,
			`select pgque.subscribe_slot('`+q+`', 'sc', s, 2) from generate_series(0, 1) s`,
		)
	}
	mustExec(t, admin,
		`select pgque.grant_queue('qa', 'a_reader', 'consume')`, `select pgque.grant_queue('qa', 'a_writer', 'produce')`,
		`select pgque.grant_queue('qb', 'b_reader', 'consume')`, `select pgque.grant_queue('qb', 'b_writer', 'produce')`,
	)
	as := func(role string) *pgx.Conn { return pgtest.Conn(t, pgtest.DSNWith(dsn, "user", role)) }
	conns := map[string]*pgx.Conn{"a_reader": as("a_reader"), "b_reader": as("b_reader"), "a_writer": as("a_writer"), "b_writer": as("b_writer")}
	// Some events, ticked, and an open batch per queue for ack/nack.
	for q, w := range map[string]string{"qa": "a_writer", "qb": "b_writer", "qc": "a_writer"} {
		mustExec(t, conns[w], `select pgque.send('`+q+`', 't', '{"n":1}'::jsonb, 'k1')`, `select pgque.send('`+q+`', 't', '{"n":2}'::jsonb, 'k2')`)
		mustExec(t, admin, `select pgque.force_next_tick('`+q+`')`, `select pgque.ticker('`+q+`')`)
	}
	batches := map[string]string{}
	for q, r := range map[string]string{"qa": "a_reader", "qb": "b_reader", "qc": "a_reader"} {
		var b, m int64
		if err := conns[r].QueryRow(ctx, `select batch_id, msg_id from pgque.receive('`+q+`', 'c', 10) limit 1`).Scan(&b, &m); err != nil {
			t.Fatalf("receive %s as %s: %v", q, r, err)
		}
		batches[q] = itoa64(b) + ", " + itoa64(m)
	}
	consume := func(q string) []string {
		bm := batches[q]
		bid := strings.SplitN(bm, ",", 2)[0]
		return []string{
			`select pgque.subscribe('` + q + `', 'mine')`,
			`select pgque.unsubscribe('` + q + `', 'c')`,
			`select * from pgque.receive('` + q + `', 'c', 10)`,
			`select * from pgque.receive_raw('` + q + `', 'c', 10)`,
			`select pgque.ack(` + bid + `)`,
			`select pgque.nack(` + bm + `, '1 s', 'r')`,
			`select pgque.subscribe_slot('` + q + `', 'sc', 0, 2)`,
			`select pgque.subscribe_slot('` + q + `', 'sc2', 0, 2, 'pause')`,
			`select pgque.unsubscribe_slot('` + q + `', 'sc', 1, 2)`,
			`select pgque.claim_slot('` + q + `', 'sc', 0, 'w', '30 s')`,
			`select pgque.release_slot('` + q + `', 'sc', 0, 'w', ` + tok + `)`,
			`select * from pgque.receive_partitioned('` + q + `', 'sc', 0, 2, 'w', ` + tok + `, 10)`,
			`select * from pgque.receive_partitioned_raw('` + q + `', 'sc', 0, 2, 'w', ` + tok + `, 10)`,
			`select * from pgque.receive_partitioned_raw_slots('` + q + `', 'sc', 'w', 10, '{0}', '{2}', array[` + tok + `]::uuid[])`,
			`select pgque.ack_partitioned('` + q + `', 'sc', 0, 2, 'w', ` + tok + `, 1, 1, 1)`,
			`select pgque.nack_partitioned('` + q + `', 'sc', 0, 2, 'w', ` + tok + `, 1, '1 s', 'r')`,
			`select * from pgque.announce_worker('` + q + `', 'sc', 'w', true, '{}', '3 s')`,
		}
	}
	produce := func(q string) []string {
		return []string{
			`select pgque.send('` + q + `', '{"x":1}'::jsonb)`,
			`select pgque.send('` + q + `', 't', '{"x":1}'::jsonb)`,
			`select pgque.send('` + q + `', 't', '{"x":1}'::jsonb, 'k')`,
			`select pgque.send_batch('` + q + `', 't', array['{"x":1}']::jsonb[], array['k'])`,
			`select pgque.send('` + q + `', 't', '{"x":1}'::jsonb, 'k', 'dedup-1')`,
			`select pgque.send('` + q + `', 't', '{"x":1}'::text, 'k', 'dedup-2')`,
			`select pgque.send_batch('` + q + `', 't', array['{"x":1}']::jsonb[], array['k'], array['dedup-3'])`,
			`select pgque.insert_event('` + q + `', 't', 'd')`,
			`select pgque.insert_event('` + q + `', 't', 'd', 'k', null, null, null)`,
		}
	}
	denied := func(code string) bool { return code == "42501" }
	check := func(role string, stmts []string, wantDenied bool) {
		t.Helper()
		for _, s := range stmts {
			code, msg := sqlstate(t, conns[role], "", s)
			if denied(code) != wantDenied {
				t.Errorf("as %s: %s = %q %s, want denied=%v", role, s, code, msg, wantDenied)
			}
		}
	}
	check("b_reader", consume("qa"), true)
	check("a_reader", consume("qb"), true)
	check("b_writer", produce("qa"), true)
	check("a_writer", produce("qb"), true)
	check("a_reader", consume("qa"), false)
	check("b_reader", consume("qb"), false)
	check("a_writer", produce("qa"), false)
	check("b_writer", produce("qb"), false)
	check("b_reader", consume("qc"), false) // unconfined
	check("b_writer", produce("qc"), false)
	// Confining consume does not confine produce, and the other way round.
	mustExec(t, admin, `select pgque.unconfine_queue('qa', 'produce')`)
	check("b_writer", produce("qa"), false)
	check("b_reader", consume("qa"), true)
	// A revoke takes effect at once and leaves the queue confined.
	mustExec(t, admin, `select pgque.revoke_queue('qa', 'a_reader', 'consume')`)
	check("a_reader", consume("qa")[:3], true)
	mustExec(t, admin, `select pgque.unconfine_queue('qa', 'consume')`)
	check("b_reader", consume("qa")[:3], false)
	// SET ROLE cannot widen a confined login: membership is judged on the
	// login role.
	mustExec(t, super, `grant b_reader to a_reader`)
	mustExec(t, admin, `select pgque.revoke_queue('qb', 'b_reader', 'consume')`, `select pgque.grant_queue('qb', 'a_writer', 'consume')`)
	code, _ := sqlstate(t, conns["a_reader"], "b_reader", `select * from pgque.receive('qb', 'c', 10)`)
	if code != "42501" {
		t.Errorf("a confined login escaped with SET ROLE: %q", code)
	}
	// Grants are per database: the same roles in another database of the
	// cluster are not confined by this one's grants, and that database's
	// confined queue refuses them.
	dsn2 := newDB("tenants2")
	owner2 := pgtest.Conn(t, pgtest.DSNWith(dsn2, "user", "pgque_owner"))
	if _, err := install.Install(ctx, owner2); err != nil {
		t.Fatal(err)
	}
	mustExec(t, owner2, `select pgque.create_queue('qa')`, `select pgque.grant_queue('qa', 'b_writer', 'produce')`)
	other := pgtest.Conn(t, pgtest.DSNWith(c.DSN("tenants2"), "user", "a_writer"))
	if code, _ := sqlstate(t, other, "", `select pgque.send('qa', '{}'::jsonb)`); code != "42501" {
		t.Errorf("a_writer produced into another database's confined queue: %q", code)
	}
}

package securitytest

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgque/pgque/internal/testing/pgtest"
)

// The lease token tests run two connections as pgque_reader, the owner of
// a slot's lease and a thief: the same role, so the thief has every
// privilege the owner has and knows everything the owner's role can read,
// its worker id included. Only the token, which claim_slot returned to the
// owner alone, tells them apart.

const (
	tokenOwner = "w-owner"
	tokenThief = "w-thief"
)

// tokenFixture: queue tq with a one-slot consumer tc (and a second one,
// tc2, on which the thief holds a lease of its own), and three events of
// key k ticked (each statement in its own transaction, so the tick sees
// the events).
var tokenFixture = []string{
	`select pgque.create_queue('tq')`,
	`select pgque.subscribe_slot('tq', 'tc', 0, 1)`,
	`select pgque.subscribe_slot('tq', 'tc2', 0, 1)`,
	`select pgque.send('tq', 't', '{"a":1}'::jsonb, 'k') from generate_series(1, 3)`,
	`select pgque.force_next_tick('tq')`,
	`select pgque.ticker('tq')`,
}

// proof names the chunk the owner received.
type proof struct{ epoch, batch, first, last int64 }

// lit quotes s as a SQL literal; NULL for nil. Only test values go
// through it.
func lit(s *string) string {
	if s == nil {
		return "null"
	}
	return "'" + strings.ReplaceAll(*s, "'", "''") + "'"
}

// holderCalls are every call that acts as the holder of slot 0 of tc, as
// worker with token, for the chunk p.
func holderCalls(worker string, token *string, p proof) map[string]string {
	w, tk := lit(&worker), lit(token)
	h := fmt.Sprintf("'tq', 'tc', 0, 1, %s, %s::uuid", w, tk)
	return map[string]string{
		"receive_partitioned":     fmt.Sprintf("select * from pgque.receive_partitioned(%s, 10)", h),
		"receive_partitioned_raw": fmt.Sprintf("select * from pgque.receive_partitioned_raw(%s, 10)", h),
		"ack_partitioned":         fmt.Sprintf("select pgque.ack_partitioned(%s, %d, %d, %d)", h, p.epoch, p.batch, p.first),
		"nack_partitioned":        fmt.Sprintf("select pgque.nack_partitioned(%s, %d, '0', 'stolen')", h, p.first),
		"fenced nack":             fmt.Sprintf("select pgque.nack_partitioned(%s, %d, %d, %d, '0', 'stolen')", h, p.epoch, p.batch, p.first),
		"release_slot":            fmt.Sprintf("select pgque.release_slot('tq', 'tc', 0, %s, %s::uuid)", w, tk),
		"hold_key_partitioned":    fmt.Sprintf("select pgque.hold_key_partitioned(%s, %d, %d, 'k', %d)", h, p.epoch, p.batch, p.first),
		"settle_held":             fmt.Sprintf("select pgque.settle_held_partitioned(%s, %d, 'k', %d, array[%d]::bigint[], '{}', '{}', '{}')", h, p.epoch, p.first, p.first),
		"release_stale_holds":     fmt.Sprintf("select pgque.release_stale_holds_partitioned(%s)", h),
		"claim_slot (renew)":      fmt.Sprintf("select epoch, token from pgque.claim_slot('tq', 'tc', 0, %s, '1 hour', %s::uuid)", w, tk),
		"claim_slot (no token)":   fmt.Sprintf("select epoch, token from pgque.claim_slot('tq', 'tc', 0, %s, '1 hour')", w),
	}
}

// runAs runs stmt on conn in the simple protocol and returns the error's
// SQLSTATE and its full text (message, detail, hint), and whether a row
// with a non-NULL first column came back.
func runAs(t *testing.T, conn *pgx.Conn, stmt string) (code, text string, got bool) {
	t.Helper()
	rows, err := conn.Query(context.Background(), stmt, pgx.QueryExecModeSimpleProtocol)
	if err == nil {
		for rows.Next() {
			v, verr := rows.Values()
			if verr == nil && len(v) > 0 && v[0] != nil {
				got = true
			}
		}
		rows.Close()
		err = rows.Err()
	}
	var pe *pgconn.PgError
	switch {
	case err == nil:
		return "", "", got
	case errors.As(err, &pe):
		return pe.Code, pe.Message + " " + pe.Detail + " " + pe.Hint, false
	default:
		t.Fatalf("%s: %v", stmt, err)
		return "", "", false
	}
}

// claimAs claims slot 0 of consumer c for worker and returns the epoch and
// token; it fails the test when the claim is refused.
func claimAs(t *testing.T, conn *pgx.Conn, c, worker string) (int64, string) {
	t.Helper()
	var epoch *int64
	var token *string
	if err := conn.QueryRow(context.Background(), `select epoch, token::text from pgque.claim_slot('tq', $1, 0, $2, '1 hour')`,
		c, worker).Scan(&epoch, &token); err != nil || epoch == nil || token == nil {
		t.Fatalf("claim_slot(%s, %s) = %v, %v, %v", c, worker, epoch, token, err)
	}
	return *epoch, *token
}

// receiveAs receives slot 0 of tc as (worker, token) and returns the
// chunk's proof (zero when empty).
func receiveAs(t *testing.T, conn *pgx.Conn, worker, token string) proof {
	t.Helper()
	rows, err := conn.Query(context.Background(), `select msg_id, batch_id, epoch
		from pgque.receive_partitioned('tq', 'tc', 0, 1, $1, $2::uuid, 10)`, worker, token)
	if err != nil {
		t.Fatalf("receive as %s: %v", worker, err)
	}
	var p proof
	var id, batch, epoch int64
	if _, err := pgx.ForEachRow(rows, []any{&id, &batch, &epoch}, func() error {
		if p.first == 0 {
			p = proof{epoch: epoch, batch: batch, first: id}
		}
		p.last = id
		return nil
	}); err != nil {
		t.Fatalf("receive as %s: %v", worker, err)
	}
	return p
}

// leaseOf reads the lease of slot 0 of tc from the view every role reads.
func leaseOf(t *testing.T, conn *pgx.Conn) (owner *string, epoch int64) {
	t.Helper()
	if err := conn.QueryRow(context.Background(), `select owner, epoch from pgque.partition_slot_leases
		where queue = 'tq' and consumer = 'tc' and slot = 0`).Scan(&owner, &epoch); err != nil {
		t.Fatal(err)
	}
	return owner, epoch
}

// randomToken is a well-formed token nobody was given.
func randomToken(t *testing.T) string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// tokenHashHex is the hex of what the lease row stores of token: the
// SHA-256 of its 16 bytes.
func tokenHashHex(t *testing.T, token string) string {
	raw, err := hex.DecodeString(strings.ReplaceAll(token, "-", ""))
	if err != nil || len(raw) != 16 {
		t.Fatalf("token %q is not a uuid: %v", token, err)
	}
	h := sha256.Sum256(raw)
	return hex.EncodeToString(h[:])
}

// TestLeaseTokenIsTheCredential: a reader who knows the owner's worker id
// (it is in the lease view) and the chunk's proof (epoch, batch id and
// event ids are in the views or guessable) can neither receive, ack, nack,
// hold, settle, renew nor release as the owner, with no token, a random one
// or the token of its own lease on another slot. Every refusal is PQ085
// (22004 for no token; a refused claim returns NULL), names neither the
// token nor the owner's worker id, and changes nothing: afterwards the
// owner, with its token, still settles the very chunk it received.
func TestLeaseTokenIsTheCredential(t *testing.T) {
	dsn := pgtest.NewInstalledDB(t)
	super := pgtest.Conn(t, dsn)
	mustExec(t, super, tokenFixture...)
	owner, thief := asRole(t, dsn, roleReader), asRole(t, dsn, roleReader)
	ctx := context.Background()

	epoch, ownerToken := claimAs(t, owner, "tc", tokenOwner)
	_, thiefToken := claimAs(t, thief, "tc2", tokenThief)
	p := receiveAs(t, owner, tokenOwner, ownerToken)
	if p.first == 0 || p.epoch != epoch {
		t.Fatalf("the owner received %+v, want a chunk at epoch %d", p, epoch)
	}
	// What the thief knows: the owner's worker id, from the lease view.
	seen, _ := leaseOf(t, thief)
	if seen == nil || *seen != tokenOwner {
		t.Fatalf("lease view shows owner %v to the thief, want %q", seen, tokenOwner)
	}
	secrets := []string{ownerToken, tokenHashHex(t, ownerToken), tokenOwner}

	random := randomToken(t)
	for _, v := range []struct {
		name  string
		token *string
		want  string
	}{
		{"no token", nil, "22004"},
		{"a random token", &random, "PQ085"},
		{"its own token of another lease", &thiefToken, "PQ085"},
	} {
		for name, stmt := range holderCalls(*seen, v.token, p) {
			code, text, got := runAs(t, thief, stmt)
			switch {
			case strings.HasPrefix(name, "claim_slot"):
				// A refused claim is an answer, not an error: NULL.
				if code != "" || got {
					t.Errorf("thief with %s: %s = SQLSTATE %q (%s), got a lease %v; want (NULL, NULL)", v.name, name, code, text, got)
				}
			case code != v.want:
				t.Errorf("thief with %s: %s = SQLSTATE %q (%s), want %s", v.name, name, code, text, v.want)
			}
			for _, s := range secrets {
				if strings.Contains(text, s) {
					t.Errorf("thief with %s: %s: the error %q reveals %q", v.name, name, text, s)
				}
			}
		}
	}
	// Nothing changed: same owner and epoch, no retry, dead letter, hold
	// or deferral, and the owner's chunk is still the one out.
	if o, e := leaseOf(t, super); o == nil || *o != tokenOwner || e != epoch {
		t.Fatalf("after the thief: lease %v epoch %d, want %q epoch %d", o, e, tokenOwner, epoch)
	}
	var n int64
	if err := super.QueryRow(ctx, `select (select count(*) from pgque.retry_queue) + (select count(*) from pgque.dead_letter)
		+ (select count(*) from pgque.key_block) + (select count(*) from pgque.deferred)`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("the thief's calls left %d rows of retries, dead letters, holds or deferrals (%v)", n, err)
	}

	// The owner, with its token, can do everything the thief could not.
	for _, stmt := range []string{
		fmt.Sprintf("select 1 from pgque.claim_slot('tq', 'tc', 0, '%s', '1 hour', '%s') where epoch = %d and token = '%s'", tokenOwner, ownerToken, epoch, ownerToken),
		fmt.Sprintf("select pgque.release_stale_holds_partitioned('tq', 'tc', 0, 1, '%s', '%s')", tokenOwner, ownerToken),
		fmt.Sprintf("select pgque.hold_key_partitioned('tq', 'tc', 0, 1, '%s', '%s', %d, %d, 'k', %d) = 3", tokenOwner, ownerToken, p.epoch, p.batch, p.first),
		fmt.Sprintf("select pgque.ack_partitioned('tq', 'tc', 0, 1, '%s', '%s', %d, %d, %d) = 1", tokenOwner, ownerToken, p.epoch, p.batch, p.last),
		// A failure dead-lettered (no delay) with a reason of 5000
		// characters, which is stored cut to 1000 as nack's.
		fmt.Sprintf("select pgque.settle_held_partitioned('tq', 'tc', 0, 1, '%s', '%s', %d, 'k', %d, array[%d, %d]::bigint[], array[%d]::bigint[], '{NULL}', array[repeat('r', 5000)]) = 1",
			tokenOwner, ownerToken, p.epoch, p.first, p.first, p.first+1, p.last),
	} {
		if code, text, got := runAs(t, owner, stmt); code != "" || !got {
			t.Fatalf("owner: %s = SQLSTATE %q (%s), got %v", stmt, code, text, got)
		}
	}
	var reasons []int
	if err := super.QueryRow(ctx, `select array_agg(length(dl_reason)) from pgque.dead_letter`).Scan(&reasons); err != nil ||
		len(reasons) != 1 || reasons[0] != 1000 {
		t.Fatalf("the settle's dead letter has reasons of %v characters (%v), want one of 1000", reasons, err)
	}
	mustExec(t, super, `select pgque.send('tq', 't', '{"a":2}'::jsonb, 'j') from generate_series(1, 2)`,
		`select pgque.force_next_tick('tq')`, `select pgque.ticker('tq')`)
	p2 := receiveAs(t, owner, tokenOwner, ownerToken)
	if p2.first == 0 || p2.last == p2.first {
		t.Fatalf("the owner received %+v, want two events", p2)
	}
	for _, stmt := range []string{
		fmt.Sprintf("select pgque.nack_partitioned('tq', 'tc', 0, 1, '%s', '%s', %d, '1 hour', 'r') = 1", tokenOwner, ownerToken, p2.first),
		fmt.Sprintf("select pgque.nack_partitioned('tq', 'tc', 0, 1, '%s', '%s', %d, %d, %d, '1 hour', 'r') = 1", tokenOwner, ownerToken, p2.epoch, p2.batch, p2.last),
		fmt.Sprintf("select pgque.ack_partitioned('tq', 'tc', 0, 1, '%s', '%s', %d, %d, %d) = 1", tokenOwner, ownerToken, p2.epoch, p2.batch, p2.first),
		fmt.Sprintf("select pgque.release_slot('tq', 'tc', 0, '%s', '%s')", tokenOwner, ownerToken),
	} {
		if code, text, got := runAs(t, owner, stmt); code != "" || !got {
			t.Fatalf("owner: %s = SQLSTATE %q (%s), got %v", stmt, code, text, got)
		}
	}
}

// TestStaleLeaseTokenIsRefused: once a lease changed hands — released and
// claimed by another worker, or claimed again by the same worker id (a
// restarted process) — the earlier token proves nothing: every holder
// call with it gets PQ085 and a renewal with it is refused, while the new
// holder works on.
func TestStaleLeaseTokenIsRefused(t *testing.T) {
	dsn := pgtest.NewInstalledDB(t)
	super := pgtest.Conn(t, dsn)
	mustExec(t, super, tokenFixture...)
	first, second := asRole(t, dsn, roleReader), asRole(t, dsn, roleReader)

	for _, v := range []struct{ name, next string }{
		{"taken over by another worker", tokenThief},
		{"claimed again under the same worker id", tokenOwner},
	} {
		epoch, old := claimAs(t, first, "tc", tokenOwner)
		p := receiveAs(t, first, tokenOwner, old)
		// The lease is freed behind the first owner's back (here by a
		// release, as after an expiry) and claimed anew.
		if code, text, _ := runAs(t, first, fmt.Sprintf("select pgque.release_slot('tq', 'tc', 0, '%s', '%s')", tokenOwner, old)); code != "" {
			t.Fatalf("%s: release: %s %s", v.name, code, text)
		}
		newEpoch, fresh := claimAs(t, second, "tc", v.next)
		if newEpoch != epoch+1 || fresh == old {
			t.Fatalf("%s: re-claim gave epoch %d (want %d), token reused %v", v.name, newEpoch, epoch+1, fresh == old)
		}
		for name, stmt := range holderCalls(tokenOwner, &old, p) {
			code, text, got := runAs(t, first, stmt)
			if strings.HasPrefix(name, "claim_slot") {
				if code != "" || got {
					t.Errorf("%s: stale %s = %q (%s), got a lease %v; want (NULL, NULL)", v.name, name, code, text, got)
				}
				continue
			}
			if code != "PQ085" {
				t.Errorf("%s: stale %s = SQLSTATE %q (%s), want PQ085", v.name, name, code, text)
			}
			if strings.Contains(text, fresh) || strings.Contains(text, old) {
				t.Errorf("%s: stale %s: the error %q reveals a token", v.name, name, text)
			}
		}
		// The new holder receives the chunk the stale one never settled.
		p2 := receiveAs(t, second, v.next, fresh)
		if p2.first != p.first || p2.epoch != newEpoch {
			t.Fatalf("%s: the new holder received %+v, want the chunk from %d at epoch %d", v.name, p2, p.first, newEpoch)
		}
		if code, text, _ := runAs(t, second, fmt.Sprintf("select pgque.release_slot('tq', 'tc', 0, '%s', '%s')", v.next, fresh)); code != "" {
			t.Fatalf("%s: release by the new holder: %s %s", v.name, code, text)
		}
	}
}

// TestLeaseTokenIsNotReadable: the token is nowhere a pgque role can read
// it. Every relation of schema pgque that reader, writer or admin may
// SELECT, and the read-only key views, are searched for the live token and
// for the hash the lease row keeps; the lease table itself is readable by
// no pgque role.
func TestLeaseTokenIsNotReadable(t *testing.T) {
	dsn := pgtest.NewInstalledDB(t)
	super := pgtest.Conn(t, dsn)
	mustExec(t, super, tokenFixture...)
	reader := asRole(t, dsn, roleReader)
	_, token := claimAs(t, reader, "tc", tokenOwner)
	receiveAs(t, reader, tokenOwner, token)
	secrets := []string{token, strings.ReplaceAll(token, "-", ""), tokenHashHex(t, token)}
	ctx := context.Background()
	for _, role := range []string{roleReader, roleWriter, roleAdmin} {
		conn := asRole(t, dsn, role)
		rows, err := super.Query(ctx, `select c.oid::regclass::text from pg_class c
			where c.relnamespace = 'pgque'::regnamespace and c.relkind in ('r', 'v', 'm', 'p')
			  and has_table_privilege($1, c.oid, 'select') order by 1`, role)
		if err != nil {
			t.Fatal(err)
		}
		rels, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		stmts := []string{
			`select * from pgque.slot_heads('tq', 'tc')`,
			`select * from pgque.key_heads('tq', 'tc', null, 100, 1000)`,
			`select * from pgque.key_shares('tq', 'tc', 1000)`,
		}
		for _, r := range rels {
			if r == "pgque.slot_lease" {
				t.Errorf("%s may read pgque.slot_lease", role)
			}
			stmts = append(stmts, "select * from "+r)
		}
		for _, stmt := range stmts {
			rows, err := conn.Query(ctx, "select pg_catalog.to_jsonb(x)::text from ("+stmt+") x", pgx.QueryExecModeSimpleProtocol)
			if err != nil {
				t.Fatalf("as %s: %s: %v", role, stmt, err)
			}
			texts, err := pgx.CollectRows(rows, pgx.RowTo[string])
			if err != nil {
				t.Fatalf("as %s: %s: %v", role, stmt, err)
			}
			for _, text := range texts {
				for _, s := range secrets {
					if strings.Contains(strings.ToLower(text), s) {
						t.Errorf("as %s: %s shows the lease token (or its hash): %s", role, stmt, text)
					}
				}
			}
		}
	}
}

package securitytest

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgque/pgque"
	"github.com/pgque/pgque/internal/testing/pgtest"
)

// acceptable reports whether a SQLSTATE is one the SQL contract promises
// for bad input: pgque's own PQ0xx, NULL (22004), bad bytes (22021), bad
// text representation (22P02), unsupported Unicode escape (22P05), or
// program limit (54000). A syntax error (42601), an undefined object
// (42xxx) or an internal error (XX000) would mean the input reached SQL
// text.
func acceptable(code string) bool {
	return strings.HasPrefix(code, "PQ0") || code == "22004" || code == "22021" || code == "22P02" ||
		code == "22P05" || code == "54000"
}

// FuzzSQLNames passes fuzzed strings as queue, consumer and worker names,
// event types and partition keys through the real database, by SQL and by
// the Go client: each call succeeds (and stores the string verbatim) or
// fails with a contract SQLSTATE; the fixture is intact afterwards.
func FuzzSQLNames(f *testing.F) {
	for _, s := range hostile {
		f.Add(s, s)
	}
	f.Add("q", "k")
	f.Add("", "")
	f.Add("a\x00", "\xff")
	f.Add("q1", "k1")

	dsn := pgtest.NewInstalledDB(f)
	ctx := context.Background()
	pool := pgtest.Pool(f, dsn)
	if _, err := pool.Exec(ctx, fixture); err != nil {
		f.Fatal(err)
	}
	client, err := pgque.NewClient(pool, &pgque.Config{PollOnly: true})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, name, key string) {
		ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		check := func(what string, err error) bool {
			t.Helper()
			if err == nil {
				return true
			}
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) {
				t.Fatalf("%s: non-SQL error %v", what, err)
			}
			if !acceptable(pgErr.Code) {
				t.Fatalf("%s: SQLSTATE %s (%s): not a contract error", what, pgErr.Code, pgErr.Message)
			}
			return false
		}
		// Queue name.
		// Only what this input created is dropped again (names of the
		// fixture come back as "existed").
		var created int
		if check("create_queue", pool.QueryRow(ctx, `select pgque.create_queue($1)`, name).Scan(&created)) && created == 1 {
			var stored string
			if err := pool.QueryRow(ctx, `select queue_name from pgque.queue where queue_name = $1`, name).Scan(&stored); err != nil {
				t.Fatalf("queue %q created but not found verbatim: %v", name, err)
			}
			check("drop_queue", exec(ctx, pool, `select pgque.drop_queue($1, true)`, name))
		}
		// Consumer name, plain and slotted.
		if check("subscribe", pool.QueryRow(ctx, `select pgque.subscribe('q1', $1)`, name).Scan(&created)) && created == 1 {
			check("unsubscribe", exec(ctx, pool, `select pgque.unsubscribe('q1', $1)`, name))
		}
		if check("subscribe_slot", pool.QueryRow(ctx, `select pgque.subscribe_slot('q1', $1, 0, 1)`, name).Scan(&created)) && created == 1 {
			check("unsubscribe_slot", exec(ctx, pool, `select pgque.unsubscribe_slot('q1', $1, 0, 1)`, name))
		}
		// Worker id.
		var token *string
		if check("claim_slot", pool.QueryRow(ctx, `select token::text from pgque.claim_slot('q1', 'sc', 1, $1, '1 min')`, name).Scan(&token)) && token != nil {
			check("release_slot", exec(ctx, pool, `select pgque.release_slot('q1', 'sc', 1, $1, $2::uuid)`, name, *token))
		}
		// Type and key through the Go client.
		id, err := client.Send(ctx, "q1", pgque.Event{Type: name, PartitionKey: key, Payload: json.RawMessage(`{"k":1}`)})
		if check("Send", err) {
			var typ string
			var k *string
			if err := pool.QueryRow(ctx, `select ev_type, ev_extra1 from pgque.event where ev_id = $1`, id).Scan(&typ, &k); err != nil {
				t.Fatal(err)
			}
			wantType := name
			if wantType == "" {
				wantType = pgque.EventTypeDefault
			}
			if typ != wantType || (key == "") != (k == nil) || (k != nil && *k != key) {
				t.Fatalf("sent type %q key %q, stored %q %v", name, key, typ, k)
			}
		}
		check("send_batch", exec(ctx, pool, `select pgque.send_batch('q1', $1, array['{}', '[]']::jsonb[], array[$2, $1])`, name, key))
		check("slot_of", exec(ctx, pool, `select pgque.slot_of($1, 3)`, key))
		check("blocked_keys", exec(ctx, pool, `select * from pgque.blocked_keys('q1', $1)`, name))
		check("dlq_list", exec(ctx, pool, `select * from pgque.dlq_list($1, $2)`, name, key))
		// The fixture survived.
		var n int
		if err := pool.QueryRow(ctx, `select count(*) from pgque.queue where queue_name = 'q1'`).Scan(&n); err != nil || n != 1 {
			t.Fatalf("queue q1 gone after %q/%q: %d %v", name, key, n, err)
		}
	})
}

func exec(ctx context.Context, pool *pgxpool.Pool, sql string, args ...any) error {
	rows, err := pool.Query(ctx, sql, args...)
	if err != nil {
		return err
	}
	for rows.Next() {
	}
	rows.Close()
	return rows.Err()
}

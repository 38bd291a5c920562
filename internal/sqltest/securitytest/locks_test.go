package securitytest

import (
	"context"
	"testing"
)

// TestDedupKeyNotHoldableByStranger: a role with no pgque grant takes the
// advisory lock a keyed send once took for its key (computable from the
// queue and key names) and holds it; the writer's keyed send and
// send_batch of that key still complete, within a statement timeout that
// fails the test rather than letting it hang.
func TestDedupKeyNotHoldableByStranger(t *testing.T) {
	dsn, _ := setupDB(t)
	ctx := context.Background()
	stranger := asRole(t, dsn, rolePublic)
	mustExec(t, stranger,
		`select pg_advisory_lock(hashtextextended('order-42', hashtext('q1')))`,
		`select pg_advisory_lock_shared(hashtextextended('order-43', hashtext('q1')))`)
	writer := asRole(t, dsn, roleWriter)
	mustExec(t, writer, `set statement_timeout = '5s'`)
	var first, again int64
	if err := writer.QueryRow(ctx, `select pgque.send('q1', 't', '{}'::jsonb, 'p', 'order-42')`).Scan(&first); err != nil {
		t.Fatalf("keyed send with a stranger holding the key's old lock: %v", err)
	}
	var ids []int64
	if err := writer.QueryRow(ctx, `select pgque.send_batch('q1', 't', array['{}', '{}']::jsonb[],
		dedup_keys => array['order-43', 'order-42'])`).Scan(&ids); err != nil {
		t.Fatalf("keyed send_batch with a stranger holding the keys' old locks: %v", err)
	}
	if len(ids) != 2 || ids[1] != first {
		t.Fatalf("send_batch ids %v, want the second to be %d", ids, first)
	}
	if err := writer.QueryRow(ctx, `select pgque.send('q1', 't', '{}'::text, 'p', 'order-43')`).Scan(&again); err != nil || again != ids[0] {
		t.Fatalf("text send of a batch's key: %d %v, want %d", again, err, ids[0])
	}
}

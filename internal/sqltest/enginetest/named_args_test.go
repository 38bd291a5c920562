package enginetest

import (
	"context"
	"testing"
)

// TestSendNamedArguments: the documented call shapes with named arguments
// work, and the key lands in the event's partition key.
func TestSendNamedArguments(t *testing.T) {
	ctx := context.Background()
	_, pool := setupEngine(t)
	var id int64
	if err := pool.QueryRow(ctx,
		`select pgque.send('q', 'FileCreated', '{"path": "/a.pdf"}', partition_key => 'tenant-42')`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	var ids []int64
	if err := pool.QueryRow(ctx,
		`select pgque.send_batch('q', 'FileDeleted', array['{"n": 1}', '{"n": 2}']::jsonb[], partition_keys => array['tenant-7', null])`).Scan(&ids); err != nil {
		t.Fatal(err)
	}
	var keys []*string
	if err := pool.QueryRow(ctx,
		`select array_agg(ev_extra1 order by ev_id) from pgque.event where ev_id = any($1)`,
		append([]int64{id}, ids...)).Scan(&keys); err != nil {
		t.Fatal(err)
	}
	if len(keys) != 3 || keys[0] == nil || *keys[0] != "tenant-42" || keys[1] == nil || *keys[1] != "tenant-7" || keys[2] != nil {
		t.Fatalf("partition keys stored: %v", keys)
	}
}

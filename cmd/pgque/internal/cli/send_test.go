package cli

import (
	"context"
	"fmt"
	"testing"
)

// TestSendMixedTypesCLI: an envelope stream of several types is sent in
// one transaction, in input order, each event with its own type (the
// --type flag for lines without one).
func TestSendMixedTypesCLI(t *testing.T) {
	t.Parallel()
	c := setup(t)
	c.ok("", "install")
	c.ok("", "queue", "create", "files")
	ids := evIDs(t, c.ok(`{"type": "FileCreated", "key": "t1", "payload": {"n": 1}}
{"type": "FileOverwritten", "key": "t1", "payload": {"n": 2}}
{"key": "t2", "payload": {"n": 3}}
{"type": "FileCreated", "key": "t2", "payload": {"n": 4}}
`, "send", "files", "--envelope", "--type", "FileDeleted"))
	rows, err := c.conn().Query(context.Background(),
		`select ev_id, ev_type, ev_extra1, ev_txid::text from pgque.event order by ev_id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var got []string
	txids := map[string]bool{}
	for rows.Next() {
		var id int64
		var typ, key, txid string
		if err := rows.Scan(&id, &typ, &key, &txid); err != nil {
			t.Fatal(err)
		}
		got = append(got, fmt.Sprintf("%d %s %s", id, typ, key))
		txids[txid] = true
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	want := []string{
		fmt.Sprintf("%d FileCreated t1", ids[0]), fmt.Sprintf("%d FileOverwritten t1", ids[1]),
		fmt.Sprintf("%d FileDeleted t2", ids[2]), fmt.Sprintf("%d FileCreated t2", ids[3]),
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("stored %v, want %v", got, want)
	}
	if len(txids) != 1 {
		t.Errorf("events stored by %d transactions, want 1", len(txids))
	}
}

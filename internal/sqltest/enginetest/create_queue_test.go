package enginetest

import (
	"context"
	"testing"
)

// attachedHere counts the event tables of queue id that are partitions of
// pgque.event, and how many of them the transaction q runs in attached.
// A session building its partition descriptor of pgque.event while an
// ATTACH commits can cache a list without the new tables
// (_event_tables_attach in pgque.create_queue.sql); a queue whose tables
// were attached by the very transaction that made it visible is the one
// such a session then cannot send to or read.
func attachedHere(t *testing.T, q db, id int32) (attached, here int64) {
	t.Helper()
	err := q.QueryRow(context.Background(), `
		select count(*), count(*) filter (where i.xmin = pg_catalog.xid(pg_catalog.pg_current_xact_id()))
		  from generate_series(0, pgque._queue_ntables() - 1) n
		  join pg_catalog.pg_inherits i on i.inhrelid = pg_catalog.to_regclass(pgque._event_table($1, n))
		 where i.inhparent = 'pgque.event'::regclass`, id).Scan(&attached, &here)
	if err != nil {
		t.Fatal(err)
	}
	return attached, here
}

// TestQueueTablesAttachedBeforeTheQueue: the tables of a queue are
// attached by an earlier transaction than the create_queue that makes it
// visible (the install's, or the previous create_queue's), and each
// create_queue attaches the next queue's. A create_queue that rolled back
// took its successor's tables with it: the next one attaches its own, and
// the one after is ahead again.
func TestQueueTablesAttachedBeforeTheQueue(t *testing.T) {
	t.Parallel()
	_, pool := setupDB(t)
	ctx := context.Background()

	// create runs create_queue(name) in a transaction and returns the
	// queue's id with how many of its tables, and of the next id's, are
	// attached, and how many of those by that transaction.
	type counts struct{ id, own, ownHere, next, nextHere int64 }
	create := func(name string, commit bool) counts {
		t.Helper()
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
		exec(t, tx, "select pgque.create_queue($1)", name)
		id := scalar[int32](t, tx, "select queue_id from pgque.queue where queue_name = $1", name)
		var c counts
		c.id = int64(id)
		c.own, c.ownHere = attachedHere(t, tx, id)
		c.next, c.nextHere = attachedHere(t, tx, id+1)
		if commit {
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
		}
		return c
	}
	ahead := func(name string, c counts) {
		t.Helper()
		if c.own != 3 || c.ownHere != 0 || c.next != 3 || c.nextHere != 3 {
			t.Errorf("create_queue(%s), id %d: its tables %d attached, %d by it; the next id's %d, %d by it; want 3, 0; 3, 3",
				name, c.id, c.own, c.ownHere, c.next, c.nextHere)
		}
	}

	for _, name := range []string{"first", "second", "third"} {
		ahead(name, create(name, true))
	}

	// A rolled-back create_queue took an id, its tables stay, its
	// successor's go.
	gone := create("gone", false)
	after := create("after", true)
	if after.id != gone.id+1 || after.own != 3 || after.ownHere != 3 || after.next != 3 || after.nextHere != 3 {
		t.Errorf("create_queue after a rollback, id %d (rolled back %d): its tables %d attached, %d by it; the next id's %d, %d by it; want 3, 3; 3, 3",
			after.id, gone.id, after.own, after.ownHere, after.next, after.nextHere)
	}
	ahead("later", create("later", true))

	// Every queue made here sends and is read.
	for _, q := range []string{"first", "second", "third", "after", "later"} {
		exec(t, pool, "select pgque.subscribe($1, 'c')", q)
		id := scalar[int64](t, pool, `select pgque.send($1, '{"x": 1}'::jsonb)`, q)
		tick(t, pool, q)
		if ms := mustReceive(t, pool, q, "c", 10); len(ms) != 1 || ms[0].MsgID != id {
			t.Errorf("queue %s: received %v, want [%d]", q, msgIDs(ms), id)
		}
	}
}

// TestQueueTablesOfTheInstall: a fresh install has attached the tables of
// the first queue; a table of the next queue's name that is no partition
// of pgque.event makes create_queue fail (XX000, naming it) and creates
// nothing.
func TestQueueTablesOfTheInstall(t *testing.T) {
	t.Parallel()
	_, pool := setupDB(t)
	next := scalar[int32](t, pool, "select pgque._spare_queue_id()")
	if n, _ := attachedHere(t, pool, next); n != 3 {
		t.Fatalf("after the install, %d tables of the first queue (id %d) are attached, want 3", n, next)
	}
	exec(t, pool, "select pgque.create_queue('a')")
	spare := scalar[string](t, pool, "select pgque._event_table(pgque._spare_queue_id(), 1)")
	exec(t, pool, "alter table pgque.event detach partition "+spare)
	err := queryErr(pool, "select pgque.create_queue('b')")
	wantCode(t, "create_queue over a detached table", err, "XX000", spare+" exists but is not a partition of pgque.event")
	if n := scalar[int64](t, pool, "select count(*) from pgque.queue where queue_name = 'b'"); n != 0 {
		t.Errorf("the failed create_queue left queue b")
	}
}

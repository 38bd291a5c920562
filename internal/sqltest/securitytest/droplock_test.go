package securitytest

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgque/pgque/internal/install"
	"github.com/pgque/pgque/internal/testing/pgtest"
)

// TestLockedQueueDropStallsNoOtherProducer: a session can lock a queue's
// sequence or event tables without the right to use them (nextval() locks
// the sequence before it checks the privilege, and keeps the lock past a
// rolled-back savepoint; PREPARE locks the tables it names and runs
// nothing). drop_queue of that queue then waits for the lock, but holding
// nothing that other queues' producers need: a send to another queue
// finishes while it waits (under a statement timeout shorter than the
// wait), and after 5 s it fails with 55P03 naming the session, having
// dropped nothing. So it does when the session holds pgque.event, the
// parent of every queue's tables, having sent or read anything. Once the
// lock is gone the drop goes through.
func TestLockedQueueDropStallsNoOtherProducer(t *testing.T) {
	t.Parallel() // its own cluster; it waits out a lock timeout
	ctx := context.Background()
	_, super, newDB := installerCluster(t)
	dsn := newDB("droplock")
	owner := pgtest.Conn(t, pgtest.DSNWith(dsn, "user", "pgque_owner"))
	if _, err := install.Install(ctx, owner); err != nil {
		t.Fatal(err)
	}
	mustExec(t, super, `create role dl_reader login`, `create role dl_writer login`)
	mustExec(t, owner, `grant pgque_reader to dl_reader`, `grant pgque_writer to dl_writer`,
		`select pgque.create_queue('doomed')`, `select pgque.create_queue('other')`)
	writer := pgtest.Conn(t, pgtest.DSNWith(dsn, "user", "dl_writer"))
	mustExec(t, writer, `set statement_timeout = '3s'`)
	var seqOID uint32
	var table string
	if err := owner.QueryRow(ctx, `select queue_event_seq::oid, pgque._event_table(queue_id, 0)
		from pgque.queue where queue_name = 'doomed'`).Scan(&seqOID, &table); err != nil {
		t.Fatal(err)
	}

	holders := []struct {
		name, role string
		hold       func(tx pgx.Tx) error
	}{
		{"a stranger's nextval() of the sequence", "stranger", func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `savepoint a`); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `select nextval(`+itoa64(int64(seqOID))+`::oid::regclass)`)
			if codeOf(err) != "42501" {
				t.Fatalf("the stranger's nextval(): %v, want 42501", err)
			}
			_, err = tx.Exec(ctx, `rollback to savepoint a`) // the sequence's lock stays
			return err
		}},
		{"a reader's PREPARE on an event table", "dl_reader", func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `prepare p as select 1 from `+table)
			return err
		}},
		// It holds pgque.event, which the drop of any queue needs: each try
		// for it waits 20 ms, so the others' sends do not queue behind a
		// wait of 5 s.
		{"a writer's open transaction that sent to another queue", "dl_writer", func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `select pgque.send('other', 't', '{}'::jsonb, 'held')`)
			return err
		}},
	}
	for _, h := range holders {
		conn := pgtest.Conn(t, pgtest.DSNWith(dsn, "user", h.role))
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := h.hold(tx); err != nil {
			t.Fatalf("%s: %v", h.name, err)
		}
		var pid int32
		if err := conn.QueryRow(ctx, `select pg_backend_pid()`).Scan(&pid); err != nil {
			t.Fatal(err)
		}

		var ownerPID int32
		if err := owner.QueryRow(ctx, `select pg_backend_pid()`).Scan(&ownerPID); err != nil {
			t.Fatal(err)
		}
		dropped := make(chan error, 1)
		go func() {
			_, err := owner.Exec(ctx, `select pgque.drop_queue('doomed', true)`)
			dropped <- err
		}()
		pgtest.WaitFor(t, 10*time.Second, "drop_queue to wait for a lock", func() bool {
			var waiting bool
			err := super.QueryRow(ctx, `select exists (select 1 from pg_stat_activity
				where pid = $1 and wait_event_type = 'Lock')`, ownerPID).Scan(&waiting)
			return err == nil && waiting
		})
		if _, err := writer.Exec(ctx, `select pgque.send('other', 't', '{}'::jsonb, 'k')`); err != nil {
			t.Errorf("%s: a send to another queue while drop_queue waits: %v", h.name, err)
		}
		err = <-dropped
		if codeOf(err) != "55P03" || !strings.Contains(err.Error(), "pid "+itoa(int(pid))) {
			t.Errorf("%s: drop_queue = %v, want 55P03 naming pid %d", h.name, err, pid)
		}
		var left int
		if err := owner.QueryRow(ctx, `select count(*)::integer from pgque.queue where queue_name = 'doomed'`).Scan(&left); err != nil || left != 1 {
			t.Errorf("%s: the failed drop left %d queues named doomed (%v), want 1", h.name, left, err)
		}
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
	}
	mustExec(t, owner, `select pgque.drop_queue('doomed', true)`)
	if _, err := writer.Exec(ctx, `select pgque.send('other', 't', '{}'::jsonb, 'k')`); err != nil {
		t.Fatal(err)
	}
}

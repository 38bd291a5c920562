package enginetest

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pgque/pgque/internal/install"
	"github.com/pgque/pgque/internal/testing/pgtest"
	sqlfiles "github.com/pgque/pgque/sql"
)

// setupInstall gives an install test a fresh, empty database and a pool.
func setupInstall(t *testing.T) (dsn string, pool beginner) {
	t.Helper()
	dsn = pgtest.NewDB(t)
	return dsn, pgtest.Pool(t, dsn)
}

// reinstall runs install.Install over its own connection and checks that it
// reports an upgrade in place from the current version.
func reinstall(t *testing.T, dsn string) {
	t.Helper()
	res, err := install.Install(context.Background(), pgtest.Conn(t, dsn))
	if err != nil {
		t.Fatal("reinstall:", err)
	}
	if res.Fresh() || res.Previous != sqlfiles.Version || res.Version != sqlfiles.Version {
		t.Errorf("reinstall result = %+v, want an in-place upgrade %s -> %s", res, sqlfiles.Version, sqlfiles.Version)
	}
}

// TestInstallTwiceOnEmptyDatabase: the first install is fresh, the second
// upgrades in place, and the recorded version is pgque's.
func TestInstallTwiceOnEmptyDatabase(t *testing.T) {
	t.Parallel()
	dsn, pool := setupInstall(t)
	res, err := install.Install(context.Background(), pgtest.Conn(t, dsn))
	if err != nil {
		t.Fatal(err)
	}
	if !res.Fresh() || res.Version != sqlfiles.Version {
		t.Errorf("first install = %+v, want fresh %s", res, sqlfiles.Version)
	}
	reinstall(t, dsn)
	if v := scalar[string](t, pool, "select version from pgque.version"); v != sqlfiles.Version {
		t.Errorf("pgque.version = %q, want %q", v, sqlfiles.Version)
	}
	if n := scalar[int64](t, pool, "select count(*) from pgque.version"); n != 1 {
		t.Errorf("pgque.version has %d rows", n)
	}
	// The reinstalled schema works end to end.
	exec(t, pool, "select pgque.create_queue('q')")
	exec(t, pool, "select pgque.subscribe('q', 'c')")
	id := scalar[int64](t, pool, `select pgque.send('q', '{"x": 1}'::jsonb)`)
	tick(t, pool, "q")
	if ms := mustReceive(t, pool, "q", "c", 10); len(ms) != 1 || ms[0].MsgID != id {
		t.Errorf("received %v, want [%d]", msgIDs(ms), id)
	}
}

// TestInstallOverLiveQueue: installing twice over a database with queued
// events, an open batch half received, and pending retries loses nothing:
// the batch is still open with the same id and rows, cursors and settings
// are unchanged, retries and events are still delivered.
func TestInstallOverLiveQueue(t *testing.T) {
	t.Parallel()
	dsn, pool := setupDB(t)
	exec(t, pool, "select pgque.create_queue('q')")
	exec(t, pool, "select pgque.subscribe('q', 'a')")
	exec(t, pool, "select pgque.subscribe('q', 'b')")
	exec(t, pool, "select pgque.set_queue_config('q', 'rotation_period', '17 minutes')")
	exec(t, pool, "select pgque.set_queue_config('q', 'max_retries', '9')")
	first := sendN(t, pool, 6, "first")
	tick(t, pool, "q")
	// a: an open batch, one chunk acked, the next chunk received (not
	// acked), one event nacked with a zero delay (due, not yet moved) and
	// one with a long delay.
	c1 := mustReceive(t, pool, "q", "a", 2)
	if ack(t, pool, c1[0].BatchID) != 0 {
		t.Fatal("ack of chunk 1 finished the batch")
	}
	c2 := mustReceive(t, pool, "q", "a", 2)
	batch := c2[0].BatchID
	exec(t, pool, "select pgque.nack($1, $2, '0', 'due')", batch, c2[0].MsgID)
	exec(t, pool, "select pgque.nack($1, $2, '1 hour', 'later')", batch, c2[1].MsgID)
	// Queued events not yet ticked, and a dead letter.
	queued := sendN(t, pool, 4, "queued")

	type state struct {
		A, B      consumerInfo
		Queue     string
		Version   string
		Retries   int64
		Events    int64
		Ticks     []int64
		Progress  string
		DeadCount int64
	}
	read := func() state {
		var s state
		s.A = getConsumerInfo(t, pool, "q", "a")
		s.B = getConsumerInfo(t, pool, "q", "b")
		s.Queue = scalar[string](t, pool, `select format('%s', q) from pgque.queue q where queue_name = 'q'`)
		s.Version = scalar[string](t, pool, "select version from pgque.version")
		s.Retries = scalar[int64](t, pool, "select count(*) from pgque.retry_queue")
		s.Events = countEvents(t, pool, "q")
		s.Ticks = column[int64](t, pool, "select tick_id from pgque.tick order by tick_id")
		s.Progress = scalar[string](t, pool, "select coalesce(string_agg(format('%s', p), ';' order by p.st_seq), '') from pgque.sub_state p")
		s.DeadCount = scalar[int64](t, pool, "select count(*) from pgque.dead_letter")
		return s
	}
	before := read()
	if before.A.CurrentBatch != batch || before.Retries != 2 {
		t.Fatalf("setup: %+v", before)
	}

	reinstall(t, dsn)
	reinstall(t, dsn)

	after := read()
	if after.Queue != before.Queue || after.Retries != before.Retries || after.Events != before.Events ||
		!slices.Equal(after.Ticks, before.Ticks) || after.Progress != before.Progress || after.A != before.A ||
		after.B != before.B || after.DeadCount != before.DeadCount {
		t.Fatalf("install changed the state:\n before %+v\n after  %+v", before, after)
	}
	if after.Version != sqlfiles.Version {
		t.Errorf("recorded version %q, want %q", after.Version, sqlfiles.Version)
	}

	// The open batch hands out the same rows again.
	again := mustReceive(t, pool, "q", "a", 2)
	if !slices.Equal(msgIDs(again), msgIDs(c2)) || again[0].BatchID != batch {
		t.Fatalf("after install a received %v of batch %d, want %v of batch %d", msgIDs(again), again[0].BatchID, msgIDs(c2), batch)
	}
	var gotA []int64
	gotA = append(gotA, msgIDs(c1)...)
	for range 100 {
		ms := mustReceive(t, pool, "q", "a", 2)
		if len(ms) == 0 {
			if len(gotA) >= len(first)+len(queued) {
				break
			}
			tick(t, pool, "q")
			continue
		}
		gotA = append(gotA, msgIDs(ms)...)
		ack(t, pool, ms[0].BatchID)
	}
	if want := append(slices.Clone(first), queued...); !slices.Equal(gotA, want) {
		t.Errorf("a received %v, want %v", gotA, want)
	}
	// The due retry comes back; the long one stays pending.
	if n := scalar[int32](t, pool, "select pgque.maint_retry_events()"); n != 1 {
		t.Errorf("maint_retry_events = %d, want 1", n)
	}
	tick(t, pool, "q")
	if ms := receiveAll(t, pool, "a", 10); len(ms) != 1 || ms[0].MsgID != c2[0].MsgID || ms[0].RetryCount != 1 {
		t.Errorf("retry after install: %+v, want msg %d with retry_count 1", ms, c2[0].MsgID)
	}
	if n := scalar[int64](t, pool, "select retry_pending from pgque.get_queue_info('q')"); n != 1 {
		t.Errorf("%d retries pending, want 1 (the one-hour delay)", n)
	}
	// b never started: it gets everything.
	gotB := msgIDs(receiveAll(t, pool, "b", 100))
	if want := append(slices.Clone(first), queued...); !slices.Equal(gotB, want) {
		t.Errorf("b received %v, want %v", gotB, want)
	}
}

// TestInstallMovesTheEventIndexOntoTheTables: earlier versions indexed
// (ev_txid, ev_id), and before that (ev_txid), on pgque.event, which made
// a copy on every event table. An install over either gives every event
// table an (ev_txid, ev_id) index of its own, and the next maint() drops
// the one of pgque.event (so that the partition layer can replace a
// table's index by its routing index); what was queued is still delivered.
func TestInstallMovesTheEventIndexOntoTheTables(t *testing.T) {
	t.Parallel()
	for _, old := range []string{"event_txid_id_idx on pgque.event (ev_txid, ev_id)", "event_txid_idx on pgque.event (ev_txid)"} {
		t.Run(strings.Fields(old)[0], func(t *testing.T) {
			dsn, pool := setupDB(t)
			exec(t, pool, "select pgque.create_queue('q')")
			exec(t, pool, "select pgque.subscribe('q', 'c')")
			sent := sendN(t, pool, 5, "old")
			tick(t, pool, "q")
			for _, ix := range column[string](t, pool, `select c.relname::text from pg_catalog.pg_index i
				  join pg_catalog.pg_class c on c.oid = i.indexrelid
				 where i.indrelid = any($1::regclass[]) and not i.indisunique`, eventTables(t, pool, "q")) {
				exec(t, pool, "drop index pgque."+ix)
			}
			// Nor did they attach the next queue's tables ahead.
			spare := scalar[int32](t, pool, "select pgque._spare_queue_id()")
			for n := range 3 {
				exec(t, pool, fmt.Sprintf("drop table pgque.event_%d_%d", spare, n))
			}
			exec(t, pool, "create index "+old)

			// A producer's lock on pgque.event (alone here: a real one also
			// holds its table, whose index build would wait for it anyway)
			// does not hold the install up: the install never locks
			// pgque.event, which cost sends deadlock errors when it did
			// (_retire_event_index).
			ctx := context.Background()
			producer, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer producer.Rollback(ctx)
			exec(t, producer, "lock table only pgque.event in row exclusive mode")
			conn := pgtest.Conn(t, dsn)
			done := make(chan error, 1)
			go func() {
				_, err := install.Install(ctx, conn)
				done <- err
			}()
			select {
			case err := <-done:
				if err != nil {
					t.Fatal("reinstall:", err)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("the install waited 30 s for a producer's lock on pgque.event")
			}
			// maint() retires the index of pgque.event, once the producer
			// is done.
			if old := scalar[int64](t, pool, "select count(*) from pg_catalog.pg_index where indrelid = 'pgque.event'::regclass and not indisunique"); old != 1 {
				t.Errorf("after the install pgque.event has %d indexes besides the dedup index, want the old one", old)
			}
			if err := producer.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			// The maint() that drops it does nothing else: its transaction
			// then holds pgque.event's ACCESS EXCLUSIVE lock, and waiting for
			// the state and tick tables consumers hold as they wait for
			// pgque.event was a deadlock.
			m, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Rollback(ctx)
			exec(t, m, "select pgque.maint()")
			if held := scalar[[]string](t, m, `select coalesce(array_agg(distinct c.relname::text order by c.relname::text), '{}')
				  from pg_catalog.pg_locks l join pg_catalog.pg_class c on c.oid = l.relation
				 where l.pid = pg_backend_pid() and c.relname ~ '^(sub_state|tick|rotation|queue)'`); len(held) != 0 {
				t.Errorf("the maint() that dropped pgque.event's index also locked %v", held)
			}
			if err := m.Commit(ctx); err != nil {
				t.Fatal(err)
			}

			defs := column[string](t, pool, `select c.relname || ' ' || regexp_replace(pg_catalog.pg_get_indexdef(i.indexrelid), '^.* USING ', '')
				  from pg_catalog.pg_index i join pg_catalog.pg_class c on c.oid = i.indexrelid
				 where i.indrelid = any($1::regclass[]) and not i.indisunique order by 1`, eventTables(t, pool, "q"))
			id := scalar[int32](t, pool, "select queue_id from pgque.queue where queue_name = 'q'")
			var want []string
			for n := range 3 {
				want = append(want, fmt.Sprintf("event_%d_%d_txid btree (ev_txid, ev_id)", id, n))
			}
			if !slices.Equal(defs, want) {
				t.Errorf("indexes of the event tables after the install: %q, want %q", defs, want)
			}
			if n, _ := attachedHere(t, pool, spare); n != 3 {
				t.Errorf("after the install %d tables of the next queue are attached, want 3", n)
			}
			if n := scalar[int64](t, pool, "select count(*) from pg_catalog.pg_index where indrelid = 'pgque.event'::regclass and not indisunique"); n != 0 {
				t.Errorf("pgque.event still has %d indexes besides the dedup index", n)
			}
			if got := msgIDs(mustReceive(t, pool, "q", "c", 10)); !slices.Equal(got, sent) {
				t.Errorf("after the install c received %v, want %v", got, sent)
			}
		})
	}
}

// TestDLQListUpgradeAddsNamedColumns: an install over the dlq_list that
// ended with ev_extra4 replaces it with the one that also names the
// consumer as subscribed, the slot and the key, and grants it again.
func TestDLQListUpgradeAddsNamedColumns(t *testing.T) {
	dsn, pool := setupEngine(t)
	exec(t, pool, `drop function pgque.dlq_list(text, text, integer)`)
	exec(t, pool, `create function pgque.dlq_list(i_queue text, i_consumer text default null, i_max integer default 100)
		returns table (dl_id bigint, consumer text, dl_time timestamptz, reason text, ev_id bigint,
		               ev_time timestamptz, ev_retry integer, ev_type text, ev_data text,
		               ev_extra1 text, ev_extra2 text, ev_extra3 text, ev_extra4 text)
		language sql as $$ select null::bigint, null, null::timestamptz, null, null::bigint, null::timestamptz,
		                          null::integer, null, null, null, null, null, null where false $$`)

	reinstall(t, dsn)

	cols := column[string](t, pool, `select unnest(proargnames) from pg_proc where oid = 'pgque.dlq_list(text, text, integer)'::regprocedure`)
	if !slices.Contains(cols, "key") || !slices.Contains(cols, "consumer_name") || !slices.Contains(cols, "slot") || !slices.Contains(cols, "ev_extra1") {
		t.Errorf("dlq_list after the upgrade has columns %v", cols)
	}
	if !scalar[bool](t, pool, `select has_function_privilege('pgque_reader', 'pgque.dlq_list(text, text, integer)', 'execute')`) {
		t.Error("dlq_list is not granted to pgque_reader after the upgrade")
	}
}

// TestSubscribeUnderAnOldSnapshot: a REPEATABLE READ transaction whose
// snapshot predates a tick flip sees no tick of the queue (the flip copies
// the kept ticks into the other partition and truncates this one). A
// subscribe there failed with a not-null violation (23502); it is now
// PQ011 naming the isolation level, and nothing is subscribed.
func TestSubscribeUnderAnOldSnapshot(t *testing.T) {
	t.Parallel()
	dsn, pool := setupDB(t)
	ctx := context.Background()
	exec(t, pool, "select pgque.create_queue('q')")
	tick(t, pool, "q")
	tick(t, pool, "q")
	old := pgtest.Conn(t, dsn)
	if _, err := old.Exec(ctx, "begin isolation level repeatable read; select count(*) from pgque.queue"); err != nil {
		t.Fatal(err)
	}
	if n := scalar[int32](t, pool, "select pgque.maint()"); n < 1 {
		t.Fatalf("maint() = %d, want the tick flip", n)
	}
	_, err := old.Exec(ctx, "select pgque.subscribe('q', 'c')")
	wantCode(t, "a subscribe under a snapshot older than the tick flip", err, "PQ011", "READ COMMITTED")
	if _, err := old.Exec(ctx, "rollback"); err != nil {
		t.Fatal(err)
	}
	if n := scalar[int64](t, pool, "select count(*) from pgque.subscription"); n != 0 {
		t.Errorf("%d subscriptions after the refused subscribe", n)
	}
	exec(t, pool, "select pgque.subscribe('q', 'c')")
}

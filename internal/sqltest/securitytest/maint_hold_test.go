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

// blockerRow is one row of rotation_blockers().
type blockerRow struct {
	Queue, Kind *string
	What        string
	Since       *time.Time
	Pid         *int
	Role, Holds *string
}

func rotationBlockers(t *testing.T, conn *pgx.Conn) []blockerRow {
	t.Helper()
	rows, err := conn.Query(context.Background(), `select queue, kind, what, since, pid, role, holds from pgque.rotation_blockers()`)
	if err != nil {
		t.Fatal("rotation_blockers:", err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[blockerRow])
	if err != nil {
		t.Fatal("rotation_blockers:", err)
	}
	return got
}

// namesSession reports whether b names the session pid, with its role (and
// the start of its transaction when wantSince).
func (b blockerRow) namesSession(pid int, wantSince bool) bool {
	return b.Pid != nil && *b.Pid == pid && b.Role != nil && *b.Role != "" && b.Holds != nil &&
		(b.Since != nil || !wantSince) && strings.Contains(b.What, sprintf("pid %d,", pid))
}

// TestHeldHotKeysReadDoesNotStopRotation: a writer reads hot_keys of a
// queue in a transaction it leaves open. The read covers the tables written
// within its window only, so it holds no lock on the old table rotation
// truncates next, and maint() rotates the queue at once.
func TestHeldHotKeysReadDoesNotStopRotation(t *testing.T) {
	dsn, conn := setupDB(t)
	ctx := context.Background()
	mustExec(t, conn, `select pgque.create_queue('hk')`,
		`select pgque.set_queue_config('hk', 'rotation_period', '1 microsecond')`,
		`select pgque.send('hk', 't', '{}'::jsonb, 'k1')`, `select pgque.force_next_tick('hk')`, `select pgque.ticker('hk')`,
		// A queue in service for an hour: its other tables were last
		// written long before the window hot_keys reads.
		`update pgque.queue set queue_switch_time = queue_switch_time - interval '1 hour' where queue_name = 'hk'`)
	writer := asRole(t, dsn, roleWriter)
	tx, err := writer.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	var key string
	if err := tx.QueryRow(ctx, `select key from pgque.hot_keys('hk')`).Scan(&key); err != nil || key != "k1" {
		t.Fatalf("hot_keys = %q, %v; want k1", key, err)
	}
	admin := asRole(t, dsn, roleAdmin)
	before := scalarOf[int](t, admin, `select queue_cur_table from pgque.get_queue_info('hk')`)
	mustExec(t, admin, `select pgque.maint()`)
	if after := scalarOf[int](t, admin, `select queue_cur_table from pgque.get_queue_info('hk')`); after == before {
		t.Fatalf("maint() did not rotate queue hk (table %d) while a writer's hot_keys read was open", after)
	}
}

// TestHeldReadsBoundMaintAndAreNamed: a writer reads hot_keys over a day on
// six queues whose rotation is due, and the slot leases and queue info,
// and leaves the transaction open. Its locks keep those tables and the
// current tick and state partitions from being truncated; one maint() call
// still returns within its lock budget (not half a second per queue), and
// rotation_blockers names the writer's session (pid, role, start, the lock)
// for every queue and for the flips it holds back.
func TestHeldReadsBoundMaintAndAreNamed(t *testing.T) {
	dsn, conn := setupDB(t)
	queues := []string{"hq1", "hq2", "hq3", "hq4", "hq5", "hq6"}
	for _, q := range queues {
		mustExec(t, conn, `select pgque.create_queue('`+q+`')`,
			`select pgque.set_queue_config('`+q+`', 'rotation_period', '1 microsecond')`,
			`select pgque.send('`+q+`', 't', '{}'::jsonb, 'k')`, `select pgque.force_next_tick('`+q+`')`, `select pgque.ticker('`+q+`')`,
			`select pgque.force_next_tick('`+q+`')`, `select pgque.ticker('`+q+`')`)
	}
	// Acknowledged batches: state records and ticks a flip would drop.
	reader := asRole(t, dsn, roleReader)
	mustExec(t, reader, `select pgque.ack(b) from (select distinct batch_id as b from pgque.receive('q1', 'c1', 100)) x`)

	reads := []string{`select count(*) from pgque.partition_slot_leases`, `select count(*) from pgque.get_queue_info()`}
	for _, q := range queues {
		reads = append(reads, `select count(*) from pgque.hot_keys('`+q+`', '1 day')`)
	}
	pid := pgtest.HoldTx(t, asRole(t, dsn, roleWriter), reads...)

	admin := asRole(t, dsn, roleAdmin)
	start := time.Now()
	mustExec(t, admin, `select pgque.maint()`)
	// One second of lock budget, plus slack for a loaded machine; each
	// queue waiting its own half second, and each flip 200 ms, would take
	// at least 3.4 s.
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("maint() took %v with a writer's reads held on %d queues", took, len(queues))
	}

	got := rotationBlockers(t, admin)
	for _, q := range queues {
		found := false
		for _, b := range got {
			found = found || b.Queue != nil && *b.Queue == q && *b.Kind == "session" && b.namesSession(pid, true)
		}
		if !found {
			t.Errorf("rotation_blockers names no session pid %d for queue %s: %+v", pid, q, got)
		}
	}
	flips := map[string]bool{}
	for _, b := range got {
		if *b.Kind == "flip" && b.namesSession(pid, true) {
			flips[strings.SplitN(b.What, " ", 2)[0]] = true
		}
	}
	if !flips["state"] || !flips["tick"] {
		t.Errorf("rotation_blockers names the writer (pid %d) for flips %v, want state and tick: %+v", pid, flips, got)
	}
}

// TestRotationBlockersAsNonSuperuserOwner installs pgque as an owner
// without superuser or pg_read_all_stats (as managed services require). A
// reader's transaction left open after subscribe holds rotation back;
// rotation_blockers, run by the owner, still names its pid and role (its
// state and start are what that owner cannot see).
func TestRotationBlockersAsNonSuperuserOwner(t *testing.T) {
	_, _, newDB := installerCluster(t)
	ctx := context.Background()
	dsn := newDB("rbown")
	owner := pgtest.Conn(t, pgtest.DSNWith(dsn, "user", "pgque_owner"))
	if _, err := install.Install(ctx, owner); err != nil {
		t.Fatal(err)
	}
	if scalarOf[bool](t, owner, `select pg_has_role(current_user, 'pg_read_all_stats', 'usage') or (select rolsuper from pg_roles where rolname = current_user)`) {
		t.Fatal("the owner can read every session's state: the test would prove nothing")
	}
	mustExec(t, owner, `select pgque.create_queue('q')`,
		`select pgque.set_queue_config('q', 'rotation_period', '1 microsecond')`,
		`create role app_r login`, `grant pgque_reader to app_r`)
	pid := pgtest.HoldTx(t, pgtest.Conn(t, pgtest.DSNWith(dsn, "user", "app_r")), `select pgque.subscribe('q', 'held')`)
	for _, b := range rotationBlockers(t, owner) {
		if b.Queue != nil && *b.Queue == "q" && *b.Kind == "session" && b.namesSession(pid, false) && *b.Role == "app_r" {
			return
		}
	}
	t.Fatalf("rotation_blockers run by a non-superuser owner does not name the reader's session (pid %d): %+v", pid, rotationBlockers(t, owner))
}

// TestSlotConsumerNameLeavesRoomForEverySlot: a slot consumer's name is
// refused (PQ010) for every slot of every N when some slot's derived name
// could not fit, so a pool never gets some of its slots only; a name at the
// documented limit (53 bytes) subscribes the last slot of 1024.
func TestSlotConsumerNameLeavesRoomForEverySlot(t *testing.T) {
	dsn, _ := setupDB(t)
	reader := asRole(t, dsn, roleReader)
	long := strings.Repeat("n", 55)
	for _, slot := range [][2]int{{0, 4}, {1023, 1024}, {0, 1}} {
		stmt := sprintf(`select pgque.subscribe_slot('q1', '%s', %d, %d)`, long, slot[0], slot[1])
		if code, msg := sqlstate(t, reader, "", stmt); code != "PQ010" {
			t.Errorf("%s = %s %s, want PQ010", stmt, code, msg)
		}
	}
	limit := strings.Repeat("m", 53)
	mustExec(t, reader, sprintf(`select pgque.subscribe_slot('q1', '%s', 1023, 1024)`, limit),
		sprintf(`select pgque.subscribe_slot('q1', '%s', 0, 1024)`, limit))
}

// TestHugeIntervalsAreBadArguments: durations that overflow a timestamp
// (or pass a naive interval comparison) are refused as the bad arguments
// they are (PQ011), not as a timestamp overflow (22008), by the lease ttl
// of claim_slot, the window of hot_keys, the age of dlq_purge and the
// retry delays of settle_held_partitioned (0 to 30 days, as nack's).
func TestHugeIntervalsAreBadArguments(t *testing.T) {
	_, conn := setupDB(t)
	for _, c := range []struct {
		role, sql string
		values    []string
	}{
		{roleReader, `select pgque.claim_slot('q1', 'sc', 0, 'w-huge', %s)`, trickyIntervals},
		{roleReader, `select * from pgque.hot_keys('q1', %s)`, trickyIntervals},
		{roleAdmin, `select pgque.dlq_purge('q1', null, %s)`, []string{`'178000000 years'`, `'-178000000 years'`}},
		{roleReader, `select pgque.settle_held_partitioned('q1', 'sc', 0, 2, 'w', gen_random_uuid(), 1, 'k', 1, '{}',
			array[1]::bigint[], array[%s]::interval[], array['r'])`,
			[]string{`'178000000 years'`, `'-178000000 years'`, `'10000 years -3599999 days'`, `'100 years -35999 days'`, `'-1 microsecond'`}},
	} {
		for _, iv := range c.values {
			if code, msg := sqlstate(t, conn, c.role, sprintf(c.sql, iv)); code != "PQ011" {
				t.Errorf("as %s: %s = %s %s, want PQ011", c.role, sprintf(c.sql, iv), code, msg)
			}
		}
	}
}

package pgque_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgque/pgque"
	"github.com/pgque/pgque/internal/install"
	"github.com/pgque/pgque/internal/pgcluster"
	"github.com/pgque/pgque/internal/testing/pgtest"
)

// managedService is a private cluster set up the way managed PostgreSQL
// services hand it over: the application's owner role is no superuser but
// has CREATEDB and CREATEROLE (which 16 narrowed: such a role may grant only
// roles it holds with ADMIN OPTION, e.g. those it created), owns the
// database it created, and installs pgque there itself.
type managedService struct {
	cluster *pgcluster.Cluster
	ownerDSN,
	writerDSN,
	readerDSN string
}

// newManagedService starts the cluster with settings, lets the owner create
// database app and install pgque (which creates the pgque roles), and gives
// two logins the owner creates their pgque role each. before runs as the
// superuser on app before the install, for what only the service's operator
// may do (create pg_cron, say).
func newManagedService(t *testing.T, settings map[string]string, before ...string) *managedService {
	t.Helper()
	ctx := context.Background()
	c := pgtest.NewCluster(t, pgcluster.Options{Settings: settings})
	su := pgtest.Conn(t, c.DSN("postgres"))
	mustExec(t, su, "create role owner login createdb createrole")
	owner := pgtest.Conn(t, pgtest.DSNWith(c.DSN("postgres"), "user", "owner"))
	mustExec(t, owner, "create database app")
	suApp := pgtest.Conn(t, c.DSN("app"))
	mustExec(t, suApp, before...)

	ownerDSN := pgtest.DSNWith(c.DSN("app"), "user", "owner")
	ownerApp := pgtest.Conn(t, ownerDSN)
	if _, err := install.Install(ctx, ownerApp); err != nil {
		t.Fatalf("installing as the non-superuser owner: %v", err)
	}
	mustExec(t, ownerApp,
		"create role writer login", "grant pgque_writer to writer",
		"create role reader login", "grant pgque_reader to reader")
	return &managedService{
		cluster:   c,
		ownerDSN:  ownerDSN,
		writerDSN: pgtest.DSNWith(c.DSN("app"), "user", "writer"),
		readerDSN: pgtest.DSNWith(c.DSN("app"), "user", "reader"),
	}
}

// mustExec runs each statement, failing the test on the first error.
func mustExec(t *testing.T, conn *pgx.Conn, stmts ...string) {
	t.Helper()
	for _, s := range stmts {
		if _, err := conn.Exec(context.Background(), s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
}

// managedClient connects to dsn with a pool of its own.
func managedClient(t *testing.T, dsn string) *pgque.Client {
	t.Helper()
	return newClient(t, pgtest.Pool(t, dsn))
}

// roundTrip has the owner create a queue and subscribe 4 slots, the writer
// send keyed events and the reader's partitioned pool receive every one, in
// order per key. Something must tick the queue meanwhile.
// explain, when set, says on a timeout what the ticking side did.
func (m *managedService) roundTrip(t *testing.T, wait time.Duration, explain func() string) {
	t.Helper()
	ctx := context.Background()
	owner := managedClient(t, m.ownerDSN)
	if _, err := owner.CreateQueue(ctx, "orders"); err != nil {
		t.Fatalf("owner creating a queue: %v", err)
	}
	if _, err := owner.SubscribeSlots(ctx, "orders", "billing", 4, pgque.FailurePolicySkip); err != nil {
		t.Fatalf("owner subscribing 4 slots: %v", err)
	}

	var chk checker
	reader := managedClient(t, m.readerDSN)
	pc, err := reader.NewPartitionedConsumer(&pgque.PartitionedConsumerConfig{
		Queue: "orders", Consumer: "billing", Slots: 4, WorkerID: "reader",
		Handler: func(_ context.Context, msg *pgque.Message) error {
			defer chk.begin("reader", msg)()
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := pc.Start(ctx); err != nil {
		t.Fatalf("reader starting its partitioned pool: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		if err := pc.Stop(ctx); err != nil {
			t.Error("stopping the reader's pool:", err)
		}
	})

	writer := managedClient(t, m.writerDSN)
	sent := make(map[int64]string)
	for i := range 40 {
		key := fmt.Sprintf("customer-%d", i%8)
		id, err := writer.Send(ctx, "orders", pgque.Event{Type: "placed", Payload: i, PartitionKey: key})
		if err != nil {
			t.Fatalf("writer sending event %d: %v", i, err)
		}
		sent[id] = key
	}
	if !pgtest.Eventually(ctx, wait, func() bool { return chk.distinct() == len(sent) }) {
		why := ""
		if explain != nil {
			why = "; " + explain()
		}
		t.Fatalf("timed out after %v waiting for the reader to receive all %d events (%d received)%s", wait, len(sent), chk.distinct(), why)
	}
	if _, err := chk.verify(sent); err != nil {
		t.Fatal(err)
	}
}

// T-managed-install: on a server with no shared_preload_libraries and no
// pg_cron, a non-superuser owner installs pgque, the Go ticker ticks, a
// writer sends keyed events and a reader's partitioned pool consumes them
// all. Runs on whatever server build the tests use (PGQUE_PG_VERSION).
func TestManagedServiceInstallWithGoTicker(t *testing.T) {
	t.Parallel()
	m := newManagedService(t, nil)
	var preload string
	if err := pgtest.Conn(t, m.cluster.DSN("app")).QueryRow(context.Background(),
		"select current_setting('shared_preload_libraries')").Scan(&preload); err != nil || preload != "" {
		t.Fatalf("shared_preload_libraries = %q (%v), want none", preload, err)
	}
	startTicker(t, managedClient(t, m.ownerDSN))
	m.roundTrip(t, 30*time.Second, nil)
}

// T-managed-install-cron: the same with pg_cron ticking instead of Go, where
// the server has pg_cron: the operator creates the extension and lets the
// owner use it, and the owner schedules the ticker with pgque.start().
func TestManagedServiceInstallWithPgCron(t *testing.T) {
	t.Parallel()
	pgtest.SkipWithoutExtension(t, "pg_cron")
	m := newManagedService(t, map[string]string{
		"shared_preload_libraries": "pg_cron",
		"cron.database_name":       "app",
		// The cluster listens on no TCP port, where pg_cron connects by
		// default; background workers need no connection.
		"cron.use_background_workers": "on",
	}, "create extension pg_cron", "grant usage on schema cron to owner")
	if _, err := pgtest.Conn(t, m.ownerDSN).Exec(context.Background(), "select pgque.start()"); err != nil {
		t.Fatalf("owner scheduling the ticker with pg_cron: %v", err)
	}
	// pg_cron starts the job at the next minute; on a busy machine a run
	// may start late or fail to start, and the one a minute later ticks.
	m.roundTrip(t, 160*time.Second, func() string {
		var runs string
		err := pgtest.Conn(t, m.cluster.DSN("app")).QueryRow(context.Background(),
			`select coalesce(string_agg(format('%s %s %s', start_time, status, return_message), '; ' order by runid), 'no run')
			   from cron.job_run_details`).Scan(&runs)
		return fmt.Sprintf("pg_cron runs: %s (%v)", runs, err)
	})
}

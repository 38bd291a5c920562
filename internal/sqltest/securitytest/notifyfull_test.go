package securitytest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgque/pgque/internal/install"
	"github.com/pgque/pgque/internal/testing/pgtest"
)

// A stranger (a role with no pgque grant: any role may LISTEN) listens on a
// channel and idles in a transaction, so the cluster's NOTIFY queue cannot
// be trimmed, and notifications pile up behind it. Past the skip threshold
// a tick must still commit, skip its wake-up notification (a listener on
// the tick channel sees a later marker but no tick notice), and consumers
// must still get the events by polling. Below the threshold the tick
// notifies as usual. The queue holds 8 GB in a standard build, so the
// ticking session lowers the threshold (pgque.notify_max_usage) to what a
// few megabytes of notifications exceed; the reading of the real queue
// usage and the skip are the production code's. The cluster is this test's
// own: the NOTIFY queue is shared by every database of a cluster.
func TestTickSkipsNotifyWhenQueueFills(t *testing.T) {
	t.Parallel()
	c, super, newDB := installerCluster(t)
	ctx := context.Background()
	dsn := newDB("notifyfull")
	owner := pgtest.Conn(t, pgtest.DSNWith(dsn, "user", "pgque_owner"))
	if _, err := install.Install(ctx, owner); err != nil {
		t.Fatal(err)
	}
	mustExec(t, super, `create role nf_admin login`, `create role nf_reader login`)
	mustExec(t, owner, `grant pgque_admin to nf_admin`, `grant pgque_reader to nf_reader`)
	admin := pgtest.Conn(t, pgtest.DSNWith(dsn, "user", "nf_admin"))
	reader := pgtest.Conn(t, pgtest.DSNWith(dsn, "user", "nf_reader"))
	mustExec(t, admin, `select pgque.create_queue('nf')`)
	mustExec(t, reader, `select pgque.subscribe('nf', 'c')`)

	// The tick channel's listener, and the stranger holding the queue.
	listener := pgtest.Conn(t, pgtest.DSNWith(dsn, "user", "stranger"))
	mustExec(t, listener, `listen pgque`)
	stranger := pgtest.Conn(t, pgtest.DSNWith(c.DSN("postgres"), "user", "stranger"))
	mustExec(t, stranger, `listen fill`)
	stx, err := stranger.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer stx.Rollback(ctx)
	if _, err := stx.Exec(ctx, "select 1"); err != nil {
		t.Fatal(err)
	}
	// About 8 MB of distinct notifications the stranger never reads.
	filler := pgtest.Conn(t, pgtest.DSNWith(c.DSN("postgres"), "user", "stranger"))
	mustExec(t, filler, `select pg_notify('fill', i || repeat('x', 7900)) from generate_series(1, 1000) i`)
	usage := scalarOf[float64](t, admin, "select pg_notification_queue_usage()")
	if usage <= 0.0005 {
		t.Fatalf("NOTIFY queue usage %v after filling: the stranger does not hold it", usage)
	}

	// tickAndWatch sends an event, ticks in one transaction with the
	// threshold set, then notifies a marker: it reports whether the
	// listener heard the tick before the marker, and the tick id.
	tickAndWatch := func(threshold string) (heard bool, tick *int64) {
		t.Helper()
		mustExec(t, admin, `select pgque.send('nf', 't', '{"n":1}'::jsonb)`)
		err := pgx.BeginFunc(ctx, admin, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "select set_config('pgque.notify_max_usage', $1, true)", threshold); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, "select pgque.force_next_tick('nf')"); err != nil {
				return err
			}
			return tx.QueryRow(ctx, "select pgque.ticker('nf')").Scan(&tick)
		})
		if err != nil {
			t.Fatalf("ticking with the NOTIFY queue at %v (threshold %s): %v", usage, threshold, err)
		}
		mustExec(t, admin, `select pg_notify('pgque', 'marker')`)
		for {
			wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			n, err := listener.WaitForNotification(wctx)
			cancel()
			if err != nil {
				t.Fatalf("waiting for the marker: %v", err)
			}
			if n.Payload == "marker" {
				return heard, tick
			}
			heard = true
		}
	}

	heard, tick := tickAndWatch("0.0001")
	if tick == nil {
		t.Fatal("the forced tick did not tick with the NOTIFY queue past the threshold")
	}
	if heard {
		t.Errorf("the tick notified with the NOTIFY queue at %v, past the threshold: the skip is broken", usage)
	}
	// The consumer polls and gets the event of the silent tick.
	if n := scalarOf[int64](t, reader, "select count(*) from pgque.receive('nf', 'c', 100)"); n != 1 {
		t.Errorf("a polling consumer received %d events after the silent tick, want 1", n)
	}
	mustExec(t, reader, `select pgque.ack(batch_id) from pgque.receive('nf', 'c', 100) limit 1`)

	// Below the threshold (the default 0.5, and settings out of range or
	// not a number, which must be ignored without an error) the tick
	// notifies.
	for _, threshold := range []string{"", "0.9", "not a number", "1e999", "-0.1"} {
		heard, tick := tickAndWatch(threshold)
		if tick == nil || !heard {
			t.Errorf("threshold %q: tick %v, heard %v; want a tick with its notification", threshold, tick, heard)
		}
	}
}

// scalarOf reads one value.
func scalarOf[T any](t *testing.T, conn *pgx.Conn, sql string, args ...any) T {
	t.Helper()
	var v T
	if err := conn.QueryRow(context.Background(), sql, args...).Scan(&v); err != nil && !errors.Is(err, pgx.ErrNoRows) {
		t.Fatalf("%s: %v", sql, err)
	}
	return v
}

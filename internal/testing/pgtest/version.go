package pgtest

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
)

// ServerVersion returns the test server's version: its major (e.g. 18, from
// server_version_num) and its full version string (e.g. "18.4").
func ServerVersion(t testing.TB) (major int, version string) {
	t.Helper()
	var num int
	queryAdmin(t, "select current_setting('server_version_num')::int, current_setting('server_version')",
		nil, &num, &version)
	return num / 10000, version
}

// SkipWithoutExtension skips the test, saying why, when the test server has
// no extension called name to install (the PgQ C extension and pg_cron are
// packaged here for Debian's PostgreSQL 15 only). Call it before the part of
// a test that needs the extension, so that only that part is skipped on the
// servers lacking it.
func SkipWithoutExtension(t testing.TB, name string) {
	t.Helper()
	var ok bool
	var version string
	queryAdmin(t, "select exists (select from pg_catalog.pg_available_extensions where name = $1), "+
		"current_setting('server_version')", []any{name}, &ok, &version)
	if !ok {
		t.Skipf("extension %s is not available on PostgreSQL %s, so what needs it is not checked on this version", name, version)
	}
}

// queryAdmin runs one single-row query on the test server's admin database.
func queryAdmin(t testing.TB, sql string, args []any, dest ...any) {
	t.Helper()
	s := getServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, s.adminDSN)
	if err != nil {
		t.Fatal("pgtest: connecting:", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if err := conn.QueryRow(ctx, sql, args...).Scan(dest...); err != nil {
		t.Fatalf("pgtest: %s: %v", sql, err)
	}
}

// SkipWithoutStatsFlush skips the test, saying why, on a server before
// PostgreSQL 15: there a backend's statistics reach the views through the
// statistics collector, late and with no way to flush them
// (pg_stat_force_next_flush is new in 15), so counts of dead tuples, writes
// or index reads cannot be read exactly. Call it where the test would flush.
func SkipWithoutStatsFlush(t testing.TB) {
	t.Helper()
	if major, version := ServerVersion(t); major < 15 {
		t.Skipf("PostgreSQL %s cannot flush a backend's statistics (pg_stat_force_next_flush is new in 15), "+
			"so the exact statistics this test checks are not read on this version", version)
	}
}

package pgtest

import (
	"context"
	"net/url"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Pool opens a connection pool to dsn, closed when the test ends.
func Pool(t testing.TB, dsn string) *pgxpool.Pool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	pool, err := pgxpool.New(ctx, dsn)
	if err == nil {
		err = pool.Ping(ctx)
	}
	if err != nil {
		if pool != nil {
			pool.Close()
		}
		t.Fatal("pgtest: opening pool:", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// Conn opens a connection to dsn, closed when the test ends.
func Conn(t testing.TB, dsn string) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal("pgtest: connecting:", err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// HoldTx begins a transaction on conn, runs stmts in it and leaves it open
// (idle in transaction, holding whatever locks they took) until the test
// ends. It returns the backend pid of conn, as pg_locks and
// pg_stat_activity name it.
func HoldTx(t testing.TB, conn *pgx.Conn, stmts ...string) int {
	t.Helper()
	ctx := context.Background()
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal("pgtest: begin:", err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	for _, s := range stmts {
		if _, err := tx.Exec(ctx, s); err != nil {
			t.Fatalf("pgtest: %s: %v", s, err)
		}
	}
	return int(conn.PgConn().PID())
}

// DSNWith returns dsn with connection parameter key (e.g. "dbname", "user",
// "password", "application_name") set to value. It accepts both URL
// (postgres://...) and keyword/value connection strings.
func DSNWith(dsn, key, value string) string {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		if u, err := url.Parse(dsn); err == nil {
			return urlWith(u, key, value)
		}
	}
	// In keyword/value form a later setting overrides an earlier one.
	quoted := value
	if value == "" || strings.ContainsAny(value, " '\\\t\n") {
		quoted = "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(value) + "'"
	}
	return strings.TrimSpace(dsn) + " " + key + "=" + quoted
}

// urlWith sets key on a URL connection string, where dbname, user and
// password live outside the query string.
func urlWith(u *url.URL, key, value string) string {
	q := u.Query()
	q.Del(key)
	pw, hasPW := "", false
	if u.User != nil {
		pw, hasPW = u.User.Password()
	}
	switch key {
	case "dbname":
		u.Path = "/" + value
	case "user":
		if hasPW {
			u.User = url.UserPassword(value, pw)
		} else {
			u.User = url.User(value)
		}
	case "password":
		u.User = url.UserPassword(u.User.Username(), value)
	default:
		q.Set(key, value)
	}
	u.RawQuery = q.Encode()
	return u.String()
}

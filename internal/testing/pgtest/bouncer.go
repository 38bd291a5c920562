package pgtest

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgque/pgque/internal/pgbouncer"
)

// PgBouncer starts pgbouncer in transaction pooling mode, with poolSize
// server connections, in front of the server dsn points at, on a Unix
// socket, and returns the pool configuration of a DSN through it to the
// same database. It fails the test, with pgbouncer's log, when pgbouncer
// is missing or cannot be started: a test that needs a transaction-mode
// pooler must run through one.
func PgBouncer(t testing.TB, dsn string, poolSize int) *pgxpool.Config {
	t.Helper()
	if _, err := os.Stat(pgbouncer.Path); err != nil {
		t.Fatalf("pgbouncer is not installed (no %s): install the Debian package pgbouncer "+
			"(apt-get install pgbouncer); this test must run through a transaction-mode pooler", pgbouncer.Path)
	}
	server, err := pgconn.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	b, err := pgbouncer.New(pgbouncer.Options{Host: server.Host, Port: int(server.Port), User: server.User,
		PoolSize: poolSize, Unix: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Remove("") })
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := b.Start(ctx); err != nil {
		log, _ := os.ReadFile(b.LogPath())
		t.Fatalf("%v; pgbouncer's log:\n%s", err, log)
	}
	cfg, err := pgxpool.ParseConfig(b.DSN(server.Database, server.User))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.Password = server.Password
	return cfg
}

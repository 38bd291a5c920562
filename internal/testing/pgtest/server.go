package pgtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgque/pgque/internal/pgcluster"
)

// EnvDSN names the environment variable that points the tests at an existing
// server instead of a throwaway cluster. Its role needs CREATEDB; databases
// are created and dropped on that server.
const EnvDSN = "PGQUE_TEST_DSN"

// setupTimeout bounds starting the cluster and creating or dropping one
// database.
const setupTimeout = 3 * time.Minute

// server is where a test binary's databases live.
type server struct {
	cluster  *pgcluster.Cluster // nil when EnvDSN is set
	adminDSN string             // runs CREATE DATABASE and DROP DATABASE

	ddlMu sync.Mutex // serializes CREATE and DROP DATABASE

	tmplMu   sync.Mutex
	tmplName string // database with pgque installed, copied by NewInstalledDB
	tmplErr  error
}

var (
	mainCalled atomic.Bool
	srvMu      sync.Mutex
	srv        *server
	srvErr     error
)

// Main runs the tests of a package that uses pgtest, then stops the shared
// cluster (if one was started) and exits with the tests' status. Call it from
// TestMain.
func Main(m *testing.M) {
	mainCalled.Store(true)
	code := m.Run()
	if err := shutdown(); err != nil {
		fmt.Fprintln(os.Stderr, "pgtest:", err)
		if code == 0 {
			code = 1
		}
	}
	os.Exit(code)
}

// getServer returns the binary's server, starting the cluster on first use.
// It fails the test when no server can be had.
func getServer(t testing.TB) *server {
	t.Helper()
	if !mainCalled.Load() {
		t.Fatal("pgtest: call pgtest.Main(m) from TestMain, so that the shared cluster is stopped after the tests")
	}
	srvMu.Lock()
	defer srvMu.Unlock()
	if srv == nil && srvErr == nil {
		srv, srvErr = startServer()
	}
	if srvErr != nil {
		t.Fatal("pgtest:", srvErr)
	}
	return srv
}

// startServer uses EnvDSN when set, else starts a throwaway cluster.
func startServer() (*server, error) {
	if dsn := os.Getenv(EnvDSN); dsn != "" {
		return &server{adminDSN: dsn}, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	c, err := pgcluster.Start(ctx, pgcluster.Options{})
	if err != nil {
		return nil, err
	}
	return &server{cluster: c, adminDSN: c.DSN("postgres")}, nil
}

// shutdown drops the template database and stops the cluster, if any.
func shutdown() error {
	srvMu.Lock()
	defer srvMu.Unlock()
	if srv == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	var errs []error
	if srv.cluster != nil {
		errs = append(errs, srv.cluster.Stop(ctx))
	} else if srv.tmplName != "" {
		errs = append(errs, srv.dropDB(ctx, srv.tmplName))
	}
	srv = nil
	return errors.Join(errs...)
}

// dsn returns the DSN of database name on this server.
func (s *server) dsn(name string) string {
	if s.cluster != nil {
		return s.cluster.DSN(name)
	}
	return DSNWith(s.adminDSN, "dbname", name)
}

// admin runs statements on a fresh connection to the admin database, under
// the DDL lock.
func (s *server) admin(ctx context.Context, stmts ...string) error {
	s.ddlMu.Lock()
	defer s.ddlMu.Unlock()
	conn, err := pgx.Connect(ctx, s.adminDSN)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	for _, stmt := range stmts {
		if _, err := conn.Exec(ctx, stmt); err != nil {
			return fmt.Errorf("%s: %w", stmt, err)
		}
	}
	return nil
}

// createDB creates database name, as a copy of template when not "".
func (s *server) createDB(ctx context.Context, name, template string) error {
	stmt := "create database " + pgx.Identifier{name}.Sanitize()
	if template != "" {
		stmt += " template " + pgx.Identifier{template}.Sanitize()
	}
	return s.admin(ctx, stmt)
}

// dropDB drops database name, disconnecting anyone still connected.
func (s *server) dropDB(ctx context.Context, name string) error {
	return s.admin(ctx, "drop database if exists "+pgx.Identifier{name}.Sanitize()+" with (force)")
}

package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgque/pgque/internal/install"
)

// dbSeq numbers the databases this process creates.
var dbSeq atomic.Int64

// NewDB creates a fresh, empty database for the test and returns its DSN
// (as the cluster's superuser, or as the PGQUE_TEST_DSN role). The database
// is dropped when the test ends, disconnecting whatever still uses it.
func NewDB(t testing.TB) string {
	t.Helper()
	return newDB(t, "")
}

// NewInstalledDB creates a fresh database with pgque installed and returns
// its DSN; it is dropped when the test ends. The database is a copy of a
// template installed once per test binary.
func NewInstalledDB(t testing.TB) string {
	t.Helper()
	tmpl, err := getServer(t).template()
	if err != nil {
		t.Fatal("pgtest: preparing the pgque template database:", err)
	}
	return newDB(t, tmpl)
}

// newDB creates a database for t, as a copy of template when not "".
func newDB(t testing.TB, template string) string {
	t.Helper()
	s := getServer(t)
	name := dbName(t.Name())
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	if err := s.createDB(ctx, name, template); err != nil {
		t.Fatal("pgtest: creating test database:", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
		defer cancel()
		if err := s.dropDB(ctx, name); err != nil {
			t.Error("pgtest: dropping test database:", err)
		}
	})
	return s.dsn(name)
}

// template returns the name of the database with pgque installed, creating
// it on first use. Its connections are closed and new ones refused, since
// CREATE DATABASE cannot copy a template that someone is connected to.
func (s *server) template() (string, error) {
	s.tmplMu.Lock()
	defer s.tmplMu.Unlock()
	if s.tmplName != "" || s.tmplErr != nil {
		return s.tmplName, s.tmplErr
	}
	name := dbName("template")
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	s.tmplErr = s.createDB(ctx, name, "")
	if s.tmplErr == nil {
		s.tmplErr = installInto(ctx, s.dsn(name))
		if s.tmplErr == nil {
			s.tmplErr = s.admin(ctx, "alter database "+pgx.Identifier{name}.Sanitize()+" allow_connections false")
		}
		if s.tmplErr != nil {
			_ = s.dropDB(ctx, name)
		}
	}
	if s.tmplErr == nil {
		s.tmplName = name
	}
	return s.tmplName, s.tmplErr
}

// Install installs pgque into the database dsn names, failing the test on
// error. Use it on databases of a private cluster (NewCluster); NewInstalledDB
// is faster on the shared one.
func Install(t testing.TB, dsn string) install.Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal("pgtest:", err)
	}
	defer conn.Close(context.Background())
	res, err := install.Install(ctx, conn)
	if err != nil {
		t.Fatal("pgtest:", err)
	}
	return res
}

// installInto installs pgque over a connection of its own, closed on return.
func installInto(ctx context.Context, dsn string) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	_, err = install.Install(ctx, conn)
	return err
}

// dbName makes a unique, valid database name that starts with the test's
// name, so a leftover database says where it came from.
func dbName(testName string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(testName) {
		if b.Len() >= 24 {
			break
		}
		if (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') {
			b.WriteRune(r)
		} else {
			b.WriteByte('_')
		}
	}
	var salt [3]byte
	_, _ = rand.Read(salt[:])
	return fmt.Sprintf("pgque_%s_%d_%d_%s", b.String(), os.Getpid(), dbSeq.Add(1), hex.EncodeToString(salt[:]))
}

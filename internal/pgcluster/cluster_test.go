package pgcluster_test

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgque/pgque/internal/pgcluster"
)

// setup starts a private cluster for one test and stops it in Cleanup.
func setup(t *testing.T, opts pgcluster.Options) (*pgcluster.Cluster, context.Context) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	c, err := pgcluster.Start(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Stop(context.Background()); err != nil {
			t.Error(err)
		}
	})
	return c, ctx
}

// connect opens a connection, closed in Cleanup.
func connect(t *testing.T, ctx context.Context, dsn string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

func queryInt(t *testing.T, ctx context.Context, conn *pgx.Conn, sql string) int {
	t.Helper()
	var n int
	if err := conn.QueryRow(ctx, sql).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

func TestFindBinDir(t *testing.T) {
	t.Parallel()
	dir, err := pgcluster.FindBinDir()
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"initdb", "pg_ctl", "postgres"} {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			t.Errorf("FindBinDir() = %s, which lacks %s: %v", dir, name, err)
		}
	}
}

func TestStartSettingsAndStop(t *testing.T) {
	t.Parallel()
	c, ctx := setup(t, pgcluster.Options{
		Settings: map[string]string{"application_name": "it's pgcluster"},
	})
	conn := connect(t, ctx, c.DSN("postgres"))
	checks := map[string]string{
		"fsync":              "off",
		"synchronous_commit": "on",
		"max_connections":    "300",
		"shared_buffers":     "256MB",
		"listen_addresses":   "",
		"application_name":   "it's pgcluster",
	}
	for name, want := range checks {
		var got string
		if err := conn.QueryRow(ctx, "select current_setting($1)", name).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Errorf("%s = %q, want %q", name, got, want)
		}
	}
	// The URL form reaches the same server.
	connect(t, ctx, c.URL("postgres"))

	if err := c.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.Stop(ctx); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
	if _, err := os.Stat(c.Dir()); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("cluster directory %s still exists after Stop (stat: %v)", c.Dir(), err)
	}
}

func TestDataSurvivesRestartAndKill(t *testing.T) {
	t.Parallel()
	c, ctx := setup(t, pgcluster.Options{})
	dsn, err := c.CreateDatabase(ctx, "survivor db")
	if err != nil {
		t.Fatal(err)
	}
	conn := connect(t, ctx, dsn)
	if _, err := conn.Exec(ctx, "create table t (id int primary key); insert into t select generate_series(1, 1000)"); err != nil {
		t.Fatal(err)
	}
	port := c.Port()

	crashes := []struct {
		name  string
		crash func() error
	}{
		{"restart immediate", func() error { return c.Restart(ctx, pgcluster.ModeImmediate) }},
		{"restart fast", func() error { return c.Restart(ctx, pgcluster.ModeFast) }},
		{"kill then restart", func() error {
			if err := c.Kill(); err != nil {
				return err
			}
			return c.Restart(ctx, pgcluster.ModeImmediate)
		}},
	}
	for i, tc := range crashes {
		if err := tc.crash(); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if c.Port() != port {
			t.Fatalf("%s: port changed from %d to %d", tc.name, port, c.Port())
		}
		conn := connect(t, ctx, dsn)
		if n := queryInt(t, ctx, conn, "select count(*) from t"); n != 1000+i {
			t.Fatalf("%s: %d rows, want %d", tc.name, n, 1000+i)
		}
		// A committed write just before the next crash must survive it too.
		if _, err := conn.Exec(ctx, "insert into t values ($1)", 2000+i); err != nil {
			t.Fatal(err)
		}
	}
}

func TestRestartRejectsUnknownMode(t *testing.T) {
	t.Parallel()
	c, ctx := setup(t, pgcluster.Options{})
	if err := c.Restart(ctx, "smart"); err == nil {
		t.Fatal("Restart with mode smart: want an error")
	}
	if err := c.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.Restart(ctx, pgcluster.ModeFast); err == nil {
		t.Fatal("Restart after Stop: want an error")
	}
}

// TestFindBinDirChosenBuild checks that PGQUE_PG_BINDIR and PGQUE_PG_VERSION
// choose the build, and that a choice that names no build is an error
// saying what to do, never a silent fallback to another version.
func TestFindBinDirChosenBuild(t *testing.T) {
	cache := t.TempDir()
	fake := filepath.Join(cache, "42", "bin")
	if err := os.MkdirAll(fake, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"initdb", "pg_ctl", "postgres"} {
		if err := os.WriteFile(filepath.Join(fake, name), []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		bindir, version string
		want            string // the directory, or a part of the error
		wantErr         bool
	}{
		{bindir: fake, version: "14", want: fake},
		{bindir: t.TempDir(), want: pgcluster.EnvBinDir, wantErr: true},
		{version: "42", want: fake},
		{version: "43", want: "scripts/fetch-postgres 43", wantErr: true},
		{version: "latest", want: "not a PostgreSQL major version", wantErr: true},
	} {
		t.Setenv(pgcluster.EnvBinDir, tc.bindir)
		t.Setenv(pgcluster.EnvVersion, tc.version)
		t.Setenv(pgcluster.EnvCache, cache)
		dir, err := pgcluster.FindBinDir()
		switch {
		case tc.wantErr && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("bindir %q, version %q: FindBinDir() = %q, %v; want an error saying %q",
				tc.bindir, tc.version, dir, err, tc.want)
		case !tc.wantErr && (err != nil || dir != tc.want):
			t.Errorf("bindir %q, version %q: FindBinDir() = %q, %v; want %q",
				tc.bindir, tc.version, dir, err, tc.want)
		}
	}
}

// TestClusterRunsTheChosenVersion checks that a cluster runs the major that
// PGQUE_PG_VERSION names, when it names one.
func TestClusterRunsTheChosenVersion(t *testing.T) {
	t.Parallel()
	major := os.Getenv(pgcluster.EnvVersion)
	if major == "" || os.Getenv(pgcluster.EnvBinDir) != "" {
		t.Skipf("%s is not set (alone): the default build runs", pgcluster.EnvVersion)
	}
	c, ctx := setup(t, pgcluster.Options{})
	conn := connect(t, ctx, c.DSN("postgres"))
	if got := queryInt(t, ctx, conn, "select current_setting('server_version_num')::int / 10000"); strconv.Itoa(got) != major {
		t.Fatalf("%s=%s, but the cluster runs PostgreSQL %d", pgcluster.EnvVersion, major, got)
	}
}

// TestOtherLocalUsersCannotConnect: connections are trusted, so the socket
// is the only gate: another local account (nobody, which does not run the
// server) running psql against the cluster is refused by the file system,
// while the caller connects. Run as root, which can act as another user.
func TestOtherLocalUsersCannotConnect(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("needs root to run psql as another local user")
	}
	psql, err := exec.LookPath("psql")
	if err != nil {
		t.Skip("psql is not installed")
	}
	nobody, err := user.Lookup("nobody")
	if err != nil {
		t.Skip("no user nobody")
	}
	c, ctx := setup(t, pgcluster.Options{})
	fi, err := os.Stat(c.Dir())
	if err != nil {
		t.Fatal(err)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && strconv.Itoa(int(st.Uid)) == nobody.Uid {
		t.Skip("the server runs as nobody here")
	}
	uid, _ := strconv.Atoi(nobody.Uid)
	gid, _ := strconv.Atoi(nobody.Gid)
	cmd := exec.CommandContext(ctx, psql, "-X", "-At", "-c", "select current_user", c.DSN("postgres"))
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}
	cmd.Dir = "/"
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("psql as nobody connected to the cluster as %q", strings.TrimSpace(string(out)))
	}
	if !strings.Contains(string(out), "Permission denied") {
		t.Errorf("psql as nobody failed, but not on the socket's permissions: %s", out)
	}
	conn := connect(t, ctx, c.DSN("postgres"))
	if n := queryInt(t, ctx, conn, "select 1"); n != 1 {
		t.Fatalf("select 1 = %d", n)
	}
}

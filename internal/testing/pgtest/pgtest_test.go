package pgtest_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgque/pgque/internal/install"
	"github.com/pgque/pgque/internal/pgcluster"
	"github.com/pgque/pgque/internal/testing/pgtest"
	sqlfiles "github.com/pgque/pgque/sql"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// dbState is what a test database looks like from inside.
type dbState struct {
	name       string
	userTables int
	hasPgque   bool
}

func inspect(t *testing.T, dsn string) dbState {
	t.Helper()
	var s dbState
	err := pgtest.Conn(t, dsn).QueryRow(context.Background(), `select current_database(),
		(select count(*) from pg_catalog.pg_tables where schemaname not in ('pg_catalog', 'information_schema')),
		exists (select 1 from pg_catalog.pg_namespace where nspname = 'pgque')`).
		Scan(&s.name, &s.userTables, &s.hasPgque)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func databaseExists(t *testing.T, dsn, name string) bool {
	t.Helper()
	var exists bool
	err := pgtest.Conn(t, dsn).QueryRow(context.Background(),
		"select exists (select 1 from pg_catalog.pg_database where datname = $1)", name).Scan(&exists)
	if err != nil {
		t.Fatal(err)
	}
	return exists
}

func TestNewDBGivesDistinctEmptyDatabases(t *testing.T) {
	t.Parallel()
	a, b := pgtest.NewDB(t), pgtest.NewDB(t)
	sa, sb := inspect(t, a), inspect(t, b)
	if sa.name == sb.name {
		t.Fatalf("two NewDB calls returned the same database %s", sa.name)
	}
	for _, s := range []dbState{sa, sb} {
		if s.userTables != 0 || s.hasPgque {
			t.Errorf("database %s is not empty: %+v", s.name, s)
		}
	}
	// A table made in one database does not show up in the other.
	if _, err := pgtest.Conn(t, a).Exec(context.Background(), "create table t (id int)"); err != nil {
		t.Fatal(err)
	}
	if s := inspect(t, b); s.userTables != 0 {
		t.Errorf("table created in %s is visible in %s", sa.name, s.name)
	}
}

func TestNewDBIsDroppedAfterTheTest(t *testing.T) {
	t.Parallel()
	var name string
	t.Run("user", func(t *testing.T) {
		dsn := pgtest.NewDB(t)
		pgtest.Pool(t, dsn) // an open pool must not block the drop
		name = inspect(t, dsn).name
	})
	if databaseExists(t, pgtest.NewDB(t), name) {
		t.Errorf("database %s still exists after its test ended", name)
	}
}

func TestNewInstalledDB(t *testing.T) {
	t.Parallel()
	a, b := pgtest.NewInstalledDB(t), pgtest.NewInstalledDB(t)
	for _, dsn := range []string{a, b} {
		v, err := install.InstalledVersion(context.Background(), pgtest.Conn(t, dsn))
		if err != nil {
			t.Fatal(err)
		}
		if v != sqlfiles.Version {
			t.Errorf("installed version = %q, want %q", v, sqlfiles.Version)
		}
	}
	if inspect(t, a).name == inspect(t, b).name {
		t.Fatal("two NewInstalledDB calls returned the same database")
	}
}

func TestNewCluster(t *testing.T) {
	t.Parallel()
	c := pgtest.NewCluster(t, pgcluster.Options{})
	dsn, err := c.CreateDatabase(context.Background(), "app")
	if err != nil {
		t.Fatal(err)
	}
	if res := pgtest.Install(t, dsn); !res.Fresh() || res.Version != sqlfiles.Version {
		t.Errorf("Install on a private cluster = %+v", res)
	}
}

func TestDSNWith(t *testing.T) {
	t.Parallel()
	tests := []struct {
		dsn, key, value string
		check           func(*pgx.ConnConfig) string
		want            string
	}{
		{"host=/tmp port=5 user=postgres dbname=a", "dbname", "b",
			func(c *pgx.ConnConfig) string { return c.Database }, "b"},
		{"host=/tmp user=postgres dbname=a", "user", "it's me",
			func(c *pgx.ConnConfig) string { return c.User }, "it's me"},
		{"postgres://u:pw@localhost:5/a?sslmode=disable&dbname=x", "dbname", "b",
			func(c *pgx.ConnConfig) string { return c.Database }, "b"},
		{"postgres://u:pw@localhost:5/a?sslmode=disable", "user", "v",
			func(c *pgx.ConnConfig) string { return c.User + ":" + c.Password }, "v:pw"},
		{"postgresql://u@localhost/a", "password", "s3 cret",
			func(c *pgx.ConnConfig) string { return c.User + ":" + c.Password }, "u:s3 cret"},
		{"postgres://u@localhost/a", "application_name", "x",
			func(c *pgx.ConnConfig) string { return c.RuntimeParams["application_name"] }, "x"},
	}
	for _, tc := range tests {
		got := pgtest.DSNWith(tc.dsn, tc.key, tc.value)
		cfg, err := pgx.ParseConfig(got)
		if err != nil {
			t.Errorf("DSNWith(%q, %s, %q) = %q, which does not parse: %v", tc.dsn, tc.key, tc.value, got, err)
			continue
		}
		if v := tc.check(cfg); v != tc.want {
			t.Errorf("DSNWith(%q, %s, %q) = %q, which means %q, want %q", tc.dsn, tc.key, tc.value, got, v, tc.want)
		}
	}
}

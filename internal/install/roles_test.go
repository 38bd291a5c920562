package install_test

import (
	"context"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgque/pgque/internal/install"
	"github.com/pgque/pgque/internal/pgcluster"
	"github.com/pgque/pgque/internal/testing/pgtest"
	sqlfiles "github.com/pgque/pgque/sql"
)

// These tests create and drop the cluster-wide pgque roles, so each runs on a
// private cluster where no other test depends on them.

// exec runs statements, failing the test on error.
func exec(t *testing.T, conn *pgx.Conn, stmts ...string) {
	t.Helper()
	for _, s := range stmts {
		if _, err := conn.Exec(context.Background(), s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
}

// pgqueRoles lists the pgque roles that exist.
// privateCluster starts a cluster of the test's own (roles are
// cluster-wide, so role tests cannot share one) and runs setup on it as the
// superuser, whose connection it returns.
func privateCluster(t *testing.T, setup ...string) (*pgcluster.Cluster, *pgx.Conn) {
	t.Helper()
	c := pgtest.NewCluster(t, pgcluster.Options{})
	su := pgtest.Conn(t, c.DSN("postgres"))
	exec(t, su, setup...)
	return c, su
}

func pgqueRoles(t *testing.T, conn *pgx.Conn) []string {
	t.Helper()
	rows, _ := conn.Query(context.Background(),
		"select rolname from pg_catalog.pg_roles where rolname = any ($1) order by rolname", install.Roles)
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return names
}

// installAs installs pgque into dsn connected as role, twice (fresh, then an
// in-place upgrade), and checks that role owns what was installed.
func installAs(t *testing.T, dsn, role string) {
	t.Helper()
	ctx := context.Background()
	conn := pgtest.Conn(t, pgtest.DSNWith(dsn, "user", role))
	for i := range 2 {
		res, err := install.Install(ctx, conn)
		if err != nil {
			t.Fatalf("install #%d as %s: %v", i+1, role, err)
		}
		if res.Version != sqlfiles.Version || res.Fresh() != (i == 0) {
			t.Errorf("install #%d as %s = %+v", i+1, role, res)
		}
	}
	var owner string
	if err := conn.QueryRow(ctx, "select nspowner::regrole::text from pg_catalog.pg_namespace where nspname = 'pgque'").
		Scan(&owner); err != nil {
		t.Fatal(err)
	}
	if owner != role {
		t.Errorf("schema pgque is owned by %s, want %s", owner, role)
	}
}

func TestInstallAsNonSuperuserOwner(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c, su := privateCluster(t,
		"create role owner_nosu login createrole",
		"create database nosu_fresh owner owner_nosu",
		"create database nosu_existing owner owner_nosu",
		"create database su_db")

	t.Log("the owner creates the roles itself")
	installAs(t, c.DSN("nosu_fresh"), "owner_nosu")
	nosu := pgtest.Conn(t, pgtest.DSNWith(c.DSN("nosu_fresh"), "user", "owner_nosu"))
	if err := install.Uninstall(ctx, nosu, true); err != nil {
		t.Fatal(err)
	}
	if roles := pgqueRoles(t, su); len(roles) != 0 {
		t.Fatalf("roles %v remain after the owner uninstalled with dropRoles", roles)
	}

	t.Log("the roles already exist, created by a superuser")
	installAs(t, c.DSN("su_db"), "postgres")
	installAs(t, c.DSN("nosu_existing"), "owner_nosu")
}

func TestUninstallDropRolesKeepsUsedRoles(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c, su := privateCluster(t, "create database db1", "create database db2")
	pgtest.Install(t, c.DSN("db1"))
	pgtest.Install(t, c.DSN("db2"))

	// db2 still grants privileges to every role: all are kept.
	if err := install.Uninstall(ctx, pgtest.Conn(t, c.DSN("db1")), true); err != nil {
		t.Fatal(err)
	}
	if got := pgqueRoles(t, su); len(got) != len(install.Roles) {
		t.Fatalf("roles after uninstalling db1 = %v, want all of %v (db2 uses them)", got, install.Roles)
	}

	// An application role is a member of pgque_writer: that one is kept.
	exec(t, su, "create role app login", "grant pgque_writer to app")
	if err := install.Uninstall(ctx, pgtest.Conn(t, c.DSN("db2")), true); err != nil {
		t.Fatal(err)
	}
	if got := pgqueRoles(t, su); !slices.Equal(got, []string{"pgque_writer"}) {
		t.Fatalf("roles after uninstalling db2 = %v, want [pgque_writer] (app is a member)", got)
	}
}

// TestInstallReportsRoleAdmins: the install lists the roles, other than
// the installing one and superusers, that may grant a pgque role to any
// role. On PostgreSQL 16 and later a CREATEROLE role holds ADMIN OPTION on
// the roles it creates, so one that created pgque's roles (before the
// install, or by installing into another database of the cluster) keeps
// that power over every database's pgque; an explicit WITH ADMIN OPTION
// grant counts on every version.
func TestInstallReportsRoleAdmins(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c, su := privateCluster(t,
		"create role creator login createrole",
		"create role dba nologin",
		"create database first owner creator",
		"create database second")
	var version int
	if err := su.QueryRow(ctx, "select current_setting('server_version_num')::int").Scan(&version); err != nil {
		t.Fatal(err)
	}

	first, err := install.Install(ctx, pgtest.Conn(t, pgtest.DSNWith(c.DSN("first"), "user", "creator")))
	if err != nil {
		t.Fatal(err)
	}
	if len(first.RoleAdmins) != 0 {
		t.Errorf("the role that created pgque's roles, installing, is told of itself: %v", first.RoleAdmins)
	}

	secondDB := pgtest.Conn(t, c.DSN("second"))
	second, err := install.Install(ctx, secondDB)
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	if version >= 160000 {
		want = []string{"creator on pgque_admin", "creator on pgque_reader", "creator on pgque_writer"}
	}
	if !slices.Equal(second.RoleAdmins, want) {
		t.Errorf("a superuser's install into another database: role admins %v, want %v", second.RoleAdmins, want)
	}

	exec(t, su, "grant pgque_reader to dba with admin option")
	again, err := install.Install(ctx, secondDB)
	if err != nil {
		t.Fatal(err)
	}
	want = append([]string{"dba on pgque_reader"}, want...)
	slices.Sort(want)
	if !slices.Equal(again.RoleAdmins, want) {
		t.Errorf("after a grant WITH ADMIN OPTION: role admins %v, want %v", again.RoleAdmins, want)
	}
}

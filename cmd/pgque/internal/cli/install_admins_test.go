package cli

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/pgque/pgque/internal/pgcluster"
	"github.com/pgque/pgque/internal/testing/pgtest"
)

// TestInstallWarnsOfRoleAdmins: pgque install names the roles, other than
// the installing one and superusers, that may grant a pgque role to any
// role, on stderr and in --json; with none it says nothing. On a private
// cluster: the grant is cluster-wide.
func TestInstallWarnsOfRoleAdmins(t *testing.T) {
	t.Parallel()
	cl := pgtest.NewCluster(t, pgcluster.Options{})
	c := &cli{t: t, dsn: cl.DSN("postgres")}
	if r := c.exec("", "install"); r.code != 0 || strings.Contains(r.stderr, "warning") {
		t.Fatalf("install with no other role admin:\n%s", r)
	}
	conn := c.conn()
	if _, err := conn.Exec(t.Context(), "create role dba nologin; grant pgque_admin to dba with admin option"); err != nil {
		t.Fatal(err)
	}
	r := c.exec("", "install")
	if r.code != 0 || !strings.Contains(r.stderr, "warning: these roles may grant pgque's roles to any role") ||
		!strings.Contains(r.stderr, "dba on pgque_admin") {
		t.Errorf("install after a grant WITH ADMIN OPTION:\n%s", r)
	}
	var res struct {
		RoleAdmins []string `json:"role_admins"`
	}
	if out := c.ok("", "install", "--json"); json.Unmarshal([]byte(out), &res) != nil ||
		len(res.RoleAdmins) != 1 || res.RoleAdmins[0] != "dba on pgque_admin" {
		t.Errorf("install --json: %s", out)
	}
}

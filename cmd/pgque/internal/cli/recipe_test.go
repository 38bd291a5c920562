package cli

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgque/pgque/internal/pgcluster"
	"github.com/pgque/pgque/internal/testing/pgtest"
)

// recipeBlock finds the README's "Into your own database" recipe: the sh
// block between the recipe markers.
var recipeBlock = regexp.MustCompile("(?s)<!-- recipe:[^>]*-->\\s*```sh\\n(.*?)```\\s*<!-- /recipe -->")

// TestReadmeRecipe runs the README's recipe for installing into one's own
// database exactly as printed, as a shell script, against a private cluster
// that plays a managed service: the only role handed to the user has
// CREATEROLE and CREATE on its database, and no superuser. The recipe must
// end with the worker printing the event the producer sent.
func TestReadmeRecipe(t *testing.T) {
	t.Parallel()
	root, err := filepath.Abs("../../../..")
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	m := recipeBlock.FindSubmatch(readme)
	if m == nil {
		t.Fatal("README.md has no recipe block between <!-- recipe: --> and <!-- /recipe -->")
	}
	script := string(m[1])

	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	c := pgtest.NewCluster(t, pgcluster.Options{})
	provision(ctx, t, c.DSN("postgres"))

	gobin := t.TempDir()

	cmd := exec.CommandContext(ctx, "bash", "-euo", "pipefail", "-c", script)
	cmd.Dir = root // `go install ./cmd/pgque` runs in the checkout
	cmd.Env = append(os.Environ(),
		"GOBIN="+gobin,
		"PATH="+gobin+string(os.PathListSeparator)+os.Getenv("PATH"),
		"GOFLAGS=-buildvcs=false",
		"PGHOST="+c.Host(),
		"PGPORT="+strconv.Itoa(c.Port()),
		"PGDATABASE=app",
		"ADMIN=app_admin",
		"PGUSER=", "PGQUE_DSN=", "DATABASE_URL=",
	)
	// Its own process group, so the ticker it leaves in the background
	// is stopped with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	// Its output goes to files, not pipes: the ticker it leaves running in
	// the background would hold a pipe open after the script ends.
	dir := t.TempDir()
	outF, err := os.Create(filepath.Join(dir, "stdout"))
	if err != nil {
		t.Fatal(err)
	}
	errF, err := os.Create(filepath.Join(dir, "stderr"))
	if err != nil {
		t.Fatal(err)
	}
	defer outF.Close()
	defer errF.Close()
	cmd.Stdout, cmd.Stderr = outF, errF
	// Cancel kills the whole group: bash and the ticker it started.
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	runErr := cmd.Wait()
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	out, _ := os.ReadFile(outF.Name())
	errOut, _ := os.ReadFile(errF.Name())
	if runErr != nil {
		t.Fatalf("recipe failed: %v\nstdout:\n%s\nstderr:\n%s", runErr, out, errOut)
	}
	got := string(out)
	if !strings.Contains(got, "FileCreated") || !strings.Contains(got, "tenant-42") || !strings.Contains(got, "/a.pdf") {
		t.Fatalf("the worker did not print the event the producer sent; stdout:\n%s\nstderr:\n%s", got, errOut)
	}
}

// provision makes the cluster look like a managed service: an admin role
// with CREATEROLE (not a superuser) that owns database app.
func provision(ctx context.Context, t *testing.T, superDSN string) {
	t.Helper()
	conn, err := pgx.Connect(ctx, superDSN)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for _, stmt := range []string{
		"create role app_admin login createrole createdb",
		"create database app owner app_admin",
	} {
		if _, err := conn.Exec(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
}

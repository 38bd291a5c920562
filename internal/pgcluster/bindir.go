package pgcluster

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// serverBinaries are the programs a cluster needs; a directory is a usable
// bin directory only when it holds all of them.
var serverBinaries = []string{"initdb", "pg_ctl", "postgres"}

// debianBinGlob matches the Debian/Ubuntu per-version layout.
const debianBinGlob = "/usr/lib/postgresql/*/bin"

// FindBinDir returns the directory holding the PostgreSQL server binaries
// (initdb, pg_ctl, postgres). It prefers `pg_config --bindir` and falls back
// to the newest /usr/lib/postgresql/<version>/bin. Its error tells the user
// how to install the binaries or where to point pgque instead.
func FindBinDir() (string, error) {
	var looked []string
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		dir := strings.TrimSpace(string(out))
		if hasServerBinaries(dir) {
			return dir, nil
		}
		looked = append(looked, dir+" (from pg_config --bindir)")
	} else {
		looked = append(looked, "pg_config on PATH")
	}
	candidates, _ := filepath.Glob(debianBinGlob)
	sort.Slice(candidates, func(i, j int) bool {
		return majorVersion(candidates[i]) > majorVersion(candidates[j])
	})
	for _, dir := range candidates {
		if hasServerBinaries(dir) {
			return dir, nil
		}
	}
	looked = append(looked, debianBinGlob)
	return "", fmt.Errorf("PostgreSQL server binaries not found (looked in %s): "+
		"install them with `apt-get install -y postgresql-15`, "+
		"or point PGQUE_TEST_DSN / --dsn at an existing database",
		strings.Join(looked, ", "))
}

// hasServerBinaries reports whether dir holds every server binary.
func hasServerBinaries(dir string) bool {
	if dir == "" {
		return false
	}
	for _, name := range serverBinaries {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
			return false
		}
	}
	return true
}

// majorVersion extracts N from /usr/lib/postgresql/N/bin, or -1.
func majorVersion(binDir string) int {
	v, err := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	if err != nil {
		return -1
	}
	return v
}

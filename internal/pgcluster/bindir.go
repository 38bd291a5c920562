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

// Environment variables that choose the server build a cluster runs.
const (
	// EnvBinDir names a bin directory holding initdb, pg_ctl and postgres.
	EnvBinDir = "PGQUE_PG_BINDIR"
	// EnvVersion names a major version (e.g. 18), found in the build cache
	// that scripts/fetch-postgres fills, or in Debian's layout.
	EnvVersion = "PGQUE_PG_VERSION"
	// EnvCache overrides the build cache's directory (default .cache/postgres
	// in the repository).
	EnvCache = "PGQUE_PG_CACHE"
)

// FindBinDir returns the directory holding the PostgreSQL server binaries
// (initdb, pg_ctl, postgres). PGQUE_PG_BINDIR, then PGQUE_PG_VERSION, choose
// a build; without them it prefers `pg_config --bindir` and falls back to the
// newest /usr/lib/postgresql/<version>/bin. Its error tells the user how to
// install the binaries or where to point pgque instead.
func FindBinDir() (string, error) {
	if dir := os.Getenv(EnvBinDir); dir != "" {
		if hasServerBinaries(dir) {
			return dir, nil
		}
		return "", fmt.Errorf("%s=%s holds no PostgreSQL server binaries (%s)",
			EnvBinDir, dir, strings.Join(serverBinaries, ", "))
	}
	if major := os.Getenv(EnvVersion); major != "" {
		return versionBinDir(major)
	}
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

// versionBinDir finds the bin directory of major version major: in the build
// cache first, then in Debian's layout (where 15 lives).
func versionBinDir(major string) (string, error) {
	if n, err := strconv.Atoi(major); err != nil || n < 10 {
		return "", fmt.Errorf("%s=%q is not a PostgreSQL major version such as 18", EnvVersion, major)
	}
	var candidates []string
	for _, cache := range cacheDirs() {
		candidates = append(candidates, filepath.Join(cache, major, "bin"))
	}
	candidates = append(candidates, filepath.Join("/usr/lib/postgresql", major, "bin"))
	for _, dir := range candidates {
		if hasServerBinaries(dir) {
			return dir, nil
		}
	}
	return "", fmt.Errorf("%s=%s: no server binaries in %s; fetch them with `scripts/fetch-postgres %s`",
		EnvVersion, major, strings.Join(candidates, ", "), major)
}

// cacheDirs returns where scripts/fetch-postgres may have put the builds:
// PGQUE_PG_CACHE when set, else .cache/postgres in the nearest directory
// above the working directory that has one (tests run in their package's
// directory, below the repository's root).
func cacheDirs() []string {
	if dir := os.Getenv(EnvCache); dir != "" {
		return []string{dir}
	}
	wd, err := os.Getwd()
	if err != nil {
		return nil
	}
	for dir := wd; ; dir = filepath.Dir(dir) {
		cache := filepath.Join(dir, ".cache", "postgres")
		if fi, err := os.Stat(cache); err == nil && fi.IsDir() {
			return []string{cache}
		}
		if dir == filepath.Dir(dir) {
			return nil
		}
	}
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

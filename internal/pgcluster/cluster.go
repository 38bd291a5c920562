package pgcluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
)

// Superuser is the bootstrap superuser every cluster is created with. Local
// connections are trusted, so it needs no password; only the server's OS
// user (and root) may reach the socket: its directory and the socket are
// mode 0700, so another local account cannot connect as the superuser.
const Superuser = "postgres"

// Options configures Start. The zero value is ready to use.
type Options struct {
	// Port is the port number the server announces; it only names the Unix
	// socket (.s.PGSQL.<port>) since the server listens on no TCP address
	// unless Settings says otherwise. 0 picks a free TCP port, so that adding
	// listen_addresses to Settings works without a clash.
	Port int
	// Settings are extra postgresql.conf parameters, written after (and so
	// overriding) the defaults, e.g. {"shared_preload_libraries": "pg_cron"}.
	// Values are written quoted; do not quote them yourself.
	Settings map[string]string
	// Log receives the output of initdb and pg_ctl. The server's own log is
	// kept in a file (see LogPath). Nil discards the output.
	Log io.Writer
}

// Cluster is a running throwaway PostgreSQL cluster. Its methods are safe for
// concurrent use.
type Cluster struct {
	binDir string
	dir    string // socket directory, log file and data directory's parent
	port   int
	user   *osUser
	log    io.Writer

	watchdog *exec.Cmd // tears the cluster down if this process dies first

	mu      sync.Mutex // serializes Restart, Kill and Stop
	removed bool
}

// Start creates a cluster in a new temporary directory and starts it. It
// returns once the server accepts connections. On failure nothing is left
// behind, and the error includes the end of the server log.
func Start(ctx context.Context, opts Options) (*Cluster, error) {
	binDir, err := FindBinDir()
	if err != nil {
		return nil, err
	}
	u, err := serverUser()
	if err != nil {
		return nil, err
	}
	if u.cred != nil && !reachableByOthers(binDir) {
		return nil, fmt.Errorf("the server runs as user %s, who cannot reach %s: "+
			"put the binaries under a directory every user can enter", u.name, binDir)
	}
	dir, err := makeClusterDir(u)
	if err != nil {
		return nil, err
	}
	port := opts.Port
	if port == 0 {
		port = freePort()
	}
	c := &Cluster{binDir: binDir, dir: dir, port: port, user: u, log: opts.Log,
		watchdog: startWatchdog(dir)}
	if c.log == nil {
		c.log = io.Discard
	}
	if err := c.create(ctx, opts.Settings); err != nil {
		return nil, errors.Join(err, c.Stop(context.WithoutCancel(ctx)))
	}
	return c, nil
}

// create runs initdb, writes the configuration and starts the server.
func (c *Cluster) create(ctx context.Context, settings map[string]string) error {
	if err := c.initdb(ctx); err != nil {
		return err
	}
	if err := writeConfig(c.DataDir(), c.baseSettings(), settings); err != nil {
		return err
	}
	return c.start(ctx)
}

// baseSettings are the parameters every throwaway cluster runs with.
func (c *Cluster) baseSettings() map[string]string {
	return map[string]string{
		"listen_addresses":        "",
		"unix_socket_directories": c.dir,
		"unix_socket_permissions": "0700",
		"port":                    strconv.Itoa(c.port),
		"fsync":                   "off",
		"max_connections":         "300",
		"shared_buffers":          "256MB",
	}
}

// Dir returns the cluster's directory. It is also the Unix socket directory,
// i.e. the host to connect to.
func (c *Cluster) Dir() string { return c.dir }

// Host returns the host to connect to: the Unix socket directory.
func (c *Cluster) Host() string { return c.dir }

// Port returns the server's port number.
func (c *Cluster) Port() int { return c.port }

// BinDir returns the directory of the server binaries the cluster runs.
func (c *Cluster) BinDir() string { return c.binDir }

// DataDir returns the data directory (PGDATA).
func (c *Cluster) DataDir() string { return filepath.Join(c.dir, "data") }

// LogPath returns the path of the server log file.
func (c *Cluster) LogPath() string { return filepath.Join(c.dir, "postgres.log") }

// DSN returns a keyword/value connection string for database dbname as the
// superuser, e.g. "host=/tmp/pgque-pg-1 port=5432 user=postgres
// dbname=app sslmode=disable". pgx, libpq and psql all accept it.
func (c *Cluster) DSN(dbname string) string {
	return fmt.Sprintf("host=%s port=%d user=%s dbname=%s sslmode=disable",
		quoteDSNValue(c.dir), c.port, Superuser, quoteDSNValue(dbname))
}

// URL returns the same connection as DSN in URL form, for tools that only
// take postgres:// URLs.
func (c *Cluster) URL(dbname string) string {
	q := url.Values{"host": {c.dir}, "port": {strconv.Itoa(c.port)}, "sslmode": {"disable"}}
	u := url.URL{Scheme: "postgres", User: url.User(Superuser), Path: "/" + dbname, RawQuery: q.Encode()}
	return u.String()
}

// CreateDatabase creates database name (owned by the superuser) and returns
// its DSN.
func (c *Cluster) CreateDatabase(ctx context.Context, name string) (string, error) {
	conn, err := pgx.Connect(ctx, c.DSN("postgres"))
	if err != nil {
		return "", fmt.Errorf("creating database %s: %w", name, err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "create database "+pgx.Identifier{name}.Sanitize()); err != nil {
		return "", fmt.Errorf("creating database %s: %w", name, err)
	}
	return c.DSN(name), nil
}

// quoteDSNValue quotes v for a keyword/value connection string when needed.
func quoteDSNValue(v string) string {
	if v != "" && !strings.ContainsAny(v, " '\\\t\n") {
		return v
	}
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(v) + "'"
}

// freePort returns a TCP port that is free right now, or 5432 if none can be
// found (the port only names the socket, so a clash there is harmless).
func freePort() int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 5432
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// makeClusterDir creates the cluster directory, owned by u and closed to
// everyone else (mode 0700, as MkdirTemp makes it): the socket is in it
// and connections are trusted. A root caller reaches the socket anyway.
func makeClusterDir(u *osUser) (string, error) {
	dir, err := os.MkdirTemp(clusterDirBase(), "pgque-pg-")
	if err != nil {
		return "", fmt.Errorf("creating cluster directory: %w", err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return "", errors.Join(fmt.Errorf("creating cluster directory: %w", err), os.RemoveAll(dir))
	}
	if u.cred != nil {
		if err := os.Chown(dir, u.uid, u.gid); err != nil {
			return "", errors.Join(fmt.Errorf("handing %s to user %s: %w", dir, u.name, err), os.RemoveAll(dir))
		}
	}
	return dir, nil
}

// clusterDirBase is os.TempDir unless that path is too long for a Unix socket
// (about 100 bytes with the socket file name) or, for a root caller, not
// reachable by the unprivileged server user; then it is /tmp.
func clusterDirBase() string {
	base := os.TempDir()
	if len(base) > 60 || (os.Geteuid() == 0 && !reachableByOthers(base)) {
		return "/tmp"
	}
	return base
}

// reachableByOthers reports whether every directory on path is searchable by
// any user.
func reachableByOthers(path string) bool {
	for p := filepath.Clean(path); ; p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		if err != nil || fi.Mode().Perm()&0o001 == 0 {
			return false
		}
		if p == filepath.Dir(p) {
			return true
		}
	}
}

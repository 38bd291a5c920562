// Package pgbouncer runs a throwaway PgBouncer in transaction pooling mode
// in front of a PostgreSQL server, for the tests and the chaos runner that
// prove pgque works through a transaction pooler.
package pgbouncer

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// Path is where the Debian package installs PgBouncer.
const Path = "/usr/sbin/pgbouncer"

// PoolSizeDefault is the default number of server connections per database.
const PoolSizeDefault = 40

// Options says which server PgBouncer fronts and how.
type Options struct {
	// Host and Port of the PostgreSQL server (Host may be a socket directory).
	Host string
	Port int
	// User is the role PgBouncer logs in as on the server.
	User string
	// PoolSize caps the server connections (per database and in total).
	// Default PoolSizeDefault.
	PoolSize int
	// Unix makes PgBouncer listen on a Unix socket in its own directory
	// instead of on a free TCP port of 127.0.0.1.
	Unix bool
}

// Bouncer is one PgBouncer process (started, killed and started again as
// often as wanted) with its configuration directory. It runs as the
// unprivileged pgque (or nobody) OS user when the caller is root: PgBouncer,
// like PostgreSQL, refuses to run as root.
type Bouncer struct {
	o    Options
	dir  string
	port int
	cred *syscall.Credential

	mu  sync.Mutex
	cmd *exec.Cmd
	ran chan struct{}
}

// New writes the configuration into a new directory under /tmp (the
// unprivileged user must reach it, and a Unix socket path must be short).
func New(o Options) (*Bouncer, error) {
	if o.PoolSize == 0 {
		o.PoolSize = PoolSizeDefault
	}
	dir, err := os.MkdirTemp("/tmp", "pgque-bouncer-")
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		return nil, err
	}
	b := &Bouncer{o: o, dir: dir, port: 6432}
	if !o.Unix {
		b.port = freeTCPPort()
	}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("pgque")
		if err != nil {
			u, err = user.Lookup("nobody")
		}
		if err != nil {
			return nil, fmt.Errorf("pgbouncer: no unprivileged user to run as: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		b.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := os.Chown(dir, uid, gid); err != nil {
			return nil, err
		}
	}
	listen := "listen_addr = 127.0.0.1\nunix_socket_dir ="
	if o.Unix {
		listen = "listen_addr =\nunix_socket_dir = " + dir
	}
	ini := fmt.Sprintf(`[databases]
* = host=%s port=%d user=%s

[pgbouncer]
%s
listen_port = %d
auth_type = any
pool_mode = transaction
max_client_conn = 1000
default_pool_size = %d
max_db_connections = %d
server_reset_query =
server_connect_timeout = 2
server_login_retry = 1
ignore_startup_parameters = extra_float_digits,search_path
logfile = %s
`, o.Host, o.Port, o.User, listen, b.port, o.PoolSize, o.PoolSize, b.LogPath())
	if err := os.WriteFile(filepath.Join(dir, "pgbouncer.ini"), []byte(ini), 0o644); err != nil {
		return nil, err
	}
	return b, nil
}

// LogPath is PgBouncer's log file.
func (b *Bouncer) LogPath() string { return filepath.Join(b.dir, "pgbouncer.log") }

// DSN is the connection string clients use through the bouncer, with the
// simple protocol: PgBouncer 1.18 in transaction mode keeps no prepared
// statements across transactions.
func (b *Bouncer) DSN(dbname, user string) string {
	host := "127.0.0.1"
	if b.o.Unix {
		host = b.dir
	}
	return fmt.Sprintf("host=%s port=%d dbname=%s user=%s sslmode=disable default_query_exec_mode=simple_protocol connect_timeout=5",
		host, b.port, dbname, user)
}

// Start starts PgBouncer and waits until it accepts connections.
func (b *Bouncer) Start(ctx context.Context) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	cmd := exec.Command(Path, filepath.Join(b.dir, "pgbouncer.ini"))
	cmd.Dir = b.dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: b.cred, Pdeathsig: syscall.SIGKILL}
	out, err := os.OpenFile(filepath.Join(b.dir, "stderr.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		out.Close()
		return fmt.Errorf("starting pgbouncer: %w", err)
	}
	ran := make(chan struct{})
	go func() { _ = cmd.Wait(); out.Close(); close(ran) }()
	b.cmd, b.ran = cmd, ran
	network, addr := "tcp", fmt.Sprintf("127.0.0.1:%d", b.port)
	if b.o.Unix {
		network, addr = "unix", filepath.Join(b.dir, fmt.Sprintf(".s.PGSQL.%d", b.port))
	}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if conn, err := net.DialTimeout(network, addr, time.Second); err == nil {
			conn.Close()
			return nil
		}
		select {
		case <-ran:
			return fmt.Errorf("pgbouncer exited at start (see %s)", b.LogPath())
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return fmt.Errorf("pgbouncer did not listen on %s within 10s (see %s)", addr, b.LogPath())
}

// Kill SIGKILLs PgBouncer, if running, and waits for it to die.
func (b *Bouncer) Kill() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.cmd == nil {
		return
	}
	_ = b.cmd.Process.Kill()
	<-b.ran
	b.cmd = nil
}

// Remove kills PgBouncer and removes its directory, first copying its log
// to keepLog when that is not "".
func (b *Bouncer) Remove(keepLog string) {
	b.Kill()
	if keepLog != "" {
		if data, err := os.ReadFile(b.LogPath()); err == nil {
			_ = os.WriteFile(keepLog, data, 0o644)
		}
	}
	_ = os.RemoveAll(b.dir)
}

func freeTCPPort() int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 6432
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
